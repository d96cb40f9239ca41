"""The arithmetic tasks: "addition", "addition2", "subtraction", "multiplication".

Prompt "37+48=", target "85"; operands of 1 to 3 digits (2 for multiplication), the number
of digits uniform, then the value uniform. The split hashes the operand pair.
Reward: the response's answer, the number answers.py reads (the last number, unless there
is a \\boxed{...} or a "####"), is the target written as an integer ("085", "85.0" and
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
"""

import random

from common.tasks.answers import final_answer
from common.tasks.splits import TEST_FRACTION, check_split


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
        check_split(split)
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
