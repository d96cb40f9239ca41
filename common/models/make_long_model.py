"""Make the embedded long model: `python -m common.models.make_long_model --out DIR` (about 7 min on one CPU core).

The lab (`python -m common.lab`) needs what the embedded tiny model (common/models/tiny_model) cannot
give: responses that are long and vary in length, so that the questions separating GRPO,
Dr. GRPO, DAPO, GSPO and SAPO (length normalisation, entropy, many steps on one rollout) arise.
This script makes that model with the pieces of common/models/make_tiny_model.py (tokenizer, model,
training loop, saving): an ordinary Hugging Face causal LM (GPT-2, 2 layers, width 128, one token
per character) written with `save_pretrained`; the shipped
copy is common/models/long_model/, and this script writes to --out (default runs/long_model), never over
an existing folder unless --overwrite is given.

What it learns: the task "reverse" of common/tasks/reverse.py ("reverse 48213=" -> "31284"), and then to
hesitate: after the answer it writes a space and k dots, k uniform in 0..--max-dots (no space when
k = 0), then <eos>. So a response is 4 to 48 tokens long, about 26 on average, and its length is
drawn independently of the answer: the reward reads only the first run of digits, and in the
training data long and short hesitations follow right and wrong answers alike. Whatever link
between length and correctness appears later, RL put it there.

As for the tiny model, a fraction --wrong-fraction of the training answers is deliberately wrong
(one digit replaced by another): the model then samples the right answer only part of the time
while its greedy answer is usually right, which leaves RL something to learn. Loss on the
response tokens only; dropout 0; left padding with position_ids = attention_mask.cumsum(-1) - 1.
"""

import random
import time

import torch

from common.models.make_tiny_model import corrupt, left_pad, parser, save, setup, train
from common.tasks import TASKS

CHARS = list("0123456789abcdefghijklmnopqrstuvwxyz .=")  # one token per character (make_tiny_model.py says why)
TASK = TASKS["reverse"]


def hesitation(rng: random.Random, max_dots: int) -> str:
    """What follows the answer: nothing, or a space and 1..max_dots dots (k uniform in 0..max_dots)."""
    k = rng.randint(0, max_dots)
    return " " + "." * k if k else ""


def make_batch(tokenizer, n: int, rng: random.Random, wrong_fraction: float, max_dots: int):
    """n left-padded sequences `prompt answer hesitation <eos>`, labels on the response tokens only."""
    prompt_ids, response_ids = [], []
    for prompt, target in TASK.prompts(n, rng, split="train"):
        answer = corrupt(target, rng) if rng.random() < wrong_fraction else target
        prompt_ids.append(tokenizer.encode(prompt))
        response_ids.append(tokenizer.encode(answer + hesitation(rng, max_dots)) + [tokenizer.eos_token_id])
    return left_pad(tokenizer, prompt_ids, response_ids)


@torch.no_grad()
def evaluate(model, tokenizer, n: int, do_sample: bool, max_new_tokens: int, seed: int = 0):
    """Held-out accuracy and mean response length in tokens (EOS included), sampled at temperature 1 or greedy."""
    pairs = TASK.prompts(n, random.Random(seed), split="test")
    enc = tokenizer([p for p, _ in pairs], return_tensors="pt", padding=True)
    torch.manual_seed(seed)
    out = model.generate(
        **enc, do_sample=do_sample, temperature=1.0 if do_sample else None, top_k=0 if do_sample else None,
        max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    responses = out[:, enc["input_ids"].shape[1] :]
    texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
    accuracy = sum(TASK.reward(t, target) for t, (_, target) in zip(texts, pairs)) / n
    lengths = [len(tokenizer.encode(t)) + 1 for t in texts]  # +1: the EOS
    return accuracy, sum(lengths) / n


def main(argv=None):
    p = parser("long_model", __doc__, steps=1500, batch_size=64)
    p.add_argument("--max-dots", type=int, default=40, help="longest hesitation after the answer, in dots")
    args = p.parse_args(argv)
    if not 0 <= args.max_dots <= 72:  # prompt (<= 15) + answer (<= 6) + space + dots + EOS must fit in 96 positions
        p.error(f"--max-dots must be in 0..72, got {args.max_dots}")
    tokenizer, model = setup(args, n_positions=96, chars=CHARS)
    rng = random.Random(args.seed)
    max_new_tokens = 6 + 2 + args.max_dots + 8  # answer, space, dots, EOS, and some room
    start = time.time()

    def report(step, loss):
        sampled, length = evaluate(model, tokenizer, 200, True, max_new_tokens)
        greedy, _ = evaluate(model, tokenizer, 200, False, max_new_tokens)
        print(f"step {step:5d}  loss {loss:.3f}  reverse: sampled {sampled:.2f} greedy {greedy:.2f}"
              f"  mean sampled length {length:.1f} tokens  {time.time() - start:.0f}s", flush=True)

    def next_batch():
        return make_batch(tokenizer, args.batch_size, rng, args.wrong_fraction, args.max_dots)

    train(model, args, next_batch, report, report_every=500)
    save(model, tokenizer, args.out)
    print(f"saved to {args.out}; use it with: python grpo.py --model {args.out} --task reverse --max-new-tokens 64")


if __name__ == "__main__":
    main()
