"""The verifiable tasks: generation and splits, the Countdown verifier (right, wrong, malformed and
adversarial expressions), the JSON Lines reader and its errors, answer extraction, and `get_task`.
Every expected reward below is worked out by hand from the rules in the docstrings of common/tasks/."""

import ast
import json
import os
import random
import re
import subprocess
import sys
import time

import pytest

from common.tasks import TASKS, Countdown, JsonlTask, get_task
from common.tasks.countdown import MAX_EXPRESSION_CHARS
from common.tasks.splits import TEST_FRACTION, hash_unit
from conftest import ROOT

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
        # a file's small test split is evaluated whole, each question once; everything else draws 20
        expected = min(20, len(task.splits["test"])) if split == "test" and hasattr(task, "splits") else 20
        assert len(first) == expected and all(isinstance(p, str) and isinstance(t, str) for p, t in first)
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


@pytest.mark.parametrize("name", ALL_TASKS)
def test_a_split_other_than_train_or_test_is_refused(name):
    with pytest.raises(ValueError, match="split must be 'train' or 'test', got 'eval'"):
        get_task(name).prompts(3, random.Random(0), split="eval")


def knuth_held_out(a: int, b: int) -> bool:
    """The arithmetic split as arithmetic.py documents it, Knuth's multiplicative hash of the operand pair: a
    contract, since changing it would move the held-out questions of every figure on the results pages."""
    return ((a * 1_000_003 + b) * 2_654_435_761) % 2**32 < 0.1 * 2**32


@pytest.mark.parametrize("name", ["addition", "addition2", "subtraction", "multiplication"])
def test_arithmetic_holds_out_the_pairs_its_hash_picks(name):
    for split in ("train", "test"):
        for prompt, _ in get_task(name).prompts(400, random.Random(0), split=split):
            a, b = re.fullmatch(r"(\d+)[-+*](\d+)=", prompt).groups()
            assert knuth_held_out(int(a), int(b)) == (split == "test"), (split, prompt)


def test_reverse_holds_out_the_strings_its_hash_picks():
    # the held-out side is the small one: a tenth of the hash's range
    for split in ("train", "test"):
        for prompt, _ in TASKS["reverse"].prompts(400, random.Random(0), split=split):
            (digits,) = re.fullmatch(r"reverse (\d+)=", prompt).groups()
            assert (hash_unit("reverse " + digits) < TEST_FRACTION) == (split == "test"), (split, prompt)


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


def test_arithmetic_operands_have_a_uniform_digit_count_then_a_uniform_value():
    # "addition": 1, 2 or 3 digits, each a third of the operands; 0 and 999 are operands, 1000 is not
    operands = [int(x) for prompt, _ in TASKS["addition"].prompts(15_000, random.Random(0))
                for x in prompt[:-1].split("+")]
    for digits in (1, 2, 3):
        share = sum(len(str(x)) == digits for x in operands) / len(operands)
        assert abs(share - 1 / 3) < 0.015, (digits, share)  # 30,000 operands: a standard error of 0.003
    assert min(operands) == 0 and max(operands) == 999 and {10, 100} <= set(operands)  # each count's smallest


@pytest.mark.parametrize("response, target, expected", [
    # the formats a model answers in
    ("85", "85", 1.0), ("85\n", "85", 1.0), ("The answer is 85.", "85", 1.0), ("#### 85", "85", 1.0),
    ("\\boxed{85}", "85", 1.0), ("37+48=85", "85", 1.0), ("37 + 48 = 85", "85", 1.0), ("= 85", "85", 1.0),
    ("9,801", "9801", 1.0),  # a thousands comma (99*99): it used to be read as 801
    ("-11", "-11", 1.0), ("37-48=-11", "-11", 1.0),
    ("−11", "-11", 1.0),  # U+2212: it used to be ignored, and "−11" scored 0 for -11...
    ("−85", "85", 0.0),  # ... and 1.0 for 85
    # an integer written as the target: the tiny model's "085" was always wrong, and "85.0" is not a plain integer
    ("085", "85", 0.0), ("85.0", "85", 0.0),
    # what used to be read as another number, scoring 1.0
    ("8.5", "5", 0.0), ("1,801", "801", 0.0), ("10-11", "-11", 0.0), ("48 -11", "-11", 0.0), ("2 * 85", "85", 0.0),
    ("85²", "85", 0.0), ("85!", "85", 0.0), ("2^85", "85", 0.0), ("sqrt(85)", "85", 0.0),
    # a percent sign after the number leaves it (GSM8K asks "what percent"); this was pinned at 0.0 before
    ("85%", "85", 1.0), ("85 % 2", "1", 0.0), ("85 % 2", "2", 0.0),  # ... but "%" between numbers is modulo
    # a sign of its own: "+85" is 85, "− 7" is -7, unless it is a binary operator or doubled
    ("+85", "85", 1.0), ("37 + 48 = +85", "85", 1.0), ("++85", "85", 0.0), ("+-85", "85", 0.0), ("+-85", "-85", 0.0),
    ("− 7", "-7", 1.0), ("4 - 11 = − 7", "-7", 1.0), ("44 − 7", "-7", 0.0), ("44 − 7", "37", 0.0), ("x − 7", "-7", 0.0),
    ("− − 7", "-7", 0.0), ("− − 7", "7", 0.0),
    # invisible characters: a zero-width space is a space, so it ends a number but does not join two
    ("85\u200b", "85", 1.0), ("The answer is 85\u200b.", "85", 1.0), ("8\u200b5", "85", 0.0),
    ("2\u206285", "285", 0.0),  # U+2062 is an invisible times sign: 2 * 85, not 285
    # a unit glued on; a fraction is not an integer written as one, even when equal
    ("85km", "85", 1.0), ("\\frac{170}{2}", "85", 0.0), ("170/2", "85", 0.0),
])
def test_arithmetic_reward(response, target, expected):
    assert TASKS["addition"].reward(response, target) == expected


def test_reverse_prompts():
    # "reverse 48213=" -> "31284": the target is the string backwards.
    # 3 to 6 digits; every count and leading zeros occur.
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

