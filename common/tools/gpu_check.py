"""The GPU check: one command that runs the group files on a GPU and prints their figures, ready for
common/results/gpu.md. Nothing is downloaded: the models are random weights in real configurations
(common/tools/scale.py), and random weights cost what trained ones cost.

    python -m common.tools.gpu_check                                # one GPU: at most 9 minutes
    python -m common.tools.gpu_check --out common/results/gpu.md    # the tables also written to a file
    python -m common.tools.gpu_check --dry-run                      # tiny shapes on the CPU: the suite runs it

Each step runs in a process of its own, bounded in time; it prints its table when it ends, or one
line when it fails or runs out of time, and the next step begins.

1. machine: torch, CUDA, transformers, the card and its memory.
2. numerics of the GPU recipe (bfloat16 autocast, the output layer in float32), for each group file on
   one batch: the largest |log π_θ − log π_θold| at the first step (0 exactly: the update's pass reads
   the scoring pass's kernels), the sampler gap (mean, max), and one gradient step (SGD at lr 1, so
   the step is the clipped gradient) against the same step in float32: ‖Δ − Δ_float32‖ / ‖Δ_float32‖.
   At ratio 1 with responses of one length (random weights rarely stop) the five losses share one
   gradient direction: alike rows say the files' code paths agree, not that their math does.
3. embedded: `python grpo.py` with no flag: seconds per iteration and the held-out accuracy at the
   end, beside the CPU's.
4. scale: Qwen2.5-0.5B's and -1.5B's configurations under grpo.py with the GPU defaults (2
   iterations, the first warming up): the pass size chosen, the memory estimate beside the measured
   peak (torch.cuda.max_memory_allocated), seconds per phase, generated tokens per second.
5. generation: one iteration's batch on Qwen2.5-0.5B's configuration: `sample` eager and compiled
   (--compile-decoding: the compile seconds, and the share of responses whose tokens are eager's:
   its float32 rounding differs, so a rare draw can flip) against Hugging Face's `generate` (the
   same batch, sampling at temperature 1, no top-k).
6. refusals that stay one line on a GPU: a pass size that does not divide the minibatch, and
   Qwen2.5-7B and -14B fully fine-tuned on one card (refused where the training state leaves no room for a pass).
"""

import argparse
import copy
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:  # the group files are imported by name
    sys.path.insert(0, ROOT)

MODULES = ["grpo", "dr_grpo", "dapo", "gspo", "sapo"]
# What each step runs on: a GPU, or the dry run's tiny shapes on the CPU (B prompts × G responses, T new tokens).
SHAPES = {
    "gpu": dict(numerics="qwen2.5-0.5b", scale=["qwen2.5-0.5b", "qwen2.5-1.5b"], generation="qwen2.5-0.5b",
                B=32, G=8, T=256, compile=True, embedded=[], scale_flags=["--num-iterations", "2"]),
    "dry": dict(numerics="qwen2.5-tiny", scale=["qwen2.5-tiny"], generation="qwen2.5-tiny", B=4, G=4, T=8,
                compile=False, embedded=["--num-iterations", "1", "--eval-size", "8"],
                scale_flags=["--num-iterations", "2", "--prompts-per-iteration", "4", "--max-new-tokens", "8"]),
}
# Each step's limit: 535 s in all, so that with the models' building (~20 s) the check stays within the 10 minutes
# of one call to a lent GPU (seen on an H200: machine 7 s, numerics 27, embedded 43, generation 75-110+, refusals
# 10-14; 3 iterations of Qwen2.5-0.5B took over 60 s, so scale runs 2, the first warming up)
STEP_SECONDS = {"machine": 20, "numerics": 45, "embedded": 65, "scale": 240, "generation": 150, "refusals": 15}
# The embedded `python grpo.py` (seed 1, 150 iterations) on a CPU core: common/results/group.md
EMBEDDED_ON_CPU = "| a CPU core (common/results/group.md) | 150 | 0.17 | 0.908 (the mean of the last 3 evaluations) |"


