"""Reverse ("reverse"): the embedded long model's task.

Prompt "reverse 48213=", target "31284": 3 to 6 digits (the count uniform, each digit
uniform, leading zeros allowed: it is a string, not a number). The split hashes the digit
string.
Reward: the first run of digits in the response equals the target, so anything after the
answer is ignored ("31284 ......" scores 1.0, "3128 4" scores 0). The embedded long model
(common/models/long_model), pretrained on "reverse" only, answers and then hesitates: it
writes a space and a random number of dots after the answer; the reward never reads them, so
the length of a response does not decide whether it is right.
Demonstration: the bare answer. default_few_shot = 3.
"""

import random
import re

from common.tasks.splits import TEST_FRACTION, check_split, hash_unit

_FIRST_DIGITS = re.compile(r"\d+")


class Reverse:
    """`reverse 48213=` → "31284": a string of 3 to 6 digits, written backwards."""

    name = "reverse"
    instruction = "Write the digits in reverse order."
    default_few_shot = 3

    def __init__(self, min_digits: int = 3, max_digits: int = 6):
        self.min_digits, self.max_digits = min_digits, max_digits

    def prompts(self, n: int, rng: random.Random, split: str = "train") -> list[tuple[str, str]]:
        check_split(split)
        out = []
        while len(out) < n:
            digits = "".join(
                rng.choice("0123456789")
                for _ in range(rng.randint(self.min_digits, self.max_digits))
            )
            if (hash_unit("reverse " + digits) < TEST_FRACTION) == (split == "test"):
                out.append((f"reverse {digits}=", digits[::-1]))
        return out

    def examples(self, k: int, rng: random.Random) -> list[tuple[str, str]]:
        return self.prompts(k, rng, split="train")  # the target is already a complete response

    @staticmethod
    def reward(response_text: str, target: str) -> float:
        first = _FIRST_DIGITS.search(response_text)
        return 1.0 if first is not None and first.group() == target else 0.0
