"""Verifiable tasks for the LLM group methods (grpo.py and its siblings).

Every task object offers the same small interface (rng is a `random.Random`):

    prompts(n, rng, split="train") -> list[(prompt, target)]   # what to ask, and what the verifier needs
    reward(response_text, target) -> float                       # 1.0 right, 0.0 wrong: no partial credit
    examples(k, rng) -> list[(prompt, solution_text)]           # worked demonstrations from the training split
    name: str               # short name, for run names
    instruction: str        # one sentence stating the answer format (for a chat model's user turn)
    default_few_shot: int   # how many demonstrations to show a base model (no chat template)

Tasks and their files stay data: how a prompt is shown to a model (chat template, few-shot,
where to cut the response) is decided by the group files. No task gives a format reward:
a response either verifies (1.0) or it does not (0.0).

Splits. Every question belongs to exactly one split, decided by a fixed, seed-independent hash
of the question, with TEST_FRACTION of them held out: training never samples a test question,
and the evaluation prompts are drawn from the test split with the fixed EVAL_SEED, so every
run and every method is evaluated on the same questions.

1. Arithmetic: "addition", "subtraction", "multiplication"
   Prompt "37+48=", target "85"; operands of 1 to 3 digits (2 for multiplication), the number
   of digits uniform, then the value uniform. The split hashes the operand pair.
   Reward: the last integer in the response equals the target (so an instruct model that writes
   "The answer is 85." is graded on 85; the embedded tiny model answers with digits only).
   Demonstration: the bare number ("85"). default_few_shot = 3.

2. Countdown: "countdown"
   Three or four numbers (equally likely), each uniform in 1..25, and a target in 1..100 made by construction:
   the numbers are combined in random order with random operations, every intermediate result
   a positive integer (subtractions stay positive, divisions are exact), until the result falls
   in 1..100; so every target is reachable, and the expression that built it is the demonstration.
   Prompt: "Using the numbers 3, 7, 25, make 46 with + - * / and parentheses, each number exactly once."
   Target: "3 7 25=46" (the numbers in prompt order, "=", the target). The split hashes the
   sorted numbers and the target, so reordering the numbers does not move a puzzle across splits.
   Reward, read from the response in this order:
     a. the text: the content of the last \\boxed{...} if there is one, else the last non-empty line;
        the LaTeX spellings \\times, \\cdot, \\div, \\left, \\right, \\( \\), \\[ \\] and $ are normalised;
     b. anything from the first "=" on is dropped ("(25 - 3) * 2 + 2 = 46" is graded on the left side;
        the value the model claims is ignored, so "46 = ..." scores 0);
     c. the expression runs from the first digit or "(" to the last digit or ")" ("Answer: 3 + 4." -> "3 + 4");
        everything inside must be part of the expression: non-negative integers, parentheses, spaces and
        the binary operators + (plus), - − – (minus), * × · (times), / ÷ (divide). No unary minus, no
        exponent (** is two times signs in a row: malformed), no decimals, no letters (x is not times).
        A leading minus sign falls outside the expression: "-3 - 7 + 25" is graded as "3 - 7 + 25";
     d. it scores 1.0 when it parses, uses every given number exactly once (as a multiset) and no other
        number, and evaluates exactly (fractions.Fraction) to the target. Intermediate fractions are
        allowed ((1 + 1/2) * 4 = 6); a division by zero scores 0.
   The parser is a small recursive-descent parser: model output is never passed to eval. An expression
   longer than MAX_EXPRESSION_CHARS or nested deeper than MAX_DEPTH scores 0 without being evaluated.
   Demonstration: the building expression, e.g. "(25 - 3) * 2 + 2". default_few_shot = 3.

3. A dataset file: `--task path/to/file.jsonl` (see `get_task`)
   One JSON object per line (blank lines are skipped), UTF-8:
       {"question": "Ann has 3 apples and buys 4 more. How many now?", "answer": "3 + 4 = 7\\n#### 7"}
       {"prompt": "What is 6 times 7?", "target": 42}
   The question is the value of "prompt" (or, when absent, "question"), a non-empty string; the answer
   is the value of "answer" (or "target"), a number or a string. In a string the answer is the number
   after the last "####" (GSM8K writes "...reasoning...\\n#### 72") or else the whole string, which must
   then be one number; commas as thousands separators are allowed ("1,234"). Anything else is an error
   naming the file and the line. The split hashes the question text; a file must leave at least one
   question in each split. prompts() draws without replacement when n fits in the split, and with
   replacement when it does not. Reward: the response's answer is the last number inside the last
   \\boxed{...} if there is one, else the first number after the last "####", else the last number of the
   response; it scores 1.0 when it equals the target numerically ("72.0" == "72", "1,234" == "1234").
   Demonstration: the answer string when it carries reasoning ("####" in it, with GSM8K's calculator
   notes "<<48/2=24>>" removed), else the bare number. default_few_shot = 2 (reasoning is long).
4. Reverse: "reverse"
   Prompt "reverse 48213=", target "31284": 3 to 6 digits (the count uniform, each digit uniform, leading
   zeros allowed: it is a string, not a number). The split hashes the digit string.
   Reward: the first run of digits in the response equals the target, so anything after the answer
   is ignored ("31284 ......" scores 1.0, "3128 4" scores 0). The embedded long model
   (common/long_model) answers and then hesitates: it writes a space and a random number of dots
   after the answer; the reward never reads them, so the length of a response does not decide whether
   it is right. Demonstration: the bare answer. default_few_shot = 3.
"""

