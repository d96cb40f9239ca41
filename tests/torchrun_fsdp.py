"""Run by torchrun (2 processes, gloo) from test_group_fsdp.py, so that one launch serves every check of --fsdp:
1. every group file takes one optimiser step on this process's half of a fixed batch with the model sharded by
   processes.distribute (FSDP2), with and without micro-batches, and with β = 0 on a batch whose halves hold unequal
   numbers of groups with signal; then, as in a run, scores the batch first (which leaves the root's weights
   gathered) and steps with a gradient clip that acts; process 0 saves the whole weights after each step, and the
   logged gradient norm, for the test to compare with the one-process step;
2. grpo.py and dapo.py run from their command line with --fsdp: 4 iterations straight (saving the model), and again
   stopped by a SIGTERM to process 1 alone after iteration 2 (both stop: none is left in the gathering save) and
   resumed (--resume), for the test to compare (which also offers that run to one process, to be refused).
   Not a test file."""

import dataclasses
import importlib
import os
import runpy
import signal
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.dirname(os.path.abspath(__file__))]
from common import processes, runs  # noqa: E402
from fixed_rollouts import (as_samples, draw_epochs, fixed_rollout, forward_of, fresh_port, shard,  # noqa: E402
                            tiny_gpt2, update, update_args)

FILES = ("grpo", "dr_grpo", "dapo", "gspo", "sapo")


def whole(model) -> dict:
    """The full weights of a sharded model, on every process."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def sharded_sgd_step(module, rollout_of, args) -> dict:
    model = tiny_gpt2()
    rollout = shard(module, rollout_of(model), rank, world_size)
    model = processes.distribute(model, True, world_size)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)  # after sharding
    torch.manual_seed(2)
    update(module, model, optimizer, rollout, dataclasses.replace(args, fsdp=True))
    return whole(model)


def scored_and_clipped_step(module, args) -> tuple[dict, list]:
    """As a run does it: π_θold scored in the first epoch's passes (the root's weights stay gathered after a
    forward pass), then one SGD step whose gradient the clip shrinks; the whole weights and the logged norm."""
    args = dataclasses.replace(args, fsdp=True)
    model = tiny_gpt2()
    rollout = shard(module, fixed_rollout(module, model), rank, world_size)
    model = processes.distribute(model, True, world_size)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    torch.manual_seed(2)
    epochs = draw_epochs(rollout, args)
    samples = as_samples(module, rollout)
    module.score_responses(model, None, samples, epochs[0], args, forward_of(module, args))
    stats = module.update_policy(model, optimizer, rollout, epochs, args, forward_of(module, args))
    return whole(model), stats["grad_norm"]


if __name__ == "__main__":
    out = sys.argv[1]
    torch.distributed.init_process_group("gloo")
    rank, world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
    steps = {}
    for name in FILES:
        module = importlib.import_module(name)
        for micro_batch_size in (None, 2):
            steps[name, micro_batch_size] = sharded_sgd_step(
                module, lambda model: fixed_rollout(module, model), update_args(module, micro_batch_size))
            steps[name, micro_batch_size, "beta 0"] = sharded_sgd_step(
                module, lambda model: fixed_rollout(module, model, no_signal=(1, 2, 3)),
                update_args(module, micro_batch_size, beta=0.0))
        steps[name, "scored, clipped"] = scored_and_clipped_step(module, update_args(module, max_grad_norm=1e-3))
    if rank == 0:
        torch.save(steps, os.path.join(out, "steps.pt"))
    torch.distributed.destroy_process_group()

    # Each main block joins a process group itself and leaves it at the end: a fresh rendezvous store for each.
    os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "False"
    flags = ["--fsdp", "--num-iterations", "4", "--eval-every", "2", "--prompts-per-iteration", "4", "--eval-size",
             "8", "--num-minibatches", "2", "--save-model"]
    real_end = runs.IterationLog.end_iteration

    def stopped_after_2(self, iteration, *rest):
        real_end(self, iteration, *rest)
        if iteration == 2 and rank == 1:  # one process only: the other must not wait for it in the save
            os.kill(os.getpid(), signal.SIGTERM)

    for name in ("grpo", "dapo"):
        for part, argv in [("straight", flags), ("stopped", flags), ("resumed", ["--resume"])]:
            fresh_port(os.path.join(out, name, part), rank)
            os.chdir(os.path.join(out, name, "stopped" if part == "resumed" else part))
            runs.IterationLog.end_iteration = stopped_after_2 if part == "stopped" else real_end
            if part == "resumed":
                argv = argv + [os.path.join("runs", os.listdir("runs")[0])]
            if rank == 0:
                print(f"=== {name} {part}", flush=True)
            sys.argv = [f"{name}.py", *argv]
            try:
                runpy.run_path(os.path.join(ROOT, f"{name}.py"), run_name="__main__")
            except SystemExit as e:
                if part != "stopped" or e.code != 143:
                    raise
            sys.stdout.flush()
