"""Sharpen or teach? pass@k of a model before and after RL, for k = 1 ... n, on the held-out questions.

    python -m common.lab sharpen-or-teach --models runs/SmolLM2-135M-Instruct runs/<grpo run>/model \\
        runs/<dapo run>/model --labels base grpo dapo --samples 64 --prompts 64

Whether RL teaches a model answers it could not sample before, or only makes it sample more often the answers it
already could, is an open question (Yue et al. 2025, arXiv 2504.13837: RL raises pass@1, while the base model
catches up at large k). Here each model samples --samples responses to each of --prompts held-out questions of
--task, formatted and sampled exactly as grpo.py does (its sample(), at temperature 1), and pass@k is estimated
without bias from those n samples (Chen et al. 2021: 1 − C(n − c, k) / C(n, k), averaged over the questions).
If RL only sharpens, the trained curve starts higher and meets (or falls under) the base curve as k grows; if it
teaches, it stays above at k = n: questions the base model never answered in n tries are now answered.

Writes <out>/sharpen-or-teach.{json,md,png} (default out: runs/lab; --update-results: common/results/lab).
"""

import argparse
import json
import os
import random
import shlex
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

NAME = "sharpen-or-teach"


def pass_curves(right: list[list[float]]) -> list[float]:
    """pass@k for k = 1 ... n, averaged over the questions, from each question's n rewards (1 = right)."""
    from common.runs import pass_at_k

    n = len(right[0])
    counts = [sum(r == 1 for r in rewards) for rewards in right]
    return [sum(pass_at_k(n, c, k) for c in counts) / len(counts) for k in range(1, n + 1)]


def sample_rewards(model_path: str, args) -> list[list[float]]:
    """The rewards of --samples responses to each held-out question, sampled as grpo.py samples them."""
    import torch

    import grpo
    from common import policy, sampling
    from common.lab.lab import duration
    from common.tasks import EVAL_SEED, get_task

    task = get_task(args.task)
    questions = task.prompts(args.prompts, random.Random(EVAL_SEED), split="test")  # grpo.py's held-out questions
    tokenizer, model = policy.load_policy(model_path, torch.device("cpu"))
    model.eval()
    g = grpo.Args(model=model_path, task=args.task, few_shot=args.few_shot, max_new_tokens=args.max_new_tokens,
                  temperature=1.0)
    prompt_format = sampling.PromptFormat(tokenizer, task, args.few_shot, model=model)
    torch.manual_seed(args.seed)
    rewards, began = [], time.time()
    for start in range(0, len(questions), args.chunk):
        chunk = questions[start : start + args.chunk]
        samples = grpo.sample(model, prompt_format, [q for q, _ in chunk], g, torch.device("cpu"), args.samples)
        texts = prompt_format.decode(samples.responses, samples.mask)
        for i, (_, target) in enumerate(chunk):
            rewards.append([task.reward(text, target) for text in texts[i * args.samples : (i + 1) * args.samples]])
        seconds = time.time() - began
        eta = seconds / len(rewards) * (len(questions) - len(rewards))  # this model's questions left, at its pace
        print(f"  {model_path}: {len(rewards)}/{len(questions)} questions {duration(seconds)}, ETA {duration(eta)}",
              flush=True)
    return rewards


def plot(curves: dict, samples: int, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ks = list(range(1, samples + 1))
    for label, curve in curves.items():
        ax.plot(ks, curve, label=label, marker="o", markersize=2)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k (samples per question)")
    ax.set_ylabel("pass@k on the held-out questions")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("sharpen or teach? pass@k before and after RL")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m common.lab sharpen-or-teach", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", required=True, help="model folders (the first: the model before RL)")
    parser.add_argument("--labels", nargs="+",
                        help="a label per model (default: the folder names, or their paths where two names are alike)")
    parser.add_argument("--task", default="addition2", help="the task (default: addition2)")
    parser.add_argument("--few-shot", type=int, default=3, help="examples before each question (default: 3)")
    parser.add_argument("--max-new-tokens", type=int, default=16, help="response length cap (default: 16)")
    parser.add_argument("--samples", type=int, default=64, help="n, responses per question (default: 64)")
    parser.add_argument("--prompts", type=int, default=64, help="held-out questions (default: 64)")
    parser.add_argument("--chunk", type=int, default=8, help="questions per sampling call (default: 8)")
    parser.add_argument("--seed", type=int, default=1, help="torch seed of the sampling (default: 1)")
    parser.add_argument("--out", default="runs/lab", help="folder of the figure and tables (default: runs/lab)")
    parser.add_argument("--update-results", action="store_true", help="write into common/results/lab instead")
    args = parser.parse_args(argv)
    labels = args.labels or [os.path.basename(os.path.normpath(m)) for m in args.models]
    if args.labels is None and len(set(labels)) < len(labels):  # runs/<run>/model twice: label by the whole path
        labels = [os.path.normpath(m) for m in args.models]
    if len(labels) != len(args.models):
        parser.error(f"--labels needs one label per model: {len(args.models)} models, {len(labels)} labels")
    twice = [label for label in labels if labels.count(label) > 1]
    if twice:  # the curves are kept by label: a second model of the same label would replace the first
        parser.error(f"--labels: each model needs a label of its own ({twice[0]!r} twice)")
    for flag, value, least in (("--samples", args.samples, 1), ("--prompts", args.prompts, 1),
                               ("--chunk", args.chunk, 1), ("--few-shot", args.few_shot, 0),
                               ("--max-new-tokens", args.max_new_tokens, 1)):
        if value < least:
            parser.error(f"{flag} must be >= {least}, got {value}")
    try:  # before any model is loaded: an unknown task must not cost a model's minutes of sampling first
        from common.tasks import get_task

        get_task(args.task)
    except ValueError as e:
        parser.error(str(e))
    missing = [m for m in args.models if not os.path.exists(m)]
    if missing:
        parser.error(f"--models: no such folder: {missing[0]}")
    out = os.path.join(ROOT, "common", "results", "lab") if args.update_results else args.out
    os.makedirs(out, exist_ok=True)
    start, rewards = time.time(), {}
    for label, model in zip(labels, args.models):
        rewards[label] = sample_rewards(model, args)
    curves = {label: pass_curves(r) for label, r in rewards.items()}
    with open(os.path.join(out, f"{NAME}.json"), "w") as f:
        json.dump({"models": dict(zip(labels, args.models)), "args": vars(args), "curves": curves,
                   "rewards": rewards}, f)
    ks = [k for k in (1, 2, 4, 8, 16, 32, 64, 128, 256) if k <= args.samples]
    lines = [f"# {NAME}", "", f"`python -m common.lab {NAME} {shlex.join(sys.argv[1:] if argv is None else argv)}`", "",
             f"{args.prompts} held-out questions of {args.task}, {args.samples} samples each at temperature 1, "
             f"--few-shot {args.few_shot}, --max-new-tokens {args.max_new_tokens}; "
             f"{(time.time() - start) / 60:.0f} min.",
             "", "| model | " + " | ".join(f"pass@{k}" for k in ks) + " |", "|---|" + "---|" * len(ks)]
    lines += [f"| {label} | " + " | ".join(f"{curve[k - 1]:.3f}" for k in ks) + " |" for label, curve in curves.items()]
    with open(os.path.join(out, f"{NAME}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    plot(curves, args.samples, os.path.join(out, f"{NAME}.png"))
    print("\n".join(lines[6:]))
    print(f"wrote {os.path.join(out, NAME)}.json/.md/.png")


if __name__ == "__main__":
    main()