import hashlib
import json
import math
import random
import re
from fractions import Fraction
from pathlib import Path

TEST_FRACTION = 0.1  # share of questions reserved for held-out evaluation
EVAL_SEED = 1234  # fixed: the held-out questions are the same in every run


def _hash_unit(text: str) -> float:
    """A fixed, seed-independent hash of a string, mapped to [0, 1) (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big") / 2**64


def _check_split(split: str):
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")


# ---------------------------------------------------------------- 1. arithmetic

_LAST_INT = re.compile(r"-?\d+")


def _in_test_split(a: int, b: int) -> bool:
    """A fixed, seed-independent hash decides the split of an operand pair (Knuth's multiplicative hash)."""
    h = ((a * 1_000_003 + b) * 2_654_435_761) % 2**32
    return h < TEST_FRACTION * 2**32


def _operand(rng: random.Random, max_digits: int) -> int:
    """Number of digits uniform in 1..max_digits, then the value uniform among those numbers."""
    digits = rng.randint(1, max_digits)
    return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)


class Arithmetic:
    """`a<op>b=` → the integer result, with operands of 1 to `max_digits` digits."""

    instruction = "End your answer with the result as a plain integer."
    default_few_shot = 3

    def __init__(self, op: str, max_digits: int, name: str):
        self.op, self.max_digits, self.name = op, max_digits, name

    def answer(self, a: int, b: int) -> int:
        return {"+": a + b, "-": a - b, "*": a * b}[self.op]

    def prompts(self, n: int, rng: random.Random, split: str = "train") -> list[tuple[str, str]]:
        _check_split(split)
        out = []
        while len(out) < n:
            a, b = _operand(rng, self.max_digits), _operand(rng, self.max_digits)
            if _in_test_split(a, b) == (split == "test"):
                out.append((f"{a}{self.op}{b}=", str(self.answer(a, b))))
        return out

    def examples(self, k: int, rng: random.Random) -> list[tuple[str, str]]:
        return self.prompts(k, rng, split="train")  # the target is already a complete response

    @staticmethod
    def reward(response_text: str, target: str) -> float:
        numbers = _LAST_INT.findall(response_text)
        return 1.0 if numbers and numbers[-1] == target else 0.0


# ---------------------------------------------------------------- 2. countdown

MAX_EXPRESSION_CHARS = 200  # longer expressions score 0 unread (a solution with 4 numbers needs ~30)
MAX_DEPTH = 20  # deeper parenthesis nesting scores 0 (bounds the parser's recursion)

_LATEX = {"\\times": "*", "\\cdot": "*", "\\div": "/", "\\left": "", "\\right": "",
          "\\(": " ", "\\)": " ", "\\[": " ", "\\]": " ", "$": " "}
_OPERATORS = {"+": "+", "-": "-", "−": "-", "–": "-", "*": "*", "×": "*", "·": "*", "/": "/", "÷": "/"}


