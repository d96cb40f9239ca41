"""Held-out accuracy of group-file runs against minutes of training (or iterations), from their TensorBoard logs.

    python -m common.tools.curves runs/<run 1> runs/<run 2> ... --labels "grpo, seed 1" ... --out curves.png

One panel for the accuracy sampled at the training temperature (charts/accuracy) and one for greedy decoding
(charts/greedy_accuracy). Minutes count from the end of the evaluation of the starting model (the first
point), so that model loading and that evaluation are not training time.
"""

import argparse
import os


def curves(run_dir: str, x: str) -> dict:
    """{tag: (xs, ys)} for the held-out accuracies of one run."""
    from common.tools.benchmark import read_scalars

    scalars = read_scalars(run_dir)  # tag -> [(wall time, step, value)]
    out = {}
    for tag in ("charts/accuracy", "charts/greedy_accuracy"):
        points = sorted(scalars.get(tag, []), key=lambda point: point[1])
        if not points:
            raise SystemExit(f"error: {run_dir} has no {tag} (not a group file's run?)")
        start = points[0][0]
        xs = [(wall - start) / 60 if x == "minutes" else step for wall, step, _ in points]
        out[tag] = (xs, [value for _, _, value in points])
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m common.tools.curves", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="run folders (runs/<run>)")
    parser.add_argument("--labels", nargs="+", help="a label per run (default: the folder names)")
    parser.add_argument("--x", choices=["minutes", "iterations"], default="minutes", help="the horizontal axis")
    parser.add_argument("--out", default="curves.png", help="the figure's file (default: curves.png)")
    parser.add_argument("--title", default="held-out accuracy", help="the figure's title")
    args = parser.parse_args(argv)
    labels = args.labels or [os.path.basename(os.path.normpath(run)) for run in args.runs]
    if len(labels) != len(args.runs):
        parser.error(f"--labels needs one label per run: {len(args.runs)} runs, {len(labels)} labels")
    missing = [run for run in args.runs if not os.path.isdir(run)]
    if missing:
        parser.error(f"no such run folder: {missing[0]}")
    from common.tools.benchmark import refuse_missing_folder

    refuse_missing_folder("--out", args.out)  # before matplotlib's import and the logs' reading
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = [curves(run, args.x) for run in args.runs]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, (tag, name) in zip(axes, (("charts/accuracy", "sampled (T = 1)"), ("charts/greedy_accuracy", "greedy"))):
        for label, run in zip(labels, data):
            ax.plot(*run[tag], marker="o", markersize=3, label=label)
        ax.set_title(name)
        ax.set_xlabel("minutes of training" if args.x == "minutes" else "iteration")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("held-out accuracy")
    axes[1].legend(fontsize=8)
    fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
