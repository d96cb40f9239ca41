"""Benchmark runner: run algorithm scripts as subprocesses and tabulate their tensorboard logs.

    python -m common.tools.benchmark --algos vpg a2c trpo ppo --env-id CartPole-v1 --seeds 1 2 3 --core 1
    python -m common.tools.benchmark --algos ppo --env-id Pendulum-v1 --seeds 1 2 3 -- --gamma 0.95
    python -m common.tools.benchmark --algos grpo dapo --seeds 1 2 --threshold 0.8 -- --num-iterations 100

Each run is `python <algo>.py --seed N [--env-id ENV] <args after -->`, pinned to one core with
`taskset -c <core>` (--core, default 0; --no-pin for none) and OMP_NUM_THREADS=1 (the way the speed figures of
common/results/ were measured), in a
fresh temporary working directory so that its runs/ folder holds exactly one run. Its event file is
then read back and summarised; seconds are event wall time minus the subprocess launch time, so
they include Python start-up and imports. Every table also gives each run's wall time and its peak
resident memory (the kernel's own count for that process, whatever else runs beside it). The runs go seed by seed
(seed 1 of every script, then seed 2, ...), so that a drift in the machine's speed falls on every script alike.

The algorithm name decides the family:
  classic (vpg a2c trpo ppo): x = env steps; "reached" = mean of the last 20 episodic returns
      >= threshold (default per env: CartPole-v1 475, Acrobot-v1 -100, MountainCar-v0 -150,
      Pendulum-v1 -250, MountainCarContinuous-v0 90);
      columns: steps and seconds to threshold, the lowest running mean after reaching it (did it
      hold?), final return (mean of last 20), SPS.
  group (grpo dr_grpo dapo gspo sapo): x = iteration; "reached" = a held-out accuracy evaluation
      >= threshold (default 0.9); columns: iterations and seconds to threshold, final accuracy
      (mean of the last 3 evaluations), response length, clip fraction, tokens/s, samples/s and
      the per-iteration time split generation / log-probs / update.

Only the standard library and tensorboard are needed; --plot needs matplotlib (imported lazily).
"""

import argparse
import glob
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass
class Family:
    """What differs between kinds of scripts: the metric that decides "reached", and the columns."""

    name: str
    algos: tuple
    metric: str  # tensorboard tag whose running mean is compared with the threshold
    window: int  # "reached" when the mean of the last `window` values of `metric` >= threshold
    final_window: int  # the final score is the mean of the last `final_window` values
    x_name: str  # what the x-axis (the event step) counts
    default_thresholds: dict = field(default_factory=dict)
    fallback_threshold: float | None = None


CLASSIC = Family(
    name="classic", algos=("vpg", "a2c", "trpo", "ppo"), metric="charts/episodic_return",
    window=20, final_window=20, x_name="steps",
    default_thresholds={"CartPole-v1": 475.0, "Acrobot-v1": -100.0, "MountainCar-v0": -150.0,
                        "Pendulum-v1": -250.0, "MountainCarContinuous-v0": 90.0},
)
GROUP = Family(
    name="group", algos=("grpo", "dr_grpo", "dapo", "gspo", "sapo"), metric="charts/accuracy",
    window=1, final_window=3, x_name="iterations", fallback_threshold=0.9,
)
FAMILIES = (CLASSIC, GROUP)

