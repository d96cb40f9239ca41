"""Verifiable tasks for the LLM group methods (grpo.py and its siblings).

A task is procedurally generated: no download, infinite data, deterministic from a seed.
Each task offers

    prompts(n, rng, split="train") -> list[(prompt, target)]   # rng is a random.Random
    reward(response_text, target) -> float                       # 1.0 right, 0.0 wrong

The `split` keeps a held-out test set: every operand pair belongs to exactly one split
(decided by a fixed hash of the pair), training never samples a test pair, and the
evaluation prompts are drawn from the test split with a fixed seed, so every run and
every method is evaluated on the same questions.

Reward: the answer is the last integer in the response (so an instruct model that writes
"The answer is 85." is graded on 85); it scores 1.0 if it equals the target, else 0.0.
There is no partial credit. The embedded tiny model answers with digits only, so for it
this is an exact match of the whole response.
"""

import random
import re

TEST_FRACTION = 0.1  # share of operand pairs reserved for held-out evaluation
EVAL_SEED = 1234  # fixed: the held-out questions are the same in every run

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

    def __init__(self, op: str, max_digits: int):
        self.op, self.max_digits = op, max_digits

    def answer(self, a: int, b: int) -> int:
        return {"+": a + b, "-": a - b, "*": a * b}[self.op]

    def prompts(self, n: int, rng: random.Random, split: str = "train") -> list[tuple[str, str]]:
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        out = []
        while len(out) < n:
            a, b = _operand(rng, self.max_digits), _operand(rng, self.max_digits)
            if _in_test_split(a, b) == (split == "test"):
                out.append((f"{a}{self.op}{b}=", str(self.answer(a, b))))
        return out

    @staticmethod
    def reward(response_text: str, target: str) -> float:
        numbers = _LAST_INT.findall(response_text)
        return 1.0 if numbers and numbers[-1] == target else 0.0


# The registry `--task` chooses from. The embedded tiny model (common/tiny_model) was pretrained
# on "addition" only: it knows neither "subtraction" nor "multiplication" (with so little signal,
# RL cannot teach them), which are there for real models (`--model ...`).
TASKS = {
    "addition": Arithmetic("+", max_digits=3),
    "subtraction": Arithmetic("-", max_digits=3),
    "multiplication": Arithmetic("*", max_digits=2),
}