def test_countdown_demonstrations_carry_only_the_parentheses_needed():
    # Python writes an expression back with the parentheses its precedence needs (ast.unparse): a
    # demonstration reads the same, so "(25 - 3) * 2" but never "(3)", "(3 * 7) * 2" or "25 - (3)"
    rng = random.Random(2)
    puzzles = [Countdown().puzzle(rng) for _ in range(3000)]
    for _, _, expression in puzzles:
        assert ast.unparse(ast.parse(expression, mode="eval")) == expression
    assert any("(" in expression for _, _, expression in puzzles)
    # _combine's own examples: a - (b + c) and a / (b * c) keep theirs, a + (b - c) and a * (b / c) need none
    three, sum_, difference = (3, "3", 3), (9, "4 + 5", 1), (1, "5 - 4", 1)
    product, quotient = (20, "4 * 5", 2), (2, "8 / 4", 2)
    assert Countdown._combine((12, "12", 3), "-", sum_)[1] == "12 - (4 + 5)"
    assert Countdown._combine((40, "40", 3), "/", product)[1] == "40 / (4 * 5)"
    assert Countdown._combine(three, "+", difference)[1] == "3 + 5 - 4"
    assert Countdown._combine(three, "*", quotient)[1] == "3 * 8 / 4"
    # every number of 1..25 is drawn, and targets reach both ends of 1..100
    assert {n for numbers, _, _ in puzzles for n in numbers} == set(range(1, 26))
    assert {1, 100} <= {target for _, target, _ in puzzles}


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
    ("-3 - 7 + 25", "3 7 25=15", 0.0),  # value 15, but unary minus is not an operation
    ("25 - 7 - 3.0", "3 7 25=15", 0.0),  # no decimals
    ("3 x 7 + 25", "3 7 25=46", 0.0),  # x is a letter, not times
    ("３*7+25", "3 7 25=46", 0.0),  # a full-width digit is not a digit here
    ("3² * 1", "1 3=9", 0.0),
    # formats around the expression: a label, a full stop, markdown, LaTeX
    ("The answer is 3 * 7 + 25.", "3 7 25=46", 1.0),
    ("**Final answer:** 3 * 7 + 25", "3 7 25=46", 1.0),
    ("**3 * 7 + 25 = 46**", "3 7 25=46", 1.0),  # bold around the line, then the left side of "="
    ("`3 * 7 + 25`", "3 7 25=46", 1.0),
    ("$$3 \\times 7 + 25 = 46$$", "3 7 25=46", 1.0),
    ("3 + 7 + 25", "3 7 25=35", 1.0),
    ("(25 + 7) + 3 = 35", "3 7 25=35", 1.0),
    ("\\boxed{25+7+3}", "3 7 25=35", 1.0),
    ("3 + 7 + 25 = 35 or 36", "3 7 25=35", 1.0),  # what follows "=" is the claimed value, ignored
    # text around the expression that changes its value: each used to score 1.0, graded on 3 + 7 + 25 = 35
    ("sqrt(3 + 7 + 25)", "3 7 25=35", 0.0),
    ("√(3 + 7 + 25)", "3 7 25=35", 0.0),
    ("log 3 + 7 + 25", "3 7 25=35", 0.0),
    ("abs(3 + 7 + 25)", "3 7 25=35", 0.0),
    ("\\sqrt{3 + 7 + 25}", "3 7 25=35", 0.0),
    ("3 + 7 + 25!", "3 7 25=35", 0.0),
    ("3 + 7 + 25²", "3 7 25=35", 0.0),
    ("3 + 7 + 25 %", "3 7 25=35", 0.0),
    ("\\boxed{-3 + 7 + 25}", "3 7 25=35", 0.0),  # value 29
    ("-(3 + 7 + 25)", "3 7 25=35", 0.0),  # value -35
    ("3 + 7 + 25 e", "3 7 25=35", 0.0),
    ("3 + 7 + 25 nan", "3 7 25=35", 0.0),
    ("\\boxed{3 + 7 + 25}^2", "3 7 25=35", 0.0),  # the box squared: text outside the box counts too
    ("\\sqrt{\\boxed{3 + 7 + 25}}", "3 7 25=35", 0.0),
    ("$\\boxed{3 + 7 + 25}$.", "3 7 25=35", 1.0),  # ... but "$" and a full stop change nothing
    # more ways to change the value, all 0
    ("3(7 + 25)", "3 7 25=96", 0.0),  # implicit multiplication: 3 * 32 = 96
    ("(3)(7) + 25", "3 7 25=46", 0.0),
    ("3 + 7 + 25^1", "1 3 7 25=35", 0.0),
    ("3 + 7 + 25**1", "1 3 7 25=35", 0.0),
    ("3 + 7 + 25.0", "3 7 25=35", 0.0),
    ("3a + 7 + 25", "3 7 25=35", 0.0),  # a digit glued to a letter
    ("3 + 7 + 2５", "3 7 25=35", 0.0),  # a full-width digit inside a number
    ("1,000 - 965", "965 1000=35", 0.0),  # thousands separator: not part of the grammar
    ("3 + 7 + 25 or 3 * 7 + 25", "3 7 25=35", 0.0),  # two candidate expressions
    ("= 3 + 7 + 25", "3 7 25=35", 0.0),  # a leading "=": the left side is empty
    ("3 + 7 + 25 mod 100", "3 7 25=35", 0.0),
    ("3 + 7 + 25 (approximately)", "3 7 25=35", 0.0),
    # what graders drop around an answer, dropped here too: each used to score 0.0
    ("Therefore, the answer is 3 * 7 + 25.", "3 7 25=46", 1.0),  # a label with a comma in it
    ("Thus, 3 * 7 + 25", "3 7 25=46", 1.0),  # ... or ending with one, just before the expression
    ("sqrt, 3 * 7 + 25", "3 7 25=46", 0.0),  # but a word that names an operation is no label
    ("negative: 3 * 7 + 25", "3 7 25=46", 0.0),
    ("The answer, times two, is 3 * 7 + 25", "3 7 25=46", 0.0),
    ("3 * 7 + 25;", "3 7 25=46", 1.0),
    ("3 * 7 + 25,", "3 7 25=46", 1.0),
    ("3 * 7 + 25 🎉", "3 7 25=46", 1.0),
    ("3 * 7 + 25 👍🏽", "3 7 25=46", 1.0),  # an emoji with its skin tone
    ("$3 \\times 7 + 25$ \\\\", "3 7 25=46", 1.0),  # a LaTeX line break
    ("3 * 7 + 25 (= 46)", "3 7 25=46", 1.0),  # the bracket of the claimed value goes with it...
    ("3 * 7 + 25 [= 47]", "3 7 25=46", 1.0),  # ... and the claimed value is still ignored
    ("\\fbox{3 * 7 + 25}", "3 7 25=46", 1.0),
    ("3 * 7 + 25\u200b", "3 7 25=46", 1.0),  # a zero-width space
    # near misses of those rules
    ("Therefore 3 * 7 + 25", "3 7 25=46", 0.0),  # no ":", "is" or "," ends the words: no label
    ("Therefore, sqrt(3 + 7 + 25)", "3 7 25=35", 0.0),  # a label takes off words, never a function
    ("3 * 7 + 25;;", "3 7 25=46", 0.0),  # one mark at most
    ("3 * 7 + 25°", "3 7 25=46", 0.0),  # a degree sign is a unit, not decoration
    ("3 * 7 🎉 + 25", "3 7 25=46", 0.0),  # decoration only at the end
    ("3 * 7 + 2 5️⃣", "3 7 25=46", 0.0),  # a keycap digit is not decoration
    ("3 * 7 + 25 ²", "3 7 25=46", 0.0),
    ("3 * 7 + 25 (1)", "1 3 7 25=46", 0.0),  # a bracket without "=" is implicit multiplication: 46, refused
    ("\\fbox{3 + 7 + 25}^2", "3 7 25=35", 0.0),
    ("2\u200b5 + 3 * 7", "3 7 25=46", 0.0),  # a zero-width space splits 25 into 2 and 5
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
    ("3*7+25" + " " * 100_000 + "0" * 100_000, "3 7 25=46", 0.0),  # the expression is the whole line: too long
    ("3*7+25" + " " * 300, "3 7 25=46", 1.0),  # trailing blanks are not part of it
    ("a " * 50_000 + "3*7+25", "3 7 25=46", 0.0),  # 50k words and no ":": no label, letters in the expression
    ("The answer is " * 10_000 + "3*7+25", "3 7 25=46", 0.0),  # one label is taken off, the rest is letters
    ("**" * 50_000, "3 7 25=46", 0.0),
    ("\\boxed{" * 30_000 + "3*7+25" + "}" * 30_000, "3 7 25=46", 0.0),  # a box in a box: what precedes it ends in "{"
    ("🎉" * 100_000, "3 7 25=46", 0.0),
    ("3*7+25" + " 🎉" * 50_000, "3 7 25=46", 1.0),  # decoration is taken off in linear time
    ("Thus, " * 50_000 + "3*7+25", "3 7 25=46", 1.0),  # one label of 50k words of letters: nothing hides in it
    # a label is words of letters: no digit or underscore hides in it; words are set apart by spaces or tabs
    ("Step 2: 3*7+25", "3 7 25=46", 0.0), ("final_answer: 3*7+25", "3 7 25=46", 0.0),
    ("Step 2 answer: 3*7+25", "3 7 25=46", 0.0), ("Step2, 3*7+25", "3 7 25=46", 0.0),
    ("my_final answer: 3*7+25", "3 7 25=46", 0.0), ("final_answer, 3*7+25", "3 7 25=46", 0.0),
    ("The answer is\t3*7+25", "3 7 25=46", 1.0), ("Thus, (3 * 7) + 25", "3 7 25=46", 1.0),
    ("The\tanswer is 3*7+25", "3 7 25=46", 1.0), ("Thus,\t3*7+25", "3 7 25=46", 1.0),
    # the parser takes every token, and only closed parentheses
    ("3 + 4)", "3 4=7", 0.0), ("(3 + 4 7", "3 4=7", 0.0), ("(3 + 4", "3 4=7", 0.0),
    ("\\boxed{3 + 4}!", "3 4=7", 0.0),  # (3 + 4)! = 5040: the sign just after the box joins it
    # the length bound: an expression of MAX_EXPRESSION_CHARS characters is read, one more is not
    ("3 +" + " " * (MAX_EXPRESSION_CHARS - 4) + "4", "3 4=7", 1.0),
    ("3 +" + " " * (MAX_EXPRESSION_CHARS - 3) + "4", "3 4=7", 0.0),
]