# The classic scripts' flags per environment (their defaults are CartPole-v1's), like rl-zoo's
# hyperparameter files; --tuned adds them to each run. common/results/classic.md's table "Flags per environment"
# shows the same strings and the results they gave.
TUNED = {
    "CartPole-v1": {"vpg": "", "a2c": "", "trpo": "", "ppo": ""},
    "Acrobot-v1": {
        "vpg": "--total-timesteps 300000 --num-steps 128 --learning-rate 2e-3",
        "ppo": "--total-timesteps 200000",
        "trpo": "--total-timesteps 200000",
        "a2c": "--total-timesteps 200000",
    },
    "MountainCar-v0": {
        "vpg": "--total-timesteps 300000 --num-envs 16 --num-steps 128 --gamma 0.99 --norm-obs --norm-reward",
        "a2c": "--total-timesteps 300000 --num-envs 16 --num-steps 16 --gamma 0.99 --norm-obs --norm-reward",
        "trpo": "--total-timesteps 300000 --num-envs 16 --num-steps 64 --gamma 0.99 --gae-lambda 0.98 "
                "--norm-obs --norm-reward",
        "ppo": "--total-timesteps 300000 --num-envs 16 --num-steps 16 --num-minibatches 4 --update-epochs 4 "
               "--learning-rate 3e-4 --gamma 0.99 --gae-lambda 0.98 --norm-obs --norm-reward",
    },
    "Pendulum-v1": {
        "vpg": "--total-timesteps 300000 --num-envs 8 --num-steps 64 --learning-rate 3e-3 --gamma 0.9 --gae-lambda 0.9 "
               "--norm-reward",
        "a2c": "--total-timesteps 500000 --num-envs 16 --num-steps 8 --learning-rate 3e-3 --gamma 0.9 "
               "--gae-lambda 0.9 --max-grad-norm 5 --norm-reward",
        "trpo": "--total-timesteps 200000 --num-envs 8 --num-steps 256 --gamma 0.95 --gae-lambda 0.95 --norm-reward",
        "ppo": "--total-timesteps 200000 --num-envs 8 --num-steps 256 --num-minibatches 8 --learning-rate 2e-3 "
               "--gamma 0.95 --gae-lambda 0.95 --norm-reward",
    },
    "MountainCarContinuous-v0": {
        "vpg": "--total-timesteps 300000 --num-envs 16 --num-steps 256 --gamma 0.99 --norm-obs --norm-reward",
        "a2c": "--total-timesteps 600000 --num-envs 16 --num-steps 32 --learning-rate 3e-4 --gamma 0.99 "
               "--gae-lambda 0.95 --norm-obs --norm-reward",
        "trpo": "--total-timesteps 300000 --num-envs 16 --num-steps 256 --gamma 0.99 --gae-lambda 0.95 "
                "--norm-obs --norm-reward",
        "ppo": "--total-timesteps 300000 --num-envs 16 --num-steps 256 --num-minibatches 8 --learning-rate 1e-3 "
               "--gamma 0.99 --gae-lambda 0.95 --norm-obs --norm-reward",
    },
}


def family_of(algo):
    for fam in FAMILIES:
        if algo in fam.algos:
            return fam
    allowed = " ".join(a for fam in FAMILIES for a in fam.algos)
    raise SystemExit(f"error: --algos: unknown algorithm {algo!r} (allowed: {allowed})")


