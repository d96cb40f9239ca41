"""How far from the hardware each phase of a group-file iteration runs: its FLOPs, its seconds, and their ratio
against one core's measured float32 matrix-multiply throughput (the roofline of a CPU's compute).

    python -m common.tools.roofline                                     # SmolLM2 (python -m common.models.smollm2)
    python -m common.tools.roofline --few-shot 0 3 8 --repeats 3
    python -m common.tools.roofline --model tiny_model --prompts 32 --max-new-tokens 8    # the embedded model
    python common/tools/roofline.py --root ../old-checkout --adam loop                 # another commit's grpo.py

One iteration of grpo.py, as its main loop runs it, on --prompts questions of --task × --group-size responses:
generation (grpo.sample), scoring (score_responses: log π_θold, no gradient), and the update (update_policy: every
pass forward and backward, then Adam's step; the advantages are fixed to ±1 so every group has signal and the work
does not depend on the rewards drawn). Every phase runs on the same sampled responses.

- FLOPs: the matrix products and attention, counted by torch.utils.flop_counter.FlopCounterMode on one run of the
  phase (a multiply-add is 2 FLOPs; the backward pass counted as it runs). Elementwise work (softmax, norms, Adam)
  is not counted: it is what the roofline calls overhead.
- Seconds: the median of --repeats timed runs, one thread by default.
- The split of those seconds, from one more run in which every operation torch dispatches (aten::mm, a softmax,
  a copy, ...) is timed on its own with time.perf_counter, by a TorchDispatchMode: the seconds inside the matrix
  products and attention ("matmul"), and inside every other operation ("other ops"), each over the median; the
  rest is "Python" (the interpreter, the modules' code). A product takes 0.1 ms or more, so the timer's few
  microseconds per call hardly touch its seconds; they do swell the many small operations' (a view, an add), so
  "other ops" is an upper bound, and what is not in the products (other ops + Python) is the measure to read. No
  profiler: its bookkeeping slowed the memory-bound operations it watched (a cache copy, a softmax over the
  vocabulary) far more than the products, so its shares did not add up.
- Peak: the best GFLOP/s of 20 runs of a 1024 × 1024 by 1024 × 1024 float32 matmul on the same threads.

Per phase it prints GFLOP, seconds, GFLOP/s, the share of the peak over the whole phase, the share of the peak
within the matmul operations (how well the products themselves run: their FLOPs over their own seconds), and
the shares of the phase's median seconds in matmuls, in other operations, and in Python.
--ops N adds each phase's N operations of the most seconds in that run, as an HTML comment under its row (a
pasted table still renders). --root imports grpo.py and common/ from another checkout (run this file by path
then), so before and after are measured by the same tool; --adam says which of torch's Adam implementations the
update steps with.
"""

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMOLLM2 = os.path.join(ROOT, "runs", "SmolLM2-135M-Instruct")
# the operations that do the matrix products and attention, forward and backward (torch.ops.aten names)
MATMUL_OPS = ("mm", "addmm", "bmm", "baddbmm", "_scaled_dot_product")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=SMOLLM2, help="a model folder or .gguf file (default: SmolLM2)")
    parser.add_argument("--root", default=ROOT, help="the checkout whose grpo.py is measured (default: this one)")
    parser.add_argument("--task", default="addition2", help="the task whose prompts are formatted (default: addition2)")
    parser.add_argument("--few-shot", type=int, nargs="+", default=[3], help="solved examples before each question")
    parser.add_argument("--prompts", type=int, default=8, help="B, prompts of the iteration (default: 8)")
    parser.add_argument("--group-size", type=int, default=8, help="G, responses per prompt (default: 8)")
    parser.add_argument("--max-new-tokens", type=int, default=16, help="response length cap (default: 16)")
    parser.add_argument("--micro-batch-size", type=int, default=16, help="responses per pass (default: 16)")
    parser.add_argument("--num-minibatches", type=int, default=4, help="optimiser steps (default: 4)")
    parser.add_argument("--adam", choices=("fused", "loop"), default="fused",
                        help="torch's Adam: fused, or a loop over the parameters, its CPU default (default: fused)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per phase (default: 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    parser.add_argument("--ops", type=int, default=0,
                        help="after each phase, its N operations of the most seconds (default: 0, none)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the prompts and of the sampled responses")
    args = parser.parse_args(argv)
    for flag, value, least in (("--prompts", args.prompts, 1), ("--group-size", args.group_size, 2),
                               ("--max-new-tokens", args.max_new_tokens, 1), ("--repeats", args.repeats, 1),
                               ("--threads", args.threads, 1), ("--micro-batch-size", args.micro_batch_size, 1),
                               ("--num-minibatches", args.num_minibatches, 1), ("--ops", args.ops, 0)):
        if value < least:
            raise SystemExit(f"error: {flag} must be >= {least}, got {value}")
    if any(k < 0 for k in args.few_shot):
        raise SystemExit(f"error: --few-shot values must be >= 0, got {args.few_shot}")
    if args.prompts % args.num_minibatches or (args.prompts // args.num_minibatches * args.group_size
                                               % args.micro_batch_size):
        raise SystemExit(f"error: --num-minibatches must divide --prompts, and --micro-batch-size the responses of a "
                         f"minibatch, got {args.num_minibatches} and {args.micro_batch_size}")
    if not os.path.isfile(os.path.join(args.root, "grpo.py")):
        raise SystemExit(f"error: --root {args.root}: no grpo.py there")
    if args.model == SMOLLM2 and not os.path.isdir(SMOLLM2):
        raise SystemExit(f"error: no {SMOLLM2}: make it with `python -m common.models.smollm2`, or pass --model")
    return args