@pytest.mark.parametrize("response", [
    "\\(3 \\times 7 + 25\\)", "\\[3 \\times 7 + 25\\]", "$3 \\cdot 7 + 25$", "\\left(3 \\times 7\\right) + 25",
    "(21 \\div 7) \\times 5 + 25",  # LaTeX's spellings of the expression
    "3*7+25 👍🏻", "3*7+25 👍🏼", "3*7+25 👍🏽", "3*7+25 👍🏾", "3*7+25 👍🏿",  # skin tones
    "3*7+25 ❤️", "3*7+25 ☺︎",  # variation selectors
])
def test_countdown_reads_latex_and_drops_decoration(response):
    target = "21 7 5 25=40" if "21" in response else "3 7 25=46"
    assert Countdown.reward(response, target) == 1.0


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
    ("10-3", "-3", 0.0),  # a minus after a digit is subtraction, not a sign
    ("10-3", "3", 0.0),  # ... nor 3: the answer is a formula (it used to score 1.0, a loophole: "6/2" read as 2)
    ("no number here", "7", 0.0),
    ("\\boxed{}", "7", 0.0),
    ("9" * 100_000, "7", 0.0),  # an absurd number is wrong, not a crash
    ("9" * 100_000, "9" * 100_000, 0.0),  # ... even when it is the target: a number that long is not read
    # formats that keep the value
    ("**72**", "72", 1.0),
    ("The total is `72`.", "72", 1.0),
    ("$72$ apples", "72", 1.0),
    ("So \\(x = \\boxed{72}\\).", "72", 1.0),
    ("\\boxed{\\text{72}}", "72", 1.0),
    ("\\boxed{1\\,234}", "1234", 1.0),  # a thin space between thousands
    ("(72)", "72", 1.0),
    ("−7", "-7", 1.0),  # U+2212, the minus sign of typeset text
    ("The answer is 0.5.", "0.5", 1.0),
    ("**Answer:** 72", "72", 1.0),  # bold closing a label is not a times sign
    ("72 \\\\", "72", 1.0),  # a LaTeX line break after it
    ("72 \\", "72", 1.0),  # a lone backslash: no LaTeX command follows it
    ("84 or 85", "85", 1.0),  # only the last number counts: listing guesses gains nothing...
    ("85 or 84", "85", 0.0),  # ... since the others are not read
    # loopholes: each used to score 1.0 (in brackets: the number read before)
    ("\\boxed{\\frac{3}{2}}", "2", 0.0),  # (2)
    ("\\boxed{\\dfrac{3}{2}}", "2", 0.0),  # (2)
    ("\\boxed{2^{10}}", "10", 0.0),  # (10)
    ("7.2e3", "3", 0.0),  # (3)
    ("#### 7.2e3", "7.2", 0.0),  # (7.2); and scientific notation is not read at all
    ("6/2", "2", 0.0),  # (2)
    ("#### 72 + 3", "72", 0.0),  # (72)
    ("1,23", "23", 0.0),  # (23): a decimal comma, or a typo; not 23
    ("−7", "7", 0.0),  # (7): the minus sign was not read
    # a number glued to or next to what changes it
    ("85!", "85", 0.0),
    ("85²", "85", 0.0),
    ("85 ²", "85", 0.0),
    ("\\boxed{85}^2", "85", 0.0),
    ("2^\\boxed{85}", "85", 0.0),
    ("2^85", "85", 0.0),
    ("2 ^ 85", "85", 0.0),
    ("2**85", "85", 0.0),
    ("2 * 85", "85", 0.0),
    ("85 \\times 2", "85", 0.0),
    ("85 \\cdot 2", "85", 0.0),
    ("3(85)", "85", 0.0),  # implicit multiplication
    ("sqrt(85)", "85", 0.0),
    ("sqrt 85", "85", 0.0),
    ("√85", "85", 0.0),
    ("√ 85", "85", 0.0),
    ("\\sqrt{85}", "85", 0.0),
    ("\\sqrt 85", "85", 0.0),
    ("log(85)", "85", 0.0),
    ("x85", "85", 0.0),  # a digit glued to a letter
    ("85x", "85", 0.0),
    ("0x55", "85", 0.0),  # hexadecimal 85
    ("negative 85", "85", 0.0),
    ("85 squared", "85", 0.0),
    ("85 thousand", "85", 0.0),
    ("2 x 85", "85", 0.0),  # x as a times sign
    ("85 x 2", "85", 0.0),
    ("2 ⋅ 85", "85", 0.0),  # U+22C5, the dot operator
    ("85,000", "85", 0.0),  # thousands separators: 85000
    ("85 000", "85", 0.0),  # a space as thousands separator: 85000, not 0
    ("85 000", "85000", 0.0),  # ... and not read as 85000 either
    ("1 234", "234", 0.0),
    ("８５", "85", 0.0),  # full-width digits
    ("٨٥", "85", 0.0),  # Arabic-Indic digits
    ("NaN", "85", 0.0),
    ("inf", "85", 0.0),
    ("1e400", "1", 0.0),
    # right answers written the way graders read them: each used to score 0.0
    ("#### 25%", "25", 1.0),  # a percent sign after the number leaves it (pinned at 0.0 before, as the next three)
    ("85%", "85", 1.0),
    ("85 %", "85", 1.0),  # set apart, as French typesets it
    ("\\boxed{85}\\%", "85", 1.0),
    ("About 25% of them voted.", "25", 1.0),
    ("\\boxed{25\\%}", "25", 1.0),
    ("25 percent", "25", 1.0),
    ("1{,}234", "1234", 1.0),  # LaTeX's thousands separator
    ("\\boxed{1{,}234}", "1234", 1.0),
    ("\\fbox{72}", "72", 1.0),
    ("\\boxed{7} then \\fbox{72}", "72", 1.0),  # the last box of either spelling
    ("\\frac{1}{2}", "0.5", 1.0),  # a fraction, by value
    ("\\boxed{\\dfrac{1}{2}}", "0.5", 1.0),
    ("$\\tfrac{1}{2}$", "0.5", 1.0),
    ("\\boxed{1/2}", "0.5", 1.0),
    ("\\boxed{\\frac{2}{4}}", "0.5", 1.0),  # equal, not reduced
    ("-\\frac{3}{4}", "-0.75", 1.0),
    ("\\boxed{\\frac{1}{2} \\text{ cup}}", "0.5", 1.0),
    ("\\frac{170}{2}", "85", 1.0),  # a dataset compares values (arithmetic asks for an integer written as one)
    ("It is .5", "0.5", 1.0),
    ("-.5", "-0.5", 1.0),
    ("-$3", "-3", 1.0),  # the sign before the currency sign
    ("−$3", "-3", 1.0),
    ("72km", "72", 1.0),  # a unit glued on
    ("It is 72kg.", "72", 1.0),
    ("90°", "90", 1.0),
    ("$90^\\circ$", "90", 1.0),
    ("#### 85, 86", "85", 1.0),  # the first number after "####", as GSM8K's grader reads it
    ("#### 85; 86", "85", 1.0),
    ("= − 7", "-7", 1.0),  # a sign set apart
    ("**Answer:** − 7", "-7", 1.0),
    ("\\boxed{− 7}", "-7", 1.0),
    # near misses of those rules, all 0.0
    ("25%2", "25", 0.0),  # "%" only where it ends the number
    ("25%2", "2", 0.0),
    ("25%%", "25", 0.0),
    ("25 % 2", "1", 0.0),  # 25 mod 2...
    ("25 % 2", "2", 0.0),  # ... is not 2 either: "%" before a number joins it (this one used to score 1.0)
    ("#### 25 % 2", "25", 0.0),
    ("25‰", "25", 0.0),  # per mille
    ("25%", "0.25", 0.0),  # the percent sign is dropped, never applied
    ("1{,}23", "123", 0.0),
    ("\\fbox{72}^2", "72", 0.0),
    ("2^\\fbox{72}", "72", 0.0),
    ("\\frac{1}{3}", "0.33", 0.0),  # only exactly equal
    ("\\frac{1}{3}", "0.3333333333", 0.0),
    ("\\frac{1}{2}", "2", 0.0),  # a fraction is one number, not its last digits
    ("\\frac{1}{0}", "0", 0.0),  # no number, no crash
    ("2\\frac{1}{2}", "2.5", 0.0),  # a mixed number, or 2 times a half: not read
    ("\\boxed{\\frac{1}{2}x}", "0.5", 0.0),
    ("\\boxed{\\frac{1}{2} x}", "0.5", 0.0),
    ("\\boxed{\\frac{1}{2} \\pi}", "0.5", 0.0),
    ("\\sqrt{\\frac{1}{4}}", "0.25", 0.0),
    ("\\frac{1}{2}^2", "0.5", 0.0),
    ("1/2/3", "0.5", 0.0),
    ("..5", "0.5", 0.0),
    ("3 .5", "0.5", 0.0),  # a number before it: "3 .5" is not .5
    ("−$3", "3", 0.0),
    ("--$3", "-3", 0.0),
    ("72km2", "72", 0.0),  # a unit, then a digit: a formula
    ("72km2", "2", 0.0),
    ("7x2", "7", 0.0),
    ("7x2", "14", 0.0),
    ("85k", "85", 0.0),  # a multiplier is no unit
    ("85M", "85", 0.0),
    ("$85m", "85", 0.0),  # money takes no unit: m is million
    ("2pi", "2", 0.0),
    ("2e", "2", 0.0),
    ("$90^{\\circ}2$", "90", 0.0),
    ("#### 85,86", "85", 0.0),  # not thousands, and no space: no list either
    ("#### 85, * 2", "85", 0.0),  # an operator still joins after a comma
    ("#### 85 86", "85", 0.0),  # a space is a thousands separator: 8586
    ("10 − 7", "-7", 0.0),  # a sign after an operand is subtraction
    ("x − 7", "-7", 0.0),
    ("5! − 7", "-7", 0.0),
    ("− \\boxed{7}", "-7", 0.0),  # outside the box the sign still changes it
    ("− " * 50_000 + "7", "-7", 0.0),  # one sign is taken, the one before it joins
    ("y − 7", "-7", 0.0), ("2n − 7", "-7", 0.0),  # after a variable, a minus sign is subtraction ...
    ("The answer is − 7", "-7", 1.0), ("Answer = − 7", "-7", 1.0),  # ... after a word or "=", a sign
    ("So x = \\boxed{− 7}", "-7", 1.0),  # a sign inside the box, after words outside it
    ("- The sum is 85", "85", 1.0),  # a markdown bullet is not a minus: only the word just before counts
    ("The total is $1 234", "234", 0.0),  # "1 234" is one number, even after "$"
    ("#### 85 \\pm2", "85", 0.0),  # a LaTeX command just after joins it, whatever follows its letters
    ("\nThe answer is 2 ^ 85", "85", 0.0),  # a response that opens with a newline: the word before still counts
    ("\\boxed{5}!", "5", 0.0),  # 5! = 120: the sign just after the box joins it
    ("####72", "72", 1.0),  # no space after "####": its first digit is read too
]


