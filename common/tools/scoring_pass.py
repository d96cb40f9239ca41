"""Peak memory and time of the scoring pass (log-probs and entropies of π_θold), against the implementation before
log-probs were computed a few positions at a time.

    python -m common.tools.scoring_pass                                   # Qwen2.5-0.5B configuration, 4 × 256 tokens
    python -m common.tools.scoring_pass --config gpt2-124m --responses 8 --repeats 5

The model is the real configuration with random weights (no download, common/tools/scale.py's CONFIGS). Each
measurement is a fresh process on one thread that builds the model, then runs grpo.py's score_responses once on
`--responses` rows of 64 prompt + `--new-tokens` response tokens, the whole batch in one forward pass (so that
only the log-prob code differs). Two variants, run in turn (A B A B ...) so that drift on the machine hits both:

    whole   the code before: logits ÷ T into a second [N, T, vocab] tensor, logsumexp over the whole tensor,
            entropy through a whole softmax (kept below, as the baseline of the measurement)
    chunked the code now: logits ÷ T in place, log-probs and entropy a few positions at a time

Peak memory is the rise of the process's peak RSS during the pass above its RSS before it (the model's weights
are built before, once). Medians over --repeats; the ratio whole / chunked is taken pair by pair.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPT_TOKENS = 64


def whole_scoring(model, sequences, attention_mask, prompt_len, responses, temperature):
    """The baseline: the scoring pass as it was, every step on the whole [N, T, vocab] tensor."""
    import torch

    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=sequences, attention_mask=attention_mask, position_ids=position_ids,
                   logits_to_keep=responses.shape[1] + 1, use_cache=False).logits[:, :-1]
    logits = logits.float() / temperature
    logprobs = logits.gather(-1, responses.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    entropies = torch.logsumexp(logits, dim=-1) - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return logprobs, entropies


def measure(variant: str, config: str, responses: int, new_tokens: int) -> dict:
    """In this process: build the model, run one scoring pass, return its peak RSS rise (GB) and seconds."""
    import resource
    import time

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    sys.path.insert(0, ROOT)
    import grpo
    from common import llm
    from common.tools.scale import CONFIGS

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model_type, fields = CONFIGS[config]
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **fields), dtype=torch.float32).eval()
    llm.float32_output_layer(model)
    vocabulary = model.get_output_embeddings().weight.shape[0]
    sequences = torch.randint(0, vocabulary, (responses, PROMPT_TOKENS + new_tokens))
    attention_mask = torch.ones_like(sequences)
    args = grpo.Args(micro_batch_size=responses, num_minibatches=1, group_size=responses, temperature=0.7)

    def rss_gb() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30

    before = rss_gb()
    start = time.perf_counter()
    with torch.no_grad():
        if variant == "whole":
            logprobs, entropies = whole_scoring(model, sequences, attention_mask, PROMPT_TOKENS, sequences[:, PROMPT_TOKENS:], 0.7)
        else:
            logprobs, _, entropies = grpo.score_responses(model, None, sequences, attention_mask, PROMPT_TOKENS,
                                                          sequences[:, PROMPT_TOKENS:], args, torch.autocast("cpu", enabled=False))
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KB → GB
    return dict(peak_gb=peak - before, seconds=seconds, logprob_sum=logprobs.double().sum().item(),
                entropy_sum=entropies.double().sum().item(), logits_gb=responses * new_tokens * vocabulary * 4 / 2**30)


def main(argv=None) -> None:
    from common.tools.scale import CONFIGS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="qwen2.5-0.5b", choices=sorted(CONFIGS), help="model configuration")
    parser.add_argument("--responses", type=int, default=4, help="rows of the scoring pass (default 4)")
    parser.add_argument("--new-tokens", type=int, default=256, help="response tokens per row (default 256)")
    parser.add_argument("--repeats", type=int, default=3, help="pairs of measurements (default 3)")
    parser.add_argument("--child", choices=["whole", "chunked"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for flag, value in (("--responses", args.responses), ("--new-tokens", args.new_tokens), ("--repeats", args.repeats)):
        if value < 1:
            raise SystemExit(f"error: {flag} must be >= 1, got {value}")
    if args.child:
        print(json.dumps(measure(args.child, args.config, args.responses, args.new_tokens)))
        return
    print(f"scoring pass: {args.config}, {args.responses} × ({PROMPT_TOKENS} + {args.new_tokens}) tokens, one thread, "
          f"{args.repeats} pairs", flush=True)
    results = {"whole": [], "chunked": []}
    for repeat in range(args.repeats):
        for variant in results:
            command = [sys.executable, "-m", "common.tools.scoring_pass", "--child", variant, "--config", args.config,
                       "--responses", str(args.responses), "--new-tokens", str(args.new_tokens)]
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
            if done.returncode != 0:
                raise SystemExit(f"error: the {variant} measurement failed:\n{done.stderr[-2000:]}")
            results[variant].append(json.loads(done.stdout.strip().splitlines()[-1]))
            r = results[variant][-1]
            print(f"  pair {repeat + 1} {variant:8} peak +{r['peak_gb']:.2f} GB  {r['seconds']:.1f} s", flush=True)
    whole, chunked = results["whole"], results["chunked"]
    assert abs(whole[0]["logprob_sum"] - chunked[0]["logprob_sum"]) < 1e-3 * abs(whole[0]["logprob_sum"])  # same values
    print(f"one [N, T, vocab] float32 copy of the logits: {whole[0]['logits_gb']:.2f} GB")
    print("| variant | median peak rise GB | median seconds |")
    print("|---|---|---|")
    for name, runs in results.items():
        print(f"| {name} | {statistics.median(r['peak_gb'] for r in runs):.2f} | {statistics.median(r['seconds'] for r in runs):.1f} |")
    memory = statistics.median(w["peak_gb"] / c["peak_gb"] for w, c in zip(whole, chunked))
    speed = statistics.median(w["seconds"] / c["seconds"] for w, c in zip(whole, chunked))
    print(f"median ratio whole / chunked, pair by pair: peak memory {memory:.2f}×, time {speed:.2f}×")


if __name__ == "__main__":
    main()