def _last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (braces may nest), or None when there is none or it is not closed."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, begin = 0, start + len("\\boxed{")
    for i in range(begin, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            if depth == 0:
                return text[begin:i]
            depth -= 1
    return None


class _Parser:
    """Recursive descent over the grammar (binary operators only, usual precedence, left to right):

        expr   := term (("+" | "-") term)*
        term   := factor (("*" | "/") factor)*
        factor := INTEGER | "(" expr ")"

    Builds a tree: an int leaf, or a tuple (op, left, right). Raises ValueError when not well-formed."""

    def __init__(self, text: str):
        self.tokens = []  # ints, and the one-character strings + - * / ( )
        i = 0
        while i < len(text):
            char = text[i]
            if char.isspace():
                i += 1
            elif char in "0123456789":  # ASCII digits only (str.isdigit also accepts "²")
                j = i
                while j < len(text) and text[j] in "0123456789":
                    j += 1
                self.tokens.append(int(text[i:j]))
                i = j
            elif char in _OPERATORS or char in "()":
                self.tokens.append(_OPERATORS.get(char, char))
                i += 1
            else:
                raise ValueError(f"unexpected character {char!r}")
        self.pos = 0

    def parse(self):
        tree = self.expr(0)
        if self.pos != len(self.tokens):
            raise ValueError("trailing tokens")
        return tree

    def peek(self):
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def expr(self, depth: int):
        tree = self.term(depth)
        while self.peek() in ("+", "-"):
            op = self.tokens[self.pos]
            self.pos += 1
            tree = (op, tree, self.term(depth))
        return tree

    def term(self, depth: int):
        tree = self.factor(depth)
        while self.peek() in ("*", "/"):
            op = self.tokens[self.pos]
            self.pos += 1
            tree = (op, tree, self.factor(depth))
        return tree

    def factor(self, depth: int):
        token = self.peek()
        self.pos += 1
        if isinstance(token, int):
            return token
        if token == "(":
            if depth >= MAX_DEPTH:
                raise ValueError("nested too deeply")
            tree = self.expr(depth + 1)
            if self.peek() != ")":
                raise ValueError("missing ')'")
            self.pos += 1
            return tree
        raise ValueError(f"expected a number or '(', got {token!r}")  # an operator, ")" or the end


def _leaves(tree) -> list[int]:
    return [tree] if isinstance(tree, int) else _leaves(tree[1]) + _leaves(tree[2])


def _evaluate(tree) -> Fraction:
    """Exact value of a parsed tree. Raises ZeroDivisionError on a division by zero."""
    if isinstance(tree, int):
        return Fraction(tree)
    op, left, right = tree
    a, b = _evaluate(left), _evaluate(right)
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return a / b


def countdown_expression(response_text: str) -> str | None:
    """The expression a Countdown response is graded on (rules a-c of the module docstring), or None."""
    boxed = _last_boxed(response_text)
    if boxed is not None:
        text = boxed
    else:
        lines = [line for line in response_text.splitlines() if line.strip()]
        text = lines[-1] if lines else ""
    for latex, plain in _LATEX.items():
        text = text.replace(latex, plain)
    text = text.split("=", 1)[0]
    first = re.search(r"[0-9(]", text)  # two linear scans (a regex "[0-9(].*[0-9)]" is quadratic on "((((...")
    last = max(text.rfind(char) for char in "0123456789)")
    return text[first.start() : last + 1] if first and last >= first.start() else None


class Countdown:
    """Reach a target with 3-4 given numbers, + - * / and parentheses, each number used exactly once."""

    name = "countdown"
    instruction = "Write one arithmetic expression that makes the target as the last line of your answer."
    default_few_shot = 3

    def __init__(self, min_count: int = 3, max_count: int = 4, max_number: int = 25, max_target: int = 100):
        self.min_count, self.max_count = min_count, max_count
        self.max_number, self.max_target = max_number, max_target

    @staticmethod
    def _combine(left, op: str, right):
        """Join two (value, text, precedence) items with `op`, adding only the parentheses needed."""
        precedence = 1 if op in "+-" else 2
        left_text = f"({left[1]})" if left[2] < precedence else left[1]
        # a - (b + c) and a / (b * c) keep their parentheses; a + (b - c) and a * (b / c) need none
        right_needs_parentheses = right[2] < precedence or (right[2] == precedence and op in "-/")
        right_text = f"({right[1]})" if right_needs_parentheses else right[1]
        a, b = left[0], right[0]
        value = {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op]  # "/" only comes exact (see puzzle)
        return value, f"{left_text} {op} {right_text}", precedence

    def puzzle(self, rng: random.Random) -> tuple[list[int], int, str]:
        """(numbers, target, an expression that reaches it), built as the module docstring describes."""
        # the count is drawn once: a retry keeps it, so 3 and 4 numbers stay equally likely
        count = rng.randint(self.min_count, self.max_count)
        while True:
            numbers = [rng.randint(1, self.max_number) for _ in range(count)]
            items = [(number, str(number), 3) for number in numbers]  # (value, text, precedence); 3 = atom
            while len(items) > 1:
                left = items.pop(rng.randrange(len(items)))
                right = items.pop(rng.randrange(len(items)))
                ops = ["+", "*"] + ["-"] * (left[0] > right[0]) + ["/"] * (left[0] % right[0] == 0)
                items.append(self._combine(left, rng.choice(ops), right))
            target, expression, _ = items[0]
            if 1 <= target <= self.max_target:
                return numbers, target, expression

    @staticmethod
    def in_test_split(numbers: list[int], target: int) -> bool:
        return _hash_unit(" ".join(map(str, sorted(numbers))) + f"={target}") < TEST_FRACTION

    def _draw(self, n: int, rng: random.Random, split: str) -> list[tuple[list[int], int, str]]:
        _check_split(split)
        out = []
        while len(out) < n:
            numbers, target, expression = self.puzzle(rng)
            if self.in_test_split(numbers, target) == (split == "test"):
                out.append((numbers, target, expression))
        return out

    @staticmethod
    def prompt(numbers: list[int], target: int) -> str:
        listed = ", ".join(map(str, numbers))
        return f"Using the numbers {listed}, make {target} with + - * / and parentheses, each number exactly once."

    @staticmethod
    def target_string(numbers: list[int], target: int) -> str:
        return f"{' '.join(map(str, numbers))}={target}"  # "3 7 25=46"

    def prompts(self, n: int, rng: random.Random, split: str = "train") -> list[tuple[str, str]]:
        puzzles = self._draw(n, rng, split)
        return [(self.prompt(numbers, target), self.target_string(numbers, target)) for numbers, target, _ in puzzles]

    def examples(self, k: int, rng: random.Random) -> list[tuple[str, str]]:
        puzzles = self._draw(k, rng, "train")
        return [(self.prompt(numbers, target), expression) for numbers, target, expression in puzzles]

    @staticmethod
    def reward(response_text: str, target: str) -> float:
        numbers_text, target_text = target.split("=")
        numbers, goal = sorted(int(x) for x in numbers_text.split()), Fraction(int(target_text))
        expression = countdown_expression(response_text)
        if expression is None or len(expression) > MAX_EXPRESSION_CHARS:
            return 0.0
        try:
            tree = _Parser(expression).parse()
        except ValueError:
            return 0.0
        if sorted(_leaves(tree)) != numbers:  # checked before evaluating: at most 4 small numbers get there
            return 0.0
        try:
            return 1.0 if _evaluate(tree) == goal else 0.0
        except ZeroDivisionError:
            return 0.0


# ---------------------------------------------------------------- 3. a dataset file (JSON Lines)

# a number: optional minus (not after a digit: "3-5" is 3 and 5), thousands commas or plain digits, decimals
_NUMBER = re.compile(r"(?:(?<![0-9])-)?(?:[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+)(?:\.[0-9]+)?")
_CALCULATOR_NOTE = re.compile(r"<<[^<>]*>>")  # GSM8K's "<<48/2=24>>"


def _to_fraction(number_text: str) -> Fraction:
    return Fraction(number_text.replace(",", ""))


def final_answer(response_text: str) -> str | None:
    """The number a response answers with: the last number in the last \\boxed{...}, else the first number
    after the last "####", else the last number of the response; None when there is none."""
    boxed = _last_boxed(response_text)
    if boxed is not None:
        numbers = _NUMBER.findall(boxed)
        return numbers[-1] if numbers else None
    if "####" in response_text:
        number = _NUMBER.search(response_text.rsplit("####", 1)[1])
        return number.group() if number else None
    numbers = _NUMBER.findall(response_text)
    return numbers[-1] if numbers else None


class JsonlTask:
    """Questions and numeric answers read from a JSON Lines file (format in the module docstring)."""

    instruction = "Give the final answer as a number after '####'."
    default_few_shot = 2

    def __init__(self, path: str):
        self.path, self.name = str(path), Path(path).stem
        self.splits = {"train": [], "test": []}  # lists of (question, target, solution_text)
        try:
            raw_lines = Path(path).read_bytes().split(b"\n")
        except OSError as e:
            raise ValueError(f"{path}: cannot read the file ({e.strerror})") from None
        for number, raw in enumerate(raw_lines, start=1):
            try:
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError:
                raise ValueError(f"{path}, line {number}: not UTF-8 text") from None
            if line.strip():
                question, target, solution = self._read_record(line, f"{path}, line {number}")
                split = "test" if _hash_unit(question) < TEST_FRACTION else "train"
                self.splits[split].append((question, target, solution))
        if not self.splits["train"] and not self.splits["test"]:
            raise ValueError(f"{path}: no questions (the file is empty)")
        for split, records in self.splits.items():
            if not records:
                raise ValueError(
                    f"{path}: no question falls in the {split} split ({TEST_FRACTION:.0%} of questions are held out "
                    f"by a hash of their text); add more lines"
                )

    @staticmethod
    def _read_record(line: str, where: str) -> tuple[str, str, str]:
        """One line -> (question, target, solution_text); ValueError naming `where` when malformed."""
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{where}: expected a JSON object {{...}}, got {type(record).__name__}")
        question = record.get("prompt", record.get("question"))
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"{where}: needs a non-empty string under \"prompt\" or \"question\"")
        answer = record.get("answer", record.get("target"))
        if isinstance(answer, (int, float)) and not isinstance(answer, bool):
            if not math.isfinite(answer):
                raise ValueError(f"{where}: the answer must be a finite number, got {answer}")
            return question, str(answer), str(answer)
        if not isinstance(answer, str):
            raise ValueError(f"{where}: needs a number or a string under \"answer\" or \"target\"")
        final = answer.rsplit("####", 1)[-1].strip()
        if not _NUMBER.fullmatch(final):
            raise ValueError(f"{where}: the answer must be a number or end with '#### <number>', got {answer!r}")
        target = final.replace(",", "")
        solution = _CALCULATOR_NOTE.sub("", answer).strip() if "####" in answer else target
        return question, target, solution

    def _sample(self, n: int, rng: random.Random, split: str) -> list[tuple[str, str, str]]:
        _check_split(split)
        records = self.splits[split]
        return rng.sample(records, n) if n <= len(records) else rng.choices(records, k=n)

    def prompts(self, n: int, rng: random.Random, split: str = "train") -> list[tuple[str, str]]:
        return [(question, target) for question, target, _ in self._sample(n, rng, split)]

    def examples(self, k: int, rng: random.Random) -> list[tuple[str, str]]:
        return [(question, solution) for question, _, solution in self._sample(k, rng, "train")]

    @staticmethod
    def reward(response_text: str, target: str) -> float:
        answer = final_answer(response_text)
        if answer is None or len(answer) > 100:  # int() refuses numbers of more than 4300 digits
            return 0.0
        return 1.0 if _to_fraction(answer) == _to_fraction(target) else 0.0


# ---------------------------------------------------------------- 4. reverse

_FIRST_DIGITS = re.compile(r"\d+")


class Reverse:
    """`reverse 48213=` → "31284": a string of 3 to 6 digits, written backwards."""

    name = "reverse"
    instruction = "Write the digits in reverse order."
    default_few_shot = 3

    def __init__(self, min_digits: int = 3, max_digits: int = 6):
        self.min_digits, self.max_digits = min_digits, max_digits

    def prompts(self, n: int, rng: random.Random, split: str = "train") -> list[tuple[str, str]]:
        _check_split(split)
        out = []
        while len(out) < n:
            digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(self.min_digits, self.max_digits)))
            if (_hash_unit("reverse " + digits) < TEST_FRACTION) == (split == "test"):
                out.append((f"reverse {digits}=", digits[::-1]))
        return out

    def examples(self, k: int, rng: random.Random) -> list[tuple[str, str]]:
        return self.prompts(k, rng, split="train")  # the target is already a complete response

    @staticmethod
    def reward(response_text: str, target: str) -> float:
        first = _FIRST_DIGITS.search(response_text)
        return 1.0 if first is not None and first.group() == target else 0.0


# ---------------------------------------------------------------- the registry

# The names `--task` accepts besides a .jsonl path. The embedded tiny model (common/tiny_model) was
# pretrained on "addition" only: it knows neither "subtraction" nor "multiplication" (with so little
# signal, RL cannot teach them), nor "countdown"; those are there for real models (`--model ...`).
# The embedded long model (common/long_model) was pretrained on "reverse" only.
TASKS = {
    "addition": Arithmetic("+", max_digits=3, name="addition"),
    "subtraction": Arithmetic("-", max_digits=3, name="subtraction"),
    "multiplication": Arithmetic("*", max_digits=2, name="multiplication"),
    "countdown": Countdown(),
    "reverse": Reverse(),
}


def get_task(task: str):
    """The task for a `--task` value: a name of TASKS, or the path of a .jsonl file.
    Raises ValueError with a one-line message otherwise (or naming the file and line of a malformed file)."""
    if task in TASKS:
        return TASKS[task]
    if task.endswith(".jsonl"):
        if not Path(task).is_file():
            raise ValueError(f"--task file not found: {task}")
        return JsonlTask(task)
    raise ValueError(f"--task must be one of {', '.join(TASKS)} or the path of a .jsonl file, got {task!r}")
