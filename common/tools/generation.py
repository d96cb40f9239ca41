"""The sampling phase and Hugging Face `generate`'s options: what each one costs, and whether it samples the same.

    python -m common.tools.generation                                          # SmolLM2 (python -m common.models.smollm2)
    python -m common.tools.generation --model gpt2 --variants dynamic static chunks=32 --repeats 5

Each variant runs grpo.py's own `sample` (one rollout of --prompts × --group-size responses: the generate call
the group files make) with one option changed:

    dynamic         today's call: a DynamicCache, grown by one position per decoding step
    static          cache_implementation="static": the KV cache allocated once for prompt + --max-new-tokens
    static+compile  the same, the forward compiled by torch.compile (transformers does this by itself on a GPU
                    whenever the cache is static; on a CPU only when asked, which this variant does)
    chunks=K        the rollout as generate calls of K responses each (batch sizing)

Timing: one warm-up rollout per variant (compilation happens there), then --repeats rounds with the variants
interleaved inside each round; median seconds and tokens/s, and the ratio to `dynamic` in the same rounds.
Exactness (an option is only worth taking if π_θold is still the policy that samples): with the same seed and
prompts, the share of sampled responses identical to `dynamic`'s, and, on a greedy pass, the largest difference
of a chosen token's log-probability from `dynamic`'s. (chunks=K draws its random numbers in other shapes, so its
samples differ from dynamic's even where its distribution is the same: the greedy column is its test.)
"""

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)  # grpo.py's sample() is what is timed

SMOLLM2 = os.path.join(ROOT, "runs", "SmolLM2-135M-Instruct")
VARIANTS = ("dynamic", "static", "static+compile", "chunks=K")


def generate_options(variant: str) -> dict:
    """The keyword arguments a variant adds to every generate call."""
    from transformers import CompileConfig

    if variant == "static":
        return {"cache_implementation": "static", "disable_compile": True}
    if variant == "static+compile":
        config = CompileConfig(fullgraph=False)
        config._compile_all_devices = True  # a CPU too: transformers compiles only on accelerators by default
        return {"cache_implementation": "static", "compile_config": config}
    return {}


def rollout(model, tokenizer, task, prompts, args, variant: str, greedy: bool = False):
    """grpo.sample on all prompts, or chunk by chunk; returns the response rows (token lists up to the mask)."""
    import torch

    import grpo

    options = generate_options(variant)
    generate = model.generate
    model.generate = lambda *a, **kw: generate(*a, **{**kw, **options})
    try:
        per_call = int(variant.split("=")[1]) // args.group_size if variant.startswith("chunks=") else len(prompts)
        rows = []
        for start in range(0, len(prompts), per_call):
            _, _, _, responses, mask, _ = grpo.sample(model, tokenizer, task, prompts[start : start + per_call], args,
                                                      torch.device("cpu"), num_samples=args.group_size, greedy=greedy)
            rows += [r[: int(n)] for r, n in zip(responses.tolist(), mask.sum(dim=1).tolist())]
    finally:
        model.generate = generate
    return rows


