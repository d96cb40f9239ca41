"""common/tools/compare_trl.py: argument handling, the missing-dependency line, the run order, the numbers it reads
back and the position-id hook. The TRL runs themselves are not part of the suite (trl is optional)."""
import math
import os
import sys

import pytest
import torch

from common import policy
from common.tools import compare_trl as C
from conftest import ROOT



# ---------------------------------------------------------------- arguments

def test_defaults_are_grpo_defaults_and_all_three_variants():
    args = C.parse_args([])
    assert args.variants == ["grpo", "trl", "trl-hook"]
    assert args.seeds == [1, 2, 3] and args.num_iterations == 150 and args.threshold == 0.9
    assert ((args.cores, args.no_pin, args.out, args.settings, args.worker, args.flags)
            == ([0], False, None, False, None, []))


def test_flags_after_the_separator_are_grpo_flags_for_both_sides(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = C.parse_args(["--seeds", "1", "--", "--model", "gpt2", "--task", "addition2"])
    assert args.seeds == [1] and args.flags == ["--model", "gpt2", "--task", "addition2"]
    g = C.grpo_args(args.flags, num_iterations=16)  # as grpo.py reads them: its per-model defaults resolved
    assert ((g.model, g.task, g.num_iterations, g.learning_rate, g.max_new_tokens)
            == ("gpt2", "addition2", 16, 1e-5, 16))  # a real model on a CPU
    assert C.grpo_args([], seed=2).learning_rate == 3e-4  # the embedded model keeps its own


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--num-iterations", "0"], "error: --num-iterations must be >= 1, got 0"),
        (["--threshold", "1.5"], "error: --threshold must be a held-out accuracy in (0, 1], got 1.5"),
        (["--threshold", "0"], "error: --threshold must be a held-out accuracy in (0, 1], got 0"),
        (["--cores", "-1"], "error: --cores must be distinct cores >= 0, got -1"),
        (["--cores", "0", "0"], "error: --cores must be distinct cores >= 0, got 0 0"),
        (["--", "--lora-rank", "8"], "error: --lora-rank: the TRL side here trains all weights"),
        (["--seeds", "1", "1"], "error: --seeds must not repeat a seed, got 1 1"),
        (["--variants", "trl", "trl"], "error: --variants must not repeat, got trl trl"),
    ],
)
def test_bad_arguments_give_one_line(argv, message):
    with pytest.raises(SystemExit) as e:
        C.parse_args(argv)
    assert str(e.value) == message


def test_a_bad_grpo_flag_gets_grpo_s_own_line_before_trl_is_configured(monkeypatch):
    monkeypatch.setattr(C, "require_optional", lambda: None)
    monkeypatch.setattr(C, "trl_version", lambda: C.TRL_TESTED)
    with pytest.raises(SystemExit, match="^error: --group-size"):
        C.main(["--settings", "--", "--group-size", "1"])


@pytest.mark.parametrize("argv", [["--variants", "dapo"], ["--seeds", "one"], ["--worker", "grpo"]])
def test_unknown_values_are_refused_by_argparse(argv, capsys):
    with pytest.raises(SystemExit) as e:
        C.parse_args(argv)
    assert e.value.code == 2 and "invalid" in capsys.readouterr().err


def test_worker_flags_are_hidden_from_help(capsys):
    with pytest.raises(SystemExit):
        C.parse_args(["--help"])
    text = capsys.readouterr().out
    assert "--variants" in text and "--settings" in text and "(default: 150)" in text
    assert "--worker" not in text and "--seed " not in text


# ---------------------------------------------------------------- the missing-dependency line

@pytest.fixture
def without_trl(monkeypatch):
    real = C.importlib.util.find_spec
    monkeypatch.setattr(C.importlib.util, "find_spec",
                        lambda name, *a: None if name in ("trl", "datasets") else real(name, *a))


@pytest.mark.parametrize("argv", [[], ["--settings"], ["--worker", "trl", "--seed", "2"]])
def test_missing_trl_says_what_to_install_in_one_line(without_trl, argv):
    with pytest.raises(SystemExit) as e:
        C.main(argv)
    message = str(e.value)
    assert "\n" not in message and message.startswith("error: python -m common.tools.compare_trl needs trl, datasets")
    assert message.endswith("pip install trl==1.16.0 datasets accelerate")


def test_trl_is_not_a_requirement_of_the_repo():
    with open(os.path.join(ROOT, "requirements.txt")) as f:
        names = {line.split("==")[0].strip().lower() for line in f if line.strip() and not line.startswith("#")}
    assert not names & {"trl", "datasets"}


# ---------------------------------------------------------------- running: order, failures