@pytest.mark.parametrize("response, target, expected", ANSWERS, ids=[f"{i}" for i in range(len(ANSWERS))])
def test_dataset_reward(response, target, expected):
    assert JsonlTask.reward(response, target) == expected


# Written out by hand: the operators and relations of ASCII and Unicode's math blocks (minus signs, times signs,
# division slashes, roots, plus-minus, comparisons), each of which makes a number part of a formula
OPERATORS_BEFORE = "+ - − – * ∗ × · ⋅ ∙ / ∕ ⁄ ÷ ^ √ ∛ ∜ ± ∓ < > ≤ ≥ ≠ ~".split()
OPERATORS_AFTER = "+ - − – * ∗ × · ⋅ ∙ / ∕ ⁄ ÷ ^ ± ∓ < > ≤ ≥ ≠ ! % ‰".split()


@pytest.mark.parametrize("operator", OPERATORS_BEFORE)
def test_an_operator_before_a_number_makes_it_part_of_a_formula(operator):
    assert JsonlTask.reward(f"x {operator} 85", "85") == 0.0  # "x ≤ 85" does not answer 85
    assert JsonlTask.reward(f"#### ({operator} 85)", "85") == 0.0


@pytest.mark.parametrize("operator", OPERATORS_AFTER)
def test_an_operator_after_a_number_makes_it_part_of_a_formula(operator):
    assert JsonlTask.reward(f"#### 85 {operator} 2", "85") == 0.0


