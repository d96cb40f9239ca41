"""Verifiable tasks for the LLM group methods (grpo.py and its siblings), a module each.

Every task object offers the same small interface (rng is a `random.Random`):

    prompts(n, rng, split="train") -> list[(prompt, target)]  # what to ask, what the verifier needs
    reward(response_text, target) -> float  # 1.0 right, 0.0 wrong: no partial credit
    examples(k, rng) -> list[(prompt, solution_text)]  # worked demonstrations (training split)
    name: str               # short name, for run names
    instruction: str        # one sentence stating the answer format (for a chat model's user turn)
    default_few_shot: int   # how many demonstrations to show a base model (no chat template)

Tasks and their files stay data: how a prompt is shown to a model (chat template, few-shot,
where to cut the response) is decided by the group files. No task gives a format reward:
a response either verifies (1.0) or it does not (0.0).

`--task` takes a name of TASKS or a file (get_task); each module states its task's rules:
    arithmetic.py  "addition", "addition2", "subtraction", "multiplication": "37+48=" -> "85"
    countdown.py   "countdown": make the target from 3-4 numbers with + - * / and parentheses
    reverse.py     "reverse": "reverse 48213=" -> "31284" (the embedded long model's task)
    files.py       your dataset (.jsonl, numeric or text answers) or your own task (.py)
and what they share:
    answers.py     how a response's answer is read, as the reference graders read it
    splits.py      which questions are held out: the same ones in every run

A reward never raises on model output: the repository's own verifiers are fuzzed for it
(tests/test_tasks.py); a task of yours that raises scores 0 on that response, and the first
time is reported.
"""

from pathlib import Path

from common.tasks.arithmetic import Arithmetic
from common.tasks.countdown import Countdown
from common.tasks.files import JsonlTask, PluginTask
from common.tasks.reverse import Reverse
from common.tasks.splits import EVAL_SEED, TEST_FRACTION

__all__ = ["EVAL_SEED", "TEST_FRACTION", "TASKS", "get_task", "Arithmetic", "Countdown", "JsonlTask", "PluginTask",
           "Reverse"]

# The names `--task` accepts besides a .jsonl path; most are for real models (`--model ...`)
TASKS = {
    "addition": Arithmetic("+", max_digits=3, name="addition"),  # the embedded tiny model's task
    "addition2": Arithmetic("+", max_digits=2, name="addition2"),
    "subtraction": Arithmetic("-", max_digits=3, name="subtraction"),
    "multiplication": Arithmetic("*", max_digits=2, name="multiplication"),
    "countdown": Countdown(),
    "reverse": Reverse(),  # the embedded long model's task
}


def get_task(task: str, eval_task: str | None = None):
    """The task for a `--task` value: a name of TASKS, the path of a .jsonl file or of a .py file
    (PluginTask); with `eval_task` (a .jsonl file, --eval-task) the held-out questions are that
    file's instead of a hash split of --task's file.
    Raises ValueError with a one-line message otherwise (or naming the file and line of a
    malformed file)."""
    if eval_task is not None and not task.endswith(".jsonl"):
        raise ValueError("--eval-task needs --task to be a .jsonl file too "
                         f"(the {task!r} task makes its own test split)")
    if eval_task is not None and not eval_task.endswith(".jsonl"):
        raise ValueError(f"--eval-task must be the path of a .jsonl file, got {eval_task!r}")
    if task.endswith((".jsonl", ".py")) and not Path(task).is_file():  # --task's file first, as typed
        raise ValueError(f"--task file not found: {task}")
    if eval_task is not None and not Path(eval_task).is_file():
        raise ValueError(f"--eval-task file not found: {eval_task}")
    if task in TASKS:
        return TASKS[task]
    if task.endswith(".jsonl"):
        return JsonlTask(task, eval_task)
    if task.endswith(".py"):
        return PluginTask(task)
    raise ValueError(
        f"--task must be one of {', '.join(TASKS)}, the path of a .jsonl file or of a .py file"
        f" of your own, got {task!r}"
    )