def test_variants_of_a_seed_run_back_to_back_and_a_failure_does_not_stop_the_rest(monkeypatch, capsys, tmp_path):
    calls = []
    monkeypatch.setattr(C, "require_optional", lambda: None)
    monkeypatch.setattr(C, "trl_version", lambda: C.TRL_TESTED)
    monkeypatch.setattr(C, "settings_markdown", lambda g: "settings table\n")
    monkeypatch.setattr(C, "run_one",
                        lambda variant, seed, n, flags, pin, keep: calls.append((variant, seed, n, pin)) or None)
    out = tmp_path / "trl.md"
    C.main(["--seeds", "1", "2", "--num-iterations", "5", "--cores", "1", "--out", str(out)])
    assert calls == [("grpo", 1, 5, 1), ("trl", 1, 5, 1), ("trl-hook", 1, 5, 1),
                     ("grpo", 2, 5, 1), ("trl", 2, 5, 1), ("trl-hook", 2, 5, 1)]
    text = out.read_text()
    assert "| grpo | 0/2 (2 failed) |" in text and "| trl-hook | 2 | failed |" in text
    assert "`python -m common.tools.compare_trl --seeds 1 2 --num-iterations 5 --cores 1 --out " in text
    assert "Differences that could not be aligned" in text and "settings table" in text


def test_with_two_cores_the_variants_of_a_seed_run_at_once_one_per_core(monkeypatch, tmp_path):
    import threading

    both_started = threading.Barrier(2, timeout=10)  # a run waits until its partner has started too
    calls = []

    def run_one(variant, seed, n, flags, pin, keep):
        calls.append((variant, seed, pin, flags))
        both_started.wait()
        return None

    monkeypatch.setattr(C, "require_optional", lambda: None)
    monkeypatch.setattr(C, "trl_version", lambda: C.TRL_TESTED)
    monkeypatch.setattr(C, "settings_markdown", lambda g: "")
    monkeypatch.setattr(C, "run_one", run_one)
    C.main(["--variants", "grpo", "trl", "--seeds", "1", "2", "--cores", "0", "1", "--", "--task", "addition2"])
    assert sorted(calls) == [("grpo", 1, 0, ["--task", "addition2"]), ("grpo", 2, 0, ["--task", "addition2"]),
                             ("trl", 1, 1, ["--task", "addition2"]), ("trl", 2, 1, ["--task", "addition2"])]
    assert {c[1] for c in calls[:2]} == {1}  # seed 1's pair ran before seed 2's