def greedy_logprobs(model, tokenizer, texts: list[str], max_new_tokens: int, variant: str):
    """Greedy responses and their chosen tokens' log-probabilities, as the variant's generate computes them."""
    import torch

    from common.llm import eos_token_ids

    per_call = int(variant.split("=")[1]) if variant.startswith("chunks=") else len(texts)
    rows = []
    for start in range(0, len(texts), per_call):
        enc = tokenizer(texts[start : start + per_call], return_tensors="pt", padding=True,
                        add_special_tokens=tokenizer.chat_template is None)
        out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, top_k=None, top_p=None,
                             temperature=None, pad_token_id=tokenizer.pad_token_id, eos_token_id=eos_token_ids(model, tokenizer),
                             output_logits=True, return_dict_in_generate=True, **generate_options(variant))
        tokens = out.sequences[:, enc["input_ids"].shape[1]:]
        logprobs = torch.stack(out.logits, dim=1).float().log_softmax(-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        rows += list(zip(tokens.tolist(), logprobs.tolist()))
    return rows


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m common.tools.generation", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default=SMOLLM2 if os.path.isdir(SMOLLM2) else "common/models/tiny_model",
                   help="the model (default: the SmolLM2 folder when it has been made, else the embedded tiny model)")
    p.add_argument("--task", default="addition2", help="the task whose prompts are sampled")
    p.add_argument("--few-shot", type=int, default=3, help="solved examples before each question (as in the SmolLM2 runs)")
    p.add_argument("--prompts", type=int, default=8, help="prompts per rollout (B)")
    p.add_argument("--group-size", type=int, default=8, help="responses per prompt (G)")
    p.add_argument("--max-new-tokens", type=int, default=16, help="response length cap")
    p.add_argument("--variants", nargs="+", default=["dynamic", "static", "static+compile", "chunks=16", "chunks=32"],
                   help=f"what to compare: {', '.join(VARIANTS)} (K a multiple of --group-size); dynamic is the baseline")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds after the warm-up")
    p.add_argument("--threads", type=int, default=1, help="torch threads (one core: as the learning runs)")
    args = p.parse_args(argv)
    for flag in ("prompts", "group_size", "max_new_tokens", "repeats", "threads"):
        if getattr(args, flag) < 1:
            raise SystemExit(f"error: --{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    for variant in args.variants:
        k = variant.split("=")[1] if variant.startswith("chunks=") else None
        if variant not in VARIANTS[:3] and not (k and k.isdigit() and int(k) > 0 and int(k) % args.group_size == 0):
            raise SystemExit(f"error: --variants: {variant!r} is not one of {', '.join(VARIANTS)} "
                             f"(K a positive multiple of --group-size {args.group_size})")
    if "dynamic" not in args.variants:
        args.variants.insert(0, "dynamic")  # the baseline every ratio is taken against
    return args


def main(argv=None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import random

    import torch

    import grpo
    from common import llm
    from common.tasks import get_task

    torch.set_num_threads(args.threads)
    g = grpo.Args(model=args.model, task=args.task, few_shot=args.few_shot, group_size=args.group_size,
                  max_new_tokens=args.max_new_tokens)
    tokenizer, model = llm.load_policy(g.model, llm.resolve_model_path(g.model), torch.device("cpu"))
    model.eval()
    task = get_task(g.task)
    prompts = [p for p, _ in task.prompts(args.prompts, random.Random(0))]
    print(f"generation: {args.model}, {args.prompts} prompts × {args.group_size} responses, up to {args.max_new_tokens} "
          f"tokens, {args.threads} thread(s); variants {' '.join(args.variants)}", flush=True)

    # Exactness, before any timing: the same seed through every variant.
    torch.manual_seed(0)
    reference = rollout(model, tokenizer, task, prompts, g, "dynamic")
    texts = llm.format_prompts(tokenizer, task, prompts, g.few_shot, g.system_prompt)
    texts = [t for t in texts for _ in range(args.group_size)]
    greedy_reference = greedy_logprobs(model, tokenizer, texts, args.max_new_tokens, "dynamic")
    exact = {}
    for variant in args.variants:
        torch.manual_seed(0)
        rows = rollout(model, tokenizer, task, prompts, g, variant)
        same = sum(a == b for a, b in zip(rows, reference)) / len(reference)
        gap = 0.0
        for (tokens, logprobs), (ref_tokens, ref_logprobs) in zip(greedy_logprobs(model, tokenizer, texts,
                                                                                   args.max_new_tokens, variant),
                                                                   greedy_reference):
            for t, lp, rt, rlp in zip(tokens, logprobs, ref_tokens, ref_logprobs):
                if t != rt:
                    break  # past the first difference the prefixes differ: nothing to compare
                gap = max(gap, abs(lp - rlp))
        exact[variant] = (same, gap)
        print(f"  {variant:15} same sampled responses {same:.0%}, greedy max |Δ log π| {gap:.2e}", flush=True)

    seconds = {variant: [] for variant in args.variants}
    tokens = {variant: [] for variant in args.variants}
    for round_ in range(args.repeats + 1):  # round 0 warms up (and compiles)
        for variant in args.variants:
            start = time.perf_counter()
            rows = rollout(model, tokenizer, task, prompts, g, variant)
            elapsed = time.perf_counter() - start
            if round_:
                seconds[variant].append(elapsed)
                tokens[variant].append(sum(map(len, rows)))
            print(f"  round {round_}{' (warm-up)' if not round_ else ''} {variant:15} {elapsed:7.2f} s", flush=True)

    print("\n| variant | median s per rollout | tokens/s | time ÷ dynamic (median of rounds) | same sampled responses "
          "| greedy max abs(Δ log π) |\n|---|---|---|---|---|---|")
    for variant in args.variants:
        ratio = statistics.median(s / d for s, d in zip(seconds[variant], seconds["dynamic"]))
        rate = statistics.median(n / s for n, s in zip(tokens[variant], seconds[variant]))
        same, gap = exact[variant]
        print(f"| {variant} | {statistics.median(seconds[variant]):.2f} | {rate:.1f} | {ratio:.2f} | {same:.0%} | {gap:.1e} |")


if __name__ == "__main__":
    main()
