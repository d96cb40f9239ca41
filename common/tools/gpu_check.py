"""The GPU check: one command that runs the group files on a GPU and prints their figures, ready for
common/results/gpu.md. Nothing is downloaded: the models are random weights in real configurations
(common/tools/scale.py), and random weights cost what trained ones cost.

    python -m common.tools.gpu_check --out gpu.md                     # one GPU: at most 15 minutes
    python -m common.tools.gpu_check --out gpu.md --steps machine generation --limits generation=400  # some steps
    python -m common.tools.gpu_check --out gpu.md --before ../old     # beside another checkout's decoding
    python -m common.tools.gpu_check --dry-run                        # tiny shapes on the CPU: the suite runs it
    python -m common.tools.card_prep                                  # a lent card's calls, planned and prepared

Each step runs in a process of its own, bounded in time; it prints its rows as they come, and one line when it
fails or runs out of time, and the next step begins. `--out` is rewritten after every step, with the profiles
beside it, so a check cut short keeps what it measured. The steps, most valuable first:

1. machine: torch, CUDA, transformers, the card, and its ceilings as measured (a bfloat16 matrix product, a copy).
2. generation: one default iteration's batch (32 prompts × 8 responses × 256 tokens) on Qwen2.5-0.5B's
   configuration made peaky (its final norm scaled so that the next token's entropy is SmolLM2's, 0.7 nats: a
   trained model's, where rounding moves few draws): `sample` eager, then compiled with the output layer in
   float32 or bfloat16, the latter with the draw step's candidate (blocked_draw) too, then TF32; with --before, the
   other checkout's compiled `sample` before the TF32 row. Per row: seconds, tokens/s, the bytes a step must move
   per second against a copy's, the compile, the share of eager's responses drawn alike, the sampler gap (|log π
   of the sampler − of the scoring pass|), the peak memory; and a torch.profiler table of each compiled row's
   kernels, written beside --out.
3. scale: Qwen2.5-0.5B's configuration with the GPU defaults and Qwen2.5-1.5B's at 8 × 16 × 512 tokens under
   grpo.py, 2 iterations (the first warms up; the evaluations decode as many responses as an iteration, so that
   one compiled step serves both): the pass size, the memory estimate beside the measured peak
   (torch.cuda.max_memory_allocated), seconds per phase, MFU of scoring and of the update, generation's bytes/s.
4. card: the README's card command, `gspo.py --group-size 8` with gpt2's configuration and the GPU defaults.
5. numerics of the GPU recipe (bfloat16 autocast, the output layer in float32) on the peaky model, each group file
   on one batch: the largest |log π_θ − log π_θold| at the first step (0 exactly: the update's pass reads the
   scoring pass's kernels), the sampler gap (mean, max), and one gradient step (SGD at lr 1, so the step is the
   clipped gradient) against the same step in float32: ‖Δ − Δ_float32‖ / ‖Δ_float32‖. At ratio 1 with responses
   of one length the five losses share one gradient direction: alike rows say the files' code paths agree.
6. hf: Hugging Face's `generate` on the generation step's batch, with the static cache and torch.compile its
   documentation recommends, then as it comes.
7. refusals that stay one line on a GPU: a pass size that does not divide the minibatch, and Qwen2.5-7B and -14B
   fully fine-tuned on one card (refused where the training state leaves no room for a pass).
8. embedded: `python grpo.py` with no flag: seconds per iteration and the held-out accuracy, beside the CPU's.
9. draw: the draw alone on one decoding step's logits, sample_token compiled (torch's own float64 scan over the
   vocabulary, 17 % of the compiled step on the second H200) beside blocked_draw, a candidate that scans blocks
   of 1,024 tokens: milliseconds a draw, the share of sample_token's tokens drawn alike, tokens of probability 0.
"""

import argparse
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
ENTROPY = 0.7  # nats: SmolLM2-135M-Instruct's mean entropy per sampled token at its first iteration (addition2)
# What each step runs on: a GPU, or the dry run's tiny shapes on the CPU (B prompts × G responses, T new tokens).
SHAPES = {
    "gpu": dict(model="qwen2.5-0.5b", B=32, G=8, T=256, hf_compile=True, vocab=151936,
                # the compiled rows, most valuable first: (the output layer, the draw), and where --before's comes
                compiled=[("float32", "sample_token"), ("bfloat16", "sample_token"), ("bfloat16", "blocked_draw"),
                          "before", ("tf32", "sample_token")], before_compiled=True,
                scale=("qwen2.5-0.5b", []), large=("qwen2.5-1.5b", ["--prompts-per-iteration", "8", "--group-size",
                                                                    "16", "--max-new-tokens", "512"]),
                card="gpt2-124m", embedded=[], runs=["--num-iterations", "2"],
                # an evaluation of as many responses as an iteration samples (a sampled and a greedy one per
                # question): the compiled decoding step it runs is the iteration's, not a second compile of 30 s
                eval_size=dict(scale=128, large=64, card=128)),
    "dry": dict(model="qwen2.5-tiny", B=4, G=4, T=8, hf_compile=False, vocab=5000,
                # --before's code read, its decoding eager: the dry run checks that this file's helpers read that
                # checkout's common/, not the old compile (9 s on the CPU)
                compiled=[("float32", "sample_token"), ("float32", "blocked_draw"), "before"], before_compiled=False,
                scale=("qwen2.5-tiny", ["--prompts-per-iteration", "4", "--max-new-tokens", "8"]),
                large=("gpt2-tiny", ["--prompts-per-iteration", "4", "--group-size", "4", "--max-new-tokens", "8"]),
                card="gpt2-tiny", embedded=["--num-iterations", "1", "--eval-size", "8"],
                runs=["--num-iterations", "2", "--no-compile-decoding"], eval_size=dict(scale=1, large=1, card=1)),
}
# Each step's limit in seconds: 855 in all, so that with the models' building (~20 s) the whole check ends within
# 15 minutes; a lent GPU's shorter call runs the first few (--steps, --limits). Seen on an H200 (results/gpu.md):
# a compile of Qwen2.5-0.5B's decoding step 29-38 s.
STEP_SECONDS = {"machine": 15, "generation": 270, "scale": 110, "numerics": 40, "card": 45, "scale-large": 115,
                "hf": 110, "refusals": 15, "embedded": 60, "draw": 75}