def step_machine(shapes, folders) -> list[str]:
    import torch
    import transformers

    lines = ["| torch | CUDA | transformers | device | memory |", "|---|---|---|---|---|"]
    if torch.cuda.is_available():
        card = torch.cuda.get_device_properties(0)
        device, memory = card.name, f"{card.total_memory / 2**30:.1f} GiB"
    else:
        device, memory = f"CPU, {os.cpu_count()} cores", "-"
    return lines + [f"| {torch.__version__} | {torch.version.cuda or '-'} | {transformers.__version__} | {device} | "
                    f"{memory} |"]


def step_numerics(shapes, folders) -> list[str]:
    """The GPU recipe against float32, each group file on the same batch (see the module's docstring)."""
    import importlib

    import torch

    from common import policy, processes, sampling
    from common.tasks import get_task

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    lines = ["| file | first step's max \\|log-ratio\\| | sampler gap mean | sampler gap max | "
             "step vs float32's, relative |", "|---|---|---|---|---|"]
    for name in MODULES:
        module = importlib.import_module(name)
        args = module.Args(model=folders[shapes["numerics"]], task="addition", few_shot=0, prompts_per_iteration=4,
                           group_size=4, max_new_tokens=16, num_minibatches=1, beta=0.04, learning_rate=1.0)
        policy.resolve_defaults(args, beta=module.BETA)
        tokenizer, recipe_model = policy.load(args, device)
        float32_model = copy.deepcopy(recipe_model)
        task = get_task("addition")
        prompt_format = sampling.PromptFormat(tokenizer, task, 0, model=recipe_model)
        questions = [question for question, _ in task.prompts(4, random.Random(0))]
        recipe = module.Forward(torch.autocast(device.type, dtype=torch.bfloat16), share_prompt=True)
        float32 = module.Forward(torch.autocast(device.type, enabled=False), share_prompt=True)
        torch.manual_seed(0)
        with torch.no_grad(), recipe.autocast:
            samples = module.sample(recipe_model.eval(), prompt_format, questions, args, device, args.group_size)
        rewards = (torch.arange(16, device=device) % 3 == 0).float()  # right and wrong in every group
        advantages = module.compute_advantages(rewards, args.group_size)
        epochs = [processes.draw_minibatches(advantages, args.group_size, num_minibatches=1, micro_batch_size=16,
                                             skip_no_signal=False)]
        passes = [inds for minibatch in epochs[0] for inds in minibatch.passes]
        steps, log_ratio, gap = {}, 0.0, None
        for which, model, forward in (("recipe", recipe_model, recipe), ("float32", float32_model, float32)):
            ref_model = module.reference_model(model, args, bf16=which == "recipe")
            old, ref = module.score_responses(model, ref_model, samples, epochs[0], args, forward)
            model.train()
            if which == "recipe":
                mask = samples.mask.bool()
                gap = (samples.logprobs - old)[mask].abs()
                with torch.no_grad():
                    for inds in passes:
                        new = module.logprobs_of(model, samples, inds, args, forward)
                        log_ratio = max(log_ratio, float((new - old[inds])[mask[inds]].abs().max()))
            trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
            before = {n: p.detach().clone() for n, p in trained.items()}
            rollout = module.Rollout(samples.prompt_ids, samples.prompt_mask, samples.responses, samples.mask,
                                     advantages, old, ref)
            module.update_policy(model, torch.optim.SGD(trained.values(), lr=1.0), rollout, epochs, args, forward)
            steps[which] = torch.cat([(p.detach() - before[n]).flatten() for n, p in trained.items()])
        relative = (steps["recipe"] - steps["float32"]).norm() / steps["float32"].norm()
        lines.append(f"| {name}.py | {log_ratio:.1e} | {gap.mean():.1e} | {gap.max():.1e} | {relative:.3f} |")
        print(lines[-1], flush=True)
    return lines


