"""Countdown ("countdown"): make the target from 3 or 4 numbers with + - * / and parentheses.

Three or four numbers (equally likely), each uniform in 1..25, and a target in 1..100 made by
construction: the numbers are combined in random order with random operations, every
intermediate result a positive integer (subtractions stay positive, divisions are exact),
until the result falls in 1..100; so every target is reachable, and the expression that built
it is the demonstration.
Prompt:
  "Using the numbers 3, 7, 25, make 46 with + - * / and parentheses, each number exactly once."
Target: "3 7 25=46" (the numbers in prompt order, "=", the target). The split hashes the
sorted numbers and the target, so reordering the numbers does not move a puzzle across splits.
Reward, read from the response in this order:
  a. the text: the content of the last \\boxed{...} or \\fbox{...} if there is one, else the
     last non-empty line (LaTeX's line break \\\\ ends a line); the LaTeX spellings \\times,
     \\cdot, \\div, \\left, \\right, \\( \\), \\[ \\] and $ are normalised, zero-width
     characters, markdown's code quotes `, emoji at the end ("3 + 4 🎉") and emphasis around
     the whole text ("**3 + 4**") dropped. The words next to the box on its line must not join
     it to a formula, as for a number (answers.py; "\\boxed{3 + 4}^2" scores 0);
  b. anything from the first "=" on is dropped, with a bracket that opens it
     ("(25 - 3) * 2 + 2 = 46" and "3 * 7 + 25 (= 46)" are graded on the left side; the value
     the model claims is ignored, so "46 = ..." scores 0);
  c. what is left is the expression, after at most a label (words of letters, each may end
     with a comma, the last ending with ":", being "is", or ending with a comma just before
     the expression: "Answer:", "**Final answer:**", "Therefore, the answer is", "Thus,") and
     before at most one mark of . , ; ? ("Answer: 3 + 4." -> "3 + 4"). All of it must be
     part of the expression: non-negative integers, parentheses, spaces and the binary
     operators + (plus), - − – (minus), * × · (times), / ÷ (divide).
     Anything else scores 0 instead of being left out, since it would change the value: a
     sign in front ("-3 + 7 + 25"), a function ("sqrt(3 + 7 + 25)", "√(...)",
     "log 3 + 7 + 25", "\\sqrt{...}"), a factorial, percent or power ("25!", "25 %", "25²",
     "3^2", "3**2": ** is two times signs in a row), implicit multiplication ("3(7 + 25)"),
     decimals, letters (x is not times), digits other than ASCII ("３"), a second expression
     ("3 + 4 or 3 * 4");
  d. it scores 1.0 when it parses, uses every given number exactly once (as a multiset) and
     no other number, and evaluates exactly (fractions.Fraction) to the target. Intermediate
     fractions are allowed ((1 + 1/2) * 4 = 6); a division by zero scores 0.
The parser is a small recursive-descent parser: model output is never passed to eval. An
expression longer than MAX_EXPRESSION_CHARS or nested deeper than MAX_DEPTH scores 0 without
being evaluated.
Demonstration: the building expression, e.g. "(25 - 3) * 2 + 2". default_few_shot = 3.
"""

import random
import re
import unicodedata
from fractions import Fraction

from common.tasks.answers import INVISIBLE, LABEL, WORDS_BEFORE, last_boxed, replaced, stands_alone
from common.tasks.splits import TEST_FRACTION, check_split, hash_unit

MAX_EXPRESSION_CHARS = 200  # longer ones score 0 unread (4 numbers need ~30)
MAX_DEPTH = 20  # deeper parenthesis nesting scores 0 (bounds the parser's recursion)

_LATEX = {
    "\\\\": "\n",
    "\\times": "*", "\\cdot": "*", "\\div": "/", "\\left": "", "\\right": "",
    "\\(": " ", "\\)": " ", "\\[": " ", "\\]": " ", "$": " ",
    "`": " ",  # markdown's code quotes
}
# variation selectors, skin tones
_EMOJI_PARTS = "\ufe0e\ufe0f\U0001F3FB\U0001F3FC\U0001F3FD\U0001F3FE\U0001F3FF"
_CLAIM_OPENED = re.compile(r"[(\[]\s*$")  # the bracket opening a claimed value ("... (= 46)")
# markdown emphasis around the whole text, "**3 + 4 = 7**": never a times sign
_BOLD = re.compile(r"(\*\*?)(.+)\1")
_OPERATORS = {
    "+": "+",
    "-": "-", "−": "-", "–": "-",
    "*": "*", "×": "*", "·": "*",
    "/": "/", "÷": "/",
}


class _Parser:
    """Recursive descent over the grammar (binary operators only, usual precedence, left to right):

        expr   := term (("+" | "-") term)*
        term   := factor (("*" | "/") factor)*
        factor := INTEGER | "(" expr ")"

    Builds a tree: an int leaf, or a tuple (op, left, right).
    Raises ValueError when not well-formed."""

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