def test_a_crashing_run_is_reported_not_raised(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(C.tempfile, "mkdtemp", lambda prefix: str(tmp_path))  # the kept output stays out of /tmp
    monkeypatch.setattr(C, "command", lambda variant, seed, n, flags: [
        sys.executable, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"])
    assert C.run_one("trl", 1, 5, [], pin=None, keep=False) is None
    err = capsys.readouterr().err
    assert "trl seed 1 FAILED (exit code 3" in err and "boom" in err


def test_a_run_reports_its_own_peak_memory(monkeypatch, tmp_path):
    # a child that holds ~200 MB and writes one event file where run_one looks for it
    code = ("import os, time; from torch.utils.tensorboard import SummaryWriter; block = bytearray(200 * 2**20); "
            "w = SummaryWriter(os.path.join('runs', 'r')); w.add_scalar('charts/accuracy', 0.5, 0); w.close()")
    monkeypatch.setattr(C, "command", lambda variant, seed, n, flags: [sys.executable, "-c", code])
    monkeypatch.setattr(C.tempfile, "mkdtemp", lambda prefix: str(tmp_path))
    scalars, launch, seconds, peak_gb = C.run_one("grpo", 1, 5, [], pin=None, keep=False)
    assert scalars["charts/accuracy"][0][1:] == (0, 0.5) and seconds > 0
    assert 0.2 < peak_gb < 2  # its own, in GiB (ru_maxrss is kB): the 200 MB block, the interpreter and torch


def test_commands():
    grpo_cmd = C.command("grpo", 2, 7, ["--model", "m"])
    assert grpo_cmd[1] == os.path.join(ROOT, "grpo.py")
    assert grpo_cmd[2:] == ["--model", "m", "--seed", "2", "--num-iterations", "7", "--no-cuda"]
    assert C.command("trl-hook", 3, 7, ["--model", "m"])[1:] == [
        "-m", "common.tools.compare_trl", "--worker", "trl-hook", "--seed", "3", "--num-iterations", "7",
        "--", "--model", "m"]


# ---------------------------------------------------------------- reading the numbers back

def _scalars(start=10.0):
    # iterations 1..20, 0.5 s apart, plus 2 s for each held-out evaluation after iterations 10 and 20
    reward, wall = [], start
    for i in range(1, 21):
        wall += 0.5 + (2.0 if i - 1 in (10,) else 0.0)
        reward.append((wall, i, 0.5))
    accuracy = [(start, 0, 0.5), (reward[9][0] + 2.0, 10, 0.92), (reward[19][0] + 2.0, 20, 0.88)]
    return {"charts/reward": reward, "charts/accuracy": accuracy,
            "charts/greedy_accuracy": [(w, s, 0.97) for w, s, _ in accuracy],
            "diagnostics/scoring_gap_nats": [(start, 0, 3.3)]}


def test_summarise_counts_training_from_the_first_evaluation_and_leaves_evaluations_out_of_s_per_iter():
    row = C.summarise(_scalars(), launch=6.0, run_seconds=30.0, peak_gb=1.5, threshold=0.9)
    assert row["startup"] == pytest.approx(4.0)  # launch → iteration-0 evaluation logged
    assert (row["x_to"], row["acc0"], row["gap"]) == (10, 0.5, 3.3)
    assert row["s_to"] == pytest.approx(10 * 0.5 + 2.0)  # from the start of training, the evaluation included
    assert row["s_iter"] == pytest.approx(0.5)  # the interval after iteration 10 holds an evaluation: left out
    assert row["final"] == pytest.approx((0.5 + 0.92 + 0.88) / 3) and row["final_greedy"] == pytest.approx(0.97)
    never = C.summarise(_scalars(), launch=6.0, run_seconds=30.0, peak_gb=1.5, threshold=0.95)
    assert math.isnan(never["x_to"]) and math.isnan(never["s_to"])
    assert math.isnan(C.summarise({}, 0.0, 1.0, 1.0, 0.9)["s_iter"])  # nothing logged: NaN, not an error


def test_s_per_iter_leaves_out_grpo_pys_evaluations_too():
    """grpo.py evaluates at iteration 10 before it logs iteration 10 (TRL's callback after): the 2 s land in the
    interval 9 → 10, which s/iter leaves out, as it leaves out 10 → 11 on TRL's side (_scalars)."""
    reward, wall = [], 10.0
    for i in range(1, 21):
        wall += 0.5 + (2.0 if i in (10, 20) else 0.0)
        reward.append((wall, i, 0.5))
    accuracy = [(10.0, 0, 0.5), (reward[9][0] - 0.1, 10, 0.92), (reward[19][0] - 0.1, 20, 0.88)]
    row = C.summarise({"charts/reward": reward, "charts/accuracy": accuracy}, 6.0, 30.0, 1.5, 0.9)
    assert row["s_iter"] == pytest.approx(0.5)  # was 13 / 18 = 0.72: 9 → 10 and 19 → 20 kept, 10 → 11 left out


def test_markdown_medians_count_unreached_seeds_as_never():
    row = C.summarise(_scalars(), launch=6.0, run_seconds=30.0, peak_gb=1.5, threshold=0.9)
    unreached = dict(row, x_to=float("nan"), s_to=float("nan"))
    text = C.markdown({"grpo": [(1, row), (2, row), (3, unreached)],
                       "trl": [(1, unreached), (2, unreached), (3, None)]}, 0.9)
    assert "| grpo | 2/3 | 10 | 7.0 | 0.500 |" in text
    assert "| trl | 0/3 (1 failed) | — | — |" in text  # no median iteration count when most seeds never got there
    assert "| trl | 3 | failed |" in text and "| grpo | 3 | — | — | 0.500 |" in text
    assert "| peak RSS GiB |" in text  # ru_maxrss's kB / 2**20: GiB, not GB


# ---------------------------------------------------------------- the position-id hook

def test_hook_gives_left_padded_rows_the_positions_they_would_have_alone():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = os.path.join(ROOT, "common", "models", "tiny_model")
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path).eval()
    enc = tokenizer(["1+2=", "123+456="], return_tensors="pt", padding=True)  # the first row is left-padded
    position_ids = (enc["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    real = enc["attention_mask"].bool()
    with torch.no_grad():
        right = model(**enc, position_ids=position_ids).logits[real]
        stock = model(**enc).logits[real]  # what a caller that passes no position_ids gets
        handle = C.add_position_ids(model)
        hooked = model(**enc).logits[real]
        explicit = model(**enc, position_ids=torch.zeros_like(position_ids)).logits[real]  # given ids are kept
        handle.remove()
    torch.testing.assert_close(hooked, right)
    assert (stock - right).abs().max() > 1.0  # the padded row is scored at the wrong positions without the hook
    assert (explicit - right).abs().max() > 1.0


def test_settings_set_every_trl_default_that_differs():
    pytest.importorskip("trl")
    import grpo

    g = grpo.Args()
    policy.resolve_defaults(g, beta=grpo.BETA)  # as grpo.py's main block does
    text = C.settings_markdown(g)
    assert "| loss aggregation | token mean per response, then mean (eq. 97) | loss_type grpo | dapo |" in text
    assert "| KL weight β | 0.04 | 0.04 | 0 |" in text and "| dtype | float32 (CPU) | bf16 False | bf16 True |" in text
    assert "| learning rate | 0.0003 | 0.0003 | 1e-06 |" in text and "max_completion_length 8 | 512 |" in text
    assert "steps_per_generation 4" in text and "shuffle_dataset False" in text
