"""Tasks from your own files, without editing the repository (get_task picks them by suffix).

A dataset: `--task path/to/file.jsonl` (JsonlTask). One JSON object per line (blank lines are
skipped), UTF-8:
  {"question": "Ann has 3 apples and buys 4 more. How many now?", "answer": "3 + 4 = 7\\n#### 7"}
  {"prompt": "What is 6 times 7?", "target": 42}
  {"question": "What is the capital of France?", "answer": "Paris"}
The question is the value of "prompt" (or, when absent, "question"), a non-empty string; the
answer is the value of "answer" (or "target"), a number or a string. In a string the answer is
what follows the last "####" (GSM8K writes "...reasoning...\\n#### 72") or else the whole
string: a number (commas as thousands separators are allowed, "1,234"), or else a text, graded
by normalised exact match; it has at most MAX_ANSWER_CHARS characters (a response's longer
answer is never read). Anything else is an error naming the file and the line, and so is a line
that Python's json cannot hold: nested too deeply, an integer of more than 4300 digits, a lone
surrogate ("\\ud800", half of a UTF-16 pair, not a character).
The split hashes the question text; a file must leave at least one question in each split.
With a second file (--eval-task, e.g. GSM8K's test.jsonl) the first file is all training
questions and the second all held-out ones. prompts() draws without replacement when n fits
in the split; beyond that, training draws with replacement and an evaluation gets every
held-out question once.
Reward: a number is compared by value with the number answers.py reads from the response
("72.0" == "72", "1,234" == "1234"); a text ("Paris") with the response's final text, both
normalised as SQuAD's grader does ("#### the Eiffel Tower!" is "Eiffel tower"; "Paris, France"
is not "Paris"). The chat instruction asks for "the final answer after '####'" (as a number when
every answer is one).
Demonstration: the answer string when it carries reasoning ("####" in it, with GSM8K's
calculator notes "<<48/2=24>>" removed), else "#### <answer>": a demonstration follows the
instruction it sits under. default_few_shot = 2 (reasoning is long).

A task of your own: `--task path/to/my_task.py` (PluginTask), a Python file with
prompts(n, rng, split) and reward(response_text, target): your data and your verifier. A
reward of yours that raises scores 0 on that response, and the first time is reported.
"""

import importlib.util
import json
import math
import random
import re
import sys
from fractions import Fraction
from pathlib import Path

from common.tasks.answers import DATA_NUMBER, MAX_ANSWER_CHARS, final_answer, final_text, normalised
from common.tasks.splits import TEST_FRACTION, check_split, hash_unit

_CALCULATOR_NOTE = re.compile(r"<<[^<>]*>>")  # GSM8K's "<<48/2=24>>"


def _lone_surrogate(text: str) -> str | None:
    """The first lone surrogate in `text` (JSON's "\\ud800" escapes give one: half of a UTF-16
    pair, which no UTF-8 text, tokenizer or hash can take), written as its escape; None when there
    is none."""
    for char in text:
        if "\ud800" <= char <= "\udfff":
            return f"\\u{ord(char):04x}"
    return None


