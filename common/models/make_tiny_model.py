"""Make the embedded tiny model: `python -m common.models.make_tiny_model --out DIR` (13-20 min on one CPU core).

The group scripts (grpo.py, dr_grpo.py, dapo.py, gspo.py, sapo.py) default to this model so
that they run and learn offline on a CPU. It is an ordinary Hugging Face causal LM: a small
GPT-2 (2 layers, width 128, 0.4M parameters) with a character-level tokenizer, saved with
`save_pretrained` and loaded with `AutoModelForCausalLM.from_pretrained`, exactly like `--model gpt2`.
The shipped copy is common/models/tiny_model/; this script writes to the folder you name with --out
(default runs/tiny_model), never over an existing folder unless --overwrite is given, and the
result is used with `python grpo.py --model DIR` (any group script).

How it is made (and why):
- Tokenizer: one token per character, built with the `tokenizers` library (nothing downloaded).
  `Split(pattern="", behavior="isolated")` cuts every character ("37" -> "3", "7"; the usual
  Whitespace pre-tokenizer would map "37" to <unk>) and `decoders.Fuse()` decodes without spaces.
  pad (<pad>) differs from eos (<eos>), and the tokenizer is saved with padding_side="left".
- Data: the training split of common/tasks/arithmetic.py's "addition" (operands of 1-3 digits),
  `a+b=` followed by the answer and <eos>. A fraction `--wrong-fraction` of the answers is
  deliberately wrong (one digit replaced by another). Trained to convergence on that data, the
  model samples the right answer only about half of the time (0.49 on the held-out split), yet
  its greedy answer is usually right (0.97): a stable base with headroom for RL. (A base merely
  stopped early instead learns slowly under RL and tends to collapse.)
- Loss on the answer tokens only (the prompt is random digits: nothing to learn there).
- Dropout 0 everywhere, so that the first PPO-style ratio of an RL update is exactly 1.
- Left padding with position_ids = attention_mask.cumsum(-1) - 1, as in the RL scripts.
- n_positions = 64 covers the longest prompt (8 characters) plus any sensible max_new_tokens.
"""

import argparse
import math
import os
import random
import shutil
import time

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

from common.tasks import TASKS

SPECIALS = ["<pad>", "<eos>", "<unk>"]
CHARS = list("0123456789+-*= ")
PRETRAIN_TASKS = ["addition"]


def build_tokenizer(chars=CHARS) -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(SPECIALS + chars)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", padding_side="left"
    )


def corrupt(answer: str, rng: random.Random) -> str:
    """A plausible wrong answer: one digit replaced by a different digit."""
    positions = [i for i, c in enumerate(answer) if c.isdigit()]
    i = rng.choice(positions)
    wrong = rng.choice([d for d in "0123456789" if d != answer[i]])
    return answer[:i] + wrong + answer[i + 1 :]


def make_batch(tokenizer, n: int, rng: random.Random, wrong_fraction: float):
    """n left-padded training sequences `prompt answer <eos>` and labels on the answer tokens only."""
    prompt_ids, answer_ids = [], []
    for _ in range(n):
        task = TASKS[rng.choice(PRETRAIN_TASKS)]
        prompt, target = task.prompts(1, rng, split="train")[0]
        answer = corrupt(target, rng) if rng.random() < wrong_fraction else target
        prompt_ids.append(tokenizer.encode(prompt))
        answer_ids.append(tokenizer.encode(answer) + [tokenizer.eos_token_id])
    return left_pad(tokenizer, prompt_ids, answer_ids)


def left_pad(tokenizer, prompt_ids: list, answer_ids: list):
    """Token lists -> left-padded input_ids, attention_mask, and labels on the answer tokens only (-100 elsewhere)."""
    n = len(prompt_ids)
    width = max(len(p) + len(a) for p, a in zip(prompt_ids, answer_ids))
    input_ids = torch.full((n, width), tokenizer.pad_token_id)
    labels = torch.full((n, width), -100)
    attention_mask = torch.zeros((n, width), dtype=torch.long)
    for row, (p, a) in enumerate(zip(prompt_ids, answer_ids)):
        seq = p + a
        input_ids[row, width - len(seq) :] = torch.tensor(seq)
        labels[row, width - len(a) :] = torch.tensor(a)
        attention_mask[row, width - len(seq) :] = 1
    return input_ids, attention_mask, labels