@pytest.mark.parametrize("response", [
    "(2) 85", "[2] 85", "{2} 85", "f( 85", "\\frac{3}{ 85",  # a bracket before it: a product or an argument
    "#### 85 cubed", "#### 85 factorial", "#### 85 hundred", "#### 85 million", "#### 85 billion",
    "#### 85 trillion", "#### 85 times 2", "#### 85 plus 2", "#### 85 minus 2", "#### 85 over 2",
    "#### 85 divided by 5", "#### 85 mod 2",  # a word after it that continues the formula
    "#### 85 %2", "*negative* 85",  # "%" opening the next word is modulo; a word of a formula in emphasis
    "\\Delta 85", "\\Gamma 85",  # a LaTeX command before it, upper case too
    *[f"#### 85 {word}" for word in ("squared.", "squared,", "squared;", "squared:", "squared!", "squared?",
                                     "*squared*", '"squared"', "'squared'", "(squared)", "[squared]", "“squared”",
                                     "‘squared’")],  # the word in punctuation, quotes or emphasis
])
def test_a_bracket_or_a_word_of_a_formula_joins_a_number(response):
    assert JsonlTask.reward(response, "85") == 0.0


@pytest.mark.parametrize("unit", ["mm", "cm", "m", "km", "in", "ft", "yd", "mi", "mg", "g", "kg", "lb", "lbs", "oz",
                                  "ml", "mL", "l", "L", "gal", "s", "sec", "min", "h", "hr", "hrs", "mph", "km/h",
                                  "m/s", "°", "°C", "°F"])
def test_a_unit_glued_to_a_number_leaves_the_number(unit):
    assert JsonlTask.reward(f"It is 72{unit}.", "72") == 1.0


@pytest.mark.parametrize("response", [
    "8\u200c5", "8\u200d5", "8\u20605", "8\ufeff5", "8\u00ad5",  # invisible characters inside a number
    "\\(85\\)", "\\[85\\]", "$\\left(85\\right)$", "\\(8\\!5\\)", "It is\\;85", "It is\\:85",
    "It is\\ 85", "It is\\quad85",  # LaTeX's delimiters and spacing commands
])
def test_invisible_characters_and_latex_spacing_are_read_through(response):
    assert JsonlTask.reward(response, "85") == 1.0


