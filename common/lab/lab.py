"""The lab: small experiments that show *why* each group method exists. One command each:

    python -m common.lab length-bias        # GRPO's 1/|o_i| vs Dr. GRPO and DAPO: length of right and wrong responses
                                            # (on the long model, then on a tabular length policy: common/lab/toys.py)
    python -m common.lab clip-higher        # DAPO with a symmetric clip vs its ε_high: entropy and accuracy
    python -m common.lab dynamic-sampling   # GRPO vs DAPO: zero-signal groups, accuracy per generated sample
    python -m common.lab off-policy         # 16 minibatch steps per rollout: GRPO vs GSPO vs SAPO
    python -m common.lab sampler-mismatch   # a bfloat16 or a stale sampler, and the corrections for it
    python -m common.lab toy-pathologies    # the two toy failures behind trust regions (exact + Monte Carlo)
    python -m common.lab all                # everything above, one after the other
    python -m common.lab sharpen-or-teach --models BASE TRAINED ...   # pass@k before and after RL (passk.py)

On the embedded tiny model (common/models/tiny_model) the methods look alike: its answers are 2-5 tokens,
so length, entropy and off-policy questions hardly arise. The lab uses the second embedded model,
common/models/long_model (made by common/models/make_long_model.py): on the task "reverse" it answers and then
hesitates for a random number of dots, so responses are 4 to 48 tokens long, and their length does
not decide the reward. Each experiment runs algorithm files as subprocesses (`python grpo.py ...`,
never imported) with 3 seeds, `--parallel` runs at a time (each pinned to one core with
OMP_NUM_THREADS=1), reads their tensorboard logs, and writes into --out (default runs/lab, so that the committed
results stay as they are; --update-results writes common/results/lab, the figures common/results/lab.md shows):
  <experiment>.png  the figure: per arm, the median over seeds as a line and the range (min-max) as a band;
                    per-iteration quantities are smoothed with a moving average over SMOOTH iterations;
  <experiment>.md   the command lines and the key numbers (median [min, max] over seeds);
  <experiment>.json the curves, so that `--replot` redraws the figure without running anything.
common/results/lab.md shows the figures and what they say, and how long each experiment took
on two CPU cores. matplotlib draws the figures (requirements.txt); it is checked before any run.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from common.tools.benchmark import read_scalars

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMOOTH = 5  # moving-average window (iterations) of the plotted per-iteration curves
EVAL_SIZE = 200  # held-out prompts per evaluation (--eval-size)

# Every run: the long model on "reverse", bare prompts, room for the longest hesitation (48 tokens) and more.
COMMON = ["--model", "common/models/long_model", "--task", "reverse", "--few-shot", "0", "--max-new-tokens", "64",
          "--prompts-per-iteration", "16", "--group-size", "8", "--eval-every", "10", "--eval-size", str(EVAL_SIZE)]


@dataclass
class Experiment:
    question: str  # what the experiment asks, for the printout and the .md file
    arms: list  # (label, script, extra flags) per compared configuration
    flags: list  # flags shared by every arm (after COMMON)


EXPERIMENTS = {
    "length-bias": Experiment(
        "GRPO divides each response's loss by its own length |o_i| (eq. 97): a long wrong response is "
        "penalised less per token, a short right one rewarded more. Do wrong responses grow under grpo.py, "
        "and not under dr_grpo.py (eq. 100) and dapo.py (eq. 102)?",
        # β = 0 for all: a KL penalty would pull the lengths back to the reference and hide the effect.
        # DAPO with one sampling round (dynamic sampling does not touch the loss weights, and it triples the time)
        # and without its overlong penalty, the one part of its reward that depends on length,
        # so that its loss aggregation is what is compared.
        [("grpo", "grpo.py", []), ("dr_grpo", "dr_grpo.py", []),
         ("dapo", "dapo.py", ["--max-sampling-rounds", "1", "--overlong-buffer", "0"])],
        ["--num-iterations", "80", "--beta", "0"],
    ),
    "clip-higher": Experiment(
        "With a symmetric clip, a token with a small probability can gain little per step (ratio <= 1 + ε), "
        "so sampling concentrates and entropy collapses; DAPO's ε_high = 0.28 (eq. 101) lets it grow. "
        "dapo.py with ε_high = 0.2 vs 0.28, 8 minibatch steps per rollout so that the clip acts; one sampling "
        "round (no dynamic sampling) so that only the clip differs and runs stay short.",
        [("symmetric ε=0.2", "dapo.py", ["--clip-eps-high", "0.2"]), ("clip-higher ε_high=0.28", "dapo.py", [])],
        ["--num-iterations", "80", "--num-minibatches", "8", "--max-sampling-rounds", "1", "--learning-rate", "1e-3"],
    ),
    "dynamic-sampling": Experiment(
        "When all G answers to a prompt are equally right, the group has no signal (Â = 0). As a model learns, "
        "more groups are solved: GRPO trains on fewer and fewer useful groups, DAPO resamples until its "
        "batch is full of signal (EQUATIONS.md, DAPO). Share of zero-signal groups, and accuracy per generated sample.",
        [("grpo", "grpo.py", []), ("dapo", "dapo.py", [])],
        ["--num-iterations", "60", "--beta", "0"],
    ),
    "off-policy": Experiment(
        "Reusing one rollout for many steps moves π_θ away from π_θold. Token ratios (GRPO) are clipped token "
        "by token, GSPO clips whole responses by their length-normalised sequence ratio (eq. 107), SAPO "
        "replaces the clip by a soft gate (eq. 117). 16 minibatch steps per rollout: clip/gate activity and "
        "stability of accuracy.",
        [("grpo", "grpo.py", []), ("gspo", "gspo.py", []), ("sapo", "sapo.py", [])],
        ["--num-iterations", "40", "--num-minibatches", "16", "--beta", "0", "--learning-rate", "1e-3"],
    ),
    "sampler-mismatch": Experiment(
        "Fast RL stacks sample with a bfloat16 copy of the weights, or with weights k updates old (an "
        "asynchronous pipeline): the responses come from μ, not π_θold. What does the mismatch cost, and what "
        "does each correction buy (EQUATIONS.md, eq. 124-128): truncated importance weights, the rejection of "
        "tokens, of whole responses by their geometric-mean ratio, or μ itself as π_old? grpo.py at a learning "
        "rate high enough for staleness to matter.",
        [("float32, lag 0", "grpo.py", [])]
        + [(f"{sampler}, {name}", "grpo.py", flags + fix)
           for sampler, flags in (("bf16", ["--sampler-dtype", "bfloat16"]), ("lag 1", ["--sampler-lag", "1"]),
                                  ("lag 4", ["--sampler-lag", "4"]))
           for name, fix in (("none", ["--correction", "none"]), ("token-tis", ["--correction", "token-tis"]),
                             ("token-reject", ["--correction", "token-reject"]),
                             ("token-icepop", ["--correction", "token-icepop"]),
                             ("sequence-geo-reject", ["--correction", "sequence-geo-reject"]),
                             ("sequence-mis", ["--correction", "sequence-mis"]),
                             ("π_old = μ", ["--old-logprobs", "sampler"]))],
        ["--num-iterations", "30", "--beta", "0", "--learning-rate", "1e-3", "--eval-samples", "4"],
    ),
}
TOY = "toy-pathologies"


# ---------------------------------------------------------------- running

def run_one(script, flags, seed, core):
    """`python <script> --seed <seed> <flags>` in a fresh folder (so its runs/ holds one run); its scalars."""
    cmd = [sys.executable, os.path.join(ROOT, script), "--seed", str(seed)] + flags
    if core is not None:
        cmd = ["taskset", "-c", str(core)] + cmd
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    workdir = tempfile.mkdtemp(prefix="lab_")
    start = time.time()
    with open(os.path.join(workdir, "stdout.txt"), "w") as out:
        proc = subprocess.run(cmd, cwd=workdir, env=env, stdout=out, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise SystemExit(f"error: {' '.join(cmd)} exited with code {proc.returncode} (output in {workdir}):\n{tail}")
    (run_dir,) = [d for d, _, files in os.walk(os.path.join(workdir, "runs")) if any("tfevents" in f for f in files)]
    scalars = {tag: [(step, value) for _, step, value in events] for tag, events in read_scalars(run_dir).items()}
    shutil.rmtree(workdir, ignore_errors=True)
    return scalars, time.time() - start


def arm_flags(exp, extra, num_iterations=None, eval_size=None):
    """The flags of one arm; num_iterations and eval_size, when given, replace the experiment's own."""
    flags = COMMON + exp.flags + extra
    for flag, value in (("--num-iterations", num_iterations), ("--eval-size", eval_size)):
        if value is not None:
            i = flags.index(flag)
            flags = flags[: i + 1] + [str(value)] + flags[i + 2 :]
    return flags