@torch.no_grad()
def accuracy(model, tokenizer, task_name: str, n: int, do_sample: bool, seed: int = 0) -> float:
    """Held-out accuracy: sampled at temperature 1, or greedy."""
    task = TASKS[task_name]
    pairs = task.prompts(n, random.Random(seed), split="test")
    enc = tokenizer([p for p, _ in pairs], return_tensors="pt", padding=True)
    torch.manual_seed(seed)
    out = model.generate(
        **enc, do_sample=do_sample, temperature=1.0 if do_sample else None, top_k=0 if do_sample else None,
        max_new_tokens=8, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    return sum(task.reward(t, target) for t, (_, target) in zip(texts, pairs)) / n


def parser(name: str, doc: str, steps: int, batch_size: int) -> argparse.ArgumentParser:
    """The flags of a make_*_model script (this one and make_long_model.py); --out defaults to runs/<name>."""
    p = argparse.ArgumentParser(prog=f"python -m common.make_{name}", description=doc.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", default=os.path.join("runs", name),
                   help=f"output folder (the shipped model is common/models/{name})")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it already exists")
    p.add_argument("--seed", type=int, default=0, help="seeds data, init and sampling")
    p.add_argument("--steps", type=int, default=steps, help="optimiser steps")
    p.add_argument("--batch-size", type=int, default=batch_size, help="sequences per step")
    p.add_argument("--lr", type=float, default=3e-3, help="peak AdamW learning rate (cosine decay)")
    p.add_argument("--wrong-fraction", type=float, default=0.5, help="share of deliberately wrong answers")
    return p


def setup(args, n_positions: int, chars=CHARS):
    """Refuse an existing --out, seed everything, and build the tokenizer and a fresh 2-layer GPT-2."""
    if os.path.exists(args.out) and not args.overwrite:
        raise SystemExit(f"error: --out {args.out} already exists (choose another folder, or add --overwrite)")
    torch.set_num_threads(1)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    tokenizer = build_tokenizer(chars)
    config = GPT2Config(
        vocab_size=len(tokenizer), n_positions=n_positions, n_embd=128, n_layer=2, n_head=4,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        embedded_toy_model=True,  # what gives it and the models trained from it the toy defaults (common/policy.py)
    )
    model = GPT2LMHeadModel(config)
    print(f"parameters: {sum(p.numel() for p in model.parameters()):,}")
    return tokenizer, model


def train(model, args, next_batch, report, report_every: int):
    """AdamW with 200 warm-up steps and cosine decay on next_batch() -> (input_ids, attention_mask, labels);
    report(step, loss) every report_every steps and at the last one (in eval mode)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    warmup = 200

    def schedule(s):
        return min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * s / args.steps))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    for step in range(args.steps):
        input_ids, attention_mask, labels = next_batch()
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        if step % report_every == 0 or step == args.steps - 1:
            model.eval()
            report(step, loss.item())
            model.train()


def save(model, tokenizer, out: str):
    """Write to a temporary folder, then rename: an interrupted run never leaves a half-written model."""
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)


def main(argv=None):
    args = parser("tiny_model", __doc__, steps=10000, batch_size=128).parse_args(argv)
    tokenizer, model = setup(args, n_positions=64)
    rng = random.Random(args.seed)
    start = time.time()

    def report(step, loss):
        accs = {t: (accuracy(model, tokenizer, t, 200, True), accuracy(model, tokenizer, t, 200, False))
                for t in PRETRAIN_TASKS}
        accs_text = "  ".join(f"{t}: sampled {s:.2f} greedy {g:.2f}" for t, (s, g) in accs.items())
        print(f"step {step:6d}  loss {loss:.3f}  {accs_text}  {time.time() - start:.0f}s", flush=True)

    train(model, args, lambda: make_batch(tokenizer, args.batch_size, rng, args.wrong_fraction), report,
          report_every=1000)
    save(model, tokenizer, args.out)
    print(f"saved to {args.out}; use it with: python grpo.py --model {args.out}")


if __name__ == "__main__":
    main()