@pytest.mark.parametrize("response, target", [
    ("#### \\frac{10}{4}", "2.5"), ("#### \\frac{9}{2}", "4.5"),  # fractions, any digits
    ("#### 90/4", "22.5"), ("#### 15/4", "3.75"), ("#### 3/15", "0.2"), ("#### \\frac{19}{10}", "1.9"),
    *[(f"It is {w}85{w2}", "85") for w, w2 in (("[", "]"), ('"', '"'), ("'", "'"), ("“", "”"), ("‘", "’"),
                                                 ("", ":"), ("", "?"))],  # brackets, quotes, punctuation
    *[(f"It is 85 %{c}", "85") for c in ')]"\'”’*`.,;:?$'],  # a percent sign set apart, then punctuation
    ("It is –85", "-85"),  # an en dash glued on is a minus sign
    ("\\boxed{\\text{about } 85}", "85"),  # \\text{...} ends at its own "}", not at the box's
])
def test_a_number_in_brackets_quotes_or_punctuation_is_read(response, target):
    assert JsonlTask.reward(response, target) == 1.0


def test_latex_degrees_and_spaces_and_an_en_dash_minus():
    assert JsonlTask.reward("$90^{\\circ}$", "90") == 1.0 and JsonlTask.reward("$90^\\circ$", "90") == 1.0
    assert JsonlTask.reward("The answer is – 7", "-7") == 1.0  # an en dash set apart is a minus sign
    assert JsonlTask.reward("$1\\ 234$", "234") == 0.0  # "\\ " is a space, and "1 234" one number


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
    # no reasoning: the answer after "####", as the instruction of a chat model asks
    assert records["How many grams in 1,500 kg?"] == ("1500000", "#### 1500000")
    assert records["Half of 5?"] == ("2.5", "#### 2.5")
    assert records["What is 3 plus 4?"] == ("7", "3 + 4 = 7\n#### 7")
    # without replacement while n fits in the split; beyond it, training draws with replacement, and an evaluation
    # gets the whole test split, each question once
    size = len(task.splits["test"])
    whole_split = sorted((q, t) for q, t, _ in task.splits["test"])
    assert sorted(task.prompts(size, random.Random(0), split="test")) == whole_split
    assert sorted(task.prompts(size + 5, random.Random(0), split="test")) == whole_split
    train_size = len(task.splits["train"])
    assert len(task.prompts(train_size + 5, random.Random(0), split="train")) == train_size + 5


def test_a_demonstration_is_a_right_answer_in_the_format_its_instruction_asks(tmp_path):
    """A solved example sits under the task's instruction (a chat model's earlier turn): it must follow it. A dataset
    file's bare answers become "#### <answer>", as its instruction asks (shown bare, they taught SmolLM2 to drop
    the format and its working); every task's demonstration scores 1 by the task's own reward."""
    numbers, texts = tmp_path / "sums.jsonl", tmp_path / "capitals.jsonl"
    numbers.write_text("".join(json.dumps({"question": f"{i}+{i}=", "answer": 2 * i}) + "\n" for i in range(60)))
    texts.write_text("".join(json.dumps({"question": f"Capital {i}?", "answer": f"C{i}"}) + "\n" for i in range(60)))
    for task in [get_task(name) for name in TASKS] + [get_task(str(numbers)), get_task(str(texts))]:
        solved = task.examples(5, random.Random(2))
        targets = dict(task.prompts(5, random.Random(2), split="train"))  # the same draws, with their targets
        for question, solution in solved:
            assert task.reward(solution, targets[question]) == 1.0, (task.name, question, solution)
        if "####" in task.instruction:
            assert all(solution.startswith("#### ") for _, solution in solved), task.name


def test_jsonl_with_a_test_file_trains_on_one_and_evaluates_on_the_other(tmp_path):
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    train.write_text("".join(json.dumps({"question": f"{i} + 1?", "answer": f"#### {i + 1}"}) + "\n" for i in range(5)))
    test.write_text("".join(json.dumps({"question": f"{i} * 2?", "answer": 2 * i}) + "\n" for i in range(7)))
    task = get_task(str(train), str(test))
    assert sorted(q for q, _, _ in task.splits["train"]) == sorted(f"{i} + 1?" for i in range(5))  # no hash split
    assert (sorted(task.prompts(1319, random.Random(0), split="test"))
            == sorted((f"{i} * 2?", str(2 * i)) for i in range(7)))
    assert {q for q, _ in task.examples(3, random.Random(0))} <= {f"{i} + 1?" for i in range(5)}  # shots from training
    with pytest.raises(ValueError, match="needs --task to be a .jsonl file"):
        get_task("countdown", str(test))
    with pytest.raises(ValueError, match="--eval-task file not found: .*missing.jsonl"):
        get_task(str(train), str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="^--task file not found: .*nowhere.jsonl"):  # both missing: --task first
        get_task(str(tmp_path / "nowhere.jsonl"), str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="--eval-task must be the path of a .jsonl file, got 'test.csv'"):
        get_task(str(train), "test.csv")
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match="empty.jsonl: no questions"):
        get_task(str(train), str(tmp_path / "empty.jsonl"))


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
        ('{"question": "What is 2+2?", "answer": "!?"}', "the answer is empty"),
        ('{"question": "What is 2+2?", "answer": NaN}', "must be a finite number"),
        ('{"question": "What is 2+2?", "answer": "2 + 2 = 4\\n####  "}', "the answer is empty"),
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


# Lines that Python's json cannot hold: each used to stop the loader with an error naming neither file nor line
# (a RecursionError traceback, int()'s digit limit, or a UnicodeEncodeError from hashing the question), or, for
# an answer string too long to read, to make every later reward raise.
UNREADABLE = {
    "nested": ('{"question": "What is 2+2?", "answer": "4", "id": ' + "[" * 100_000 + "]" * 100_000 + "}",
               "JSON nested too deeply to read"),
    "long integer": ('{"question": "What is 2+2?", "answer": ' + "4" * 4301 + "}",
                     "a number with more than 4300 digits (more than Python reads)"),
    "surrogate in the question": ('{"question": "What is \\ud800?", "answer": "4"}',
                                  "\\ud800 is a lone surrogate (half of a UTF-16 pair), not a character"),
    "surrogate in the answer": ('{"question": "What is 2+2?", "answer": "2 + 2 = 4 \\udfff\\n#### 4"}',
                                "\\udfff is a lone surrogate (half of a UTF-16 pair), not a character"),
    "long answer string": ('{"question": "What is 2+2?", "answer": "' + "4" * 5000 + '"}',
                           "the answer has more than 100 characters"),
    "long answer number": ('{"question": "What is 2+2?", "answer": ' + "4" * 101 + "}",
                           "the answer has more than 100 characters"),
}


