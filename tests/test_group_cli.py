"""The four grpo.py variants from the command line: a short smoke run each (dapo.py's is in
test_group_crossfile.py), and their own flags' bad input, checked in-process (one clear line each)."""

import os
import subprocess
import sys

import pytest

import dapo
from common import policy
import dr_grpo
import gspo
import sapo
from conftest import ROOT


@pytest.mark.parametrize("script", ["dr_grpo.py", "gspo.py", "sapo.py"])
def test_smoke_run_writes_tensorboard(script, in_process):
    # the main block from its command line, in this process (grpo.py's runs as a subprocess: tests/test_grpo.py)
    run_dir, out = in_process(script, ["--num-iterations", "2", "--prompts-per-iteration", "4", "--eval-size", "8"])
    assert run_dir.name.startswith(f"addition__{script[:-3]}__tiny_model__1__")
    assert any(f.name.startswith("events.out.tfevents") for f in run_dir.iterdir())
    assert "iteration    2/2" in out


@pytest.mark.parametrize(
    "module, field, value, flag",
    [
        (dr_grpo, "clip_eps", 0.0, "--clip-eps"),
        (dapo, "clip_eps_low", 1.0, "--clip-eps-low"),
        (dapo, "clip_eps_high", -0.1, "--clip-eps-high"),
        (dapo, "clip_eps_high", 0.1, "--clip-eps-high"),  # below --clip-eps-low: clip-higher raises the top
        (dapo, "overlong_buffer", 8, "--overlong-buffer"),  # must stay below --max-new-tokens (8)
        (dapo, "max_sampling_rounds", 0, "--max-sampling-rounds"),
        (gspo, "clip_eps_low", 0.0, "--clip-eps-low"),
        (gspo, "clip_eps_high", 0.0, "--clip-eps-high"),
        (sapo, "tau_pos", 0.0, "--tau-pos"),
        (sapo, "tau_neg", -1.0, "--tau-neg"),
        (sapo, "group_size", 1, "--group-size"),
        (gspo, "seed", -1, "--seed"),  # numpy's seeds are 32-bit, unsigned
        (dr_grpo, "seed", 2**32, "--seed"),
        (sapo, "exp_name", "a/b", "--exp-name"),  # one folder under runs/, not nested ones
    ],
)
def test_bad_method_flags_give_one_clear_line(module, field, value, flag):
    with pytest.raises(SystemExit) as e:
        args = module.Args(**{field: value})
        policy.resolve_defaults(args, beta=module.BETA)  # as the main block does, before the checks
        module.check_args(args)
    message = str(e.value)
    assert message.startswith(f"error: {flag} ") and "\n" not in message


def test_the_last_seeds_are_refused_when_the_processes_add_their_rank(monkeypatch):
    # process k seeds with seed + k: under 4 processes the largest seed is 2**32 - 4
    monkeypatch.setenv("WORLD_SIZE", "4")
    args = sapo.Args(seed=2**32 - 4, prompts_per_iteration=4, num_minibatches=1)
    policy.resolve_defaults(args, beta=sapo.BETA)
    sapo.check_args(args, world_size=4)
    with pytest.raises(SystemExit) as e:
        sapo.check_args(sapo.Args(**{**vars(args), "seed": 2**32 - 3}), world_size=4)
    assert str(e.value) == f"error: --seed must be in [0, 2**32 - 3), got {2**32 - 3}"


@pytest.mark.parametrize("rank, local_rank, said", [("0", "0", True), ("1", "1", False), ("2", "0", True)],
                         ids=["process 0", "process 1", "the second machine's first process"])
def test_under_torchrun_one_process_per_machine_says_what_is_wrong(rank, local_rank, said, in_process, monkeypatch,
                                                                   capsys):
    # every process checks the same flags: one line on each machine's console, not one per process; the same status
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("LOCAL_RANK", local_rank)
    for argv in (["--group-size", "1"], ["--grup-size", "2"]):  # refuse_bad_args's, then parse_args's
        with pytest.raises(SystemExit) as e:
            in_process("grpo", argv)
        assert (e.value.code != 1 and "--group-size" in e.value.code) if said else e.value.code == 1
    assert capsys.readouterr().err == ""


def test_help_cut_short_by_a_pipe_ends_quietly():
    # `python grpo.py --help | head` used to end in a BrokenPipeError traceback. Here the reader is gone before the
    # script writes a line (it takes a second to import torch), so every write meets a closed pipe.
    process = subprocess.Popen([sys.executable, os.path.join(ROOT, "sapo.py"), "--help"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    process.stdout.close()
    stderr = process.stderr.read()
    process.wait(timeout=120)
    assert stderr == "", stderr[-2000:]


def test_gradient_checkpointing_says_that_it_does_not_share_the_prompt(in_process):
    _, out = in_process("grpo", ["--num-iterations", "1", "--prompts-per-iteration", "2", "--num-minibatches", "1",
                                 "--eval-size", "4", "--gradient-checkpointing"])
    assert "--gradient-checkpointing: each response is scored with its own copy of its prompt" in out
    assert "iteration    1/1" in out
