"""The two splits of every task. Every question belongs to exactly one split, decided by a fixed, seed-independent hash
of the question, with TEST_FRACTION of them held out: training never samples a test question,
and the evaluation prompts are drawn from the test split with the fixed EVAL_SEED, so every
run and every method is evaluated on the same questions.
"""

import hashlib

TEST_FRACTION = 0.1  # share of questions reserved for held-out evaluation
EVAL_SEED = 1234  # fixed: the held-out questions are the same in every run


def hash_unit(text: str) -> float:
    """A fixed, seed-independent hash of text, in [0, 1) (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big") / 2**64


def check_split(split: str):
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