@pytest.mark.parametrize("case", UNREADABLE)
def test_jsonl_line_python_cannot_hold(tmp_path, case):
    bad_line, message = UNREADABLE[case]
    lines = good_lines()
    lines[1:1] = ["", bad_line]  # line 3, as above
    path = write_jsonl(tmp_path / "bad.jsonl", lines)
    with pytest.raises(ValueError) as error:
        get_task(path)
    assert str(error.value) == f"{path}, line 3: {message}"


def test_jsonl_answer_of_100_characters_is_read(tmp_path):
    # the bound of the test above is MAX_ANSWER_CHARS, and an answer that long still earns its reward
    lines = good_lines()
    lines[0] = json.dumps({"question": "What is a googol minus one?", "answer": "9" * 100})
    task = JsonlTask(write_jsonl(tmp_path / "long.jsonl", lines))
    (target,) = [t for records in task.splits.values() for q, t, _ in records if q == "What is a googol minus one?"]
    assert target == "9" * 100
    assert task.reward("#### " + "9" * 100, target) == 1.0
    assert task.reward("#### " + "9" * 99, target) == 0.0


def test_jsonl_a_byte_order_mark_opens_the_file_and_a_draw_of_the_whole_split_takes_each_question_once(tmp_path):
    path = tmp_path / "bom.jsonl"  # Windows' Notepad writes UTF-8 with a byte order mark
    path.write_bytes("\ufeff".encode("utf-8") + "".join(line + "\n" for line in good_lines()).encode("utf-8"))
    task = JsonlTask(str(path))
    questions = [question for question, _, _ in task.splits["train"]]
    assert "What is 0 plus 1?" in questions + [q for q, _, _ in task.splits["test"]]
    drawn = [question for question, _ in task.prompts(len(questions), random.Random(0))]
    assert sorted(drawn) == sorted(questions)  # n = the split's size: without replacement, every one once


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


# ---------------------------------------------------------------- every reward: any text in, 0.0 or 1.0 out

# What a model might write, for token soup: numbers (the targets below among them, and one too long to read),
# operators, LaTeX, markdown, words the verifiers look for, other scripts' digits, a lone surrogate, controls.
SOUP = ["85", "-11", "3", "7", "25", "72", "1,234", "2.5", "0", "9" * 5000, "(", ")", "{", "}", "[", "]", "+", "-",
        "−", "–", "*", "**", "×", "·", "/", "÷", "^", "!", "%", "²", "√", "=", ":", ".", ",", "$", "#", "####", "\\",
        "\\boxed{", "\\frac{", "\\sqrt", "\\text{", "\\left(", "\\right)", "\\(", "\\)", "\\%", "\\,", "\\times",
        "\\fbox{", "\\dfrac{", "{,}", "^\\circ", "km", "°", "🎉", "\u200b", "\ufe0f", ";", "(=", "Thus,",
        "sqrt", "log", "is", "squared", "Answer:", "**Answer:**", "x", "e", "nan", "inf", "∞", "３", "٣", "\ud800",
        "\x00", "`", "'", '"', " ", " ", " ", "\n", "\t", "\u2028", "\r"]


def fuzz_responses(count, rng, fragments):
    """Half token soup (SOUP and `fragments`), half random code points (any of the 0x110000, surrogates included)."""
    soup = SOUP + fragments
    responses = []
    for i in range(count):
        if i % 2:
            separator = rng.choice(["", " "])  # glued, or words of their own
            responses.append(separator.join(rng.choice(soup) for _ in range(rng.randrange(1, 12))))
        else:
            responses.append("".join(chr(rng.randrange(0x110000)) for _ in range(rng.randrange(0, 30))))
    return responses


@pytest.mark.parametrize("name", ALL_TASKS)
def test_reward_never_raises(name):
    # A reward reads whatever a model writes: it must return 0.0 or 1.0 for any text, never raise.
    task = get_task(name)
    rng = random.Random(0)
    if name == "countdown":  # the soup holds right answers: solutions, not the "3 7 25=35" targets
        puzzles = [Countdown().puzzle(rng) for _ in range(2)]
        targets = [f"{' '.join(map(str, numbers))}={target}" for numbers, target, _ in puzzles]
        fragments = [expression for _, _, expression in puzzles]
    else:
        targets = fragments = [target for _, target in task.prompts(2, rng)]
    rewards = [task.reward(response, rng.choice(targets)) for response in fuzz_responses(3000, rng, fragments)]
    assert all(type(reward) is float and reward in (0.0, 1.0) for reward in rewards)
    assert 1.0 in rewards  # the soup reaches the comparison with the target, not only early refusals


# ---------------------------------------------------------------- get_task

def test_get_task_names_and_errors(tmp_path):
    for name in TASKS:
        assert get_task(name) is TASKS[name]
    with pytest.raises(ValueError) as error:
        get_task("countdwn")
    assert str(error.value) == (
        "--task must be one of addition, addition2, subtraction, multiplication, countdown, reverse, "
        "the path of a .jsonl file or of a .py file of your own, got 'countdwn'"
    )
    with pytest.raises(ValueError, match=r"^--task file not found: .*missing\.jsonl$"):
        get_task(str(tmp_path / "missing.jsonl"))


@pytest.mark.parametrize("name, op", [("addition", "+"), ("addition2", "+"), ("subtraction", "-"),
                                      ("multiplication", "*")])
def test_arithmetic_demonstrations_write_the_operation_out_and_score_1(name, op):
    # "37 + 48 = 85": a small chat model imitates it; the reward reads the number after "="
    task = get_task(name)
    for (prompt, solution), (same_prompt, target) in zip(task.examples(5, random.Random(3)),
                                                          task.prompts(5, random.Random(3), split="train")):
        a, b = prompt[:-1].split(op, 1) if op != "-" or not prompt.startswith("-") else (None, None)
        assert prompt == same_prompt and solution == f"{a} {op} {b} = {target}"
        assert task.reward(solution, target) == 1.0