def duration(seconds):
    """41s, 3m20s, 1h05m: a console duration."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def progress_line(done, total, label, seed, seconds, mean_seconds, parallel):
    """The line printed as a run ends. The ETA assumes the runs left go `parallel` at a time, each as long as
    the mean run so far."""
    rounds_left = -(-(total - done) // parallel)  # ceil
    return (f"[lab] run {done}/{total} done ({label} seed {seed}) {duration(seconds)}, "
            f"ETA {duration(rounds_left * mean_seconds)}")


def run_experiment(name, seeds, parallel, cores, num_iterations=None, arms=None, eval_size=None):
    """The arms (all, or those labelled in `arms`) x seeds, `parallel` at a time; {label: [scalars per seed]} and
    the wall time."""
    exp = EXPERIMENTS[name]
    jobs = [(label, script, arm_flags(exp, extra, num_iterations, eval_size), seed)
            for label, script, extra in exp.arms if arms is None or label in arms for seed in seeds]
    free = list(cores) if cores else [None] * parallel
    durations = []  # seconds of each finished run, in the order they finished
    lock = threading.Lock()  # runs finish in several threads: one counts and prints at a time

    def work(job):
        label, script, flags, seed = job
        core = free.pop()  # at most `parallel` jobs run at once, so a core is always free (list ops are atomic)
        try:
            scalars, seconds = run_one(script, flags, seed, core)
        finally:
            free.append(core)
        with lock:
            durations.append(seconds)
            mean = statistics.fmean(durations)
            print(progress_line(len(durations), len(jobs), label, seed, seconds, mean, parallel), flush=True)
        return label, scalars

    # Say what is coming: the wait for the first run to end is otherwise a silence.
    print(f"[lab] {len(jobs)} runs ({len(jobs) // len(seeds)} arms x {len(seeds)} seeds), {parallel} at a time; "
          "a line as each ends", flush=True)
    start = time.time()
    results = {label: [] for label, _, _ in exp.arms if arms is None or label in arms}
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        for label, scalars in pool.map(work, jobs):
            results[label].append(scalars)
    return results, time.time() - start


# ---------------------------------------------------------------- reading the curves

def series(scalars, tag):
    """(steps, values) of one tag, or ([], []) when the run did not log it."""
    pairs = scalars.get(tag, [])
    return [s for s, _ in pairs], [v for _, v in pairs]


def smooth(values, window=SMOOTH):
    """Trailing moving average (the first points average what there is)."""
    return [statistics.fmean(values[max(0, i - window + 1) : i + 1]) for i in range(len(values))]


def band(runs, tag, window=SMOOTH, keep=None):
    """Median and range over seeds of one tag, step by step: (steps, median, low, high).
    keep(scalars, step) -> bool drops points (e.g. the length of wrong responses where there were none)."""
    curves = []
    for scalars in runs:
        steps, values = series(scalars, tag)
        if keep is not None:
            kept = [(s, v) for s, v in zip(steps, values) if keep(scalars, s)]
            steps, values = [s for s, _ in kept], [v for _, v in kept]
        curves.append(dict(zip(steps, smooth(values, window) if window > 1 else values)))
    common = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
    med = [statistics.median(c[s] for c in curves) for s in common]
    low = [min(c[s] for c in curves) for s in common]
    high = [max(c[s] for c in curves) for s in common]
    return common, med, low, high


def at(scalars, tag, step):
    return dict(scalars.get(tag, [])).get(step)


def window_mean(scalars, tag, first=None, last=None, keep=None):
    """Mean of a tag over its first or last k logged points (after keep)."""
    steps, values = series(scalars, tag)
    values = [v for s, v in zip(steps, values) if keep is None or keep(scalars, s)]
    values = values[:first] if first else values[-last:]
    return statistics.fmean(values) if values else float("nan")


def summary(values):
    """'median [min, max]' over seeds."""
    values = [v for v in values if v == v]
    if not values:
        return "n/a"
    def fmt(v):
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"
    return f"{fmt(statistics.median(values))} [{fmt(min(values))}, {fmt(max(values))}]"


def has_wrong(scalars, step):
    """Whether the iteration had a wrong response: the group files log a mean length of 0 when there was none."""
    return (at(scalars, "charts/wrong_response_length", step) or 0) > 0


def has_right(scalars, step):
    return (at(scalars, "charts/right_response_length", step) or 0) > 0


def samples_per_iteration(scalars, step):
    """Responses generated at one iteration: rounds (DAPO's dynamic sampling; 1 otherwise) x B x G."""
    rounds = at(scalars, "charts/sampling_rounds", step) or 1
    return rounds * 16 * 8


def final_accuracy(scalars):
    return window_mean(scalars, "charts/accuracy", last=3)


# ---------------------------------------------------------------- the key numbers

def key_numbers(name, results):
    """Rows (label, quantity, 'median [min, max]') of the figures' key numbers."""
    rows = []
    for label, runs in results.items():
        def add(quantity, values):
            rows.append((label, quantity, summary(values)))
        add("held-out accuracy, start", [at(r, "charts/accuracy", 0) for r in runs])
        add("held-out accuracy, end (mean of last 3 evaluations)", [final_accuracy(r) for r in runs])
        if name == "length-bias":
            for kind, keep, tag in (("wrong", has_wrong, "charts/wrong_response_length"),
                                    ("right", has_right, "charts/right_response_length")):
                add(f"{kind}-response length, first 5 iterations",
                    [window_mean(r, tag, first=5, keep=keep) for r in runs])
                add(f"{kind}-response length, last 10 iterations",
                    [window_mean(r, tag, last=10, keep=keep) for r in runs])
        if name == "clip-higher":
            add("entropy (nats/token), first 5 iterations", [window_mean(r, "losses/entropy", first=5) for r in runs])
            add("entropy (nats/token), last 10 iterations", [window_mean(r, "losses/entropy", last=10) for r in runs])
            add("clip fraction, mean over the run", [window_mean(r, "losses/clipfrac", last=10**6) for r in runs])
        if name == "dynamic-sampling":
            add("zero-signal share of the trained groups, last 10 iterations",
                [window_mean(r, "charts/zero_signal_fraction", last=10) for r in runs])
            add("zero-signal share of the sampled groups, last 10 iterations",
                [1 - window_mean(r, "charts/mixed_group_fraction", last=10) if "charts/mixed_group_fraction" in r
                 else window_mean(r, "charts/zero_signal_fraction", last=10) for r in runs])
            add("responses generated in the run",
                [sum(samples_per_iteration(r, s) for s in series(r, "charts/reward")[0]) for r in runs])
        if name == "sampler-mismatch":
            add("held-out pass@1 of 4, end (mean of last 2 evaluations)",
                [window_mean(r, "charts/pass@1", last=2) for r in runs])
            add("sampler gap |log μ − log π_θold|, mean (median over iterations)",
                [statistics.median(series(r, "charts/sampler_gap_mean")[1] or [float("nan")]) for r in runs])
            add("sampler gap, largest token (median over iterations)",
                [statistics.median(series(r, "charts/sampler_gap_max")[1] or [float("nan")]) for r in runs])
            for tag, what in (("is_ratio_min", "ratio π_θold/μ, smallest"), ("is_ratio_max", "ratio π_θold/μ, largest"),
                              ("is_masked_fraction", "share of tokens masked"),
                              ("is_masked_response_fraction", "share of responses masked")):
                if f"charts/{tag}" in runs[0]:
                    add(f"{what} (median over iterations)",
                        [statistics.median(series(r, f"charts/{tag}")[1]) for r in runs])
        if name == "off-policy":
            tag = "losses/gate" if label == "sapo" else "losses/clipfrac"
            what = "mean gate (1 = on-policy)" if label == "sapo" else "clip fraction"
            add(f"{what}, mean over the run", [window_mean(r, tag, last=10**6) for r in runs])
            add("largest drop of held-out accuracy from its best so far",
                [max(max(acc[: i + 1]) - a for i, a in enumerate(acc))
                 for acc in (series(r, "charts/accuracy")[1] for r in runs)])
            add("grad norm, mean over the run", [window_mean(r, "losses/grad_norm", last=10**6) for r in runs])
    return rows


# ---------------------------------------------------------------- figures

def panels(name, results, eval_size=EVAL_SIZE):
    """[(title, y label, x label, {label: (x, median, low, high)})] for one experiment."""
    def per_arm(tag, window=SMOOTH, keep=None, x=None):
        out = {}
        for label, runs in results.items():
            steps, med, low, high = band(runs, tag, window, keep)
            if x is not None:  # map the step to another x, one per arm: x(runs, step) reduces over the seeds
                steps = [x(runs, s) for s in steps]
            out[label] = (steps, med, low, high)
        return out

    accuracy = (f"held-out accuracy ({eval_size} prompts)", "accuracy", "iteration",
                per_arm("charts/accuracy", window=1))
    if name == "length-bias":
        return [("wrong responses", "mean length (tokens)", "iteration",
                 per_arm("charts/wrong_response_length", keep=has_wrong)),
                ("right responses", "mean length (tokens)", "iteration",
                 per_arm("charts/right_response_length", keep=has_right)),
                accuracy]
    if name == "clip-higher":
        return [("policy entropy", "nats per response token", "iteration", per_arm("losses/entropy")),
                ("clipped tokens", "clip fraction", "iteration", per_arm("losses/clipfrac")), accuracy]
    if name == "dynamic-sampling":
        def generated(runs, step):  # responses generated up to this iteration (median over seeds)
            return statistics.median(sum(samples_per_iteration(r, s)
                                         for s in series(r, "charts/reward")[0] if s <= step)
                                     for r in runs)
        sampled = {}
        for label, runs in results.items():
            tag = ("charts/mixed_group_fraction" if "charts/mixed_group_fraction" in runs[0]
                   else "charts/zero_signal_fraction")
            steps, med, low, high = band(runs, tag)
            if tag == "charts/mixed_group_fraction":
                med, low, high = [1 - v for v in med], [1 - v for v in high], [1 - v for v in low]
            sampled[label + (" (sampled)" if tag == "charts/mixed_group_fraction" else " (sampled = trained)")] = (
                steps, med, low, high)
        trained = {label + " (trained)": curve for label, curve in per_arm("charts/zero_signal_fraction").items()
                   if "charts/mixed_group_fraction" in results[label][0]}  # without dynamic sampling: the same curve
        return [("groups without signal (all equally right)", "share of groups", "iteration", {**sampled, **trained}),
                ("held-out accuracy", "accuracy", "responses generated",
                 per_arm("charts/accuracy", window=1, x=generated)),
                accuracy]
    if name == "off-policy":
        activity = {}
        for label, runs in results.items():
            tag = "losses/gate" if label == "sapo" else "losses/clipfrac"
            steps, med, low, high = band(runs, tag)
            if label == "sapo":  # show 1 - mean gate: how much of the gradient the gate takes away
                med, low, high = [1 - v for v in med], [1 - v for v in high], [1 - v for v in low]
            activity[label + (" (1 − mean gate)" if label == "sapo" else " (clip fraction)")] = (steps, med, low, high)
        return [("clip / gate activity", "share", "iteration", activity),
                ("gradient norm (before clipping)", "norm", "iteration", per_arm("losses/grad_norm")), accuracy]
    if name == "sampler-mismatch":
        reference = "float32, lag 0"
        rows = []
        for sampler in ("bf16", "lag 1", "lag 4"):
            arms = [reference] + [label for label in results if label.startswith(sampler + ",")]
            curves = {label: band(results[label], "charts/pass@1", window=1) for label in arms}
            rows.append((f"{sampler} sampler: held-out pass@1", "pass@1 (4 samples)", "iteration", curves))
        gaps = {label: band(runs, "charts/sampler_gap_mean")
                for label, runs in results.items() if label.endswith(", none") or label == reference}
        rows.append(("sampler gap (no correction)", "mean |log μ − log π_θold|", "iteration", gaps))
        return rows
    raise KeyError(name)


def plot(name, results, path, eval_size=EVAL_SIZE):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("error: the lab's figures need matplotlib: pip install matplotlib")
    rows = panels(name, results, eval_size)
    colors = {arm: f"C{i % 10}" for i, arm in enumerate(results)}  # one colour per arm in every panel
    if name == "sampler-mismatch":  # one colour per correction, whichever the sampler
        kinds = ["lag 0", "none", "token-tis", "token-reject", "token-icepop", "sequence-geo-reject", "sequence-mis",
                 "π_old = μ"]
        colors = {arm: f"C{kinds.index(arm.split(', ')[1])}" for arm in results}
    fig, axes = plt.subplots(1, len(rows), figsize=(5 * len(rows), 3.8 if len(rows) < 4 else 4.6))
    for ax, (title, ylabel, xlabel, curves) in zip(axes, rows):
        for label, (x, med, low, high) in curves.items():
            color = colors[label.split(" (")[0]] if label.split(" (")[0] in colors else colors[label]
            ax.plot(x, med, label=label, color=color, linestyle="--" if "(trained)" in label else "-")
            ax.fill_between(x, low, high, alpha=0.2, color=color)
        ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
        if "gap" in title:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{name}: median and range over {len(next(iter(results.values())))} seeds", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ---------------------------------------------------------------- main

def learning(scalars):
    """A run's scalars without the timings (charts/*_per_second, perf/*), as JSON stores them: what the same seed
    must repeat exactly."""
    timing = ("charts/samples_per_second", "charts/tokens_per_second")
    return {tag: [list(point) for point in points] for tag, points in scalars.items()
            if not tag.startswith("perf/") and tag not in timing}


def write_report(name, results, seeds, wall, path, num_iterations=None, eval_size=None):
    exp = EXPERIMENTS[name]
    lines = [f"# Lab: {name}", "", exp.question, "",
             f"`python -m common.lab {name}` ran these ({len(seeds)} seeds: {' '.join(map(str, seeds))}) "
             f"in {wall / 60:.1f} min of wall time:", ""]
    lines += [f"    python {script} --seed N {' '.join(arm_flags(exp, extra, num_iterations, eval_size))}"
              for _, script, extra in exp.arms]
    lines += ["", "| arm | quantity | median [min, max] over seeds |", "|---|---|---|"]
    lines += [f"| {label} | {quantity} | {value} |" for label, quantity, value in key_numbers(name, results)]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv=None):
    class Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
        """Flag defaults shown, and the experiment list kept as written."""

        def _get_help_string(self, action):  # a default of None: the help says in words what happens
            return action.help if action.default is None else super()._get_help_string(action)

    p = argparse.ArgumentParser(prog="python -m common.lab", description="\n\n".join(__doc__.split("\n\n")[:2]),
                                formatter_class=Formatter)
    p.add_argument("experiment", choices=[*EXPERIMENTS, TOY, "all"], help="which experiment to run")
    p.add_argument("--seeds", type=int, nargs="+", default=None,
                   help="seeds of every arm (default: 1 2 3; under --replot: the saved curves' seeds)")
    p.add_argument("--parallel", type=int, default=2, help="runs at a time (each on one core)")
    p.add_argument("--cores", type=int, nargs="*", default=None,
                   help="pin the runs to these cores with taskset (default: 0..parallel-1 when taskset exists; "
                        "give no value to not pin)")
    p.add_argument("--out", default="runs/lab", help="folder of figures and tables")
    p.add_argument("--update-results", action="store_true",
                   help="write into common/results/lab, the committed figures of lab.md (instead of --out)")
    p.add_argument("--replot", action="store_true", help="redraw from <out>/<experiment>.json without running")
    p.add_argument("--num-iterations", type=int, default=None,
                   help="iterations of every run (default: the experiment's own; fewer for a quick look)")
    p.add_argument("--eval-size", type=int, default=None,
                   help=f"held-out prompts of each evaluation (default: {EVAL_SIZE}; fewer for a quick look)")
    p.add_argument("--arms", nargs="+", default=None, metavar="LABEL",
                   help="run only these arms (labels as in <experiment>.md) and keep the other arms' curves from "
                        "<out>/<experiment>.json, run with the same seeds: for an arm added to an experiment")
    args = p.parse_args(argv)
    if args.arms is not None:
        if args.experiment not in EXPERIMENTS or args.replot:
            p.error("--arms needs one experiment that runs (not all, toy-pathologies or --replot)")
        labels = [label for label, _, _ in EXPERIMENTS[args.experiment].arms]
        unknown = [arm for arm in args.arms if arm not in labels]
        if unknown:
            p.error(f"--arms: no arm {unknown[0]!r} in {args.experiment}; its arms are: " + "; ".join(labels))
    if args.seeds is not None and len(set(args.seeds)) < len(args.seeds):  # a seed twice: the same run twice
        p.error(f"--seeds: each seed once, got {' '.join(map(str, args.seeds))}")
    if args.parallel < 1:
        p.error(f"--parallel must be >= 1, got {args.parallel}")
    for flag, value in (("--num-iterations", args.num_iterations), ("--eval-size", args.eval_size)):
        if value is not None and value < 1:
            p.error(f"{flag} must be >= 1, got {value}")
    try:  # before any run: a missing figure library must not cost minutes of experiments first
        import matplotlib  # noqa: F401
    except ImportError:
        p.error("the figures need matplotlib: pip install -r requirements.txt")
    if args.update_results:
        args.out = os.path.join(ROOT, "common", "results", "lab")
    names = [*EXPERIMENTS, TOY] if args.experiment == "all" else [args.experiment]
    for name in names if args.replot else []:  # every saved curve there, or one line before any figure is drawn
        saved_path = os.path.join(args.out, f"{name}.json")
        if name != TOY and not os.path.exists(saved_path):
            p.error(f"--replot redraws from {saved_path}, which does not exist: run the experiment first")
        if name != TOY and args.seeds is not None:
            with open(saved_path) as f:
                saved_seeds = json.load(f)["seeds"]
            if saved_seeds != args.seeds:  # the figure shows the seeds that ran, whatever --seeds says
                p.error(f"--replot: {saved_path} holds seeds {saved_seeds}, not {args.seeds}; give those or no --seeds")
    args.seeds = args.seeds or [1, 2, 3]
    kept = {}  # under --arms: the saved curves of the arms that do not run
    if args.arms is not None:
        saved_path = os.path.join(args.out, f"{args.experiment}.json")
        if not os.path.exists(saved_path):
            p.error(f"--arms keeps the other arms from {saved_path}, which does not exist: run the whole experiment")
        with open(saved_path) as f:
            kept = json.load(f)
        ran_with = (kept["seeds"], kept["num_iterations"], kept.get("eval_size"))
        if ran_with != (args.seeds, args.num_iterations, args.eval_size):
            p.error(f"--arms: {saved_path} was run with seeds {kept['seeds']}, --num-iterations "
                    f"{kept['num_iterations']} and --eval-size {kept.get('eval_size')}; give the same")
    cores = args.cores
    if cores is None:
        cores = list(range(args.parallel)) if shutil.which("taskset") else []
    if cores and len(cores) < args.parallel:
        p.error(f"--cores needs at least --parallel ({args.parallel}) cores, got {cores}")
    os.makedirs(args.out, exist_ok=True)

    for name in names:
        if name == TOY:  # no algorithm file involved: exact computations and a Monte Carlo check
            from common.lab import toys
            toys.main(["--out", args.out, "--seeds", *map(str, args.seeds)])
            continue
        data_path = os.path.join(args.out, f"{name}.json")
        if args.replot:
            with open(data_path) as f:
                saved = json.load(f)
            results, seeds, wall, num_iterations = (
                saved[k] for k in ("results", "seeds", "wall_seconds", "num_iterations"))
            eval_size = saved.get("eval_size")  # None: the experiment's own
        else:
            print(f"[lab] {name}: {EXPERIMENTS[name].question}", flush=True)
            results, wall = run_experiment(name, args.seeds, args.parallel, cores[: args.parallel], args.num_iterations,
                                           args.arms, args.eval_size)
            seeds, num_iterations, eval_size = args.seeds, args.num_iterations, args.eval_size
            if kept:  # every arm in the experiment's order; the wall time is the sum of both runs'
                ran, wall = results, wall + kept["wall_seconds"]
                for label in set(ran) & set(kept["results"]):  # an arm run again: does it learn as it did?
                    same = [learning(now) == learning(then) for now, then in zip(ran[label], kept["results"][label])]
                    print(f"[lab] {label}: every figure but the timings as saved, seed by seed: {same}", flush=True)
                results = {label: ran[label] if label in ran else kept["results"][label]
                           for label, _, _ in EXPERIMENTS[name].arms if label in ran or label in kept["results"]}
            with open(data_path, "w") as f:
                json.dump({"seeds": seeds, "wall_seconds": wall, "num_iterations": num_iterations,
                           "eval_size": eval_size, "results": results}, f)
        write_report(name, results, seeds, wall, os.path.join(args.out, f"{name}.md"), num_iterations, eval_size)
        plot(name, results, os.path.join(args.out, f"{name}.png"), eval_size or EVAL_SIZE)
        if name == "length-bias":  # the same question on a policy that can tell right from wrong (seconds, exact)
            from common.lab import toys
            toys.length_bias_main(["--out", args.out, "--seeds", *map(str, seeds)])
        print(f"[lab] {name}: {wall / 60:.1f} min; wrote {os.path.join(args.out, name)}.png/.md/.json")


if __name__ == "__main__":
    main()
