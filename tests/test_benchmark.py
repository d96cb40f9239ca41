"""common/tools/benchmark.py: threshold detection, tables for both families, and one end-to-end run."""
import math

import pytest

from common.tools import benchmark as B


def test_running_means():
    assert B.running_means([1, 2, 3, 4], 2) == [None, 1.5, 2.5, 3.5]
    assert B.running_means([5], 3) == [None]


def _classic_scalars(returns, t0=100.0, steps_per_episode=500):
    ev = [(t0 + 0.5 * i, steps_per_episode * (i + 1), r) for i, r in enumerate(returns)]
    return {"charts/episodic_return": ev, "charts/SPS": [(t0, 1, 900.0), (t0 + 9, 2, 1000.0)]}


def test_classic_threshold_is_mean_of_last_20_returns():
    # the window of the first 20 episodes has mean (10 + 19 * 490) / 20 = 466 < 475; the next one,
    # (19 * 490 + 500) / 20 = 490.5, is the first "reached": episode 21, logged at step 21 * 500
    returns = [10.0] + [490.0] * 19 + [500.0] * 5
    row = B.summarise(B.CLASSIC, _classic_scalars(returns), 475.0, launch_time=98.0)
    assert row["x_to"] == 500 * 21
    assert row["s_to"] == pytest.approx(100.0 + 0.5 * 20 - 98.0)  # event wall time - launch time
    assert row["low_after"] == pytest.approx(490.5)  # it held: the running mean only rose afterwards
    assert row["final"] == pytest.approx((15 * 490 + 5 * 500) / 20)
    assert row["sps"] == 1000.0
    never = B.summarise(B.CLASSIC, _classic_scalars([100.0] * 30), 475.0, launch_time=0.0)
    assert math.isnan(never["x_to"]) and math.isnan(never["s_to"])


def test_group_family_reads_accuracy_and_perf_tags():
    scalars = {
        "charts/accuracy": [(10.0, 5, 0.5), (20.0, 10, 0.92), (30.0, 15, 0.88), (40.0, 20, 0.95)],
        "charts/response_length": [(0, 1, 4.0), (0, 2, 6.0)],
        "losses/clipfrac": [(0, 1, 0.1), (0, 2, 0.3)],
        "charts/tokens_per_second": [(0, 1, 100.0)],
        "charts/samples_per_second": [(0, 1, 10.0)],
        "perf/generate_seconds": [(0, 1, 1.0), (0, 2, 3.0)],
        "perf/logprob_seconds": [(0, 1, 0.5)],
        "perf/update_seconds": [(0, 1, 0.25)],
    }
    assert B.family_of("dapo") is B.GROUP and B.family_of("ppo") is B.CLASSIC
    row = B.summarise(B.GROUP, scalars, 0.9, launch_time=5.0)
    assert (row["x_to"], row["s_to"]) == (10, 15.0)  # the first evaluation >= 0.9
    assert row["final"] == pytest.approx((0.92 + 0.88 + 0.95) / 3)  # mean of the last 3 evaluations
    assert (row["length"], row["clipfrac"], row["t_gen"]) == pytest.approx((5.0, 0.2, 2.0))
    row["run_s"], row["rss"] = 50.0, 1.25
    text = B.markdown(B.GROUP, "group methods", 0.9, {"grpo": [(1, row), (2, dict(row, x_to=float("nan")))]})
    assert "| grpo | 1 | 10 | 15.0 | 0.917 | 5.0 | 0.200 | 100 | 10.0 | 2.00 / 0.50 / 0.25 | 50.0 | 1.25 |" in text
    assert "| grpo | 1/2 |" in text  # one seed of two reached the threshold
    assert "| run seconds | peak RSS GiB |" in text  # ru_maxrss's kB / 2**20: GiB, not GB


def test_medians_count_unreached_seeds_as_infinite():
    rows = [{"x_to": 10.0, "s_to": 1.0, "final": 1.0}, {"x_to": float("nan"), "s_to": float("nan"), "final": 3.0},
            {"x_to": float("nan"), "s_to": float("nan"), "final": 2.0}]
    med = B.median_row(rows)
    assert math.isnan(med["x_to"]) and med["final"] == 2.0  # 2 of 3 never reached: no median
    med = B.median_row(rows[:2] + [{"x_to": 30.0, "s_to": 3.0, "final": 2.0}])
    assert med["x_to"] == 30.0 and med["s_to"] == 3.0


def test_unknown_algo_is_a_clear_error():
    with pytest.raises(SystemExit, match="unknown algorithm 'ppo2'"):
        B.main(["--algos", "ppo2"])
    with pytest.raises(SystemExit, match="mix of classic and group"):
        B.main(["--algos", "ppo", "grpo"])


