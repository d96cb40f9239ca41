"""--fsdp under torchrun (2 processes, gloo; tests/torchrun_fsdp.py): the model sharded by FSDP2 takes the
one-process step on the whole batch in every file; a sharded run stopped and resumed from its distributed checkpoint
is the uninterrupted run; --save-model writes a plain Hugging Face folder; and what --fsdp cannot do is refused in
one line."""

import os
import re
import subprocess
import sys

import pytest
import torch

import dapo
import dr_grpo
import grpo
import gspo
import sapo
from conftest import ROOT
from fixed_rollouts import as_samples, draw_epochs, fixed_rollout, forward_of, sgd_step, tiny_gpt2, update_args
from test_group_distributed import assert_same_parameters
from test_group_runs import scalars, weights

MODULES = [grpo, dr_grpo, dapo, gspo, sapo]


@pytest.fixture(scope="module")
def fsdp(tmp_path_factory):
    """One torchrun launch of 2 processes: the sharded steps to compare, and grpo.py's and dapo.py's runs."""
    out = tmp_path_factory.mktemp("fsdp")
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",
         os.path.join(ROOT, "tests", "torchrun_fsdp.py"), str(out)],
        capture_output=True, text=True, timeout=400, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return out, torch.load(out / "steps.pt"), result.stdout


@pytest.mark.parametrize("beta_0", [False, True], ids=["beta>0", "beta=0 unequal signal"])
@pytest.mark.parametrize("micro_batch_size", [None, 2])
@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_two_sharded_processes_take_the_one_process_step(module, micro_batch_size, beta_0, fsdp):
    """Each process holds half of the weights and half of the groups; the step equals the one-process step."""
    _, steps, _ = fsdp
    model = tiny_gpt2()
    initial = {name: p.detach().clone() for name, p in model.named_parameters()}
    rollout = fixed_rollout(module, model, no_signal=(1, 2, 3) if beta_0 else ())
    args = update_args(module, micro_batch_size, beta=0.0) if beta_0 else update_args(module, micro_batch_size)
    expected = sgd_step(module, model, rollout, args)
    actual = steps[(module.__name__, micro_batch_size, "beta 0") if beta_0 else (module.__name__, micro_batch_size)]
    assert_same_parameters(actual, expected, initial)


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_after_scoring_the_clip_and_the_logged_norm_are_the_one_process_ones(module, fsdp):
    """As in a run, π_θold is scored before the update, which leaves the root module (embeddings, the tied output
    layer, the final norm) gathered whole; the update must still clip and step the shards Adam holds: the gradient
    norm logged, and the weights after a step whose gradient the clip shrinks, are those of one process."""
    _, steps, _ = fsdp
    model = tiny_gpt2()
    initial = {name: p.detach().clone() for name, p in model.named_parameters()}
    rollout = fixed_rollout(module, model)
    args = update_args(module, max_grad_norm=1e-3)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    torch.manual_seed(2)
    epochs = draw_epochs(rollout, args)
    samples = as_samples(module, rollout)
    module.score_responses(model, None, samples, epochs[0], args, forward_of(module, args))
    stats = module.update_policy(model, optimizer, rollout, epochs, args, forward_of(module, args))
    expected = {name: p.detach().clone() for name, p in model.named_parameters()}
    actual, grad_norm = steps[module.__name__, "scored, clipped"]
    assert stats["grad_norm"][0] > 1e-3 * 10  # the clip acts: the step is shrunk by a factor above 10
    assert grad_norm == pytest.approx(stats["grad_norm"], rel=1e-5)
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], atol=1e-7, rtol=1e-4, msg=name)
    assert any(not torch.equal(expected[name], initial[name]) for name in expected)


@pytest.mark.parametrize("name", ["grpo", "dapo"])
def test_a_sharded_run_stopped_and_resumed_is_the_uninterrupted_run(name, fsdp):
    """SIGTERM to process 1 alone after iteration 2, with --save-model: both stop (neither waits for the other in the
    gathering save) and each writes its shards of the weights and of Adam's state
    (torch.distributed.checkpoint) and its random states; --resume then gives every logged number and the final
    weights of the straight run. The saved model is a plain Hugging Face folder of the whole weights."""
    from transformers import AutoModelForCausalLM

    out, _, stdout = fsdp
    (straight,) = (out / name / "straight" / "runs").iterdir()
    (resumed,) = (out / name / "stopped" / "runs").iterdir()
    checkpoint = resumed / "checkpoint-2"
    assert {"state.pt", "random-0.pt", "random-1.pt", "shards"} <= set(os.listdir(checkpoint))
    expected, actual = scalars(straight), scalars(resumed)
    assert {step for _, step in expected} == {0, 1, 2, 3, 4} and actual == expected
    expected_weights, actual_weights = weights(straight), weights(resumed)
    assert all(torch.equal(actual_weights[key], expected_weights[key]) for key in expected_weights)
    saved = AutoModelForCausalLM.from_pretrained(straight / "model")  # whole, loadable without torchrun
    start = AutoModelForCausalLM.from_pretrained(os.path.join(ROOT, "common", "models", "tiny_model"))
    assert sum(p.numel() for p in saved.parameters()) == sum(p.numel() for p in start.parameters())
    held = re.search(r"each process holds the policy's weights \(([\d.]+) MiB\)", stdout)
    whole = sum(p.numel() for p in start.parameters()) * 4 / 2**20
    assert float(held.group(1)) == pytest.approx(whole / 2, abs=0.06)  # each process: half of the weights


def test_a_sharded_run_resumed_on_one_process_is_refused_in_one_line(fsdp, in_process):
    out, _, _ = fsdp
    (resumed,) = (out / "grpo" / "stopped" / "runs").iterdir()
    with pytest.raises(SystemExit) as e:
        in_process("grpo", ["--resume", str(resumed)])
    assert str(e.value).startswith("error: --fsdp shards the model over the processes of torchrun")


@pytest.mark.parametrize("argv, message", [
    (["--fsdp"], "error: --fsdp shards the model over the processes of torchrun: run it with torchrun "
                 "--nproc_per_node N (N >= 2)"),
])
def test_fsdp_without_torchrun_is_one_line(argv, message, in_process):
    with pytest.raises(SystemExit) as e:
        in_process("grpo", argv)
    assert str(e.value) == message


@pytest.mark.parametrize("argv, message", [
    (["--lora-rank", "4"], "error: --fsdp with --lora-rank: LoRA's trained state is already small; train the "
                           "adapters with DDP (no --fsdp)"),
    *[(flags, "error: --fsdp with --sampler-dtype, --sampler-lag or --compile-decoding: a sharded model samples "
               "itself, gathered anew each time; use DDP (no --fsdp)")
      for flags in (["--compile-decoding"], ["--sampler-lag", "1"], ["--sampler-dtype", "bfloat16"])],
])
def test_fsdp_with_lora_or_a_sampler_of_its_own_is_one_line(argv, message, in_process, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit) as e:
        in_process("grpo", ["--fsdp", *argv])
    assert str(e.value) == message
