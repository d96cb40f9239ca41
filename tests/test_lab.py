"""The lab (common/lab/lab.py), its model (common/models/long_model) and the script that makes it."""
import json
import ast
import os
import random
import re
import statistics
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from common.lab import lab
from common.models import make_long_model
from common.tasks import EVAL_SEED, TASKS
from conftest import ROOT

LONG_MODEL = os.path.join(ROOT, "common", "models", "long_model")


# ---------------------------------------------------------------- the long model

@pytest.fixture(scope="module")
def long_model_samples():
    """200 held-out prompts, one response each at temperature 1, and the greedy responses."""
    tokenizer = AutoTokenizer.from_pretrained(LONG_MODEL)
    model = AutoModelForCausalLM.from_pretrained(LONG_MODEL).eval()
    pairs = TASKS["reverse"].prompts(200, random.Random(EVAL_SEED), split="test")
    enc = tokenizer([p for p, _ in pairs], return_tensors="pt", padding=True)
    out = {}
    torch.manual_seed(0)
    for name, sample in (("sampled", True), ("greedy", False)):
        with torch.no_grad():
            ids = model.generate(**enc, do_sample=sample, top_k=0 if sample else None,
                                 temperature=1.0 if sample else None, max_new_tokens=64,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        out[name] = tokenizer.batch_decode(ids[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    return pairs, out


def test_long_model_is_small_and_loads_like_any_model():
    size = sum(os.path.getsize(os.path.join(LONG_MODEL, f)) for f in os.listdir(LONG_MODEL))
    assert size < 5 * 2**20
    config = AutoModelForCausalLM.from_pretrained(LONG_MODEL).config
    # 15 + 64: the longest prompt + the lab's --max-new-tokens
    assert config.model_type == "gpt2" and config.n_positions >= 15 + 64


def test_long_model_answers_then_hesitates(long_model_samples):
    pairs, out = long_model_samples
    reward = TASKS["reverse"].reward
    sampled = [reward(t, target) for t, (_, target) in zip(out["sampled"], pairs)]
    greedy = [reward(t, target) for t, (_, target) in zip(out["greedy"], pairs)]
    # Room for RL: the greedy answer is usually right, a sampled one often is not.
    assert 0.3 < statistics.fmean(sampled) < 0.8 and statistics.fmean(greedy) > 0.9
    # Every response is digits, then nothing or a space and dots.
    assert sum(bool(re.fullmatch(r"\d{3,6}( \.+)?", t)) for t in out["sampled"]) >= 190
    # Long and varied: tokens = characters + EOS, 4 to 48 of them, spread over tens of tokens.
    lengths = [len(t) + 1 for t in out["sampled"]]
    assert 18 < statistics.fmean(lengths) < 35 and statistics.stdev(lengths) > 8 and max(lengths) >= 40


def test_long_model_length_does_not_track_correctness(long_model_samples):
    # Before RL, right and wrong answers are followed by hesitations of the same length distribution:
    # whatever link between length and correctness the lab shows, RL made it.
    pairs, out = long_model_samples
    right = [len(t) for t, (_, target) in zip(out["sampled"], pairs) if TASKS["reverse"].reward(t, target)]
    wrong = [len(t) for t, (_, target) in zip(out["sampled"], pairs) if not TASKS["reverse"].reward(t, target)]
    assert len(right) > 40 and len(wrong) > 40
    assert abs(statistics.fmean(right) - statistics.fmean(wrong)) < 5  # the std of each mean is about 1.8


def test_make_long_model_refuses_an_existing_folder(tmp_path):
    out = tmp_path / "model"
    out.mkdir()
    with pytest.raises(SystemExit) as exc:
        make_long_model.main(["--out", str(out)])
    assert str(exc.value.code).startswith(f"error: --out {out} already exists") and "--overwrite" in str(exc.value.code)


@pytest.mark.parametrize("value", ["-1", "73"])
def test_make_long_model_bad_max_dots_gets_one_line(value, capsys):
    with pytest.raises(SystemExit):
        make_long_model.main(["--out", "unused", "--max-dots", value])
    assert f"--max-dots must be in 0..72, got {value}" in capsys.readouterr().err


def test_make_long_model_hesitation_is_uniform():
    rng = random.Random(0)
    counts = [len(make_long_model.hesitation(rng, 40).lstrip(" ")) for _ in range(41_000)]
    assert min(counts) == 0 and max(counts) == 40
    assert all(800 < counts.count(k) < 1200 for k in range(41))
    assert all(h == "" or re.fullmatch(r" \.+", h) for h in (make_long_model.hesitation(rng, 40) for _ in range(200)))


# ---------------------------------------------------------------- the lab's arithmetic on logs

def fake_run(rewards, tag_values, accuracy=None):
    """Scalars of one run as the lab reads them: {tag: [(step, value), ...]}, steps from 1."""
    scalars = {"charts/reward": list(enumerate(rewards, start=1))}
    for tag, values in tag_values.items():
        scalars[tag] = list(enumerate(values, start=1))
    if accuracy is not None:
        scalars["charts/accuracy"] = accuracy
    return scalars


def test_band_is_median_and_range_over_seeds():
    runs = [fake_run([0.5] * 3, {"x": values}) for values in ([1, 2, 3], [4, 5, 6], [10, 20, 30])]
    steps, med, low, high = lab.band(runs, "x", window=1)
    assert steps == [1, 2, 3] and med == [4, 5, 6] and low == [1, 2, 3] and high == [10, 20, 30]
    # smoothing is a trailing moving average, applied per seed before the median
    _, med, _, _ = lab.band(runs, "x", window=2)
    assert med == [4, 4.5, 5.5]


def test_band_drops_iterations_without_wrong_responses():
    # reward 1.0 at iteration 2: no wrong response, so its logged wrong length (0) is not a length
    runs = [fake_run([0.5, 1.0, 0.5], {"charts/wrong_response_length": [10, 0, 30]})] * 3
    steps, med, _, _ = lab.band(runs, "charts/wrong_response_length", window=1, keep=lab.has_wrong)
    assert steps == [1, 3] and med == [10, 30]
    assert lab.window_mean(runs[0], "charts/wrong_response_length", first=2, keep=lab.has_wrong) == 20


def test_key_numbers_of_length_bias():
    accuracy = [(0, 0.5), (10, 0.6), (20, 0.7), (30, 0.8)]
    runs = [fake_run([0.5] * 20, {"charts/wrong_response_length": [10] * 5 + [20] * 15,
                                  "charts/right_response_length": [30 - seed] * 20}, accuracy) for seed in range(3)]
    rows = {(label, quantity): value for label, quantity, value in lab.key_numbers("length-bias", {"grpo": runs})}
    assert rows[("grpo", "wrong-response length, first 5 iterations")] == "10 [10, 10]"
    assert rows[("grpo", "wrong-response length, last 10 iterations")] == "20 [20, 20]"
    assert rows[("grpo", "right-response length, last 10 iterations")] == "29 [28, 30]"
    assert rows[("grpo", "held-out accuracy, end (mean of last 3 evaluations)")] == "0.7 [0.7, 0.7]"


def test_sampler_mismatch_crosses_every_sampler_with_every_correction():
    arms = {label: flags for label, script, flags in lab.EXPERIMENTS["sampler-mismatch"].arms}
    assert len(arms) == 1 + 3 * 7 and arms["float32, lag 0"] == []
    assert arms["bf16, sequence-mis"] == ["--sampler-dtype", "bfloat16", "--correction", "sequence-mis"]
    assert arms["lag 4, token-reject"] == ["--sampler-lag", "4", "--correction", "token-reject"]
    assert arms["bf16, π_old = μ"] == ["--sampler-dtype", "bfloat16", "--old-logprobs", "sampler"]
    gap = {"charts/sampler_gap_mean": [1e-3, 2e-3, 4e-3], "charts/pass@1": [0.2, 0.4, 0.6],
           "charts/is_masked_fraction": [0.0, 0.1, 0.3]}
    rows = {(label, quantity): value for label, quantity, value
            in lab.key_numbers("sampler-mismatch", {"lag 1, token-reject": [fake_run([0.5] * 3, gap, [(0, 0.2)])] * 3})}
    assert rows[("lag 1, token-reject", "held-out pass@1 of 4, end (mean of last 2 evaluations)")] == "0.5 [0.5, 0.5]"
    assert rows[("lag 1, token-reject", "share of tokens masked (median over iterations)")] == "0.1 [0.1, 0.1]"


def test_dynamic_sampling_counts_every_generated_response():
    # DAPO logs its sampling rounds: 3 rounds of B x G = 16 x 8 responses is 384; GRPO generates one round
    dapo = fake_run([0.5, 0.5], {"charts/sampling_rounds": [3, 1]})
    grpo = fake_run([0.5, 0.5], {})
    assert [lab.samples_per_iteration(dapo, s) for s in (1, 2)] == [384, 128]
    assert lab.samples_per_iteration(grpo, 1) == 128


def test_arm_flags_replace_the_number_of_iterations_and_the_held_out_prompts():
    exp = lab.EXPERIMENTS["length-bias"]
    flags = lab.arm_flags(exp, [], num_iterations=7, eval_size=9)
    for flag, value in (("--num-iterations", "7"), ("--eval-size", "9")):
        assert flags.count(flag) == 1 and flags[flags.index(flag) + 1] == value
    own = lab.arm_flags(exp, [])
    assert own[own.index("--num-iterations") + 1] == "80" and own[own.index("--eval-size") + 1] == "200"


def test_a_progress_line_with_an_eta_as_each_run_ends(monkeypatch, capsys):
    # 12 runs, 2 at a time, 40 s each so far: after the 3rd, 9 are left, 5 rounds of 40 s
    assert lab.progress_line(3, 12, "grpo", 2, 41, 40.0, 2) == "[lab] run 3/12 done (grpo seed 2) 41s, ETA 3m20s"
    assert [lab.duration(s) for s in (0, 59.4, 60, 200, 3725)] == ["0s", "59s", "1m00s", "3m20s", "1h02m"]
    monkeypatch.setattr(lab, "run_one", lambda script, flags, seed, core: ({"charts/reward": [(1, 0.5)]}, 40.0))
    results, _ = lab.run_experiment("off-policy", [1, 2], parallel=2, cores=[])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "[lab] 6 runs (3 arms x 2 seeds), 2 at a time; a line as each ends"
    assert [line.split(" (")[0] for line in lines[1:]] == [f"[lab] run {i}/6 done" for i in range(1, 7)]
    assert lines[-1].endswith("40s, ETA 0s") and [len(runs) for runs in results.values()] == [2, 2, 2]


def test_arms_run_alone_and_the_others_are_kept_from_the_saved_curves(tmp_path, monkeypatch, capsys):
    """An arm added to an experiment runs alone; the saved arms keep their curves, an arm run again says whether
    it learned as it did (timings aside), and the arms stay in the experiment's order."""
    def run_one(script, flags, seed, core):
        return {"charts/pass@1": [(30, 0.5 + seed / 10)], "perf/iteration_seconds": [(30, 9.0)]}, 40.0
    monkeypatch.setattr(lab, "run_one", run_one)
    for reader in ("write_report", "plot"):  # they read figures these fake runs do not log
        monkeypatch.setattr(lab, reader, lambda *args, **kwargs: None)
    saved = {label: [{"charts/pass@1": [[30, 0.1 * seed]], "perf/iteration_seconds": [[30, 1.0]]} for seed in (1, 2)]
             for label in ("float32, lag 0", "bf16, none", "lag 4, none")}
    saved["lag 4, none"] = [{**run_one(None, None, seed, None)[0], "perf/iteration_seconds": [[30, 1.0]]}
                            for seed in (1, 2)]  # the same run, another machine's timings
    (tmp_path / "sampler-mismatch.json").write_text(json.dumps(
        {"seeds": [1, 2], "wall_seconds": 60.0, "num_iterations": None, "results": saved}))
    lab.main(["sampler-mismatch", "--seeds", "1", "2", "--out", str(tmp_path), "--cores",
              "--arms", "lag 4, none", "bf16, sequence-mis"])
    out = capsys.readouterr().out
    assert "[lab] 4 runs (2 arms x 2 seeds)" in out
    assert "[lab] lag 4, none: every figure but the timings as saved, seed by seed: [True, True]" in out
    merged = json.loads((tmp_path / "sampler-mismatch.json").read_text())
    assert list(merged["results"]) == ["float32, lag 0", "bf16, none", "bf16, sequence-mis", "lag 4, none"]
    assert merged["results"]["bf16, none"] == saved["bf16, none"] and merged["wall_seconds"] > 60.0
    assert merged["results"]["bf16, sequence-mis"][1]["charts/pass@1"] == [[30, 0.7]]
    with pytest.raises(SystemExit):  # other seeds than the saved curves' would mix two experiments
        lab.main(["sampler-mismatch", "--seeds", "1", "--out", str(tmp_path), "--arms", "lag 4, none"])
    assert "was run with seeds [1, 2]" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # and so would other held-out prompts
        lab.main(["sampler-mismatch", "--seeds", "1", "2", "--eval-size", "8", "--out", str(tmp_path), "--arms",
                  "lag 4, none"])
    assert "--num-iterations None and --eval-size None; give the same" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["sampler-mismatch", "--arms", "lag 9, none"], "--arms: no arm 'lag 9, none' in sampler-mismatch"),
    (["all", "--arms", "grpo"], "--arms needs one experiment"),
    (["length-bias", "--parallel", "0"], "--parallel must be >= 1"),
    (["length-bias", "--num-iterations", "0"], "--num-iterations must be >= 1"),
    (["length-bias", "--eval-size", "0"], "--eval-size must be >= 1, got 0"),
    (["length-bias", "--parallel", "2", "--cores", "0"], "--cores needs at least --parallel"),
    (["entropy"], "invalid choice"),
    (["length-bias", "--seeds", "1", "1"], "--seeds: each seed once, got 1 1"),
])
def test_bad_arguments_get_one_line(argv, message, capsys):
    with pytest.raises(SystemExit):
        lab.main(argv)
    assert message in capsys.readouterr().err


