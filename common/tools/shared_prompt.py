"""Each prompt read once, measured: one pass of grpo.py's scoring (no gradient) and of its update (forward and
backward) on the same responses, with the prompt shared by its group (response_logits(share_prompt=True), what the
group files do) and with every response carrying its own copy of it (share_prompt=False), against prompt length.

    python -m common.tools.shared_prompt                          # SmolLM2 (python -m common.models.smollm2)
    python -m common.tools.shared_prompt --few-shot 0 3 8 --prompts 4 --group-size 8 --repeats 5

For each --few-shot value it formats --prompts questions of --task as grpo.py does, samples --group-size responses
to each with grpo.py's sample() (up to --max-new-tokens tokens), then times the two passes both ways, interleaved
(plain, shared, plain, shared, ...), one thread. It prints the median seconds, the ratio, and that both ways
compute the same thing: the largest difference of a token's log-probability, and the relative difference of the
gradient of the mean log-probability.
"""

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)  # grpo.py's sample() and response_logits() are what is timed

SMOLLM2 = os.path.join(ROOT, "runs", "SmolLM2-135M-Instruct")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=SMOLLM2, help="a model folder, .gguf file or hub id (default: SmolLM2)")
    parser.add_argument("--task", default="addition2", help="the task whose prompts are formatted (default: addition2)")
    parser.add_argument("--few-shot", type=int, nargs="+", default=[0, 3, 8], help="examples before each question")
    parser.add_argument("--prompts", type=int, default=4, help="distinct prompts (groups) in the pass (default: 4)")
    parser.add_argument("--group-size", type=int, default=8, help="G, responses per prompt (default: 8)")
    parser.add_argument("--max-new-tokens", type=int, default=16, help="response length cap (default: 16)")
    parser.add_argument("--repeats", type=int, default=3, help="timed pairs per measurement (default: 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    args = parser.parse_args(argv)
    for flag, value, least in (("--prompts", args.prompts, 1), ("--group-size", args.group_size, 2),
                               ("--max-new-tokens", args.max_new_tokens, 1), ("--repeats", args.repeats, 1),
                               ("--threads", args.threads, 1)):
        if value < least:
            raise SystemExit(f"error: {flag} must be >= {least}, got {value}")
    if any(k < 0 for k in args.few_shot):
        raise SystemExit(f"error: --few-shot values must be >= 0, got {args.few_shot}")
    try:  # an unknown task: one line before the model loads, not a traceback after
        from common.tasks import get_task

        get_task(args.task)
    except ValueError as e:
        raise SystemExit(f"error: {e}")
    if args.model == SMOLLM2 and not os.path.isdir(SMOLLM2):
        raise SystemExit(f"error: no {SMOLLM2}: make it with `python -m common.models.smollm2`, or pass --model")
    return args


def main(argv=None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import random

    import torch

    import grpo
    from common import policy, sampling
    from common.tasks import get_task

    torch.set_num_threads(args.threads)
    cpu = torch.device("cpu")
    tokenizer, model = policy.load_policy(args.model, cpu)
    task = get_task(args.task)
    questions = [p for p, _ in task.prompts(args.prompts, random.Random(0))]
    print(f"{os.path.basename(os.path.normpath(args.model))}: {args.prompts} prompts × {args.group_size} responses "
          f"of up to {args.max_new_tokens} tokens, {args.threads} thread(s), median of {args.repeats}")
    print("| few-shot | prompt tokens | response tokens | pass | plain s | shared s | plain / shared | "
          "max Δ log-prob | gradient rel. Δ |")
    print("|---|---|---|---|---|---|---|---|---|")
    for few_shot in args.few_shot:
        g = grpo.Args(model=args.model, task=args.task, few_shot=few_shot, group_size=args.group_size,
                      max_new_tokens=args.max_new_tokens, temperature=1.0)
        torch.manual_seed(0)
        model.eval()
        prompt_format = sampling.PromptFormat(tokenizer, task, few_shot, model=model)
        samples = grpo.sample(model, prompt_format, questions, g, cpu, num_samples=args.group_size)
        index = torch.arange(len(samples.responses)) // args.group_size
        inputs = (samples.prompt_ids, samples.prompt_mask, index, samples.responses, 1.0)
        mask = samples.mask.bool()

        def score(share: bool):
            model.eval()
            with torch.no_grad():
                return grpo.token_logprobs(grpo.response_logits(model, *inputs, share), samples.responses)

        def update(share: bool):
            model.train()
            model.zero_grad()
            logprobs = grpo.token_logprobs(grpo.response_logits(model, *inputs, share), samples.responses)
            (logprobs[mask].mean()).backward()
            return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

        plain, shared = score(False), score(True)
        largest = (plain - shared)[mask].abs().max().item()
        plain_grad, shared_grad = update(False), update(True)
        gradient = ((plain_grad - shared_grad).norm() / plain_grad.norm()).item()
        prompt_tokens, response_tokens = int(samples.prompt_mask.sum(1).max()), int(samples.mask.sum(1).max())
        for name, run in (("scoring", score), ("update", update)):
            seconds = {False: [], True: []}
            for _ in range(args.repeats):
                for share in (False, True):
                    start = time.perf_counter()
                    run(share)
                    seconds[share].append(time.perf_counter() - start)
            a, b = statistics.median(seconds[False]), statistics.median(seconds[True])
            ratio = statistics.median(p / s for p, s in zip(seconds[False], seconds[True]))
            print(f"| {few_shot} | {prompt_tokens} | {response_tokens} | {name} | {a:.2f} | {b:.2f} | {ratio:.2f}× | "
                  f"{largest:.1e} | {gradient:.1e} |", flush=True)


if __name__ == "__main__":
    main()