def run_script(flags: list[str], timeout: float) -> tuple[str, dict]:
    """`python grpo.py <flags>` in a folder of its own: its console and its TensorBoard scalars."""
    with tempfile.TemporaryDirectory() as cwd:
        result = subprocess.run([sys.executable, os.path.join(ROOT, "grpo.py"), *flags], cwd=cwd, text=True,
                                capture_output=True, timeout=timeout)
        if result.returncode != 0:
            tail = (result.stderr.strip() or result.stdout.strip()).splitlines()[-1:]
            raise RuntimeError(f"grpo.py {' '.join(flags)} failed: {' '.join(tail)}")
        from common.tools.scale import scalars

        runs = os.listdir(os.path.join(cwd, "runs"))
        return result.stdout, scalars(os.path.join(cwd, "runs", runs[0]))


def median(values: list[float]) -> float:
    return statistics.median(values[1:] if len(values) > 1 else values)  # the first iteration warms up


def step_embedded(shapes, folders) -> list[str]:
    console, values = run_script(["--seed", "1", *shapes["embedded"]], STEP_SECONDS["embedded"] - 10)
    held_out = re.findall(r"held-out ([\d.]+) \(greedy ([\d.]+)\)", console)[-1]
    seconds = sum(median(values[f"perf/{phase}_seconds"]) for phase in ("generate", "logprob", "update"))
    return ["| where | iterations | s / iteration (generate + log-probs + update) | held-out at the end (greedy) |",
            "|---|---|---|---|",
            f"| here | {len(values['perf/iteration_seconds'])} | {seconds:.2f} | {held_out[0]} ({held_out[1]}) |",
            EMBEDDED_ON_CPU]


def step_scale(shapes, folders) -> list[str]:
    """grpo.py's defaults on real shapes: the pass size and its estimate against the measured peak."""
    import torch

    card = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None
    lines = ["| model | pass size | estimated peak | measured peak | generate s | log-probs s | update s | "
             "tokens / s |", "|---|---|---|---|---|---|---|---|"]
    for name in shapes["scale"]:
        limit = STEP_SECONDS["scale"] / len(shapes["scale"]) - 10
        try:
            console, values = run_script(["--model", folders[name], "--eval-size", "1", *shapes["scale_flags"]], limit)
        except subprocess.TimeoutExpired:
            lines.append(f"| {name} | ran out of its {limit:.0f} s | | | | | | |")
            print(lines[-1], flush=True)
            continue
        size, budget, per_response = re.search(
            r"--micro-batch-size (\d+) .*within ([\d.]+) GiB, at an estimated ([\d,.]+) MB each", console).groups()
        per_response = float(per_response.replace(",", "")) * 2**20
        if card is None:  # the CPU's budget is fixed: no card to estimate a peak against
            estimated = f"{int(size) * per_response / 2**30:.2f} GiB (passes only)"
        else:  # the budget is half of what 90 % of the card leaves after the state: the state is the rest
            state = 0.9 * card - 2 * float(budget) * 2**30
            estimated = f"{(state + int(size) * per_response) / 2**30:.1f} GiB"
        peak = max(values.get("perf/peak_gpu_memory_gb", [0.0]))
        phases = [f"{median(values[f'perf/{phase}_seconds']):.2f}" for phase in ("generate", "logprob", "update")]
        lines.append(f"| {name} | {size} | {estimated} | {f'{peak:.1f} GiB' if card else '-'} | "
                     f"{' | '.join(phases)} | {median(values['charts/tokens_per_second']):.0f} |")
        print(lines[-1], flush=True)
    return lines