def test_the_lab_writes_to_runs_and_checks_matplotlib_before_any_run(tmp_path, monkeypatch, capsys):
    """The committed results are rewritten only when asked (--update-results); without matplotlib the lab stops in
    one line before minutes of experiments, not after them."""
    ran = []
    monkeypatch.setattr(lab, "run_experiment", lambda *a, **k: ran.append(a) or ({}, 0.0))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    with pytest.raises(SystemExit):
        lab.main(["dynamic-sampling"])
    assert "the figures need matplotlib" in capsys.readouterr().err and ran == []
    monkeypatch.undo()
    help_text = subprocess.run([sys.executable, "-m", "common.lab", "--help"], cwd=ROOT, capture_output=True,
                               text=True).stdout
    assert "(default: runs/lab)" in " ".join(help_text.split()) and "--update-results" in help_text


def test_an_experiment_runs_end_to_end(tmp_path, monkeypatch):
    # Two iterations per run, one seed, 16 held-out prompts: the whole path (the runs' processes, logs, report,
    # figure). The lab itself runs in this process (its command line runs above, with --help).
    ran, run_one = [], lab.run_one
    monkeypatch.setattr(lab, "run_one", lambda script, flags, *rest: ran.append(flags) or run_one(script, flags, *rest))
    lab.main(["dynamic-sampling", "--seeds", "1", "--num-iterations", "2", "--eval-size", "16", "--out", str(tmp_path)])
    assert len(ran) == 2 and all(" --num-iterations 2 " in f" {' '.join(flags)} " and
                                 " --eval-size 16 " in f" {' '.join(flags)} " for flags in ran)
    report = (tmp_path / "dynamic-sampling.md").read_text()
    assert ("python grpo.py --seed N" in report and "python dapo.py --seed N" in report
            and "--num-iterations 2" in report and "--eval-size 16" in report and "--eval-size 200" not in report)
    assert re.search(r"\| dapo \| responses generated in the run \| [\d,]+ \[", report)
    assert (tmp_path / "dynamic-sampling.png").read_bytes()[:4] == b"\x89PNG"
    # The group files' new tags are consistent: the mean length is the reward-weighted mean of the right and the
    # wrong responses' lengths (grpo's reward is the accuracy), and shares are shares.
    (grpo,) = json.loads((tmp_path / "dynamic-sampling.json").read_text())["results"]["grpo"]
    for step, reward in grpo["charts/reward"]:
        right, wrong, length = (lab.at(grpo, f"charts/{kind}response_length", step)
                                for kind in ("right_", "wrong_", ""))
        assert reward * right + (1 - reward) * wrong == pytest.approx(length, rel=1e-4)
        assert 0 <= lab.at(grpo, "charts/zero_signal_fraction", step) <= 1
    # --replot redraws from the saved curves without running anything, its title with their held-out prompts
    (tmp_path / "dynamic-sampling.png").unlink()
    titles, panels = [], lab.panels
    monkeypatch.setattr(lab, "panels", lambda *args: titles.extend(row[0] for row in panels(*args)) or panels(*args))
    lab.main(["dynamic-sampling", "--replot", "--out", str(tmp_path)])
    assert (tmp_path / "dynamic-sampling.png").exists() and "held-out accuracy (16 prompts)" in titles