class JsonlTask:
    """Questions and answers (numbers or texts) read from a JSON Lines file (format in the module
    docstring)."""

    default_few_shot = 2

    def __init__(self, path: str, test_path: str | None = None):
        """Questions of `path`, split by a hash of their text; or, given `test_path` (a dataset's
        official test file), all of `path` to train on and all of `test_path` held out."""
        self.path, self.name = str(path), Path(path).stem
        self.splits = {"train": [], "test": []}  # lists of (question, target, solution_text)
        for file in (path,) if test_path is None else (path, test_path):
            for question, target, solution in self._read_file(file):
                if test_path is None:
                    split = "test" if hash_unit(question) < TEST_FRACTION else "train"
                else:
                    split = "train" if file == path else "test"
                self.splits[split].append((question, target, solution))
        if not self.splits["train"] and not self.splits["test"]:
            raise ValueError(f"{path}: no questions (the file is empty)")
        numbers = all(
            DATA_NUMBER.fullmatch(target)
            for records in self.splits.values()
            for _, target, _ in records
        )
        self.instruction = f"Give the final answer{' as a number' if numbers else ''} after '####'."
        for split, records in self.splits.items():
            if not records and test_path is not None:
                raise ValueError(
                    f"{path if split == 'train' else test_path}: no questions (the file is empty)"
                )
            if not records:
                raise ValueError(
                    f"{path}: no question falls in the {split} split"
                    f" ({TEST_FRACTION:.0%} of questions are held out by a hash of their text);"
                    " add more lines"
                )

    @classmethod
    def _read_file(cls, path: str) -> list[tuple[str, str, str]]:
        try:
            raw_lines = Path(path).read_bytes().split(b"\n")
        except OSError as e:
            raise ValueError(f"{path}: cannot read the file ({e.strerror})") from None
        records = []
        for number, raw in enumerate(raw_lines, start=1):
            try:
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError:
                raise ValueError(f"{path}, line {number}: not UTF-8 text") from None
            if line.strip():
                records.append(cls._read_record(line, f"{path}, line {number}"))
        return records

    @staticmethod
    def _read_record(line: str, where: str) -> tuple[str, str, str]:
        """One line -> (question, target, solution_text); ValueError naming `where` when
        malformed."""
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
        except RecursionError:  # json recurses into nested arrays and objects
            raise ValueError(f"{where}: JSON nested too deeply to read") from None
        except ValueError:  # json.loads's one other error: an integer of over 4300 digits
            limit = sys.get_int_max_str_digits()
            raise ValueError(
                f"{where}: a number with more than {limit} digits (more than Python reads)"
            ) from None
        if not isinstance(record, dict):
            raise ValueError(
                f"{where}: expected a JSON object {{...}}, got {type(record).__name__}"
            )
        question = record.get("prompt", record.get("question"))
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"{where}: needs a non-empty string under \"prompt\" or \"question\"")
        answer = record.get("answer", record.get("target"))
        for text in (question, answer):
            surrogate = _lone_surrogate(text) if isinstance(text, str) else None
            if surrogate:
                raise ValueError(
                    f"{where}: {surrogate} is a lone surrogate (half of a UTF-16 pair),"
                    " not a character"
                )
        if isinstance(answer, (int, float)) and not isinstance(answer, bool):
            if not math.isfinite(answer):
                raise ValueError(f"{where}: the answer must be a finite number, got {answer}")
            target = str(answer)
            solution = f"#### {target}"  # as the instruction asks: the answer after "####"
        elif isinstance(answer, str):
            final = answer.rsplit("####", 1)[-1].strip()
            if not normalised(final):
                raise ValueError(
                    f"{where}: the answer is empty (or only punctuation), got {answer!r}"
                )
            # a number, or a text
            target = final.replace(",", "") if DATA_NUMBER.fullmatch(final) else final
            solution = _CALCULATOR_NOTE.sub("", answer).strip() if "####" in answer else f"#### {target}"
        else:
            raise ValueError(f"{where}: needs a number or a string under \"answer\" or \"target\"")
        # a response's answer that long is never read: no reward could be earned
        if len(target) > MAX_ANSWER_CHARS:
            raise ValueError(f"{where}: the answer has more than {MAX_ANSWER_CHARS} characters")
        return question, target, solution

    def _sample(self, n: int, rng: random.Random, split: str) -> list[tuple[str, str, str]]:
        """n records without replacement; more than the split holds: training draws with
        replacement, an evaluation gets every held-out question once (so that --eval-size >= the
        test file's length evaluates all of it)."""
        check_split(split)
        records = self.splits[split]
        if n <= len(records) or split == "test":
            return rng.sample(records, min(n, len(records)))
        return rng.choices(records, k=n)

    def prompts(self, n: int, rng: random.Random, split: str = "train") -> list[tuple[str, str]]:
        return [(question, target) for question, target, _ in self._sample(n, rng, split)]

    def examples(self, k: int, rng: random.Random) -> list[tuple[str, str]]:
        return [(question, solution) for question, _, solution in self._sample(k, rng, "train")]

    @staticmethod
    def reward(response_text: str, target: str) -> float:
        if not DATA_NUMBER.fullmatch(target):  # a text answer: normalised exact match
            return 1.0 if normalised(final_text(response_text)) == normalised(target) else 0.0
        # at most MAX_ANSWER_CHARS characters: Fraction reads it at once
        answer = final_answer(response_text)
        return 1.0 if answer is not None and Fraction(answer) == Fraction(target) else 0.0


