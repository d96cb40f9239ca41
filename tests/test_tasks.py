"""The verifiable tasks: generation and splits, the Countdown verifier (right, wrong, malformed and
adversarial expressions), the JSON Lines reader and its errors, answer extraction, and `get_task`.
Every expected reward below is worked out by hand from the rules in common/tasks.py's docstring."""

import json
import os
import random
import re
import subprocess
import sys
import time

import pytest

from common.tasks import TASKS, Countdown, JsonlTask, get_task

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "common", "data", "example.jsonl")
COUNTDOWN_PROMPT = re.compile(
    r"Using the numbers ([\d, ]+), make (\d+) with \+ - \* / and parentheses, each number exactly once\."
)


def countdown_target(prompt: str) -> str:
    """The target string a Countdown prompt stands for, read back from the prompt text."""
    numbers, target = COUNTDOWN_PROMPT.fullmatch(prompt).groups()
    return f"{numbers.replace(',', '')}={target}"


def arithmetic_target(prompt: str) -> str:
    a, op, b = re.fullmatch(r"(\d+)([-+*])(\d+)=", prompt).groups()
    return str({"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op])


def reverse_target(prompt: str) -> str:
    (digits,) = re.fullmatch(r"reverse (\d+)=", prompt).groups()
    return "".join(reversed(digits))


def write_jsonl(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def good_lines(count=100):
    records = [{"question": f"What is {i} plus {i + 1}?", "answer": f"{i} + {i + 1} = {2 * i + 1}\n#### {2 * i + 1}"}
               for i in range(count)]
    return [json.dumps(record) for record in records]


# ---------------------------------------------------------------- generation and splits (every task)

ALL_TASKS = [*TASKS, EXAMPLE]


@pytest.mark.parametrize("name", ALL_TASKS)
def test_same_seed_same_prompts(name):
    task = get_task(name)
    for split in ("train", "test"):
        first = task.prompts(20, random.Random(7), split=split)
        assert first == task.prompts(20, random.Random(7), split=split)
        assert first != task.prompts(20, random.Random(8), split=split)
        assert len(first) == 20 and all(isinstance(p, str) and isinstance(t, str) for p, t in first)
    assert task.examples(3, random.Random(7)) == task.examples(3, random.Random(7))


@pytest.mark.parametrize("name", ALL_TASKS)
def test_train_and_test_splits_do_not_overlap(name):
    task = get_task(name)
    train = {p for p, _ in task.prompts(1500, random.Random(0), split="train")}
    test = {p for p, _ in task.prompts(150, random.Random(0), split="test")}
    assert train and test and not train & test
    examples = {p for p, _ in task.examples(50, random.Random(1))}
    assert not examples & test  # demonstrations come from the training split
    if name == "countdown":  # a puzzle space too large for the check above to bite: ask the split itself
        for prompt in examples:
            numbers, target = countdown_target(prompt).split("=")
            assert not Countdown.in_test_split([int(x) for x in numbers.split()], int(target))


def test_split_is_a_property_of_the_puzzle_not_of_its_order():
    # Countdown's split hashes the sorted numbers: any order of the same puzzle falls on the same side.
    rng = random.Random(3)
    puzzles = [Countdown().puzzle(rng) for _ in range(2000)]
    held_out = [(numbers, target) for numbers, target, _ in puzzles if Countdown.in_test_split(numbers, target)]
    assert 100 < len(held_out) < 300  # about 10 % of 2000
    for numbers, target in held_out:
        assert Countdown.in_test_split(list(reversed(numbers)), target)
        assert Countdown.in_test_split(sorted(numbers), target)


@pytest.mark.parametrize("name", ALL_TASKS)
def test_task_describes_itself(name):
    task = get_task(name)
    assert isinstance(task.name, str) and task.name
    assert isinstance(task.instruction, str) and task.instruction.endswith(".") and "\n" not in task.instruction
    assert isinstance(task.default_few_shot, int) and task.default_few_shot >= 0


@pytest.mark.parametrize("name", ALL_TASKS)
def test_every_demonstration_earns_its_reward(name):
    task = get_task(name)
    if name == "countdown":
        lookup = countdown_target
    elif name == EXAMPLE:
        lookup = {q: t for records in task.splits.values() for q, t, _ in records}.get
    elif name == "reverse":
        lookup = reverse_target
    else:
        lookup = arithmetic_target
    examples = task.examples(50, random.Random(5))
    assert len(examples) == 50
    for prompt, solution in examples:
        assert task.reward(solution, lookup(prompt)) == 1.0, (prompt, solution)


def test_arithmetic_prompts_are_bare():
    # The embedded tiny model was trained on "37+48=": the prompt is the bare sum, the target its value.
    for prompt, target in TASKS["addition"].prompts(200, random.Random(0)):
        a, b = re.fullmatch(r"(\d{1,3})\+(\d{1,3})=", prompt).groups()
        assert target == str(int(a) + int(b))
    assert TASKS["addition"].reward("The answer is 85.", "85") == 1.0
    assert TASKS["addition"].reward("84", "85") == 0.0


def test_reverse_prompts():
    # "reverse 48213=" -> "31284": 3 to 6 digits, every count and leading zeros occur, the target is the string backwards.
    pairs = TASKS["reverse"].prompts(2000, random.Random(0))
    counts = {n: 0 for n in range(3, 7)}
    for prompt, target in pairs:
        (digits,) = re.fullmatch(r"reverse (\d{3,6})=", prompt).groups()
        assert target == digits[::-1]
        counts[len(digits)] += 1
    assert all(400 < c < 600 for c in counts.values()), counts  # the digit count is uniform
    assert any(t.startswith("0") for _, t in pairs) and any(t.endswith("0") for _, t in pairs)


@pytest.mark.parametrize("response, expected", [
    ("31284", 1.0), ("31284 ", 1.0), ("31284 .", 1.0), ("31284 " + "." * 40, 1.0),  # the hesitation is never read
    ("31284.....", 1.0), ("The answer: 31284, sure", 1.0),
    ("3128 4", 0.0), ("312845", 0.0), ("031284", 0.0), ("48213", 0.0), ("", 0.0), ("  ....", 0.0),
    (". 31284", 1.0), ("1 31284", 0.0),  # the first run of digits is the answer
])
def test_reverse_reward(response, expected):
    assert TASKS["reverse"].reward(response, "31284") == expected


def test_reverse_reward_keeps_leading_zeros():
    assert TASKS["reverse"].reward("0120 ..", "0120") == 1.0
    assert TASKS["reverse"].reward("120", "0120") == 0.0


# ---------------------------------------------------------------- countdown: generation

def test_countdown_puzzles_are_in_range_and_reachable():
    task = TASKS["countdown"]
    counts = []
    for prompt, target in task.prompts(500, random.Random(0)):
        assert countdown_target(prompt) == target  # the prompt states exactly the numbers and target
        numbers, goal = target.split("=")
        counts.append(len(numbers.split()))
        assert all(1 <= int(x) <= 25 for x in numbers.split()) and 1 <= int(goal) <= 100
    assert set(counts) == {3, 4} and 200 < counts.count(3) < 300  # 3 and 4 numbers equally likely
    rng = random.Random(1)
    for numbers, target, expression in [task.puzzle(rng) for _ in range(500)]:
        # the expression that built the target verifies, and uses only the four operations
        assert set(expression) <= set("0123456789+-*/() ")
        assert task.reward(expression, f"{' '.join(map(str, numbers))}={target}") == 1.0


# ---------------------------------------------------------------- countdown: the verifier

CASES = [
    # right: 3 * 7 + 25 = 46
    ("3*7+25", "3 7 25=46", 1.0),
    ("25 + 3 * 7", "3 7 25=46", 1.0),  # precedence: 3 * 7 first
    ("(7 * 3) + 25", "3 7 25=46", 1.0),
    ("3 × 7 + 25", "3 7 25=46", 1.0),  # unicode times
    ("7·3+25", "3 7 25=46", 1.0),
    ("25+3*7 = 46", "3 7 25=46", 1.0),  # the part before "=" is graded
    ("25+3*7 = 47", "3 7 25=46", 1.0),  # ... the claimed value is ignored
    ("Answer: 25 + 7*3.", "3 7 25=46", 1.0),  # from the first digit to the last digit
    ("3*7 = 21\n21 + 25 = 46\n25 + 3*7\n\n", "3 7 25=46", 1.0),  # the last non-empty line
    ("So \\(\\boxed{3 \\times 7 + 25}\\). Done, 99", "3 7 25=46", 1.0),  # boxed wins over the last line
    ("$3 \\cdot 7 + 25$", "3 7 25=46", 1.0),
    ("x" * 100_000 + "\n3*7+25", "3 7 25=46", 1.0),  # long reasoning, short answer line
    ("((((3 * 7)))) + 25", "3 7 25=46", 1.0),  # redundant parentheses are fine
    # right: minus and divide, unicode and fractions
    ("25 − 7 − 3", "3 7 25=15", 1.0),  # U+2212 minus
    ("25 – 7 – 3", "3 7 25=15", 1.0),  # en dash
    ("25 - (7 + 3)", "3 7 25=15", 1.0),
    ("4 ÷ (3 ÷ 6)", "3 4 6=8", 1.0),  # 3/6 = 1/2, 4 / (1/2) = 8: exact fractions
    ("4 / (3 / 6)", "3 4 6=8", 1.0),
    ("6 / (4 - 2)", "2 4 6=3", 1.0),
    ("(4 + 6) * (9 - 7)", "4 6 7 9=20", 1.0),
    # wrong value
    ("3+7+25", "3 7 25=46", 0.0),  # 35
    ("25*3+7", "3 7 25=46", 0.0),  # 82
    ("25 - 7 + 3", "3 7 25=15", 0.0),  # 21: left to right
    ("46 = 25+3*7", "3 7 25=46", 0.0),  # the left side "46" is graded
    ("6 / 4 - 2", "2 4 6=3", 0.0),  # -1/2
    # numbers used twice, missing, or not given
    ("3*7+25+3-3", "3 7 25=46", 0.0),  # value 46, but 3 three times
    ("21+25", "3 7 25=46", 0.0),  # value 46, 21 is not given
    ("3*7*1+25", "3 7 25=46", 0.0),  # value 46, 1 is not given
    ("7*3", "3 7 25=21", 0.0),  # 25 missing
    ("37+9", "3 7 9=46", 0.0),  # concatenating 3 and 7 is not an operation
    # malformed
    ("", "3 7 25=46", 0.0),
    ("I don't know", "3 7 25=46", 0.0),
    ("3*7+", "3 7 25=46", 0.0),
    ("3*(7+25", "3 7 25=46", 0.0),
    ("3*7)+25", "3 7 25=46", 0.0),
    ("3 7 25", "3 7 25=46", 0.0),
    ("()3*7+25", "3 7 25=46", 0.0),
    ("25 - 3 + -7", "3 7 25=15", 0.0),  # value 15, but unary minus is not an operation
    ("25 - 3 + (-7)", "3 7 25=15", 0.0),
    ("-3 - 7 + 25", "3 7 25=15", 0.0),  # the expression starts at the first digit: 3 - 7 + 25 = 21
    ("25 - 7 - 3.0", "3 7 25=15", 0.0),  # no decimals
    ("3 x 7 + 25", "3 7 25=46", 0.0),  # x is a letter, not times
    ("３*7+25", "3 7 25=46", 0.0),  # a full-width digit is not a digit here
    ("3² * 1", "1 3=9", 0.0),
]

# Adversarial responses run in a child process with a deadline: a verifier that evaluated 9**9**9 would
# hang inside one C call that no signal interrupts, so the test must be able to give up on it from outside.
ADVERSARIAL = [
    ("__import__('os')", "3 7 25=46", 0.0),
    ("__import__('os').system('echo 3*7+25')", "3 7 25=46", 0.0),
    ("2**999999", "2 999999=46", 0.0),  # ** is two times signs: malformed, not a power
    ("9**9**9", "9 9 9=46", 0.0),
    ("3^2", "2 3=9", 0.0),  # 9 if ^ were a power
    ("3**2", "2 3=9", 0.0),
    ("1/0", "0 1=1", 0.0),  # division by zero
    ("7/(3-3)", "3 3 7=1", 0.0),
    ("(" * 21 + "3*7+25" + ")" * 21, "3 7 25=46", 0.0),  # nested deeper than 20
    ("(" * 20 + "3*7+25" + ")" * 20, "3 7 25=46", 1.0),  # 20 levels are fine
    ("(" * 100_000, "3 7 25=46", 0.0),
    ("(" * 50_000 + "1" + ")" * 50_000, "1=1", 0.0),
    ("1+" * 50_000 + "1", "1=1", 0.0),  # 100k characters
    ("3*7+25" + " " * 100_000 + "0" * 100_000, "3 7 25=46", 0.0),  # the span runs to the last digit: too long
    ("3*7+25" + " " * 300, "3 7 25=46", 1.0),  # trailing blanks are not part of it
]


@pytest.mark.parametrize("response, target, expected", CASES, ids=[f"{i}" for i in range(len(CASES))])
def test_countdown_verifier(response, target, expected):
    start = time.perf_counter()
    assert Countdown.reward(response, target) == expected
    assert time.perf_counter() - start < 0.5


CHILD = """
import json, sys, time
from common.tasks import Countdown
for response, target, _ in json.load(sys.stdin):
    start = time.perf_counter()
    print(json.dumps([Countdown.reward(response, target), time.perf_counter() - start]), flush=True)
"""


def test_countdown_verifier_adversarial():
    child = subprocess.run(
        [sys.executable, "-c", CHILD],
        input=json.dumps(ADVERSARIAL),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert child.returncode == 0, child.stderr
    results = [json.loads(line) for line in child.stdout.splitlines()]
    assert len(results) == len(ADVERSARIAL)
    for (response, target, expected), (reward, seconds) in zip(ADVERSARIAL, results):
        assert (reward, seconds < 0.5) == (expected, True), (response[:40], target)


# ---------------------------------------------------------------- dataset file: answer extraction and reward

ANSWERS = [
    ("The answer is \\boxed{72}.", "72", 1.0),
    ("\\boxed{72} is what I get, not 71", "72", 1.0),  # boxed wins over the last number
    ("\\boxed{\\$1,234}", "1234", 1.0),  # thousands comma
    ("\\boxed{72 \\text{ apples}} and \\boxed{7}", "72", 0.0),  # the last boxed counts
    ("\\boxed{3 + 4 = 7}", "7", 1.0),  # the last number in the box
    ("20 + 52 = 72\n#### 72", "72", 1.0),
    ("#### 72\nThat took me 3 steps.", "72", 1.0),  # the first number after "####" wins over the last number
    ("#### 1,234", "1234", 1.0),
    ("#### 12\n#### 13", "12", 0.0),  # the last "####" counts
    ("First 3 + 4 = 7, so she has 7 apples.", "7", 1.0),  # the last number
    ("It is 72.0", "72", 1.0),  # numerically equal
    ("It is 72.", "72", 1.0),  # a full stop is not a decimal point
    ("1,234", "1234", 1.0),
    ("1, 234", "1234", 0.0),  # a list of two numbers: the last is 234
    ("It is 2.5", "2.5", 1.0),
    ("-7 degrees", "-7", 1.0),
    ("10-3", "-3", 0.0),  # a minus after a digit is subtraction: the last number is 3
    ("10-3", "3", 1.0),
    ("no number here", "7", 0.0),
    ("\\boxed{}", "7", 0.0),
    ("9" * 100_000, "7", 0.0),  # an absurd number is wrong, not a crash
]


@pytest.mark.parametrize("response, target, expected", ANSWERS, ids=[f"{i}" for i in range(len(ANSWERS))])
def test_dataset_reward(response, target, expected):
    assert JsonlTask.reward(response, target) == expected


# ---------------------------------------------------------------- dataset file: the reader

def test_jsonl_good_file(tmp_path):
    lines = good_lines()
    lines[0] = json.dumps({"prompt": "What is 48/2?", "target": "48/2 = <<48/2=24>>24\n#### 24"})
    lines[1] = json.dumps({"question": "How many grams in 1,500 kg?", "answer": "1,500,000"})
    lines[2] = json.dumps({"question": "Half of 5?", "target": 2.5})
    lines.insert(3, "   ")  # blank lines are skipped
    task = JsonlTask(write_jsonl(tmp_path / "mine.jsonl", lines))
    assert task.name == "mine"
    records = {q: (t, s) for split in task.splits.values() for q, t, s in split}
    assert len(records) == 100 and task.splits["test"] and task.splits["train"]
    assert records["What is 48/2?"] == ("24", "48/2 = 24\n#### 24")  # calculator notes removed
    assert records["How many grams in 1,500 kg?"] == ("1500000", "1500000")  # no reasoning: the number
    assert records["Half of 5?"] == ("2.5", "2.5")
    assert records["What is 3 plus 4?"] == ("7", "3 + 4 = 7\n#### 7")
    # without replacement while n fits in the split, with replacement beyond
    size = len(task.splits["test"])
    whole_split = sorted((q, t) for q, t, _ in task.splits["test"])
    assert sorted(task.prompts(size, random.Random(0), split="test")) == whole_split
    assert len(task.prompts(size + 5, random.Random(0), split="test")) == size + 5


def test_shipped_example_file():
    task = get_task(EXAMPLE)
    assert isinstance(task, JsonlTask)
    assert len(task.splits["train"]) + len(task.splits["test"]) == 36
    assert len(task.splits["test"]) >= 1


@pytest.mark.parametrize(
    "bad_line, message",
    [
        ('{"question": "What is 2+2?", "answer": "4"', "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"answer": "4"}', '"prompt" or "question"'),
        ('{"question": "", "answer": "4"}', '"prompt" or "question"'),
        ('{"question": "What is 2+2?"}', '"answer" or "target"'),
        ('{"question": "What is 2+2?", "answer": null}', '"answer" or "target"'),
        ('{"question": "What is 2+2?", "answer": true}', '"answer" or "target"'),
        ('{"question": "What is 2+2?", "answer": "four"}', "must be a number"),
        ('{"question": "What is 2+2?", "answer": NaN}', "must be a finite number"),
        ('{"question": "What is 2+2?", "answer": "2 + 2 = 4\\n#### four"}', "must be a number"),
    ],
)
def test_jsonl_malformed_line_names_file_and_line(tmp_path, bad_line, message):
    lines = good_lines()
    lines[1:1] = ["", bad_line]  # a blank line 2 still counts: the bad one is line 3
    path = write_jsonl(tmp_path / "bad.jsonl", lines)
    with pytest.raises(ValueError) as error:
        get_task(path)
    text = str(error.value)
    assert f"{path}, line 3:" in text and message in text and "\n" not in text


def test_jsonl_not_utf8(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"question": "1+1?", "answer": "2"}\n{"question": "caf\xe9?", "answer": "3"}\n')
    with pytest.raises(ValueError, match=r"latin1\.jsonl, line 2: not UTF-8"):
        JsonlTask(str(path))


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_jsonl_empty_file(tmp_path, content):
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=r"empty\.jsonl: no questions \(the file is empty\)"):
        get_task(str(path))


def test_jsonl_too_small_for_both_splits(tmp_path):
    path = write_jsonl(tmp_path / "one.jsonl", good_lines(1))  # one question leaves one split empty
    with pytest.raises(ValueError, match=r"one\.jsonl: no question falls in the (train|test) split"):
        get_task(path)


# ---------------------------------------------------------------- get_task

def test_get_task_names_and_errors(tmp_path):
    for name in TASKS:
        assert get_task(name) is TASKS[name]
    with pytest.raises(ValueError) as error:
        get_task("countdwn")
    assert str(error.value) == (
        "--task must be one of addition, subtraction, multiplication, countdown, reverse or the path of a .jsonl file, "
        "got 'countdwn'"
    )
    with pytest.raises(ValueError, match=r"^--task file not found: .*missing\.jsonl$"):
        get_task(str(tmp_path / "missing.jsonl"))