# The embedded `python grpo.py` (seed 1, 150 iterations) on a CPU core: common/results/group.md
EMBEDDED_ON_CPU = "| a CPU core (common/results/group.md) | 150 | 0.17 | 0.908 (the mean of the last 3 evaluations) |"


def device_and_autocast():
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return device, torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


def step_machine(shapes, folders, options) -> list[str]:
    import torch
    import transformers

    from common.perf import machine_ceilings

    device, _ = device_and_autocast()
    flops, copy = machine_ceilings(device)
    name, memory = f"CPU, {os.cpu_count()} cores", "-"
    if device.type == "cuda":
        card = torch.cuda.get_device_properties(0)
        name, memory = card.name, f"{card.total_memory / 2**30:.1f} GiB"
    unit = "bfloat16" if device.type == "cuda" else "float32"
    return ["| torch | CUDA | transformers | device | memory | matrix product | copy |", "|---" * 7 + "|",
            f"| {torch.__version__} | {torch.version.cuda or '-'} | {transformers.__version__} | {name} | {memory} | "
            f"{flops / 1e12:,.1f} TFLOP/s ({unit}) | {copy / 1e12:.2f} TB/s |"]


def make_peaky(folder: str, entropy: float = ENTROPY) -> float:
    """Scale the final norm of the random model in `folder` so that its next token's mean entropy on the check's
    prompts is `entropy`; the scale. A random model's next token is near uniform over its vocabulary (11.8 nats of
    11.9 for Qwen2.5-0.5B), where any rounding moves a draw; a trained model's is peaked."""
    import torch

    from common import policy, sampling
    from common.tasks import get_task

    device, autocast = device_and_autocast()
    tokenizer, model = policy.load_policy(folder, device)
    task = get_task("addition")
    prompt_ids, prompt_mask = sampling.PromptFormat(tokenizer, task, 0, model=model).encode(
        [question for question, _ in task.prompts(16, random.Random(1))], device)
    norm = model.base_model.norm.weight  # the final norm of a Llama-like model (Qwen, SmolLM2)
    start = norm.detach().clone()

    @torch.no_grad()
    def mean_entropy(scale: float) -> float:
        norm.copy_(start * scale)
        with autocast:
            logits = model(input_ids=prompt_ids, attention_mask=prompt_mask, logits_to_keep=1).logits[:, -1].float()
        return float(torch.special.entr(torch.softmax(logits, dim=-1)).sum(dim=-1).mean())

    scale = scale_for_entropy(mean_entropy, entropy, 1.0, 1e4)
    mean_entropy(scale)
    model.save_pretrained(folder)
    return scale


def scale_for_entropy(mean_entropy, entropy: float, low: float, high: float) -> float:
    """The scale in [low, high] at which mean_entropy(scale), which falls as the scale grows, is `entropy`:
    bisection in log space."""
    for _ in range(30):
        middle = (low * high) ** 0.5
        low, high = (middle, high) if mean_entropy(middle) > entropy else (low, middle)
    return high


def sampler_gap(grpo, model, samples, autocast, group_size: int) -> float:
    """Mean |log-prob the sampler kept − the scoring pass's| over the responses' tokens, as a run logs it."""
    import torch

    args, forward = grpo.Args(temperature=1.0, group_size=group_size), grpo.Forward(autocast, share_prompt=True)
    gaps = []
    for start in range(0, len(samples.responses), 16):
        inds = torch.arange(start, min(start + 16, len(samples.responses)), device=samples.responses.device)
        with torch.no_grad():
            scored = grpo.logprobs_of(model, samples, inds, args, forward)
        gaps.append((samples.logprobs[inds] - scored)[samples.mask[inds].bool()].abs())
    return float(torch.cat(gaps).mean())


def timed(call, device, repeats: int = 1):
    """The result of the last of `repeats` calls, and the median seconds (each call seeded alike)."""
    import torch

    seconds = []
    for _ in range(repeats):
        torch.manual_seed(0)
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        result = call()
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return result, statistics.median(seconds)


