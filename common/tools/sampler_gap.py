"""The sampler/trainer gap of grpo.py and what each sampler costs: how far the log-probs the sampler computed as
it drew each token (a KV cache, one token at a time) are from those the float32 update scores as π_θold (whole
passes), |log μ − log π_θold| per response token, its mean and its largest; and the seconds of drawing the
responses and of scoring them (the pass that --old-logprobs sampler skips).

    python -m common.tools.sampler_gap                     # SmolLM2 (python -m common.models.smollm2), seeds 1-3
    python -m common.tools.sampler_gap --model common/models/tiny_model --task addition --few-shot 0

For each seed: --prompts questions of --task, --group-size responses each (grpo.py's sample()), then scoring in the
update's passes of --micro-batch-size responses (score_responses), then runs.sampler_gap, what a run logs as
charts/sampler_gap_mean and _max. The samplers: the float32 policy itself, the policy under bfloat16 autocast
(a GPU's recipe, casting on every call), and the copies --sampler-dtype makes once per update (sampling.Sampler).
The same weights every way: the gap is the arithmetic's, not the policy's. --threads 1 (the default) times one
core, the way the speed figures of common/results/ are measured.
"""

import argparse
import os
import random
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)  # grpo.py's sample() and score_responses() are what is measured
SMOLLM2 = os.path.join(ROOT, "runs", "SmolLM2-135M-Instruct")
SAMPLERS = ("float32", "bfloat16 autocast", "bfloat16 copy", "float16 copy")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=SMOLLM2, help="a model folder or .gguf file (default: SmolLM2)")
    parser.add_argument("--task", default="addition2", help="the task whose prompts are formatted (default: addition2)")
    parser.add_argument("--few-shot", type=int, default=3, help="solved examples before each question (default: 3)")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per seed (default: 8)")
    parser.add_argument("--group-size", type=int, default=8, help="G, responses per prompt (default: 8)")
    parser.add_argument("--max-new-tokens", type=int, default=16, help="response length cap (default: 16)")
    parser.add_argument("--micro-batch-size", type=int, default=16, help="responses per scoring pass (default: 16)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="seeds (default: 1 2 3)")
    parser.add_argument("--samplers", nargs="+", choices=SAMPLERS, default=list(SAMPLERS),
                        help="which samplers to measure (default: all)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1, one core)")
    args = parser.parse_args(argv)
    for flag, value, least in (("--prompts", args.prompts, 1), ("--group-size", args.group_size, 2),
                               ("--max-new-tokens", args.max_new_tokens, 1), ("--few-shot", args.few_shot, 0),
                               ("--micro-batch-size", args.micro_batch_size, 1), ("--threads", args.threads, 1)):
        if value < least:
            raise SystemExit(f"error: {flag} must be >= {least}, got {value}")
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
    import torch

    import grpo
    from common import policy, processes, runs, sampling
    from common.tasks import get_task

    torch.set_num_threads(args.threads)
    cpu = torch.device("cpu")
    tokenizer, model = policy.load_policy(args.model, cpu)
    task = get_task(args.task)
    g = grpo.Args(model=args.model, task=args.task, few_shot=args.few_shot, group_size=args.group_size,
                  max_new_tokens=args.max_new_tokens, micro_batch_size=args.micro_batch_size, beta=0.0)
    prompt_format = sampling.PromptFormat(tokenizer, task, args.few_shot, model=model)
    n = args.prompts * args.group_size
    first_epoch = [processes.Minibatch(torch.arange(n), list(torch.arange(n).split(args.micro_batch_size)))]
    no_autocast, bf16_autocast = torch.autocast("cpu", enabled=False), torch.autocast("cpu", dtype=torch.bfloat16)
    copies = {name: sampling.Sampler(model, name.split()[0]).model for name in args.samplers if "copy" in name}
    samplers = {"float32": (model, no_autocast), "bfloat16 autocast": (model, bf16_autocast),
                **{name: (copy, no_autocast) for name, copy in copies.items()}}
    print("| seed | sampler | mean gap | largest gap | tokens drawn | sampling s | scoring s |")
    print("|---|---|---|---|---|---|---|")
    for seed in args.seeds:
        questions = [question for question, _ in task.prompts(args.prompts, random.Random(seed))]
        for name in args.samplers:
            sampler, autocast = samplers[name]
            torch.manual_seed(seed)
            start = time.perf_counter()
            with autocast:
                samples = grpo.sample(sampler.eval(), prompt_format, questions, g, cpu, num_samples=args.group_size)
            sampled = time.perf_counter()
            forward = grpo.Forward(no_autocast, share_prompt=True)  # π_θold: the float32 trainer's scoring
            old_logprobs, _ = grpo.score_responses(model, None, samples, first_epoch, g, forward)
            scored = time.perf_counter()
            gap = runs.sampler_gap(samples.logprobs, old_logprobs, samples.mask, first_epoch)
            print(f"| {seed} | {name} | {gap['charts/sampler_gap_mean']:.2e} | {gap['charts/sampler_gap_max']:.2e} | "
                  f"{int(samples.mask.sum())} | {sampled - start:.2f} | {scored - sampled:.2f} |", flush=True)

if __name__ == "__main__":
    main()