def step_generation(shapes, folders) -> list[str]:
    """sample eager and compiled against generate, one batch of B × G responses of T tokens."""
    import torch

    import grpo
    from common import policy, sampling
    from common.tasks import get_task

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer, model = policy.load_policy(folders[shapes["generation"]], device)
    model.eval()
    task = get_task("addition")
    prompt_format = sampling.PromptFormat(tokenizer, task, 0, model=model)
    questions = [question for question, _ in task.prompts(shapes["B"], random.Random(0))]
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    def timed(call):
        torch.manual_seed(0)
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.no_grad(), autocast:
            result = call()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return result, time.perf_counter() - start

    def draw(compiled: bool):
        args = grpo.Args(max_new_tokens=shapes["T"], temperature=1.0, compile_decoding=compiled)
        return grpo.sample(model, prompt_format, questions, args, device, shapes["G"])

    def sampler_gap(samples) -> str:  # mean |log-prob the sampler kept − the scoring pass's|, as in numerics
        args, forward = grpo.Args(temperature=1.0, group_size=shapes["G"]), grpo.Forward(autocast, share_prompt=True)
        gaps = []
        for start in range(0, len(samples.responses), 16):
            inds = torch.arange(start, min(start + 16, len(samples.responses)), device=device)
            with torch.no_grad():
                scored = grpo.logprobs_of(model, samples, inds, args, forward)
            gaps.append((samples.logprobs[inds] - scored)[samples.mask[inds].bool()].abs())
        return f"{torch.cat(gaps).mean():.1e}"

    eager, eager_seconds = timed(lambda: draw(False))
    if shapes["compile"]:
        _, first_call = timed(lambda: draw(True))
        compiled, compiled_seconds = timed(lambda: draw(True))
        # bfloat16 sums in another order can flip a draw, and a response differs from there on: the median
        # token at which they part says whether the two decode alike (a bug would part them at the first token)
        differs = eager.responses != compiled.responses
        parted = differs.float().argmax(dim=1)[differs.any(dim=1)]
        same = f"{1 - len(parted) / len(differs):.1%} of the responses whole" + (
            f", the rest part at token {parted.float().median():.0f} (median)" if len(parted) else "")
        compiled_row = (f"| sample, --compile-decoding | {compiled_seconds:.2f} | "
                        f"{eager.responses.numel() / compiled_seconds:,.0f} | {first_call:.1f} s | {same} | "
                        f"{sampler_gap(compiled)} |")
    else:  # tests/test_group_real_models.py checks its tokens; compiling costs the suite a minute
        compiled_row = "| sample, --compile-decoding | not in the dry run | | | | |"
    ids, mask = prompt_format.encode(questions, device)
    generated, generate_seconds = timed(lambda: model.generate(
        input_ids=ids.repeat_interleave(shapes["G"], 0), attention_mask=mask.repeat_interleave(shapes["G"], 0),
        do_sample=True, temperature=1.0, top_k=None, top_p=None, max_new_tokens=shapes["T"],
        min_new_tokens=shapes["T"], pad_token_id=prompt_format.pad_id))
    tokens = eager.responses.numel()
    return [f"{shapes['B']} prompts × {shapes['G']} responses × {shapes['T']} tokens ({shapes['generation']}):", "",
            "| decoding | seconds | tokens / s | first call (compiles) | eager's tokens | sampler gap mean |",
            "|---|---|---|---|---|---|",
            f"| sample, eager | {eager_seconds:.2f} | {tokens / eager_seconds:,.0f} | - | - | {sampler_gap(eager)} |",
            compiled_row,
            f"| Hugging Face generate | {generate_seconds:.2f} | "
            f"{(generated.shape[1] - ids.shape[1]) * len(generated) / generate_seconds:,.0f} | - | - | - |"]