def test_end_to_end_ppo(tmp_path, capsys):
    out = tmp_path / "table.md"
    B.main(["--algos", "ppo", "--seeds", "1", "--no-pin", "--threshold", "30", "--out", str(out),
            "--", "--total-timesteps", "4096", "--num-envs", "4", "--num-steps", "128"])
    text = capsys.readouterr().out
    assert text.strip() == out.read_text().strip()
    (row,) = [line for line in text.splitlines() if line.startswith("| ppo | 1 |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    steps_to, seconds_to, low_after, final = int(cells[2].replace(",", "")), *map(float, cells[3:6])
    assert 0 < steps_to <= 4096 and 0.1 < seconds_to < 60 and final >= 30 and low_after <= final
    assert "| ppo | 1/1 |" in text
    # The command comes first.
    assert text.startswith("`python -m common.tools.benchmark --algos ppo --seeds 1 --no-pin")


def test_help_shows_every_default_and_the_classic_targets(capsys):
    with pytest.raises(SystemExit) as exc:
        B.main(["--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "CPU core to pin each run to with taskset (default: 0)" in text
    assert "(default: [1, 2, 3])" in text and "(default: CartPole-v1)" in text
    targets = {"CartPole-v1": 475, "Acrobot-v1": -100, "MountainCar-v0": -150, "Pendulum-v1": -250,
               "MountainCarContinuous-v0": 90}
    assert B.CLASSIC.default_thresholds == targets


def test_plot_median_and_band(tmp_path):
    curves = {"ppo": [([0, 100, 200], [1.0, 2.0, 3.0]), ([0, 150, 250], [1.5, 2.5, 2.0])], "a2c": [([], [])]}
    B.plot(str(tmp_path / "curves.png"), B.CLASSIC, "CartPole-v1", [2.5], curves)
    assert (tmp_path / "curves.png").stat().st_size > 10_000


def test_tuned_flags_parse_and_pass_every_check():
    # every string of the per-env table is valid input for its script (a typo would fail only at run time)
    import importlib
    import shlex

    import tyro

    for env_id, per_algo in B.TUNED.items():
        for algo, flags in per_algo.items():
            mod = importlib.import_module(algo)
            args = tyro.cli(mod.Args, args=["--env-id", env_id] + shlex.split(flags))
            mod.check_args(args)
            assert B.tuned_args(algo, env_id) == shlex.split(flags)
    with pytest.raises(SystemExit, match="--tuned: no flags for vpg on NoSuchEnv-v0"):
        B.tuned_args("vpg", "NoSuchEnv-v0")


def test_results_table_shows_the_tuned_flags():
    import os

    readme = open(os.path.join(B.ROOT, "common", "results", "classic.md")).read()
    table = readme.split("## Flags per environment", 1)[1]
    for env_id, per_algo in B.TUNED.items():
        for algo, flags in per_algo.items():
            if flags:
                assert f"`{flags}`" in table, f"classic.md: flags of {algo} on {env_id} missing or different"


def test_seeds_are_interleaved_across_algorithms(monkeypatch, capsys):
    """Seed 1 of every algorithm, then seed 2: a machine that slows down mid-benchmark slows every algorithm's
    later seeds alike, not the last algorithm's every seed. The tables still list each algorithm's seeds together."""
    calls = []

    def run_one(algo, seed, *rest):
        calls.append((algo, seed))
        return {}, 0.0, 1.0, 0.5

    monkeypatch.setattr(B, "run_one", run_one)
    B.main(["--algos", "grpo", "dapo", "--seeds", "1", "2", "3", "--no-pin"])
    assert calls == [("grpo", 1), ("dapo", 1), ("grpo", 2), ("dapo", 2), ("grpo", 3), ("dapo", 3)]
    rows = [line.split(" | ")[:2] for line in capsys.readouterr().out.splitlines() if line.startswith("| grpo | ")
            or line.startswith("| dapo | ")]
    assert rows[:6] == [["| grpo", "1"], ["| grpo", "2"], ["| grpo", "3"], ["| dapo", "1"], ["| dapo", "2"],
                        ["| dapo", "3"]]


@pytest.mark.parametrize("tool, argv", [
    ("benchmark", ["--algos", "ppo", "--out", "{missing}/table.md"]),
    ("benchmark", ["--algos", "ppo", "--plot", "{missing}/curves.png"]),
    ("compare_trl", ["--out", "{missing}/trl.md"]),
    ("curves", ["{run}", "--out", "{missing}/curves.png"]),
    ("gpu_check", ["--dry-run", "--out", "{missing}/gpu.md"]),
    ("smollm2_on_gpu", ["run", "--out", "{missing}/smollm2.md"]),
])
def test_an_output_file_in_a_missing_folder_is_refused_before_any_run(tool, argv, tmp_path, monkeypatch):
    """--out and --plot were opened only after the runs (hours of them), and failed there on a folder not made."""
    import importlib

    from common.tools import scale

    def ran(*args, **kwargs):
        raise AssertionError("a run started")

    monkeypatch.setattr(B, "run_one", ran)
    monkeypatch.setattr(scale, "build_model", ran)  # the GPU check's first heavy step
    module = importlib.import_module(f"common.tools.{tool}")
    if tool == "smollm2_on_gpu":
        monkeypatch.setattr(module, "join", ran)
    if tool == "compare_trl":
        monkeypatch.setattr(module, "require_optional", ran)  # what main does first, before the runs
    missing = tmp_path / "not_made"
    argv = [arg.format(missing=missing, run=tmp_path) for arg in argv]
    with pytest.raises(SystemExit) as e:
        module.main(argv)
    path = next(arg for arg in argv if arg.startswith(str(missing)))
    flag = argv[argv.index(path) - 1]
    assert str(e.value) == f"error: {flag} {path}: no folder {missing}; make it first, or write the file elsewhere"