def read_scalars(run_dir):
    """{tag: [(wall_time, step, value), ...]} from the tensorboard event file(s) of one run."""
    from tensorboard.backend.event_processing import event_accumulator  # slow import, only when needed

    acc = event_accumulator.EventAccumulator(run_dir, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {tag: [(e.wall_time, e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def running_means(values, window):
    """Mean of the last `window` values at each position (None until `window` values exist)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / window if i >= window - 1 else None)
    return out


def mean_of(scalars, tag, last=None):
    vals = [v for _, _, v in scalars.get(tag, [])]
    if last:
        vals = vals[-last:]
    return sum(vals) / len(vals) if vals else float("nan")


def summarise(fam, scalars, threshold, launch_time):
    """One row of numbers for one run (NaN where a quantity is missing)."""
    events = scalars.get(fam.metric, [])
    row = {"x_to": float("nan"), "s_to": float("nan"), "low_after": float("nan")}
    means = running_means([v for _, _, v in events], fam.window)
    if threshold is not None:
        for i, ((wall, step, _), m) in enumerate(zip(events, means)):
            if m is not None and m >= threshold:
                row["x_to"], row["s_to"] = step, wall - launch_time
                row["low_after"] = min(means[i:])  # did it hold? the lowest running mean from then on
                break
    row["final"] = mean_of(scalars, fam.metric, last=fam.final_window)
    if fam is CLASSIC:
        sps = scalars.get("charts/SPS", [])
        row["sps"] = sps[-1][2] if sps else float("nan")
    else:
        row["length"] = mean_of(scalars, "charts/response_length")
        row["clipfrac"] = mean_of(scalars, "losses/clipfrac")
        row["tok_s"] = mean_of(scalars, "charts/tokens_per_second")
        row["smp_s"] = mean_of(scalars, "charts/samples_per_second")
        row["t_gen"] = mean_of(scalars, "perf/generate_seconds")
        row["t_logp"] = mean_of(scalars, "perf/logprob_seconds")
        row["t_upd"] = mean_of(scalars, "perf/update_seconds")
    return row


def columns(fam, threshold):
    """(header, key, format) for each column of a family's table."""
    t = "n/a" if threshold is None else f"{threshold:g}"
    x = fam.x_name
    if fam is CLASSIC:
        return [(f"{x} to {t}", "x_to", "{:,.0f}"), (f"seconds to {t}", "s_to", "{:.1f}"),
                ("lowest after", "low_after", "{:.1f}"), ("final return (last 20)", "final", "{:.1f}"),
                ("SPS", "sps", "{:,.0f}"),
                ("run seconds", "run_s", "{:.1f}"), ("peak RSS GiB", "rss", "{:.2f}")]
    return [(f"{x} to {t}", "x_to", "{:,.0f}"), (f"seconds to {t}", "s_to", "{:.1f}"),
            ("final accuracy (last 3 evals)", "final", "{:.3f}"), ("response length", "length", "{:.1f}"),
            ("clipfrac", "clipfrac", "{:.3f}"), ("tokens/s", "tok_s", "{:,.0f}"), ("samples/s", "smp_s", "{:,.1f}"),
            ("s/iter gen / logp / update", ("t_gen", "t_logp", "t_upd"), "{:.2f}"), ("run seconds", "run_s", "{:.1f}"),
            ("peak RSS GiB", "rss", "{:.2f}")]


def fmt(row, key, spec):
    if isinstance(key, tuple):
        return " / ".join(fmt(row, k, spec) for k in key)
    v = row.get(key, float("nan"))
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else spec.format(v)


def median_row(rows, reached_keys=("x_to", "s_to")):
    """Medians over seeds; a seed that never reached the threshold counts as +inf there."""
    med = {}
    for key in rows[0]:
        vals = [r[key] for r in rows if isinstance(r[key], (int, float))]
        if key in reached_keys:
            vals = [math.inf if math.isnan(v) else v for v in vals]
        else:
            vals = [v for v in vals if not math.isnan(v)]
        m = statistics.median(vals) if vals else float("nan")
        med[key] = float("nan") if m == math.inf else m
    return med


def markdown(fam, label, threshold, results):
    """results: {algo: [(seed, row), ...]} -> markdown text: per-seed table, then medians."""
    cols = columns(fam, threshold)
    what = "mean of the last 20 episodic returns" if fam is CLASSIC else "held-out accuracy"
    lines = [f"### {label}: threshold {threshold if threshold is not None else 'none'} ({what})", "",
             "| algo | seed | " + " | ".join(c[0] for c in cols) + " |",
             "|---|---|" + "---|" * len(cols)]
    for algo, runs in results.items():
        for seed, row in runs:
            lines.append(f"| {algo} | {seed} | " + " | ".join(fmt(row, k, s) for _, k, s in cols) + " |")
    lines += ["", "| algo | reached | " + " | ".join("median " + c[0] for c in cols) + " |",
              "|---|---|" + "---|" * len(cols)]
    for algo, runs in results.items():
        rows = [row for _, row in runs]
        reached = sum(not math.isnan(r["x_to"]) for r in rows)
        med = median_row(rows)
        lines.append(f"| {algo} | {reached}/{len(rows)} | " + " | ".join(fmt(med, k, s) for _, k, s in cols) + " |")
    return "\n".join(lines) + "\n"


def refuse_missing_folder(flag, path):
    """One line before any run for an output file whose folder does not exist: open() would fail only after them."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise SystemExit(f"error: {flag} {path}: no folder {folder}; make it first, or write the file elsewhere")


def tuned_args(algo, env_id):
    """The flags TUNED gives this algorithm on this env, as a list; a clear error if there are none."""
    if algo not in TUNED.get(env_id, {}):
        raise SystemExit(f"error: --tuned: no flags for {algo} on {env_id} (they exist for: "
                         + "; ".join(f"{env} {' '.join(algos)}" for env, algos in TUNED.items()) + ")")
    return shlex.split(TUNED[env_id][algo])


def launch(cmd, workdir, env):
    """Run `cmd` in `workdir` (stdout.txt and stderr.txt there); returns (exit code, launch time, seconds, peak RSS
    in GiB). os.wait4 reports this child's own peak resident memory, whatever else runs beside it."""
    with open(os.path.join(workdir, "stdout.txt"), "w") as out, open(os.path.join(workdir, "stderr.txt"), "w") as err:
        start = time.time()
        proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)  # Popen would otherwise wait for it again
        seconds = time.time() - start
    return proc.returncode, start, seconds, usage.ru_maxrss / 2**20  # kB on Linux


def stderr_tail(workdir, lines=5):
    with open(os.path.join(workdir, "stderr.txt")) as f:
        return "\n".join(f.read().strip().splitlines()[-lines:])


def run_one(algo, seed, env_id, extra, pin_core, keep):
    """Run one script in a fresh temporary directory; returns (scalars, launch_time, run_seconds, peak RSS GiB)."""
    fam = family_of(algo)
    script = os.path.join(ROOT, f"{algo}.py")
    cmd = [sys.executable, script, "--seed", str(seed)]
    if fam is CLASSIC:
        cmd += ["--env-id", env_id]
    cmd += extra
    if pin_core is not None:
        cmd = ["taskset", "-c", str(pin_core)] + cmd
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    workdir = tempfile.mkdtemp(prefix=f"bench_{algo}_{seed}_")
    print(f"[benchmark] {' '.join(cmd)}   (in {workdir})", file=sys.stderr, flush=True)
    returncode, launch_time, run_seconds, peak_gb = launch(cmd, workdir, env)
    if returncode != 0:
        raise SystemExit(f"error: {algo} seed {seed} exited with code {returncode} (output in {workdir}):\n"
                         + stderr_tail(workdir))
    run_dirs = [os.path.dirname(p) for p in glob.glob(os.path.join(workdir, "runs", "*", "events.out.tfevents.*"))]
    if len(run_dirs) != 1:
        raise SystemExit(f"error: expected one tensorboard run under {workdir}/runs, found {len(run_dirs)}")
    scalars = read_scalars(run_dirs[0])
    if not keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return scalars, launch_time, run_seconds, peak_gb


def curve(fam, scalars):
    """(xs, ys) learning curve of one run: running mean of the metric against the x-axis."""
    events = scalars.get(fam.metric, [])
    means = running_means([v for _, _, v in events], fam.window if fam is CLASSIC else 1)
    pts = [(step, m) for (_, step, _), m in zip(events, means) if m is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def plot(path, fam, label, thresholds, curves):
    """Median over seeds per algorithm, shaded min-max, on a common grid (step-wise interpolation)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("warning: --plot needs matplotlib (pip install matplotlib); no plot written", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for algo, runs in curves.items():
        runs = [(xs, ys) for xs, ys in runs if xs]
        if not runs:
            continue
        x_max = min(xs[-1] for xs, _ in runs)
        grid = [x_max * i / 200 for i in range(201)]

        def at(xs, ys, x):  # last value logged at or before x (NaN before the first one)
            j = next((k for k in range(len(xs) - 1, -1, -1) if xs[k] <= x), None)
            return float("nan") if j is None else ys[j]

        table = [[at(xs, ys, x) for x in grid] for xs, ys in runs]
        pts = [(x, [t[i] for t in table if not math.isnan(t[i])]) for i, x in enumerate(grid)]
        pts = [(x, v) for x, v in pts if v]
        xs = [x for x, _ in pts]
        line, = ax.plot(xs, [statistics.median(v) for _, v in pts], label=f"{algo} (n={len(runs)})")
        ax.fill_between(xs, [min(v) for _, v in pts], [max(v) for _, v in pts], color=line.get_color(), alpha=0.2)
    for threshold in thresholds:
        ax.axhline(threshold, color="grey", ls="--", lw=1)
    ax.set_xlabel(fam.x_name)
    ax.set_ylabel(("mean of last 20 episodic returns" if fam is CLASSIC else "held-out accuracy"))
    ax.set_title("\n".join(textwrap.wrap(label, 90)), fontsize=9)  # the label may carry long extra args
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"[benchmark] wrote {path}", file=sys.stderr)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    command = shlex.join(["python", "-m", "common.tools.benchmark"] + argv)  # recorded above the tables
    extra = []
    if "--" in argv:  # everything after `--` goes to the scripts unchanged
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="python -m common.tools.benchmark", description=__doc__.split("\n\n")[0],
                                epilog="Arguments after -- are passed to every script.",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)  # --help shows defaults
    p.add_argument("--algos", nargs="+", required=True, help="scripts to run, e.g. vpg a2c trpo ppo (or grpo dapo ...)")
    p.add_argument("--env-id", default="CartPole-v1", help="environment for the classic scripts")
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3], help="seeds to run each script with")
    p.add_argument("--threshold", type=float, nargs="+", default=None,
                   help="score(s) that count as reached, one table each; None: the env's target (classic), 0.9 (group)")
    p.add_argument("--core", type=int, default=0, help="CPU core to pin each run to with taskset")
    p.add_argument("--no-pin", action="store_true", help="do not pin runs with taskset")
    p.add_argument("--out", default=None, help="also write the markdown tables to this file")
    p.add_argument("--plot", default=None, help="write learning curves to this .png (needs matplotlib)")
    p.add_argument("--keep", action="store_true", help="keep each run's temporary working directory")
    p.add_argument("--tuned", action="store_true",
                   help="add each classic script's flags for --env-id from TUNED before those after --")
    args = p.parse_args(argv)

    fams = {family_of(a).name: family_of(a) for a in args.algos}
    if len(fams) > 1:
        raise SystemExit("error: --algos: mix of classic and group algorithms; benchmark one family at a time")
    fam = next(iter(fams.values()))
    missing = [a for a in args.algos if not os.path.exists(os.path.join(ROOT, f"{a}.py"))]
    if missing:
        raise SystemExit(f"error: --algos: no script {', '.join(m + '.py' for m in missing)} in {ROOT}")
    if args.tuned and fam is not CLASSIC:
        raise SystemExit("error: --tuned is for the classic scripts (vpg a2c trpo ppo)")
    algo_extra = {a: (tuned_args(a, args.env_id) if args.tuned else []) + extra for a in args.algos}
    for flag, path in (("--out", args.out), ("--plot", args.plot)):
        if path is not None:
            refuse_missing_folder(flag, path)
    thresholds = args.threshold or [fam.default_thresholds.get(args.env_id, fam.fallback_threshold)]
    pin = None if args.no_pin else args.core
    if pin is not None and shutil.which("taskset") is None:
        print("warning: taskset not found, runs are not pinned to a core", file=sys.stderr)
        pin = None
    if pin is not None:
        print(f"[benchmark] runs pinned to core {pin} (--core N to choose another, --no-pin for none)",
              file=sys.stderr, flush=True)
    label = args.env_id if fam is CLASSIC else "group methods"
    if args.tuned:
        label += " (tuned flags)"
    if extra:
        label += f" ({' '.join(extra)})"

    # the same runs, tabulated once per threshold
    results = {threshold: {algo: [] for algo in args.algos} for threshold in thresholds}
    curves = {algo: [] for algo in args.algos}
    for seed in args.seeds:  # seed 1 of every algorithm, then seed 2: a drift in machine speed hits them all alike
        for algo in args.algos:
            scalars, launch, run_seconds, peak_gb = run_one(algo, seed, args.env_id, algo_extra[algo], pin, args.keep)
            for threshold in thresholds:
                row = summarise(fam, scalars, threshold, launch)
                row["run_s"], row["rss"] = run_seconds, peak_gb
                results[threshold][algo].append((seed, row))
            curves[algo].append(curve(fam, scalars))
    flags = "".join(f"- {a}: `{' '.join(algo_extra[a]) or '(defaults)'}`\n" for a in args.algos)
    tables = "\n".join(markdown(fam, label, threshold, results[threshold]) for threshold in thresholds)
    text = f"`{command}`\n\nFlags per script:\n{flags}\n{tables}"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    if args.plot:
        plot(args.plot, fam, label, thresholds, curves)


if __name__ == "__main__":
    main()
