"""Verifiable tasks for the LLM group methods (grpo.py and its siblings).

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

Reference graders. A verifier accepts an answer written the way the grader of its kind reads it:
after "####", the first number, as GSM8K's own grader (`#### (\\-?[0-9\\.\\,]+)`) reads it
("#### 25%", "#### 85, 86" is 85); elsewhere, as a careful math grader does (Qwen's math
evaluation): \\boxed{} or \\fbox{}, "%", "$", units, LaTeX separators ("1{,}234") dropped,
fractions compared by value. Countdown has no such grader: it checks each number once and the
exact value, after taking off what those graders drop around an answer (a label, a full stop,
emoji). Nothing that changes a value is dropped: every known loophole stays shut.

Splits. Every question belongs to exactly one split, decided by a fixed, seed-independent hash
of the question, with TEST_FRACTION of them held out: training never samples a test question,
and the evaluation prompts are drawn from the test split with the fixed EVAL_SEED, so every
run and every method is evaluated on the same questions.

1. Arithmetic: "addition", "subtraction", "multiplication"
   Prompt "37+48=", target "85"; operands of 1 to 3 digits (2 for multiplication), the number
   of digits uniform, then the value uniform. The split hashes the operand pair.
   Reward: the response's answer, read as for a dataset file (3. below: the last number, unless
   there is a \\boxed{...} or a "####"), is the target written as an integer ("085", "85.0" and
   "170/2" are not; "1,085", "+85", "85%" and "85km" are). So an instruct model that writes
   "The answer is 85." is graded on 85, "−85" and "= − 85" are minus 85, and "8.5", "1,085",
   "85²" or "2^85" are not read as 85 or 5.
   The embedded tiny model (common/models/tiny_model) answers with digits only. It was pretrained
   on "addition" only: it knows neither "subtraction" nor "multiplication" (with so little
   signal, RL cannot teach them), nor "countdown"; those are there for real models (`--model ...`).
   Demonstration: the sum written out ("37 + 48 = 85"). default_few_shot = 3.
   "addition2" is addition with operands of 1 to 2 digits: the task on which a small real chat
   model (SmolLM2-135M-Instruct, with --few-shot 3) starts at ~30 % sampled accuracy, where RL
   shows.

2. Countdown: "countdown"
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
        it to a formula, as for a number in 3. ("\\boxed{3 + 4}^2" scores 0);
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

3. A dataset file: `--task path/to/file.jsonl` (see `get_task`)
   One JSON object per line (blank lines are skipped), UTF-8:
     {"question": "Ann has 3 apples and buys 4 more. How many now?", "answer": "3 + 4 = 7\\n#### 7"}
     {"prompt": "What is 6 times 7?", "target": 42}
     {"question": "What is the capital of France?", "answer": "Paris"}
   The question is the value of "prompt" (or, when absent, "question"), a non-empty string; the
   answer is the value of "answer" (or "target"), a number or a string. In a string the answer is
   what follows the last "####" (GSM8K writes "...reasoning...\\n#### 72") or else the whole
   string: a number (commas as thousands separators are allowed, "1,234"), or else a text, graded
   by normalised exact match (below); it has at most MAX_ANSWER_CHARS characters (a response's
   longer answer is never read). Anything else is an error naming the file and the line, and so
   is a line that Python's json cannot hold: nested too deeply, an integer of more than 4300
   digits, a lone surrogate ("\\ud800", half of a UTF-16 pair, not a character).
   The split hashes the question text; a file must leave at least one question in each split.
   With a second file (--eval-task, e.g. GSM8K's test.jsonl) the first file is all training
   questions and the second all held-out ones. prompts() draws without replacement when n fits
   in the split; beyond that, training draws with replacement and an evaluation gets every
   held-out question once.
   Reward: the response's answer is the last number inside the last \\boxed{...} or \\fbox{...}
   if there is one, else the first number after the last "####", else the last number of the
   response; it scores 1.0 when it equals the target exactly ("72.0" == "72",
   "1,234" == "1234", "−7" == "-7", "\\frac{1}{2}" == "0.5"). A number is read whole (a sign
   + - − –, thousands commas, decimals, ".5", a fraction "\\frac{1}{2}", "\\dfrac", "\\tfrac",
   "1/2") and must stand alone, else the response scores 0 (rather than being graded on some
   other number):
     - the word that holds it (words are split at spaces and "=") is the number, with at most a
       "%" or a unit abbreviation glued to it ("25%", "72km", "90°"; not "25%2", "72km2", a
       multiplier "85k", "85M", "85bn", a letter that may be a variable or a times sign "85x",
       "85e", nor "$85m": money takes no unit), wrapped at most in brackets, quotes, "$"
       (currency, before or after the sign, or LaTeX math), markdown bold or code, trailing
       punctuation: "(85)", "**85**.", "$1,234", "-$3", "85,"; not "x85", "++85", "85!", "85²",
       "√85", "2^10", "2\\frac{1}{2}", "7.2e3" (not read: 0), "10-3", nor digits of other
       scripts ("８５", "٨٥": int() would read them, Countdown does not). A sign that is a word
       of its own belongs to the number unless an operand precedes it ("= − 7" is -7; "10 − 7"
       and "x − 7" are not);
     - the words next to it on its line do not join it to something else: an operator
       ("2 ^ 10", "10 - 3", "√ 85", "85 * 2", "85 % 2"; "85 %" is a percent sign set apart),
       another number ("1 234" is 1234; after a comma or semicolon a number is the next item of
       a list: "#### 85, 86" is 85), a LaTeX command ("\\sqrt 85", "85 \\times 2") or a word of
       a short list ("sqrt 85", "negative 85", "2 x 85", "85 squared", "85 thousand": natural
       language has more ways, these are the common ones). Around a \\boxed{...} the words
       outside it count too ("\\boxed{85}^2" is not 85).
   LaTeX's \\text{...}, \\$, \\%, \\( \\), \\[ \\], \\left, \\right, spacing commands, {,} and
   ^\\circ are read as plain text first ("1\\,234" and "1{,}234" are 1234, "90^\\circ" is "90°");
   a zero-width space is a space.
   Only the last number counts, so "84 or 85" is graded on 85: naming several answers gains
   nothing over naming the last one.
   A text answer ("Paris") is compared with the response's final text: what follows its last
   "####", else the content of its last \\boxed{...}, else its last non-empty line, without a
   label in front ("Answer:", "The answer is"); both normalised as SQuAD's exact-match grader
   does (case, punctuation, the articles a, an, the and extra spaces dropped), so
   "#### the Eiffel Tower!" is "Eiffel tower" and "Paris, France" is not "Paris".
   The chat instruction asks for "the final answer after '####'" (as a number when every answer
   is one).
   Demonstration: the answer string when it carries reasoning ("####" in it, with GSM8K's
   calculator notes "<<48/2=24>>" removed), else "#### <answer>": a demonstration follows the
   instruction it sits under. default_few_shot = 2 (reasoning is long).

4. Reverse: "reverse"
   Prompt "reverse 48213=", target "31284": 3 to 6 digits (the count uniform, each digit
   uniform, leading zeros allowed: it is a string, not a number). The split hashes the digit
   string.
   Reward: the first run of digits in the response equals the target, so anything after the
   answer is ignored ("31284 ......" scores 1.0, "3128 4" scores 0). The embedded long model
   (common/models/long_model), pretrained on "reverse" only, answers and then hesitates: it
   writes a space and a random number of dots after the answer; the reward never reads them, so
   the length of a response does not decide whether it is right.
   Demonstration: the bare answer. default_few_shot = 3.

5. A task of your own: `--task path/to/my_task.py`, a Python file with prompts(n, rng, split)
   and reward(response_text, target) (see PluginTask): your data and your verifier, without
   editing the repository. A reward never raises on model output: the repository's own
   verifiers are tested for it (tests/test_tasks.py fuzzes them); a task of yours that raises
   scores 0 on that response, and the first time is reported.
"""

