"""How a response's answer is read, as the reference grader of its kind reads it: the number it
answers with (`final_answer`: the arithmetic tasks, a dataset's numbers), its final text (`final_text`:
a dataset's texts), and what Countdown reads its expression with (the last box, a label, whether the
words around a span join it to a formula).

Reference graders. After "####", the first number, as GSM8K's own grader
(`#### (\\-?[0-9\\.\\,]+)`) reads it ("#### 25%", "#### 85, 86" is 85); elsewhere, as a careful
math grader does (Qwen's math evaluation): \\boxed{} or \\fbox{}, "%", "$", units, LaTeX
separators ("1{,}234") dropped, fractions compared by value. Countdown has no such grader: it checks
each number once and the exact value, after taking off what those graders drop around an answer (a
label, a full stop, emoji). Nothing that changes a value is dropped: every known loophole stays shut.

The number: a response's answer is the last number inside the last \\boxed{...} or \\fbox{...}
if there is one, else the first number after the last "####", else the last number of the
response; it is right when it equals the target exactly ("72.0" == "72",
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
The text: a text answer ("Paris") is compared with the response's final text: what follows its last
"####", else the content of its last \\boxed{...}, else its last non-empty line, without a
label in front ("Answer:", "The answer is"); both normalised as SQuAD's exact-match grader
does (case, punctuation, the articles a, an, the and extra spaces dropped), so
"#### the Eiffel Tower!" is "Eiffel tower" and "Paris, France" is not "Paris".
"""

import re
import unicodedata

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
# A word that is a number, maybe wrapped: "(85)", "**85**." (module docstring)
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
WORDS_BEFORE = {
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
INVISIBLE = {
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
# A label before an answer, maybe bold: "Answer:", "**Final answer:**", "Therefore, the answer is"
LABEL = re.compile(
    # words of letters only, each may end with ","
    r"\**(?:[^\W\d_]+,?[ \t]+)*?"
    # the last ends with ":", is "is", or ends with "," just before the expression
    r"(?:[^\W\d_]+\**:|is[ \t]|[^\W\d_]+,(?=[ \t]*[\d(]))\**"
)
# A number as a data file writes an answer: "72", "-7", "1,234", "2.5"
DATA_NUMBER = re.compile(rf"-?{_UNSIGNED}")


def replaced(text: str, table: dict[str, str]) -> str:
    for old, new in table.items():
        text = text.replace(old, new)
    return text


def last_boxed(text: str) -> tuple[int, int, int] | None:
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
        or word.strip(_PUNCTUATION).lower() in WORDS_BEFORE
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


def stands_alone(text: str, start: int, end: int) -> bool:
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
    if not stands_alone(text, start, stop):
        return None
    return ("-" if sign in _MINUS_SIGNS else "") + _value_text(number.group("value"))


def final_answer(response_text: str) -> str | None:
    """The number a response answers with (module docstring), as Fraction reads it: the last
    number in the last \\boxed{...} or \\fbox{...}, else the first number after the last "####",
    else the last number of the response; None when there is none, or when that number does not
    stand alone. The words around a box are the neighbours of a number at its edge
    ("2^\\boxed{10}", "\\boxed{85}^2")."""
    text = replaced(_LATEX_TEXT.sub(r" \1 ", response_text), {**INVISIBLE, **_LATEX_PLAIN})
    box = last_boxed(text)
    if box is not None:
        start, begin, end = box
        # blank "\boxed{" and "}" out, same length, so the span holds
        text = text[:start] + " " * (begin - start) + text[begin:end] + " " + text[end + 1 :]
        return _read_number(text, begin, end, first=False)
    if "####" in text:
        after = text.rsplit("####", 1)[1]  # what comes before "####" is reasoning, not a neighbour
        return _read_number(after, 0, len(after), first=True)
    return _read_number(text, 0, len(text), first=False)


def final_text(response_text: str) -> str:
    """The text a response answers with: what follows the last "####", else the content of the
    last \\boxed{...}, else its last non-empty line; then without a label in front ("Answer:",
    "The answer is")."""
    if "####" in response_text:
        text = response_text.rsplit("####", 1)[1]
    elif last_boxed(response_text) is not None:
        _, begin, end = last_boxed(response_text)
        text = response_text[begin:end]
    else:
        lines = [line for line in response_text.splitlines() if line.strip()]
        text = lines[-1] if lines else ""
    text = text.strip()
    label = LABEL.match(text)
    return text[label.end() :] if label else text


def normalised(text: str) -> str:
    """A text answer as exact match compares it (SQuAD's grader): lower case, punctuation and the
    articles a, an, the dropped, spaces collapsed; compatibility forms folded ("ﬁ" is "fi")."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = "".join(" " if unicodedata.category(char).startswith("P") else char for char in text)
    return " ".join(word for word in text.split() if word not in ("a", "an", "the"))