def _without_decoration(text: str) -> str:
    """`text` without the emoji and other pictographs that end it ("3 + 4 🎉"): Unicode's "other
    symbols" (not "°", a unit), with their variation selectors and skin tones; never "!", "²" or
    "√", which change a value."""
    end = len(text)
    while end and (text[end - 1].isspace() or text[end - 1] in _EMOJI_PARTS
                   or (unicodedata.category(text[end - 1]) == "So" and text[end - 1] != "°")):
        end -= 1
    return text[:end]


def countdown_expression(response_text: str) -> str | None:
    """The expression a Countdown response is graded on (module docstring, rules a-c), or None.

    Only a label, a claimed value, decoration and a full stop are taken off: whatever else
    surrounds the expression stays, and fails to parse. A label holds words of letters only, so
    no number, operator or bracket hides in it. A function name is no label: "sqrt(...)" and
    "log 3 + ..." stay in front of the expression, and so does a label holding a word that names
    an operation ("sqrt, (...)", "negative: 3 + 4"; the words of WORDS_BEFORE)."""
    text = replaced(response_text, {**INVISIBLE, **_LATEX})
    box = last_boxed(text)
    if box is not None:
        start, begin, end = box
        if not stands_alone(text, start, end + 1):  # "\boxed{3 + 4}^2", "\sqrt{\boxed{3 + 4}}"
            return None
        text = text[begin:end]
    else:
        lines = [line for line in text.splitlines() if line.strip()]
        text = lines[-1] if lines else ""
    text = _without_decoration(text)
    bold = _BOLD.fullmatch(text.strip())
    if bold:
        text = bold.group(2)
    text = _CLAIM_OPENED.sub("", text.split("=", 1)[0]).strip()
    label = LABEL.match(text)
    if label and not WORDS_BEFORE.intersection(re.findall(r"[^\W\d_]+", label.group().lower())):
        text = text[label.end() :].lstrip()
    if text.endswith((".", ",", ";", "?")):  # a sentence's end: no decimal point is allowed
        text = text[:-1].rstrip()
    return text or None


class Countdown:
    """Reach a target with 3-4 numbers, + - * / and parentheses, each number used exactly once."""

    name = "countdown"
    instruction = (
        "Write one arithmetic expression that makes the target as the last line of your answer."
    )
    default_few_shot = 3

    def __init__(
        self, min_count: int = 3, max_count: int = 4, max_number: int = 25, max_target: int = 100
    ):
        self.min_count, self.max_count = min_count, max_count
        self.max_number, self.max_target = max_number, max_target

    @staticmethod
    def _combine(left, op: str, right):
        """Join two (value, text, precedence) items with `op`, adding only the parentheses needed:
        a - (b + c) and a / (b * c) keep theirs; a + (b - c) and a * (b / c) need none."""
        precedence = 1 if op in "+-" else 2
        left_text = f"({left[1]})" if left[2] < precedence else left[1]
        right_needs_parentheses = right[2] < precedence or (right[2] == precedence and op in "-/")
        right_text = f"({right[1]})" if right_needs_parentheses else right[1]
        a, b = left[0], right[0]
        # "/" only comes exact (see puzzle)
        value = {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op]
        return value, f"{left_text} {op} {right_text}", precedence

    def puzzle(self, rng: random.Random) -> tuple[list[int], int, str]:
        """(numbers, target, an expression that reaches it), built as the module docstring
        describes."""
        # drawn once, kept on a retry: 3 and 4 numbers stay equally likely
        count = rng.randint(self.min_count, self.max_count)
        while True:
            numbers = [rng.randint(1, self.max_number) for _ in range(count)]
            # (value, text, precedence); precedence 3 = an atom
            items = [(number, str(number), 3) for number in numbers]
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
        return hash_unit(" ".join(map(str, sorted(numbers))) + f"={target}") < TEST_FRACTION

    def _draw(self, n: int, rng: random.Random, split: str) -> list[tuple[list[int], int, str]]:
        check_split(split)
        out = []
        while len(out) < n:
            numbers, target, expression = self.puzzle(rng)
            if self.in_test_split(numbers, target) == (split == "test"):
                out.append((numbers, target, expression))
        return out

    @staticmethod
    def prompt(numbers: list[int], target: int) -> str:
        listed = ", ".join(map(str, numbers))
        return (
            f"Using the numbers {listed}, make {target} with + - * / and parentheses,"
            " each number exactly once."
        )

    @staticmethod
    def target_string(numbers: list[int], target: int) -> str:
        return f"{' '.join(map(str, numbers))}={target}"  # "3 7 25=46"

    def prompts(self, n: int, rng: random.Random, split: str = "train") -> list[tuple[str, str]]:
        puzzles = self._draw(n, rng, split)
        return [
            (self.prompt(numbers, target), self.target_string(numbers, target))
            for numbers, target, _ in puzzles
        ]

    def examples(self, k: int, rng: random.Random) -> list[tuple[str, str]]:
        puzzles = self._draw(k, rng, "train")
        return [
            (self.prompt(numbers, target), expression) for numbers, target, expression in puzzles
        ]

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
        if sorted(_leaves(tree)) != numbers:  # checked first: at most 4 small numbers get evaluated
            return 0.0
        try:
            return 1.0 if _evaluate(tree) == goal else 0.0
        except ZeroDivisionError:
            return 0.0