def test_addition2_has_operands_of_one_or_two_digits_and_a_real_test_split():
    task = get_task("addition2")
    pairs = task.prompts(500, random.Random(0), split="train") + task.prompts(500, random.Random(0), split="test")
    operands = [int(x) for prompt, _ in pairs for x in prompt[:-1].split("+")]
    assert max(operands) <= 99 and min(operands) >= 0 and max(operands) >= 90
    assert len({p for p, _ in task.prompts(500, random.Random(0), split="test")}) > 50  # ~10 % of ~10,000 pairs



# ---------------------------------------------------------------- text answers and tasks of your own

@pytest.mark.parametrize("response, target, expected", [
    ("#### Paris", "Paris", 1.0),
    ("The capital is Paris.", "Paris", 1.0),  # a label (words, then "is") before the answer
    ("I think so.\nThe answer is Paris.", "paris", 1.0),  # a label and the full stop dropped, case folded
    ("Answer: the Eiffel Tower!", "Eiffel tower", 1.0),  # articles and punctuation dropped
    ("\\boxed{Paris}", "Paris", 1.0),
    ("#### Paris, France", "Paris", 0.0),  # more than the answer
    ("#### Lyon", "Paris", 0.0),
    ("#### four", "4", 0.0),  # a number target is compared as a number
    ("#### 4", "four", 0.0),
    ("", "Paris", 0.0),
    ("#### Paris\n#### Lyon", "Lyon", 1.0),  # the last "####" holds the answer
    ("#### The answer is Paris", "Paris", 1.0),  # a label after "####", past its space
])
def test_text_answers_are_graded_by_normalised_exact_match(response, target, expected):
    assert JsonlTask.reward(response, target) == expected


def test_a_file_of_text_answers_is_read_and_says_so(tmp_path):
    path = write_jsonl(tmp_path / "capitals.jsonl",
                       [json.dumps({"question": f"Capital number {i}?", "answer": f"City {i}"}) for i in range(40)])
    task = get_task(str(path))
    assert task.instruction == "Give the final answer after '####'."  # not "as a number"
    (prompt, target), = task.prompts(1, random.Random(0))
    assert target.startswith("City ") and task.reward(f"#### {target.lower()}", target) == 1.0
    numbers = get_task(EXAMPLE)
    assert numbers.instruction == "Give the final answer as a number after '####'."


PLUGIN = """
QUESTIONS = [(f"Say {word}.", word) for word in ("yes", "no", "maybe", "never", "always")]
INSTRUCTION = "Answer with the word alone."

def prompts(n, rng, split="train"):
    return [rng.choice(QUESTIONS) for _ in range(n)]

def reward(response_text, target):
    if response_text == "raise":
        raise RuntimeError("a bug of mine")
    return float(response_text.strip() == target) if response_text != "nan" else float("nan")
"""


def test_a_task_of_your_own_plugs_in_and_its_reward_never_raises(tmp_path, capsys):
    path = tmp_path / "my_task.py"
    path.write_text(PLUGIN)
    task = get_task(str(path))
    assert task.name == "my_task" and task.instruction == "Answer with the word alone." and task.default_few_shot == 0
    prompt, target = task.prompts(1, random.Random(1))[0]
    assert prompt == f"Say {target}." and task.reward(target, target) == 1.0 and task.reward("other", target) == 0.0
    assert (task.reward("raise", target) == 0.0 and task.reward("raise", target) == 0.0
            and task.reward("nan", target) == 0.0)
    err = capsys.readouterr().err
    assert err.count("reward raised RuntimeError: a bug of mine; such responses score 0") == 1
    assert task.examples(2, random.Random(0))[0][0].startswith("Say ")  # without examples(): its prompts
    path.write_text(PLUGIN + "\ndef examples(k, rng):\n    return [('Say yes.', 'yes')] * k\n")
    assert get_task(str(path)).examples(2, random.Random(0)) == [("Say yes.", "yes")] * 2
    path.write_text(PLUGIN.replace("for _ in range(n)]", "for _ in range(min(n, 3))]"))  # 3 at most
    with pytest.raises(ValueError, match=r"prompts\(8, rng, 'train'\) must return n .* got 3 pairs"):
        get_task(str(path)).prompts(8, random.Random(0))  # during the run too


def test_a_bad_pair_is_shown_cut_to_60_characters(tmp_path):
    path = tmp_path / "long.py"
    path.write_text(f"def prompts(n, rng, split): return [('{'x' * 100}', 1)] * n\ndef reward(r, t): return 0.0\n")
    with pytest.raises(ValueError) as e:
        get_task(str(path))
    assert str(e.value).endswith("got ('" + "x" * 58)


@pytest.mark.parametrize("source, message", [
    ("def prompts(n, rng, split): return []\n", "needs a function reward(...)"),
    ("import no_such_module\n", "importing it failed (ModuleNotFoundError"),
    ("def prompts(n, rng, split): return [1, 2]\ndef reward(r, t): return 0.0\n",
     "must return n (prompt, target) pairs of strings in a list, got 1"),
    ("def prompts(n, rng, split): return [('Say yes.', 1)] * n\ndef reward(r, t): return 0.0\n",
     "must return n (prompt, target) pairs of strings in a list, got ('Say yes.', 1)"),  # a target that is no string
    ("def prompts(n, rng, split): return 5\ndef reward(r, t): return 0.0\n",
     "prompts(2, rng, 'train') must return n (prompt, target) pairs of strings in a list, got int 5"),
    ("def prompts(n, rng, split): return []\ndef reward(r, t): return 0.0\n", "got 0 pairs"),
    ("def prompts(n, rng, split): return [('Say yes.', 'yes')] * (n + 1)\ndef reward(r, t): return 0.0\n",
     "got 3 pairs"),
    ("def prompts(n, rng, split): return [('Say yes.', 'yes')] * n if split == 'train' else []\n"
     "def reward(r, t): return 0.0\n", "prompts(2, rng, 'test') must return"),  # the held-out split too
    ("def prompts(n, rng, split): return 1 / 0\ndef reward(r, t): return 0.0\n",
     "prompts(2, rng, 'train') raised ZeroDivisionError: division by zero"),
])
def test_a_broken_task_file_is_one_line(tmp_path, source, message):
    path = tmp_path / "broken.py"
    path.write_text(source)
    with pytest.raises(ValueError) as e:
        get_task(str(path))
    assert message in str(e.value) and "\n" not in str(e.value)
    assert str(e.value).startswith(f"--task {path}: "), str(e.value)
    with pytest.raises(ValueError, match="--task file not found: nowhere.py"):
        get_task("nowhere.py")
