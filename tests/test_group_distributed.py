"""One optimiser step is the same whether the batch runs whole, in gradient-accumulation micro-batches, or split over
two processes (torchrun, DDP over gloo), and it is the step of the loss formula itself; plus a two-process run
of every file from its command line."""

import json
import os
import subprocess
import sys

import pytest
import torch

import dapo
import dr_grpo
import grpo
import gspo
import sapo
from common import processes
from conftest import ROOT
from fixed_rollouts import GROUP_SIZE, direct_step, fixed_rollout, forward_of, sgd_step, tiny_gpt2, update_args

MODULES = [grpo, dr_grpo, dapo, gspo, sapo]


def assert_same_parameters(actual, expected, initial):
    moved = sum((expected[name] - initial[name]).abs().sum() for name in expected)
    assert moved > 1e-3, "the reference step did not move the weights: the comparison would prove nothing"
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], atol=1e-6, rtol=0, msg=name)


@pytest.mark.parametrize("beta, no_signal", [(0.04, ()), (0.0, (1, 2))], ids=["beta>0", "beta=0 zero-signal groups"])
@pytest.mark.parametrize("micro_batch_size", [None, 1, 2, 8])
@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_update_step_equals_the_loss_formula_step_with_and_without_micro_batches(module, micro_batch_size, beta,
                                                                                 no_signal):
    """update_policy (log-probs at the temperature, micro-batch weights, DAPO's whole-step token count) gives
    θ − ∇loss of policy_loss evaluated once on the whole batch with independently computed log-probs; with β = 0
    also when the update skips the responses without signal (the normalisers stay the whole minibatch's)."""
    model = tiny_gpt2()
    initial = {name: p.detach().clone() for name, p in model.named_parameters()}
    rollout = fixed_rollout(module, model, no_signal=no_signal)
    assert (rollout.advantages == 0).sum() == len(no_signal) * GROUP_SIZE
    expected = direct_step(module, model, rollout, update_args(module, beta=beta))
    actual = sgd_step(module, model, rollout, update_args(module, micro_batch_size, beta=beta))
    assert_same_parameters(actual, expected, initial)


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_a_corrections_weights_reach_the_update_step(module):
    """A sampler that is not π_θold (common/sampling.py's correct): update_policy hands each pass its rows of the
    rollout's per-token weights, and the step is that of policy_loss given all of them at once."""
    model = tiny_gpt2()
    initial = {name: p.detach().clone() for name, p in model.named_parameters()}
    rollout = fixed_rollout(module, model)
    weights = 0.3 + 1.7 * torch.rand(rollout.mask.shape, generator=torch.Generator().manual_seed(5))
    rollout = rollout._replace(weights=weights)
    expected = direct_step(module, model, rollout, update_args(module))
    actual = sgd_step(module, model, rollout, update_args(module, 2))  # in passes of 2 responses
    assert_same_parameters(actual, expected, initial)
    unweighted = direct_step(module, model, rollout._replace(weights=None), update_args(module))
    assert any(not torch.allclose(unweighted[name], expected[name], atol=1e-5, rtol=0) for name in expected)


@pytest.mark.parametrize("module", [dapo, gspo], ids=lambda m: m.__name__)
def test_the_update_step_takes_each_clip_bound_from_its_own_flag(module):
    """ε_low = 0.05 and ε_high = 0.3, bounds that the rollout's ratios fall between (GSPO's own, 3e-4 and 4e-4,
    clip all its sequence ratios alike either way): update_policy hands each flag to its own argument."""
    model = tiny_gpt2()
    initial = {name: p.detach().clone() for name, p in model.named_parameters()}
    rollout = fixed_rollout(module, model)
    expected = direct_step(module, model, rollout, update_args(module, clip_eps_low=0.05, clip_eps_high=0.3))
    swapped = direct_step(module, model, rollout, update_args(module, clip_eps_low=0.3, clip_eps_high=0.05))
    assert any(not torch.allclose(swapped[name], expected[name], atol=1e-5, rtol=0) for name in expected)
    actual = sgd_step(module, model, rollout, update_args(module, 2, clip_eps_low=0.05, clip_eps_high=0.3))
    assert_same_parameters(actual, expected, initial)