import hashlib
import importlib.util
import json
import math
import random
import re
import sys
import unicodedata
from fractions import Fraction
from pathlib import Path

TEST_FRACTION = 0.1  # share of questions reserved for held-out evaluation
EVAL_SEED = 1234  # fixed: the held-out questions are the same in every run


def _hash_unit(text: str) -> float:
    """A fixed, seed-independent hash of text, in [0, 1) (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big") / 2**64


def _check_split(split: str):
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")


# ---------------------------------------------------------------- a response's number (1 and 3)

# longer answers: not read (int() refuses 4300+ digits), nor allowed in a data file
MAX_ANSWER_CHARS = 100

# The digits of a number: thousands commas or plain digits, then decimals.
_UNSIGNED = r"(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?"
# A fraction: "\frac{1}{2}" (or \dfrac, \tfrac) or "1/2"; a zero denominator is no number
_NONZERO = r"0*[1-9][0-9]*"
_FRACTION = rf"\\[dt]?frac\{{[0-9]+\}}\{{{_NONZERO}\}}|[0-9]+/{_NONZERO}"
# Units a number may carry ("72km"); not a multiplier ("85k") or a variable ("85x")
_UNITS = "|".join([
    "mm", "cm", "m", "km", "in", "ft", "yd", "mi",
    "mg", "g", "kg", "lb", "lbs", "oz",
    "ml", "mL", "l", "L", "gal",
    "s", "sec", "min", "h", "hr", "hrs",
    "mph", "km/h", "m/s",
    "°", "°C", "°F",
])
# A word that is a number, maybe wrapped: "(85)", "**85**." (module docstring, 3)
_NUMBER_WORD = re.compile(
    r"[$(\[\"'“‘*`]*"  # brackets, quotes, "$", bold, code
    r"(?P<sign>[-−–+]?)\$?"  # "-$3"
    rf"(?P<value>{_FRACTION}|{_UNSIGNED}|\.[0-9]+)"
    rf"(?P<suffix>%|{_UNITS})?"
    r"[)\]\"'”’*`.,;:?$]*"  # and trailing punctuation
)
# "85 %": a percent sign set apart, as French typesets it
_PERCENT_WORD = re.compile(r"%[)\]\"'”’*`.,;:?$]*")
_MINUS_SIGNS = ("-", "−", "–")
# Words: split at spaces; "=" and each newline (which ends a number's neighbourhood) are words
_WORDS = re.compile(r"\n|=|[^\s=]+")  # "3+4=7": 7 follows "=", not "3+4"

# Before a number: the last characters and words that join it to a formula
_JOINS_BEFORE = set("+-−–*∗×·⋅∙/∕⁄÷^√∛∜±∓<>≤≥≠~({)]}%")
_WORDS_BEFORE = {
    "sqrt", "cbrt", "root", "log", "ln", "exp", "sin", "cos", "tan",
    "minus", "negative", "plus", "times", "x", "over", "mod",
}
# After a number: the first characters and words that join it to a formula
_JOINS_AFTER = set("+-−–*∗×·⋅∙/∕⁄÷^±∓<>≤≥≠!%‰")
_WORDS_AFTER = {
    "squared", "cubed", "factorial", "hundred", "thousand", "million", "billion", "trillion",
    "times", "x", "plus", "minus", "over", "divided", "mod",
}
# stripped from a neighbour before looking it up in the word lists
_PUNCTUATION = ".,;:!?*\"'()[]“”‘’"
# "\sqrt", "\log", "\cdot", "\sqrt{" before a number
_LATEX_COMMAND_AT_END = re.compile(r"\\[A-Za-z]+[{(]?$")

# Invisible characters; the invisible operators U+2061-U+2064 stay ("2\u206285" is 2 times 85)
_INVISIBLE = {
    "\u200b": " ",  # a zero-width space separates words
    "\u200c": "",  # zero-width non-joiner
    "\u200d": "",  # zero-width joiner
    "\u2060": "",  # word joiner
    "\ufeff": "",  # byte order mark
    "\u00ad": "",  # soft hyphen
}
# \text{...} and its kin hold words ("72 \text{ apples}")
_LATEX_TEXT = re.compile(r"\\(?:text|textrm|textbf|mathrm|mbox)\{([^{}]*)\}")
# LaTeX that is plain text or spacing
_LATEX_PLAIN = {
    "\\$": "$", "\\%": "%",
    "\\(": " ", "\\)": " ", "\\[": " ", "\\]": " ", "\\left": "", "\\right": "",
    "\\,": "", "\\!": "", "\\;": " ", "\\:": " ", "\\ ": " ", "\\quad": " ",  # "1\,234": thin space
    "{,}": ",",  # "1{,}234" keeps the comma from math spacing
    "^{\\circ}": "°", "^\\circ": "°",
}


def _replaced(text: str, table: dict[str, str]) -> str:
    for old, new in table.items():
        text = text.replace(old, new)
    return text


def _last_boxed(text: str) -> tuple[int, int, int] | None:
    """Where the last \\boxed{...} or \\fbox{...} is: (start of the command, begin and end of its
    content; braces may nest), or None when there is none or it is not closed."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    depth, begin = 0, text.index("{", start) + 1
    for i in range(begin, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            if depth == 0:
                return start, begin, i
            depth -= 1
    return None


def _joins_before(word: str) -> bool:
    """Whether `word`, just before a number (or a box) on its line, makes it part of a formula: by
    its last character ("2 ^ 85", "10 - 3", "√ 85", "sqrt( 85", "\\frac{3}{ 2", "(2) 85" is a
    product) or its letters ("sqrt 85", "negative 85")."""
    if any(char.isalpha() for char in word):
        word = word.rstrip("*")  # bold closing a label ("**Answer:** 85"), not a times sign
    return (
        word[-1] in _JOINS_BEFORE
        or word[-1].isnumeric()  # "1 234" is 1234 (a space as thousands separator), not 234
        or _LATEX_COMMAND_AT_END.search(word) is not None
        or word.strip(_PUNCTUATION).lower() in _WORDS_BEFORE
    )


def _joins_after(word: str) -> bool:
    """Whether `word`, just after a number (or a box) on its line, makes it part of a formula: by
    its first character ("85 * 2", "85 !", "85 - 3") or its letters ("85 squared", "85 x 2")."""
    return (
        word[0] in _JOINS_AFTER
        or word[0].isnumeric()  # "85 000" is 85000, "85 ²" is 85 squared
        or (word[0] == "\\" and word[1:2].isalpha())  # "85 \times 2", "85 \cdot 2"
        or word.strip(_PUNCTUATION).lower() in _WORDS_AFTER
    )


def _ends_operand(word: str) -> bool:
    """Whether `word` may be the left side of a minus sign after it: "x", "2n", "5!", "50%" (but
    not "is", "=")."""
    variable = word[-1].isalpha() and (len(word) == 1 or any(char.isdigit() for char in word))
    return variable or word[-1] in "!%‰°′″"


def _stands_alone(text: str, start: int, end: int) -> bool:
    """Whether neither the word just before text[start:end] nor the word just after it, on its
    line, joins it to a formula (the words are those of text as a whole: a neighbour may lie
    outside a box)."""
    before, after = _WORDS.findall(text[:start]), _WORDS.findall(text[end:])
    joined_before = bool(before) and before[-1] != "\n" and _joins_before(before[-1])
    # "#### 85, 86": after a comma or semicolon comes the next item of a list
    next_item = (
        text[start:end].endswith((",", ";")) and bool(after) and after[0][0] in "0123456789"
    )
    joined_after = bool(after) and after[0] != "\n" and not next_item and _joins_after(after[0])
    return not (joined_before or joined_after)


def _detached_sign(text: str, begin: int, start: int) -> tuple[int, str]:
    """(start, sign) of a sign that is a word of its own just before the number at `start` and
    after `begin` ("= − 7", "is + 85"); (start, "") when there is none, or when it is a binary
    operator ("44 − 7", "x − 7")."""
    words = list(_WORDS.finditer(text, 0, start))
    if not words or words[-1].group() not in ("+", *_MINUS_SIGNS) or words[-1].start() < begin:
        return start, ""
    previous = words[-2].group() if len(words) > 1 else "\n"
    if previous != "\n" and (_joins_before(previous) or _ends_operand(previous)):
        return start, ""
    return words[-1].start(), words[-1].group()


def _percent_end(text: str, end: int) -> int:
    """The end of a percent sign set apart just after a number that ends at `end` ("85 %"), else
    `end`."""
    following = _WORDS.search(text, end)
    return following.end() if following and _PERCENT_WORD.fullmatch(following.group()) else end


def _value_text(value: str) -> str:
    """A number's value as Fraction reads it: "1,234" -> "1234", "\\frac{1}{2}" -> "1/2"."""
    if value.startswith("\\"):
        return "/".join(re.findall(r"[0-9]+", value))
    return value.replace(",", "")


def _read_number(text: str, begin: int, end: int, first: bool) -> str | None:
    """The first (or last) word of text[begin:end] that holds a digit, as a number Fraction reads
    ("-1234", "1/2"), when it is one and stands alone; None when there is no such word or it is a
    formula: the answer is then wrong, never some other number of the response."""
    # any script's digits ("８５", "²"): a wrong answer, not an unseen one
    holding = [
        w for w in _WORDS.finditer(text, begin, end) if any(char.isdigit() for char in w.group())
    ]
    if not holding:
        return None
    word = holding[0] if first else holding[-1]
    number = _NUMBER_WORD.fullmatch(word.group()) if len(word.group()) <= MAX_ANSWER_CHARS else None
    # money takes no unit ("$85m" is millions); LaTeX math ("$90°$") has two "$"
    if number is None or (
        number.group("suffix") not in (None, "%") and word.group().count("$") == 1
    ):
        return None
    start, sign = word.start(), number.group("sign")
    if not sign:
        start, sign = _detached_sign(text, begin, start)
    stop = word.end() if number.group("suffix") else _percent_end(text, word.end())
    if not _stands_alone(text, start, stop):
        return None
    return ("-" if sign in _MINUS_SIGNS else "") + _value_text(number.group("value"))


def final_answer(response_text: str) -> str | None:
    """The number a response answers with (module docstring, 3), as Fraction reads it: the last
    number in the last \\boxed{...} or \\fbox{...}, else the first number after the last "####",
    else the last number of the response; None when there is none, or when that number does not
    stand alone. The words around a box are the neighbours of a number at its edge
    ("2^\\boxed{10}", "\\boxed{85}^2")."""
    text = _replaced(_LATEX_TEXT.sub(r" \1 ", response_text), {**_INVISIBLE, **_LATEX_PLAIN})
    box = _last_boxed(text)
    if box is not None:
        start, begin, end = box
        # blank "\boxed{" and "}" out, same length, so the span holds
        text = text[:start] + " " * (begin - start) + text[begin:end] + " " + text[end + 1 :]
        return _read_number(text, begin, end, first=False)
    if "####" in text:
        after = text.rsplit("####", 1)[1]  # what comes before "####" is reasoning, not a neighbour
        return _read_number(after, 0, len(after), first=True)
    return _read_number(text, 0, len(text), first=False)


# ---------------------------------------------------------------- 1. arithmetic

def _in_test_split(a: int, b: int) -> bool:
    """A fixed, seed-independent hash decides the split of an operand pair (Knuth's
    multiplicative hash)."""
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
        """Training prompts, each with its sum written out ("37 + 48 = 85"). Shown bare numbers
        ("85") as answers, a small chat model drops to ~3 % accuracy (SmolLM2-135M-Instruct,
        2-digit addition); shown the sum written out, it writes one and gets ~30 %."""
        pairs = self.prompts(k, rng, split="train")
        return [
            (prompt, f"{prompt[:-1].replace(self.op, f' {self.op} ', 1)} = {target}")
            for prompt, target in pairs
        ]

    @staticmethod
    def reward(response_text: str, target: str) -> float:
        """Compared as text, not as a value: "085", "85.0" and "170/2" are not 85 written as an
        integer ("085" always scored 0)."""
        return 1.0 if final_answer(response_text) == target else 0.0


# ---------------------------------------------------------------- 2. countdown

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
# A label before an answer, maybe bold: "Answer:", "**Final answer:**", "Therefore, the answer is"
_LABEL = re.compile(
    # words of letters only, each may end with ","
    r"\**(?:[^\W\d_]+,?[ \t]+)*?"
    # the last ends with ":", is "is", or ends with "," just before the expression
    r"(?:[^\W\d_]+\**:|is[ \t]|[^\W\d_]+,(?=[ \t]*[\d(]))\**"
)


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
    an operation ("sqrt, (...)", "negative: 3 + 4"; the words of _WORDS_BEFORE)."""
    text = _replaced(response_text, {**_INVISIBLE, **_LATEX})
    box = _last_boxed(text)
    if box is not None:
        start, begin, end = box
        if not _stands_alone(text, start, end + 1):  # "\boxed{3 + 4}^2", "\sqrt{\boxed{3 + 4}}"
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
    label = _LABEL.match(text)
    if label and not _WORDS_BEFORE.intersection(re.findall(r"[^\W\d_]+", label.group().lower())):
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


# ---------------------------------------------------------------- 3. a dataset file (JSON Lines)

_DATA_NUMBER = re.compile(rf"-?{_UNSIGNED}")  # an answer in a data file: "72", "-7", "1,234", "2.5"
_CALCULATOR_NOTE = re.compile(r"<<[^<>]*>>")  # GSM8K's "<<48/2=24>>"


def _lone_surrogate(text: str) -> str | None:
    """The first lone surrogate in `text` (JSON's "\\ud800" escapes give one: half of a UTF-16
    pair, which no UTF-8 text, tokenizer or hash can take), written as its escape; None when there
    is none."""
    for char in text:
        if "\ud800" <= char <= "\udfff":
            return f"\\u{ord(char):04x}"
    return None


def _normalised(text: str) -> str:
    """A text answer as exact match compares it (SQuAD's grader): lower case, punctuation and the
    articles a, an, the dropped, spaces collapsed; compatibility forms folded ("ﬁ" is "fi")."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = "".join(" " if unicodedata.category(char).startswith("P") else char for char in text)
    return " ".join(word for word in text.split() if word not in ("a", "an", "the"))


def final_text(response_text: str) -> str:
    """The text a response answers with: what follows the last "####", else the content of the
    last \\boxed{...}, else its last non-empty line; then without a label in front ("Answer:",
    "The answer is")."""
    if "####" in response_text:
        text = response_text.rsplit("####", 1)[1]
    elif _last_boxed(response_text) is not None:
        _, begin, end = _last_boxed(response_text)
        text = response_text[begin:end]
    else:
        lines = [line for line in response_text.splitlines() if line.strip()]
        text = lines[-1] if lines else ""
    text = text.strip()
    label = _LABEL.match(text)
    return text[label.end() :] if label else text


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
                    split = "test" if _hash_unit(question) < TEST_FRACTION else "train"
                else:
                    split = "train" if file == path else "test"
                self.splits[split].append((question, target, solution))
        if not self.splits["train"] and not self.splits["test"]:
            raise ValueError(f"{path}: no questions (the file is empty)")
        numbers = all(
            _DATA_NUMBER.fullmatch(target)
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
            if not _normalised(final):
                raise ValueError(
                    f"{where}: the answer is empty (or only punctuation), got {answer!r}"
                )
            # a number, or a text
            target = final.replace(",", "") if _DATA_NUMBER.fullmatch(final) else final
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
        _check_split(split)
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
        if not _DATA_NUMBER.fullmatch(target):  # a text answer: normalised exact match
            return 1.0 if _normalised(final_text(response_text)) == _normalised(target) else 0.0
        # at most MAX_ANSWER_CHARS characters: Fraction reads it at once
        answer = final_answer(response_text)
        return 1.0 if answer is not None and Fraction(answer) == Fraction(target) else 0.0


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
            digits = "".join(
                rng.choice("0123456789")
                for _ in range(rng.randint(self.min_digits, self.max_digits))
            )
            if (_hash_unit("reverse " + digits) < TEST_FRACTION) == (split == "test"):
                out.append((f"reverse {digits}=", digits[::-1]))
        return out

    def examples(self, k: int, rng: random.Random) -> list[tuple[str, str]]:
        return self.prompts(k, rng, split="train")  # the target is already a complete response

    @staticmethod
    def reward(response_text: str, target: str) -> float:
        first = _FIRST_DIGITS.search(response_text)
        return 1.0 if first is not None and first.group() == target else 0.0


# ---------------------------------------------------------------- 5. a task of your own (.py)

class PluginTask:
    """A task of your own, from a Python file given as --task (no edit of the repository):

        def prompts(n, rng, split="train"):  # -> n pairs (prompt text, target text)
        def reward(response_text, target):   # -> a float, 1.0 for a right answer
        def examples(k, rng):                # optional: k solved (prompt, solution) for --few-shot
        INSTRUCTION = "..."                  # optional: the answer format, stated to a chat model
        DEFAULT_FEW_SHOT = 0                 # optional: examples shown to a base model by default

    `rng` is a random.Random; `split` is "train" or "test": keep the held-out questions apart. A
    reward never raises on model output: an exception (or a value that is not a finite number)
    scores 0, and the first one is reported in one line."""

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
                    " (see common/tasks.py, PluginTask)"
                )
        self.instruction = getattr(self.module, "INSTRUCTION", "")
        self.default_few_shot = getattr(self.module, "DEFAULT_FEW_SHOT", 0)
        self.reported = False
        pairs = self.module.prompts(2, random.Random(0), "train")
        if not all(
            isinstance(p, (tuple, list)) and len(p) == 2 and all(isinstance(x, str) for x in p)
            for p in pairs
        ):
            raise ValueError(
                f"--task {path}: prompts(n, rng, split) must return n (prompt, target) pairs"
                " of strings"
            )

    def prompts(self, n: int, rng: random.Random, split: str = "train") -> list[tuple[str, str]]:
        return [tuple(pair) for pair in self.module.prompts(n, rng, split)]

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


# ---------------------------------------------------------------- the registry

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
    if eval_task is not None and not Path(eval_task).is_file():
        raise ValueError(f"--eval-task file not found: {eval_task}")
    if task in TASKS:
        return TASKS[task]
    if task.endswith((".jsonl", ".py")) and not Path(task).is_file():
        raise ValueError(f"--task file not found: {task}")
    if task.endswith(".jsonl"):
        return JsonlTask(task, eval_task)
    if task.endswith(".py"):
        return PluginTask(task)
    raise ValueError(
        f"--task must be one of {', '.join(TASKS)}, the path of a .jsonl file or of a .py file"
        f" of your own, got {task!r}"
    )