def matmul_peak(torch, repeats: int = 20) -> float:
    """FLOP/s of a large float32 matmul on the current threads, the best of `repeats`: what the kernels can do."""
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    a @ b  # warm-up
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        seconds.append(time.perf_counter() - start)
    return 2 * 1024**3 / min(seconds)


def op_seconds(run) -> dict:
    """Seconds of `run()` in each operation torch dispatches, by name ("mm", "_softmax", ...): each call timed on its
    own (a TorchDispatchMode sees them all, the backward pass's included)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seconds = {}

    class Timer(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            start = time.perf_counter()
            out = func(*args, **(kwargs or {}))
            name = func.__name__.split(".")[0]
            seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - start
            return out

    with Timer():
        run()
    return seconds


def matmul_and_other(seconds: dict) -> tuple[float, float]:
    """Of op_seconds' seconds by operation, those inside the matrix products and attention, and those of the rest."""
    matmul = sum(s for name, s in seconds.items() if name.startswith(MATMUL_OPS))
    return matmul, sum(seconds.values()) - matmul


def attention_flops(torch) -> dict:
    """FlopCounterMode's formulas for the CPU's attention kernel, forward and backward: torch counts only the GPU's
    (flash, efficient, cuDNN), so on a CPU the attention's products were counted as 0 FLOPs. The GPU's formulas are
    reused, so a CPU and a GPU count the same work (the full T × T scores, as torch counts them, causal or not)."""
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    aten = torch.ops.aten

    def forward(query, key, value, *args, out_shape=None, **kwargs):
        return sdpa_flop_count(query, key, value)

    def backward(grad_out, query, key, value, *args, out_shape=None, **kwargs):
        return sdpa_backward_flop_count(grad_out, query, key, value)

    return {aten._scaled_dot_product_flash_attention_for_cpu: forward,
            aten._scaled_dot_product_flash_attention_for_cpu_backward: backward}


