"""Make the embedded long model: `python -m common.make_long_model --out DIR` (about 7 min on one CPU core).

The lab (`python -m common.lab`) needs what the embedded tiny model (common/tiny_model) cannot
give: responses that are long and vary in length, so that the questions separating GRPO,
Dr. GRPO, DAPO, GSPO and SAPO (length normalisation, entropy, many steps on one rollout) arise.
This script makes that model. Like common/make_tiny_model.py it writes an ordinary Hugging Face
causal LM (GPT-2, 2 layers, width 128, character tokenizer) with `save_pretrained`; the shipped
copy is common/long_model/, and this script writes to --out (default runs/long_model), never over
an existing folder unless --overwrite is given.

What it learns: the task "reverse" of common/tasks.py ("reverse 48213=" -> "31284"), and then to
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

from common.make_tiny_model import corrupt
from common.tasks import TASKS

SPECIALS = ["<pad>", "<eos>", "<unk>"]
CHARS = list("0123456789abcdefghijklmnopqrstuvwxyz .=")
TASK = TASKS["reverse"]


def build_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character (see make_tiny_model.py for why Split and Fuse)."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", padding_side="left"
    )


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
    width = max(len(p) + len(r) for p, r in zip(prompt_ids, response_ids))
    input_ids = torch.full((n, width), tokenizer.pad_token_id)
    labels = torch.full((n, width), -100)
    attention_mask = torch.zeros((n, width), dtype=torch.long)
    for row, (p, r) in enumerate(zip(prompt_ids, response_ids)):
        seq = p + r
        input_ids[row, width - len(seq) :] = torch.tensor(seq)
        labels[row, width - len(r) :] = torch.tensor(r)
        attention_mask[row, width - len(seq) :] = 1
    return input_ids, attention_mask, labels


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
    p = argparse.ArgumentParser(prog="python -m common.make_long_model", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", default=os.path.join("runs", "long_model"),
                   help="output folder (the shipped model is common/long_model)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it already exists")
    p.add_argument("--seed", type=int, default=0, help="seeds data, init and sampling")
    p.add_argument("--steps", type=int, default=1500, help="optimiser steps")
    p.add_argument("--batch-size", type=int, default=64, help="sequences per step")
    p.add_argument("--lr", type=float, default=3e-3, help="peak AdamW learning rate (cosine decay)")
    p.add_argument("--wrong-fraction", type=float, default=0.5, help="share of deliberately wrong answers")
    p.add_argument("--max-dots", type=int, default=40, help="longest hesitation after the answer, in dots")
    args = p.parse_args(argv)
    if os.path.exists(args.out) and not args.overwrite:
        raise SystemExit(f"error: --out {args.out} already exists (choose another folder, or add --overwrite)")

    torch.set_num_threads(1)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)

    tokenizer = build_tokenizer()
    config = GPT2Config(
        vocab_size=len(tokenizer), n_positions=96, n_embd=128, n_layer=2, n_head=4,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    model = GPT2LMHeadModel(config)
    print(f"parameters: {sum(p.numel() for p in model.parameters()):,}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    warmup = 200
    schedule = lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * s / args.steps))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    max_new_tokens = 6 + 2 + args.max_dots + 8  # answer, space, dots, EOS, and some room

    start = time.time()
    for step in range(args.steps):
        input_ids, attention_mask, labels = make_batch(tokenizer, args.batch_size, rng, args.wrong_fraction, args.max_dots)
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        if step % 500 == 0 or step == args.steps - 1:
            model.eval()
            sampled, length = evaluate(model, tokenizer, 200, True, max_new_tokens)
            greedy, _ = evaluate(model, tokenizer, 200, False, max_new_tokens)
            model.train()
            print(f"step {step:5d}  loss {loss.item():.3f}  reverse: sampled {sampled:.2f} greedy {greedy:.2f}"
                  f"  mean sampled length {length:.1f} tokens  {time.time() - start:.0f}s", flush=True)

    tmp = args.out + ".tmp"  # write, then rename: an interrupted run never leaves a half-written model
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(args.out, ignore_errors=True)
    os.replace(tmp, args.out)
    print(f"saved to {args.out}; use it with: python grpo.py --model {args.out} --task reverse --max-new-tokens 56")


if __name__ == "__main__":
    main()