def test_the_lab_tags_are_computed_by_one_function_for_every_group_file():
    # grpo.py's tags are checked on real logs above; every sibling logs them through the same function of
    # common/runs.py (dapo.py on its task accuracies, since its reward also carries the overlong penalty)
    calls = {}
    for script in ("grpo.py", "dr_grpo.py", "dapo.py", "gspo.py", "sapo.py"):
        with open(os.path.join(ROOT, script)) as f:
            source = f.read()
        assert "charts/zero_signal_fraction" not in source and "right_response_length" not in source, script
        calls[script] = [ast.unparse(node) for node in ast.walk(ast.parse(source))
                         if isinstance(node, ast.Call) and ast.unparse(node.func) == "runs.rollout_stats"]
    assert calls["grpo.py"] == [
        "runs.rollout_stats(samples, rewards, advantages, accuracies=rewards, old_logprobs=old_logprobs, "
        "first_epoch=epochs[0])"]
    assert calls["dapo.py"] == [
        "runs.rollout_stats(samples, rewards, advantages, accuracies=accuracies, old_logprobs=old_logprobs, "
        "first_epoch=epochs[0])"]
    assert calls["dr_grpo.py"] == calls["gspo.py"] == calls["sapo.py"] == calls["grpo.py"]


def test_sharpen_or_teach_pass_curves_by_hand_and_end_to_end(tmp_path):
    from common.lab import passk

    # two questions, n = 4: right 1 and 0 times. pass@1 = (1/4 + 0) / 2; pass@2 = (1 − C(3,2)/C(4,2) + 0) / 2 = 0.25;
    # pass@4 = (1 + 0) / 2
    assert passk.pass_curves([[1, 0, 0, 0], [0, 0, 0, 0]]) == pytest.approx([0.125, 0.25, 0.375, 0.5])
    # the command line reaches passk.py (its --help, without torch); the run itself goes in this process
    usage = subprocess.run([sys.executable, "-m", "common.lab", "sharpen-or-teach", "--help"], cwd=ROOT,
                           capture_output=True, text=True, timeout=60).stdout
    assert usage.startswith("usage: python -m common.lab sharpen-or-teach") and "--samples" in usage
    tiny = os.path.join(ROOT, "common", "models", "tiny_model")
    passk.main(["--models", tiny, tiny, "--labels", "base", "again", "--task", "addition", "--few-shot", "0",
                "--max-new-tokens", "8", "--samples", "4", "--prompts", "4", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "sharpen-or-teach.json").read_text())
    for label in ("base", "again"):
        curve = saved["curves"][label]
        assert len(curve) == 4 and curve == sorted(curve) and 0 <= curve[0] <= curve[-1] <= 1  # pass@k grows with k
        assert curve == pytest.approx(passk.pass_curves(saved["rewards"][label]))
    assert (tmp_path / "sharpen-or-teach.png").read_bytes()[:4] == b"\x89PNG"
    assert "| base |" in (tmp_path / "sharpen-or-teach.md").read_text()