def measure(run, repeats: int, reset=lambda: None) -> dict:
    """FLOPs, median seconds, and seconds in matmul and in other operations of `run()`, with `reset()` (untimed)
    after each run."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False, custom_mapping=attention_flops(torch))
    with counter:
        run()
    reset()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - start)
        reset()
    ops = op_seconds(run)
    reset()
    matmul, other = matmul_and_other(ops)
    return {"flops": counter.get_total_flops(), "seconds": statistics.median(seconds), "matmul_seconds": matmul,
            "other_seconds": other, "ops": ops}


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    root = os.path.abspath(args.root)
    if root != ROOT and "common" in sys.modules:  # run as a module of this checkout: start again as a file, there
        os.chdir(root)
        os.execv(sys.executable, [sys.executable, os.path.abspath(__file__), *argv])
    sys.path.insert(0, root)
    from common.tasks import get_task  # --root's tasks: an unknown one is one line before anything loads

    try:
        task = get_task(args.task)
    except ValueError as e:
        raise SystemExit(f"error: {e}")
    import random

    import torch

    import grpo
    from common import policy, processes, sampling

    torch.set_num_threads(args.threads)
    cpu = torch.device("cpu")
    peak = matmul_peak(torch)
    tokenizer, model = policy.load_policy(args.model, cpu)
    questions = [p for p, _ in task.prompts(args.prompts, random.Random(args.seed))]
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-5,
                                 fused=args.adam == "fused", foreach=False)
    forward = grpo.Forward(torch.autocast("cpu", enabled=False), share_prompt=True)
    print(f"{os.path.basename(os.path.normpath(args.model))}, grpo.py of {root}: {args.prompts} prompts × "
          f"{args.group_size} responses of up to {args.max_new_tokens} tokens, passes of {args.micro_batch_size}, "
          f"Adam {args.adam}, {args.threads} thread(s), median of {args.repeats}; "
          f"matmul peak {peak / 1e9:.1f} GFLOP/s")
    print("| few-shot | prompt tokens | response tokens | phase | GFLOP | s | GFLOP/s | of peak | matmuls at | "
          "in matmuls | in other ops | in Python |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for few_shot in args.few_shot:
        g = grpo.Args(model=args.model, task=args.task, few_shot=few_shot, group_size=args.group_size,
                      max_new_tokens=args.max_new_tokens, temperature=1.0, beta=0.0, learning_rate=1e-5,
                      prompts_per_iteration=args.prompts, num_minibatches=args.num_minibatches,
                      micro_batch_size=args.micro_batch_size)
        # ±1 within each group: every group has signal, so every pass runs whatever the rewards
        advantages = torch.tensor([1.0, -1.0]).repeat(args.prompts * args.group_size // 2)
        torch.manual_seed(args.seed)
        epochs = [processes.draw_minibatches(advantages, args.group_size, num_minibatches=args.num_minibatches,
                                             micro_batch_size=args.micro_batch_size, skip_no_signal=True)]
        model.eval()
        prompt_format = sampling.PromptFormat(tokenizer, task, few_shot, model=model)
        samples = grpo.sample(model, prompt_format, questions, g, cpu, num_samples=args.group_size)
        weights = {name: p.detach().clone() for name, p in model.named_parameters()}

        def generate():
            torch.manual_seed(args.seed)
            model.eval()
            grpo.sample(model, prompt_format, questions, g, cpu, num_samples=args.group_size)

        def score():
            return grpo.score_responses(model, None, samples, epochs[0], g, forward)[0]

        old_logprobs = score()
        rollout = grpo.Rollout(samples.prompt_ids, samples.prompt_mask, samples.responses, samples.mask, advantages,
                               old_logprobs, None)

        def update():
            grpo.update_policy(model, optimizer, rollout, epochs, g, forward)

        @torch.no_grad()
        def restore():  # the same weights for every run: each update starts where the first did
            for name, p in model.named_parameters():
                p.copy_(weights[name])

        prompt_tokens = int(samples.prompt_mask.sum(1).max())
        response_tokens = int(samples.mask.sum(1).max())
        phases = {}
        for name, run, reset in (("generation", generate, None), ("scoring", score, None), ("update", update, restore)):
            phases[name] = measure(run, args.repeats, reset or (lambda: None))
            print_row(few_shot, prompt_tokens, response_tokens, name, phases[name], peak)
            if args.ops:
                top = sorted(phases[name]["ops"].items(), key=lambda item: -item[1])[:args.ops]
                print(f"<!-- {name}: " + ", ".join(f"{op} {s:.2f} s" for op, s in top) + " -->", flush=True)
        whole = {key: sum(phase[key] for phase in phases.values())
                 for key in ("flops", "seconds", "matmul_seconds", "other_seconds")}
        print_row(few_shot, prompt_tokens, response_tokens, "iteration", whole, peak)


def print_row(few_shot: int, prompt_tokens: int, response_tokens: int, name: str, m: dict, peak: float) -> None:
    rate = m["flops"] / m["seconds"]
    in_matmuls = m["flops"] / m["matmul_seconds"] if m["matmul_seconds"] else float("nan")  # their own seconds
    matmul_share = min(m["matmul_seconds"] / m["seconds"], 1.0)
    other_share = min(m["other_seconds"] / m["seconds"], 1.0 - matmul_share)
    print(f"| {few_shot} | {prompt_tokens} | {response_tokens} | {name} | {m['flops'] / 1e9:.3g} | "
          f"{m['seconds']:.3g} | {rate / 1e9:.1f} | {rate / peak:.0%} | {in_matmuls / peak:.0%} | "
          f"{matmul_share:.0%} | {other_share:.0%} | {1 - matmul_share - other_share:.0%} |", flush=True)


if __name__ == "__main__":
    main()