def profile_table(call, device, path: str, rows: int = 25) -> str:
    """torch.profiler over one call: the table of the kernels (or CPU operations) by their own time, written to
    `path`; returns its top 4 as one line (name, share of the device time)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    try:
        with profile(activities=activities) as profiler:
            timed(call, device)
        events = profiler.key_averages()
        key = "self_device_time_total" if cuda else "self_cpu_time_total"
        with open(path, "w") as f:
            f.write(events.table(sort_by=key, row_limit=rows, max_name_column_width=90))
        kernels = [event for event in events if getattr(event, key) > 0 and (not cuda or event.key[:4] != "aten")]
        total = sum(getattr(event, key) for event in kernels) or 1
        top = sorted(kernels, key=lambda event: -getattr(event, key))[:4]
        return "; ".join(f"{event.key[:60]} {getattr(event, key) / total:.0%}" for event in top)
    except Exception as e:  # the row's figures matter more than its profile
        return f"no profile: {type(e).__name__}: {str(e)[:100]}"


def generation_batch(shapes, folder: str):
    """The model, its prompt format and the batch's questions, as both checkouts' `sample` takes them."""
    from common import policy, sampling
    from common.tasks import get_task

    device, autocast = device_and_autocast()
    tokenizer, model = policy.load_policy(folder, device)
    task = get_task("addition")
    prompt_format = sampling.PromptFormat(tokenizer, task, 0, model=model)
    questions = [question for question, _ in task.prompts(shapes["B"], random.Random(0))]
    return model.eval(), prompt_format, questions, device, autocast


def decoding_figures(grpo, model, samples, eager, autocast, shapes) -> dict:
    """How a way of decoding drew: its shapes, its share of eager's responses drawn alike (and the median token
    where the others part from them), its sampler gap."""
    import torch

    responses, same = samples.responses, "-"
    if eager is not None:
        eager, pad = eager.to(responses.device), torch.nn.functional.pad
        width = max(eager.shape[1], responses.shape[1])
        differs = pad(eager, (0, width - eager.shape[1]), value=-1) != pad(responses, (0, width - responses.shape[1]),
                                                                             value=-1)
        parted = differs.float().argmax(dim=1)[differs.any(dim=1)]
        same = f"{1 - len(parted) / len(differs):.0%}" + (
            f", the rest part at token {parted.float().median():.0f}" if len(parted) else "")
    return {"decoding": [len(responses), samples.prompt_ids.shape[1] + responses.shape[1], responses.shape[1]],
            "same": same, "gap": sampler_gap(grpo, model, samples, autocast, shapes["G"])}


def decoding_row(name: str, model, figures: dict, seconds: float, first: str, peak: str) -> str:
    """A table row of a way to decode: its speed, its bandwidth use, its tokens beside eager's, its sampler gap."""
    from common.perf import Roofline

    rows, columns, steps = figures["decoding"]
    work = {"perf/decoding_rows": rows, "perf/decoding_columns": columns, "perf/decoding_steps": steps,
            "perf/pass_tokens": 0, "perf/pass_logit_tokens": 0, "perf/pass_attention_pairs": 0,
            "perf/generate_seconds": seconds}
    use = Roofline(model, argparse.Namespace(update_epochs=1, lora_rank=0), cuda=model.device.type == "cuda"
                        ).figures(work)
    return (f"| {name} | {seconds:.2f} | {rows * steps / seconds:,.0f} | "
            f"{use['perf/generate_bytes_per_second'] / 1e9:,.0f} ({use['perf/generate_bandwidth_share']:.0%}) | "
            f"{first} | {figures['same']} | {figures['gap']:.1e} | {peak} |")


def say(lines: list[str]) -> list[str]:
    """Lines of a step's table, printed as they come: a step stopped at its limit keeps them."""
    print("\n".join(f"@@ {line}" for line in lines), flush=True)
    return lines


def peak_memory(device) -> str:
    import torch

    return f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB" if device.type == "cuda" else "-"