@pytest.mark.parametrize("argv, message", [
    (["--task", "nope"], "--task must be one of"),
    (["--few-shot", "-1"], "--few-shot must be >= 0, got -1"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1, got 0"),
    (["--samples", "0"], "--samples must be >= 1, got 0"),
    (["--labels", "a", "a"], "--labels: each model needs a label of its own ('a' twice)"),
])
def test_sharpen_or_teach_bad_flags_get_one_line_before_any_model_loads(argv, message, monkeypatch, capsys):
    from common.lab import passk

    monkeypatch.setattr(passk, "sample_rewards", lambda *a: pytest.fail("sampled despite a bad flag"))
    with pytest.raises(SystemExit):
        passk.main(["--models", "common/models/tiny_model", "common/models/tiny_model", "--labels", "x", "y", *argv])
    assert message in capsys.readouterr().err


def test_sharpen_or_teach_keeps_every_model_and_writes_the_command_as_typed(tmp_path, monkeypatch):
    """Two trained models are two folders named model (runs/<run>/model): by default they are labelled by their
    paths, not both 'model', which kept one curve of the two; labels with spaces are quoted on the page."""
    from common.lab import passk

    for run in ("grpo_run", "dapo_run"):
        (tmp_path / run / "model").mkdir(parents=True)
    monkeypatch.setattr(passk, "sample_rewards", lambda model, args: [[1.0, 0.0]] if "grpo" in model else [[0.0, 0.0]])
    models = [str(tmp_path / "grpo_run" / "model"), str(tmp_path / "dapo_run" / "model")]
    passk.main(["--models", *models, "--samples", "2", "--out", str(tmp_path / "a")])
    saved = json.loads((tmp_path / "a" / "sharpen-or-teach.json").read_text())
    assert saved["curves"] == {models[0]: [0.5, 1.0], models[1]: [0.0, 0.0]}
    passk.main(["--models", *models, "--labels", "after grpo.py", "after dapo.py", "--samples", "2",
                "--out", str(tmp_path / "b")])
    page = (tmp_path / "b" / "sharpen-or-teach.md").read_text()
    assert "--labels 'after grpo.py' 'after dapo.py' --samples 2" in page


def test_replot_needs_the_saved_curves_of_its_seeds_and_help_lists_every_experiment(tmp_path, capsys):
    """--replot without saved curves, or with other seeds than they hold, is one line before anything is drawn; the
    help's experiment list is whole (it was cut after off-policy)."""
    with pytest.raises(SystemExit):
        lab.main(["off-policy", "--replot", "--out", str(tmp_path)])
    assert f"--replot redraws from {tmp_path / 'off-policy.json'}, which does not exist" in capsys.readouterr().err
    (tmp_path / "off-policy.json").write_text(json.dumps({"seeds": [1, 2], "wall_seconds": 1.0,
                                                          "num_iterations": 2, "results": {}}))
    with pytest.raises(SystemExit):
        lab.main(["off-policy", "--replot", "--seeds", "1", "2", "3", "--out", str(tmp_path)])
    assert "holds seeds [1, 2], not [1, 2, 3]" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        lab.main(["--help"])
    help_text = capsys.readouterr().out
    for name in [*lab.EXPERIMENTS, lab.TOY, "all", "sharpen-or-teach"]:
        assert f"python -m common.lab {name} " in help_text, name
    assert "(default: None)" not in help_text