def step_refusals(shapes, folders) -> list[str]:
    """The lines a user gets; both are checked before anything heavy runs."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    import grpo
    from common import policy
    from common.tools.scale import CONFIGS

    lines = []
    try:
        args = grpo.Args(micro_batch_size=24)  # the embedded model: nothing is loaded
        policy.resolve_defaults(args, beta=grpo.BETA)
        grpo.check_args(args, world_size=1)
        lines.append("- --micro-batch-size 24: NOT refused")
    except SystemExit as e:
        lines.append(f"- `--micro-batch-size 24`: {e}")
    card = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else 80 * 10**9
    for name in ["qwen2.5-7b", "qwen2.5-14b"]:  # 7B's state fits a 141 GB card, not an 80 GB one; 14B's fits neither
        model_type, fields = CONFIGS[name]
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **fields))
        state = policy.model_state_bytes(model, None, processes=1)
        per_response = policy.response_bytes(256, 64, 8, model.config, 2)
        try:
            policy.refuse_what_does_not_fit(policy.pass_budget(card, state), per_response, state, card)
            lines.append(f"- {name} fully fine-tuned on one card: fits (its training state {state / 2**30:.1f} GiB "
                         f"of the card's {card / 2**30:.1f} GiB), not refused")
        except SystemExit as e:
            lines.append(f"- {name} fully fine-tuned on one card: {e}")
    return lines


STEPS = {"machine": step_machine, "numerics": step_numerics, "embedded": step_embedded, "scale": step_scale,
         "generation": step_generation, "refusals": step_refusals}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (what the test suite runs)")
    parser.add_argument("--out", default=None, help="also write the tables to this markdown file")
    parser.add_argument("--steps", nargs="+", choices=list(STEPS), default=list(STEPS), help="default: all")
    parser.add_argument("--step", choices=list(STEPS), help=argparse.SUPPRESS)  # one step, in its own process
    parser.add_argument("--folders", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    shapes = SHAPES["dry" if args.dry_run else "gpu"]
    if args.step:  # a child: run one step, print its table
        folders = dict(item.split("=", 1) for item in args.folders.split(";"))
        print("\n".join(["@@table", *STEPS[args.step](shapes, folders)]), flush=True)
        return
    import importlib.util

    import torch

    # the first lent H200 had torch, transformers, peft and tensorboard but not tyro: two steps failed on it
    missing = [name for name in ("tyro", "transformers", "tensorboard") if importlib.util.find_spec(name) is None]
    if missing:
        raise SystemExit(f"error: {', '.join(missing)} not installed: pip install -r requirements.txt first")
    if not args.dry_run and not torch.cuda.is_available():
        raise SystemExit("error: no GPU here; `python -m common.tools.gpu_check --dry-run` runs tiny shapes on the CPU")
    from common.tools.scale import build_model

    report = [f"# The GPU check ({'dry run: tiny shapes on the CPU' if args.dry_run else 'one GPU'})", ""]
    with tempfile.TemporaryDirectory() as models:
        folders = {}
        needs = {"numerics": [shapes["numerics"]], "scale": shapes["scale"], "generation": [shapes["generation"]]}
        for name in sorted({name for step in args.steps for name in needs.get(step, [])}):
            folders[name] = os.path.join(models, name)
            build_model(name, folders[name])
        for step in args.steps:
            start = time.time()
            command = [sys.executable, "-m", "common.tools.gpu_check", "--step", step,
                       "--folders", ";".join(f"{k}={v}" for k, v in folders.items()) or "none=none",
                       *(["--dry-run"] if args.dry_run else [])]
            try:
                result = subprocess.run(command, cwd=ROOT, text=True, capture_output=True,
                                        timeout=STEP_SECONDS[step])
                if result.returncode != 0 or "@@table" not in result.stdout:
                    tail = (result.stderr.strip() or result.stdout.strip()).splitlines()[-1:] or ["no output"]
                    table = [f"failed: {tail[0][:300]}"]
                else:
                    table = result.stdout.split("@@table\n", 1)[1].rstrip("\n").splitlines()
            except subprocess.TimeoutExpired:
                table = [f"ran out of its {STEP_SECONDS[step]} s"]
            section = [f"## {step} ({time.time() - start:.0f} s)", "", *table, ""]
            print("\n".join(section), flush=True)
            report += section
            if args.out:  # after every step: a check cut short by its lease keeps the tables it has
                with open(args.out, "w") as f:
                    f.write("\n".join(report))
    if args.out:
        print(f"written: {args.out}")


if __name__ == "__main__":
    main()