def step_generation(shapes, folders, options) -> list[str]:
    """sample eager, then compiled with each output layer, on one default iteration's batch (see the docstring)."""
    import torch

    import grpo
    from common import decoding

    folder = options.generation_model or folders[shapes["model"]]
    model, prompt_format, questions, device, autocast = generation_batch(shapes, folder)

    def draw(compiled: bool):
        args = grpo.Args(max_new_tokens=shapes["T"], temperature=1.0, compile_decoding=compiled)
        with torch.no_grad(), autocast:
            return grpo.sample(model, prompt_format, questions, args, device, shapes["G"])

    name = os.path.basename(options.generation_model) if options.generation_model else f"{shapes['model']}, peaky"
    lines = say([f"{shapes['B']} prompts × {shapes['G']} responses × up to {shapes['T']} tokens ({name}), "
                 f"{'bfloat16 autocast' if device.type == 'cuda' else 'float32'}:", "",
                 "| decoding | seconds | tokens / s | GB/s a step must move (of a copy's) | first call (compiles) | "
                 "eager's responses | sampler gap mean | peak memory |", "|---|---|---|---|---|---|---|---|"])
    eager, seconds = timed(lambda: draw(False), device)
    torch.save(eager.responses.cpu(), os.path.join(options.work, "eager.pt"))  # for --before's row
    figures = decoding_figures(grpo, model, eager, None, autocast, shapes)
    # no profile of eager's steps: the compiled ones are what a GPU runs, and eager's would take their seconds
    lines += say([decoding_row("sample, eager", model, figures, seconds, "-", peak_memory(device))])
    own_draw = grpo.sample_token
    for variant in shapes["compiled"]:
        if variant == "before":
            lines += say(before_rows(model, options, shapes) if options.before else [])
            continue
        output_layer, draw_name = variant
        decoding.OUTPUT_LAYER = output_layer
        grpo.sample_token = own_draw if draw_name == "sample_token" else blocked_draw  # what grpo.sample draws with
        decoding._decoding_models.clear()  # a decoding model for this output layer
        decoding._caches.clear()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        _, first = timed(lambda: draw(True), device)
        samples, seconds = timed(lambda: draw(True), device, repeats=3)
        name = output_layer + ("" if draw_name == "sample_token" else f"_{draw_name}")
        top = profile_table(lambda: draw(True), device, os.path.join(options.profiles, f"profile_{name}.txt"))
        figures = decoding_figures(grpo, model, samples, eager.responses, autocast, shapes)
        what = f"sample, compiled, {output_layer} output layer" + ("" if draw_name == "sample_token" else
                                                                   f", {draw_name}")
        lines += say([decoding_row(what, model, figures, seconds, f"{first:.1f} s", peak_memory(device)),
                      f"|  ↳ top kernels: {top} | | | | | | | |"])
    grpo.sample_token = own_draw
    return lines


def before_rows(model, options, shapes) -> list[str]:
    """The other checkout's compiled `sample` (--before), in a process that imports that checkout's code."""
    import json

    command = [sys.executable, os.path.abspath(__file__), "--step", "before", "--root", options.before,
               "--folders", options.folders, "--work", options.work, "--profiles", options.profiles,
               *(["--dry-run"] if options.dry_run else [])]
    result = subprocess.run(command, cwd=options.before, text=True, capture_output=True)
    if result.returncode != 0 or "@@table" not in result.stdout:
        tail = (result.stderr.strip() or result.stdout.strip()).splitlines()[-1:] or ["no output"]
        return [f"| --before: failed: {tail[0][:200]} | | | | | | | |"]
    figures = json.loads(result.stdout.split("@@table\n", 1)[1].splitlines()[0])
    what = f"sample, {'compiled' if shapes['before_compiled'] else 'eager'} (--before's code)"
    return [decoding_row(what, model, figures, figures["seconds"], figures["first"], figures["peak"]),
            f"|  ↳ top kernels: {figures['top']} | | | | | | | |"]


def step_before(shapes, folders, options) -> list[str]:
    """Run in the --before checkout: its compiled `sample` as that checkout wrote it; its figures as one JSON line
    (this file's arithmetic may be newer than that checkout's)."""
    import json

    import torch

    import grpo

    model, prompt_format, questions, device, autocast = generation_batch(
        shapes, options.generation_model or folders[shapes["model"]])

    def draw():
        args = grpo.Args(max_new_tokens=shapes["T"], temperature=1.0, compile_decoding=shapes["before_compiled"])
        with torch.no_grad(), autocast:
            return grpo.sample(model, prompt_format, questions, args, device, shapes["G"])

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    _, first = timed(draw, device)
    samples, seconds = timed(draw, device, repeats=3)
    top = profile_table(draw, device, os.path.join(options.profiles, "profile_before.txt"))
    eager = torch.load(os.path.join(options.work, "eager.pt"))
    figures = decoding_figures(grpo, model, samples, eager, autocast, shapes)
    return [json.dumps({**figures, "seconds": seconds, "first": f"{first:.1f} s", "peak": peak_memory(device),
                        "top": top})]