class PluginTask:
    """A task of your own, from a Python file given as --task (no edit of the repository):

        def prompts(n, rng, split="train"):  # -> n pairs (prompt text, target text)
        def reward(response_text, target):   # -> a float, 1.0 for a right answer
        def examples(k, rng):                # optional: k solved (prompt, solution) for --few-shot
        INSTRUCTION = "..."                  # optional: the answer format, stated to a chat model
        DEFAULT_FEW_SHOT = 0                 # optional: examples shown to a base model by default

    `rng` is a random.Random; `split` is "train" or "test": keep the held-out questions apart.
    prompts() is tried on both splits as the file loads: an exception, or anything but n pairs of
    strings, is one line. A reward never raises on model output: an exception (or a value that is
    not a finite number) scores 0, and the first one is reported in one line."""

    def __init__(self, path: str):
        spec = importlib.util.spec_from_file_location(Path(path).stem, path)
        self.module, self.path, self.name = (
            importlib.util.module_from_spec(spec), path, Path(path).stem
        )
        try:
            spec.loader.exec_module(self.module)
        except Exception as e:  # the user's code: whatever it raises, one line
            raise ValueError(
                f"--task {path}: importing it failed ({type(e).__name__}: {e})"
            ) from None
        for needed in ("prompts", "reward"):
            if not callable(getattr(self.module, needed, None)):
                raise ValueError(
                    f"--task {path}: needs a function {needed}(...)"
                    " (see PluginTask in common/tasks/files.py)"
                )
        self.instruction = getattr(self.module, "INSTRUCTION", "")
        self.default_few_shot = getattr(self.module, "DEFAULT_FEW_SHOT", 0)
        self.reported = False
        for split in ("train", "test"):  # both splits tried now, before any model loads
            try:
                pairs = self.module.prompts(2, random.Random(0), split)
            except Exception as e:  # the user's code: whatever it raises, one line
                raise ValueError(
                    f"--task {path}: prompts(2, rng, {split!r}) raised {type(e).__name__}: {e}"
                ) from None
            self._checked(pairs, 2, split)

    def prompts(self, n: int, rng: random.Random, split: str = "train") -> list[tuple[str, str]]:
        return self._checked(self.module.prompts(n, rng, split), n, split)

    def _checked(self, pairs, n: int, split: str) -> list[tuple[str, str]]:
        """The pairs prompts() returned, as tuples; a ValueError naming the file and what it
        returned instead of a list of n (prompt, target) pairs of strings."""
        if not isinstance(pairs, (list, tuple)):
            got = f"{type(pairs).__name__} {pairs!r:.40}"
        elif len(pairs) != n:
            got = f"{len(pairs)} pairs"
        else:
            got = next((repr(p)[:60] for p in pairs if not (
                isinstance(p, (tuple, list)) and len(p) == 2 and all(isinstance(x, str) for x in p))), None)
        if got is not None:
            raise ValueError(f"--task {self.path}: prompts({n}, rng, {split!r}) must return n (prompt, target) "
                             f"pairs of strings in a list, got {got}")
        return [tuple(pair) for pair in pairs]

    def examples(self, k: int, rng: random.Random) -> list[tuple[str, str]]:
        if hasattr(self.module, "examples"):
            return list(self.module.examples(k, rng))
        return self.prompts(k, rng)  # without worked solutions: the target is the demonstration

    def reward(self, response_text: str, target: str) -> float:
        try:
            value = float(self.module.reward(response_text, target))
        except Exception as e:  # the user's code: a reward never raises on model output
            value = math.nan
            if not self.reported:
                print(
                    f"warning: --task {self.path}: reward raised {type(e).__name__}: {e};"
                    " such responses score 0 (said once)",
                    file=sys.stderr,
                )
                self.reported = True
        return value if math.isfinite(value) else 0.0