@pytest.fixture(scope="module")
def torchrun(tmp_path_factory):
    """One torchrun launch of 2 processes (torchrun_worker.py): the steps to compare, every file's run, a run's end."""
    out = tmp_path_factory.mktemp("torchrun")
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",
         os.path.join(ROOT, "tests", "torchrun_worker.py"), str(out)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    outputs = dict(part.split("\n", 1) for part in result.stdout.split("=== ")[1:])
    return out, torch.load(out / "steps.pt"), outputs


@pytest.mark.parametrize("micro_batch_size", [None, 2])
@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_two_processes_take_the_one_process_step(module, micro_batch_size, torchrun):
    """The test of record for torchrun: each process holds half of the groups (unequal token counts), DDP averages
    the gradients, and the step equals the one-process step on the whole batch."""
    _, steps, _ = torchrun
    model = tiny_gpt2()
    initial = {name: p.detach().clone() for name, p in model.named_parameters()}
    expected = sgd_step(module, model, fixed_rollout(module, model), update_args(module))
    assert_same_parameters(steps[module.__name__, micro_batch_size], expected, initial)


@pytest.mark.parametrize("micro_batch_size", [None, 2])
@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_two_processes_with_unequal_signal_take_the_one_process_step(module, micro_batch_size, torchrun):
    """β = 0, and process 0 holds every response with signal: process 1 must still run as many passes (DDP's
    backward is collective; with unequal passes the launch hangs), and the step is the one-process step."""
    _, steps, _ = torchrun
    model = tiny_gpt2()
    initial = {name: p.detach().clone() for name, p in model.named_parameters()}
    rollout = fixed_rollout(module, model, no_signal=(1, 2, 3))
    assert ((rollout.advantages[: 2 * GROUP_SIZE] != 0).sum() == GROUP_SIZE
            and (rollout.advantages[2 * GROUP_SIZE :] == 0).all())
    expected = direct_step(module, model, rollout, update_args(module, beta=0.0))
    assert_same_parameters(steps[module.__name__, micro_batch_size, "beta 0"], expected, initial)


@pytest.mark.parametrize("micro_batch_size", [None, 2])
@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_two_processes_skipping_groups_without_signal_take_the_one_process_adam_steps(module, micro_batch_size,
                                                                                      torchrun):
    """β = 0, Adam, 2 epochs × 2 minibatches, the processes holding unequal numbers of groups with signal (on some
    steps one process has none): skipping those groups gives the parameters of running them all, and both give
    the one-process update on the same minibatches (each process draws its own groups' order: here, the same one)."""
    _, steps, _ = torchrun
    model = tiny_gpt2()
    initial = {name: p.detach().clone() for name, p in model.named_parameters()}
    rollout = fixed_rollout(module, model, num_groups=8, no_signal=(1, 2, 4, 5, 7))
    args = update_args(module, micro_batch_size, beta=0.0, num_minibatches=2, update_epochs=2)
    torch.manual_seed(3)  # as adam_update seeds before each process draws the order of its 4 groups, once per epoch
    epochs = []
    for order in [torch.randperm(4) for epoch in range(2)]:
        minibatches = []
        for half in (order[:2], order[2:]):
            groups = torch.cat([half, half + 4])  # the same places in each process's share: groups 0-3 and 4-7
            rows = (groups.unsqueeze(1) * GROUP_SIZE + torch.arange(GROUP_SIZE)).flatten()
            minibatches.append(processes.Minibatch(rows, [rows]))
        epochs.append(minibatches)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, eps=1e-4)
    module.update_policy(model, optimizer, rollout, epochs, args, forward_of(module, args))
    expected = {name: p.detach().clone() for name, p in model.named_parameters()}
    for skip in (True, False):
        assert_same_parameters(steps[module.__name__, micro_batch_size, "adam", skip], expected, initial)