def run_script(script: str, flags: list[str], timeout: float) -> tuple[str, dict]:
    """`python <script> <flags>` in a folder of its own: its console and its TensorBoard scalars; a run stopped at
    its limit gives what it logged until then, its console ending "stopped at the step's limit"."""
    with tempfile.TemporaryDirectory() as cwd:
        process = subprocess.Popen([sys.executable, os.path.join(ROOT, script), *flags], cwd=cwd, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
            stdout += "\nstopped at the step's limit"
        else:
            if process.returncode != 0:
                tail = (stderr.strip() or stdout.strip()).splitlines()[-1:]
                raise RuntimeError(f"{script} {' '.join(flags)} failed: {' '.join(tail)}")
        from common.tools.scale import scalars

        runs = os.listdir(os.path.join(cwd, "runs")) if os.path.isdir(os.path.join(cwd, "runs")) else []
        return stdout, scalars(os.path.join(cwd, "runs", runs[0])) if runs else {}


def median(values: list[float]) -> float:
    return statistics.median(values[1:] if len(values) > 1 else values)  # the first iteration warms up


def step_embedded(shapes, folders, options) -> list[str]:
    console, values = run_script("grpo.py", ["--seed", "1", *shapes["embedded"]], STEP_SECONDS["embedded"] - 5)
    held_out = re.findall(r"held-out ([\d.]+) \(greedy ([\d.]+)\)", console)[-1]
    seconds = sum(median(values[f"perf/{phase}_seconds"]) for phase in ("generate", "logprob", "update"))
    return ["| where | iterations | s / iteration (generate + log-probs + update) | held-out at the end (greedy) |",
            "|---|---|---|---|",
            f"| here | {len(values['perf/iteration_seconds'])} | {seconds:.2f} | {held_out[0]} ({held_out[1]}) |",
            EMBEDDED_ON_CPU]


def scale_row(name: str, console: str, values: dict, card) -> str:
    """A run's pass size, its memory estimate beside its measured peak, and its figures per phase."""
    sized = re.search(r"--micro-batch-size (\d+) .*within ([\d.]+) GiB, at an estimated ([\d,.]+) MiB each", console)
    if sized is None:
        return f"| {name} | {console.strip().splitlines()[-1][:200] if console.strip() else 'no output'} |"
    size, budget, per_response = sized.groups()
    per_response = float(per_response.replace(",", "")) * 2**20
    if card is None:  # the CPU's budget is fixed: no card to estimate a peak against
        estimated = f"{int(size) * per_response / 2**30:.2f} GiB (passes only)"
    else:  # the budget is half of what 90 % of the card leaves after the state: the state is the rest
        state = 0.9 * card - 2 * float(budget) * 2**30
        estimated = f"{(state + int(size) * per_response) / 2**30:.1f} GiB"
    peak = max(values.get("perf/peak_gpu_memory_gb", [0.0]))
    phases = [f"{median(values.get(f'perf/{p}_seconds', [0.0])):.2f}" for p in ("generate", "logprob", "update")]
    mfu = [f"{100 * median(values.get(f'perf/{phase}_mfu', [0.0])):.2g}%" for phase in ("logprob", "update")]
    bandwidth = median(values.get("perf/generate_bytes_per_second", [0.0])) / 1e9
    return (f"| {name} | {median(values.get('perf/iteration_seconds', [0.0])):.2f} | {size} | {estimated} | "
            f"{f'{peak:.1f} GiB' if card else '-'} | {' | '.join(phases)} | {' | '.join(mfu)} | {bandwidth:,.0f} |")


SCALE_HEADER = ["| model | s / iteration | pass size | estimated peak | measured peak | generate s | log-probs s | "
                "update s | log-probs MFU | update MFU | generate GB/s |", "|---" * 11 + "|"]


def step_scale(shapes, folders, options, which: str = "scale") -> list[str]:
    """grpo.py's defaults on real shapes: the pass size and its estimate against the measured peak, the phases."""
    import torch

    card = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None
    name, flags = shapes[which]
    limit = STEP_SECONDS["scale" if which == "scale" else "scale-large"] - 5
    console, values = run_script("grpo.py", ["--model", folders[name], *shapes["runs"], *flags, "--eval-size",
                                             str(shapes["eval_size"][which])], limit)
    return [*SCALE_HEADER, scale_row(name + (f" ({' '.join(flags[1::2])})" if flags else ""), console, values, card),
            *([f"(stopped at the step's limit of {limit:.0f} s after {len(values.get('perf/iteration_seconds', []))} "
               "iterations)"] if console.endswith("stopped at the step's limit") else [])]


def step_scale_large(shapes, folders, options) -> list[str]:
    return step_scale(shapes, folders, options, which="large")


def step_card(shapes, folders, options) -> list[str]:
    """The card's command: `python gspo.py --model gpt2 --group-size 8`, gpt2's configuration with random weights."""
    import torch

    card = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None
    console, values = run_script("gspo.py", ["--model", folders[shapes["card"]], "--group-size", "8", *shapes["runs"],
                                             "--eval-size", str(shapes["eval_size"]["card"])], STEP_SECONDS["card"] - 5)
    return [*SCALE_HEADER, scale_row(f"gspo.py --model {shapes['card']} --group-size 8", console, values, card),
            *(["(stopped at the step's limit)"] if console.endswith("stopped at the step's limit") else [])]


def step_numerics(shapes, folders, options) -> list[str]:
    """The GPU recipe against float32, each group file on the same batch (see the module's docstring)."""
    import copy
    import importlib

    import torch

    from common import policy, processes, sampling
    from common.tasks import get_task

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    lines = say(["| file | first step's max \\|log-ratio\\| | sampler gap mean | sampler gap max | "
                 "step vs float32's, relative |", "|---|---|---|---|---|"])
    for name in MODULES:
        module = importlib.import_module(name)
        args = module.Args(model=folders[shapes["model"]], task="addition", few_shot=0, prompts_per_iteration=4,
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
        lines += say([f"| {name}.py | {log_ratio:.1e} | {gap.mean():.1e} | {gap.max():.1e} | {relative:.3f} |"])
    return lines


def blocked_draw(logits, greedy, u, block: int = 1024):
    """A candidate for the group files' draw (sample_token), measured by the draw step and used by no file yet: the
    same token, the first whose cumulative probability exceeds u·Σπ, found with two short scans instead of one over
    the whole vocabulary: the block of `block` tokens where the CDF crosses the target, then the token inside it. On
    the second H200 the float64 scan over 151,936 entries took 17 % of the compiled decoding step (results/gpu.md).
    A token of probability 0 is never drawn: the counts skip them, and `last` keeps a rounding of the block sums
    against the block's own scan (1e-16) from running past the block's last token of positive probability."""
    import torch
    import torch.nn.functional as F

    log_pi = torch.log_softmax(logits, dim=-1)
    pi = log_pi.exp()
    vocab = pi.shape[-1]
    blocks = F.pad(pi, (0, -vocab % block)).unflatten(-1, (-1, block))  # [N, blocks, block], padded with 0
    ends = blocks.sum(dim=-1, dtype=torch.float64).cumsum(dim=-1)  # [N, blocks]: the CDF at each block's end
    target = u * ends[:, -1:]  # [N, 1]
    chosen = (ends <= target).sum(dim=-1, keepdim=True).clamp(max=ends.shape[-1] - 1)  # [N, 1]
    start = torch.where(chosen > 0, ends.gather(1, (chosen - 1).clamp(min=0)), 0.0)  # the CDF before it
    inside = blocks.gather(1, chosen.unsqueeze(-1).expand(-1, 1, block)).squeeze(1)  # [N, block]
    within = (inside.cumsum(dim=-1, dtype=torch.float64) <= target - start).sum(dim=-1)
    last = (torch.arange(block, device=pi.device) * (inside > 0)).amax(dim=-1)  # its last token of π > 0
    drawn = chosen.squeeze(1) * block + torch.minimum(within, last)
    token = torch.where(greedy, logits.argmax(dim=-1), drawn)
    return token, log_pi.gather(1, token.unsqueeze(1)).squeeze(1), torch.special.entr(pi).sum(dim=-1)


def peaky_logits(rows: int, vocab: int, device, entropy: float = ENTROPY):
    """[rows, vocab] random logits scaled until softmax's mean entropy is `entropy` (a trained model's)."""
    import torch

    logits = torch.randn(rows, vocab, generator=torch.Generator(device).manual_seed(0), device=device)

    def mean_entropy(scale: float) -> float:
        return float(torch.special.entr(torch.softmax(scale * logits, dim=-1)).sum(dim=-1).mean())

    return scale_for_entropy(mean_entropy, entropy, 0.1, 100.0) * logits


def step_draw(shapes, folders, options) -> list[str]:
    """The draw alone, on one decoding step's logits (B·G rows over Qwen2.5's vocabulary, peaked to SmolLM2's
    entropy): sample_token compiled as the decoding step compiles it (torch's own scan), beside blocked_draw compiled
    without that fallback. Per row: milliseconds a draw, the share of sample_token's tokens drawn alike over 14
    random uniforms a row, and the tokens of probability 0 drawn (must be 0) at those and at both ends of the CDF
    (u = 0 and 1 − 2⁻⁵³, where the two orders of summing may part by a rounding)."""
    import torch

    import grpo
    from common import decoding

    device, _ = device_and_autocast()
    cuda = device.type == "cuda"
    rows, vocab = shapes["B"] * shapes["G"], shapes["vocab"]
    logits = peaky_logits(rows, vocab, device)
    logits[:, vocab // 3: vocab // 2] = -float("inf")  # whole blocks of probability 0, as a masked vocabulary has
    greedy = torch.zeros(rows, dtype=torch.bool, device=device)
    uniforms = torch.rand(16, rows, 1, generator=torch.Generator(device).manual_seed(1), device=device,
                          dtype=torch.float64)
    uniforms[0] = 0.0  # both ends of the CDF
    one = torch.ones((), dtype=torch.float64, device=device)
    uniforms[1] = torch.nextafter(one, 0 * one)
    mode = "reduce-overhead" if cuda else None
    torch._dynamo.mark_static_address(logits)  # CUDA graphs read it in place, as the decoding step's own logits
    card = torch.cuda.get_device_name() if cuda else "the CPU"
    lines = say([f"{rows} rows × {vocab} tokens on {card}, softmax's entropy {ENTROPY} nats (a trained model's), a "
                 "sixth of the tokens masked:", "",
                 "| draw, compiled | ms a draw | sample_token's tokens | tokens of probability 0 |",
                 "|---|---|---|---|"])
    pi = torch.softmax(logits, dim=-1)
    drawn, seconds = {}, {}
    for name, draw in (("blocked_draw", blocked_draw), ("sample_token", grpo.sample_token)):
        if name == "sample_token":  # torch's own scan for cumsum, as the decoding step compiles it; after
            decoding.compiled_step(cuda)  # blocked_draw's compile, which inductor's short scans serve
        compiled = torch.compile(draw, mode=mode, dynamic=False)

        def call(u, compiled=compiled):
            torch.compiler.cudagraph_mark_step_begin()
            return compiled(logits, greedy, u)[0].clone()

        try:
            call(uniforms[2])  # compiles
            drawn[name] = torch.stack([call(u) for u in uniforms])  # [16, rows]
            # 20 draws back to back a timing, as a decoding loop runs them: the host's overhead shared out
            _, seconds[name] = timed(lambda: [call(uniforms[2]) for _ in range(20)], device, repeats=5)
            seconds[name] /= 20
        except Exception as e:  # one draw's failure (a compile, say) leaves the other's row
            drawn[name] = f"failed: {type(e).__name__}: {str(e)[:150]}"
    for name, what in (("sample_token", "sample_token (torch's scan)"), ("blocked_draw", "blocked_draw")):
        if isinstance(drawn[name], str):
            lines += say([f"| {what} | {drawn[name]} | | |"])
            continue
        alike = "-"  # the share over the random uniforms (rows 2 on), where sample_token drew
        if not isinstance(drawn["sample_token"], str):
            alike = f"{(drawn[name][2:] == drawn['sample_token'][2:]).float().mean():.2%}"
        zero = int((pi.gather(1, drawn[name].T) == 0).sum())
        lines += say([f"| {what} | {seconds[name] * 1e3:.3f} | {alike} | {zero} |"])
    return lines


def step_hf(shapes, folders, options) -> list[str]:
    """Hugging Face's generate on the generation step's batch, the model in bfloat16 as its documentation loads it:
    with the static cache (which compiles the forward on a GPU, as the documentation recommends; under autocast it
    fails: its cache takes the float32 dtype of the weights), then as it comes; sampling at temperature 1, no top-k."""
    import torch

    from common import policy

    model, prompt_format, questions, device, _ = generation_batch(shapes, folders[shapes["model"]])
    _, model = policy.load_policy(folders[shapes["model"]], device, float32_logits=False)
    model = model.to(torch.bfloat16 if device.type == "cuda" else torch.float32).eval()
    ids, mask = prompt_format.encode(questions, device)
    lines = say(["| decoding | seconds | tokens / s | first call (compiles) |", "|---|---|---|---|"])
    # the fair row first: generate as it comes took 21-25 s on the first H200, its compiled one is not known yet
    for name, cache in (("generate, static cache + torch.compile", "static"), ("generate", None)):
        if cache and not shapes["hf_compile"]:
            lines += say([f"| {name} | not in the dry run | | |"])
            continue

        def call():
            with torch.no_grad():
                return model.generate(input_ids=ids.repeat_interleave(shapes["G"], 0),
                                      attention_mask=mask.repeat_interleave(shapes["G"], 0), do_sample=True,
                                      temperature=1.0, top_k=None, top_p=None, max_new_tokens=shapes["T"],
                                      min_new_tokens=shapes["T"], pad_token_id=prompt_format.pad_id,
                                      cache_implementation=cache)
        first = "-"
        if cache:
            _, first = timed(call, device)
            first = f"{first:.1f} s"
        generated, seconds = timed(call, device)
        tokens = (generated.shape[1] - ids.shape[1]) * len(generated)
        lines += say([f"| {name} | {seconds:.2f} | {tokens / seconds:,.0f} | {first} |"])
    return lines


def step_refusals(shapes, folders, options) -> list[str]:
    """The lines a user gets; both are checked before anything heavy runs."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    import grpo
    from common import memory, policy
    from common.tools.scale import CONFIGS, GPU_MEMORY

    lines = []
    try:
        args = grpo.Args(micro_batch_size=24)  # the embedded model: nothing is loaded
        policy.resolve_defaults(args, beta=grpo.BETA)
        grpo.check_args(args, world_size=1)
        lines.append("- --micro-batch-size 24: NOT refused")
    except SystemExit as e:
        lines.append(f"- `--micro-batch-size 24`: {e}")
    card = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else GPU_MEMORY
    # 7B's state fits an H200 decoding eagerly, not with compiled decoding's bfloat16 copy (a GPU's default for
    # responses of 256 tokens), nor with a bfloat16 sampler's copy; 14B's fits neither
    for name, sampler_dtype, compiled in [("qwen2.5-7b", None, False), ("qwen2.5-7b", None, True),
                                          ("qwen2.5-7b", "bfloat16", False), ("qwen2.5-14b", None, True)]:
        model_type, fields = CONFIGS[name]
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **fields))
        args = grpo.Args(sampler_dtype=sampler_dtype, compile_decoding=compiled)
        state = sum(memory.state_parts(model, None, args, processes=1, cuda=True).values())
        per_response = memory.response_bytes(256, 64, 8, model.config, 2)
        what = (f"{name} fully fine-tuned on one card, {'' if compiled else 'no '}compiled decoding"
                + (f", --sampler-dtype {sampler_dtype}" if sampler_dtype else ""))
        try:
            memory.refuse_what_does_not_fit(memory.pass_budget(card, state), per_response, state, card,
                                            memory.what_helps(args))
            lines.append(f"- {what}: fits (its training state {state / 2**30:.1f} GiB of the card's "
                         f"{card / 2**30:.1f} GiB), not refused")
        except SystemExit as e:
            lines.append(f"- {what}: {e}")
    return lines


STEPS = {"machine": step_machine, "generation": step_generation, "scale": step_scale, "numerics": step_numerics,
         "card": step_card, "scale-large": step_scale_large, "hf": step_hf, "refusals": step_refusals,
         "embedded": step_embedded, "draw": step_draw}
NEEDS = {"generation": ["model"], "numerics": ["model"], "hf": ["model"], "card": ["card"]}  # the models each builds on


def step_table(command: list[str], limit: float) -> list[str]:
    """A step's table from its own process: the one it returns, or, when it fails or runs out of time, the lines
    it said (say) until then and one line on what happened."""
    try:
        result = subprocess.run(command, cwd=ROOT, text=True, capture_output=True, timeout=limit)
        if result.returncode == 0 and "@@table" in result.stdout:
            return result.stdout.split("@@table\n", 1)[1].rstrip("\n").splitlines()
        tail = (result.stderr.strip() or result.stdout.strip()).splitlines()[-1:] or ["no output"]
        printed, end = result.stdout, f"failed: {tail[0][:300]}"
    except subprocess.TimeoutExpired as e:
        printed = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        end = f"(ran out of its {limit:.0f} s)"
    return [line[3:] for line in printed.splitlines() if line.startswith("@@ ")] + [end]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (what the test suite runs)")
    parser.add_argument("--out", default=None, help="also write the tables to this markdown file, and the profiles "
                                                    "beside it")
    parser.add_argument("--steps", nargs="+", choices=list(STEPS), default=list(STEPS), help="default: all")
    parser.add_argument("--before", default=None, help="another checkout (today's code, say): its compiled `sample` "
                                                       "measured in the generation step beside this one's")
    parser.add_argument("--generation-model", default=None, help="a model folder for the generation step instead of "
                                                                 "the peaky random model (a trained model, say)")
    parser.add_argument("--limits", nargs="+", default=[], metavar="STEP=SECONDS",
                        help="other time limits for some steps (a short lease, say)")
    for hidden in ("--step", "--folders", "--work", "--profiles", "--root"):  # a step's own process
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv=None) -> None:
    options = parse_args(argv)
    shapes = SHAPES["dry" if options.dry_run else "gpu"]
    for limit in options.limits:
        step, _, seconds = limit.partition("=")
        if step not in STEP_SECONDS or not seconds.replace(".", "", 1).isdigit() or float(seconds) <= 0:
            raise SystemExit(f"error: --limits takes STEP=SECONDS, STEP one of {', '.join(STEP_SECONDS)} and "
                             f"SECONDS > 0, got {limit!r}")
        STEP_SECONDS[step] = float(seconds)
    if options.step:  # a child: run one step, print its table
        if options.root:  # the --before checkout's own grpo.py and common/
            sys.path.insert(0, os.path.abspath(options.root))
        folders = dict(item.split("=", 1) for item in options.folders.split(";"))
        step = step_before if options.step == "before" else STEPS[options.step]
        print("\n".join(["@@table", *step(shapes, folders, options)]), flush=True)
        return
    if options.out:  # written after the first step, minutes of a lease in
        from common.tools.benchmark import refuse_missing_folder

        refuse_missing_folder("--out", options.out)
    import importlib.util

    import torch

    # the first lent H200 had torch, transformers, peft and tensorboard but not tyro: two steps failed on it
    missing = [name for name in ("tyro", "transformers", "tensorboard") if importlib.util.find_spec(name) is None]
    if missing:
        raise SystemExit(f"error: {', '.join(missing)} not installed: pip install -r requirements.txt first")
    if not options.dry_run and not torch.cuda.is_available():
        raise SystemExit("error: no GPU here; `python -m common.tools.gpu_check --dry-run` runs tiny shapes on the CPU")
    if options.before and not os.path.isfile(os.path.join(options.before, "grpo.py")):
        raise SystemExit(f"error: --before {options.before}: no grpo.py there")
    if options.generation_model and not os.path.isfile(os.path.join(options.generation_model, "config.json")):
        raise SystemExit(f"error: --generation-model {options.generation_model}: no model folder there")
    from common.tools.scale import build_model

    report = [f"# The GPU check ({'dry run: tiny shapes on the CPU' if options.dry_run else 'one GPU'})", ""]
    with tempfile.TemporaryDirectory() as models:
        wanted = {shapes[need] for step in options.steps for need in NEEDS.get(step, [])
                  if not (options.generation_model and step == "generation")}
        wanted |= {shapes[which][0] for which, step in (("scale", "scale"), ("large", "scale-large"))
                   if step in options.steps}
        folders = {}
        for name in sorted(wanted):
            folders[name] = os.path.join(models, name)
            build_model(name, folders[name])
        if shapes["model"] in folders:
            report += [f"The peaky model: {shapes['model']}'s final norm scaled by "
                       f"{make_peaky(folders[shapes['model']]):.1f} (next-token entropy {ENTROPY} nats).", ""]
        profiles = os.path.dirname(os.path.abspath(options.out)) if options.out else models
        for step in options.steps:
            start = time.time()
            command = [sys.executable, "-m", "common.tools.gpu_check", "--step", step, "--work", models,
                       "--profiles", profiles,
                       "--folders", ";".join(f"{k}={v}" for k, v in folders.items()) or "none=none",
                       *(["--before", os.path.abspath(options.before)] if options.before else []),
                       *(["--generation-model", os.path.abspath(options.generation_model)]
                         if options.generation_model else []),
                       *(["--dry-run"] if options.dry_run else [])]
            table = step_table(command, STEP_SECONDS[step])
            section = [f"## {step} ({time.time() - start:.0f} s)", "", *table, ""]
            print("\n".join(section), flush=True)
            report += section
            if options.out:  # after every step: a check cut short by its lease keeps the tables it has
                with open(options.out, "w") as f:
                    f.write("\n".join(report))
    if options.out:
        print(f"written: {options.out}")


if __name__ == "__main__":
    main()