def test_logged_fractions_and_means_cover_both_processes(torchrun):
    """clipfrac, gate and KL are fractions of the whole batch's tokens, summed over the processes before dividing."""
    _, steps, _ = torchrun
    assert steps["whole-batch statistics"] == (3 / 8, 0.5)


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_torchrun_two_processes_end_to_end(module, torchrun):
    out, _, outputs = torchrun
    stdout = outputs[f"{module.__name__}.py"]
    (run_dir,) = (out / module.__name__ / "runs").iterdir()  # process 0 alone logs
    assert len([f for f in run_dir.iterdir() if f.name.startswith("events.out.tfevents")]) == 1
    for iteration in (1, 2):  # one console line per iteration, not one per process
        assert stdout.count(f"iteration    {iteration}/2") == 1, stdout
    assert "on 2 × cpu, 32 responses per iteration" in stdout
    checksums = [float((out / module.__name__ / f"weights_rank{rank}.txt").read_text()) for rank in (0, 1)]
    assert checksums[0] == pytest.approx(checksums[1], rel=1e-12, abs=0), "the two processes' models drifted apart"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts threads in /proc/self/task")
def test_torchrun_run_ends_after_the_final_evaluation_and_leaves_no_gloo_thread(torchrun):
    """The end of a real run (the launch's last part): process 0's final evaluation is long (1000 prompts), then it
    saves the model (slowly), and process 1 has nothing left to do. Process 1 must leave only after both: the
    evaluation (it is held by the reduction after the last iteration, checkpoints.after), and the save (by
    processes.finish's barrier alone). Both must return without a gloo worker thread: one left alive (the group
    kept by DDP or by torch.distributed.nn) ran into interpreter finalisation and aborted process 1 in about 1 run
    of 5 (SIGABRT), and torchrun then killed process 0 mid-evaluation. Without the fix this fails every time, not 1
    time in 5.
    grpo.py stands for all five: their main blocks end alike (tests/test_group_crossfile.py)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, _, _ = torchrun
    ranks = [json.loads((out / "exit" / f"exit_rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [rank["gloo_threads"] for rank in ranks] == [0, 0], "the process group outlived the script"
    (run_dir,) = (out / "exit" / "runs").iterdir()
    accumulator = EventAccumulator(str(run_dir))
    accumulator.Reload()
    (final,) = [event for event in accumulator.Scalars("charts/accuracy") if event.step == 1]
    assert ranks[1]["returned"] > final.wall_time, "process 1 left before process 0's final evaluation ended"
    assert ranks[1]["returned"] > ranks[0]["saved"], "process 1 left before process 0 had saved the model"


def test_two_processes_stopped_and_resumed_are_the_uninterrupted_run(torchrun):
    """torchrun, 2 processes: SIGTERM to process 1 alone after iteration 2; both stop with a checkpoint (process 0's
    weights and Adam, each process's random states) and exit status 143, then --resume: every logged number and the
    final weights equal the straight run's."""
    from test_group_runs import scalars, weights

    out, _, _ = torchrun
    (straight,) = (out / "resume" / "straight" / "runs").iterdir()
    (resumed,) = (out / "resume" / "stopped" / "runs").iterdir()
    assert sorted(f for f in os.listdir(resumed / "checkpoint-2")) == ["random-0.pt", "random-1.pt", "state.pt"]
    for rank in (0, 1):  # each stopped process exited with SIGTERM's status, after the checkpoint
        assert (out / "resume" / f"stopped_exit_rank{rank}.txt").read_text() == "143"
    expected, actual = scalars(straight), scalars(resumed)
    assert {step for _, step in expected} == {0, 1, 2, 3, 4} and actual == expected
    expected_weights, actual_weights = weights(straight), weights(resumed)
    assert all(torch.equal(actual_weights[key], expected_weights[key]) for key in expected_weights)
