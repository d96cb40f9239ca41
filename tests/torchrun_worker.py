"""Run by torchrun (2 processes, gloo) from test_group_distributed.py, so that one launch serves every check:
1. every group file takes one optimiser step on this process's half of a fixed batch, DDP-wrapped, with and
   without micro-batches, and with β = 0 on a batch whose halves hold unequal numbers of groups with signal;
   then, on such a batch, an update of 2 epochs × 2 minibatches with Adam, skipping the groups without signal
   and running them all; process 0 saves the parameters for the test to compare with the one-process steps;
2. every group file runs from its command line for 2 iterations (its main block, in this process, in its own
   folder), as `torchrun --nproc_per_node 2 grpo.py ...` would; each process writes a checksum of its trained
   weights, which must agree (the processes sample different responses; DDP keeps one model);
3. grpo.py for 4 iterations straight, and again stopped by a SIGTERM to process 1 alone after iteration 2 (every
   process stops with it) and resumed (--resume): process 0's logs and saved model, for the test to compare;
4. the end of a run, last: grpo.py for 1 iteration with a long final evaluation (1000 prompts, process 0's alone)
   and a slow --save-model (process 0 writes); then each process writes what is left when the main block returns:
   the time (and process 0 when its save ended), and the gloo worker threads still alive (one that outlives the
   script can abort it during interpreter finalisation: common/processes.py, finish).
   Not a test file."""

import importlib
import json
import os
import runpy
import signal
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.dirname(os.path.abspath(__file__))]
from fixed_rollouts import fixed_rollout, fresh_port, sgd_step, shard, tiny_gpt2, update_args  # noqa: E402
from test_group_update import adam_update  # noqa: E402
from common import policy, processes  # noqa: E402

FILES = ("grpo", "dr_grpo", "dapo", "gspo", "sapo")

if __name__ == "__main__":
    out = sys.argv[1]
    torch.distributed.init_process_group("gloo")
    rank, world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
    steps = {}
    for name in FILES:
        module = importlib.import_module(name)
        for micro_batch_size in (None, 2):
            model = tiny_gpt2()
            rollout = shard(module, fixed_rollout(module, model), rank, world_size)
            ddp_model = torch.nn.parallel.DistributedDataParallel(model)
            steps[name, micro_batch_size] = sgd_step(module, ddp_model, rollout, update_args(module, micro_batch_size))
            # β = 0 and groups 1-3 without signal: process 0 holds 4 responses with signal, process 1 none, so it runs
            # 4 of its zero-advantage rows to match process 0's passes (common/processes.py: draw_minibatches)
            model = tiny_gpt2()
            rollout = shard(module, fixed_rollout(module, model, no_signal=(1, 2, 3)), rank, world_size)
            ddp_model = torch.nn.parallel.DistributedDataParallel(model)
            steps[name, micro_batch_size, "beta 0"] = sgd_step(
                module, ddp_model, rollout, update_args(module, micro_batch_size, beta=0.0)
            )
            # Adam, 2 epochs × 2 minibatches, 8 groups (4 per process) of which 5 have no signal:
            # with and without the skip
            args = update_args(module, micro_batch_size, beta=0.0, num_minibatches=2, update_epochs=2)
            for skip in (True, False):
                model = tiny_gpt2()
                rollout = shard(module, fixed_rollout(module, model, num_groups=8, no_signal=(1, 2, 4, 5, 7)), rank,
                                world_size)
                ddp_model = torch.nn.parallel.DistributedDataParallel(model)
                steps[name, micro_batch_size, "adam", skip] = adam_update(module, ddp_model, rollout, args, skip)[0]
    # the logged statistics of the whole batch: process 0 counts 1 part of 4, process 1 2 of 4
    steps["whole-batch statistics"] = processes.global_fraction(rank + 1.0, 4.0), processes.global_mean(float(rank))
    if rank == 0:
        torch.save(steps, os.path.join(out, "steps.pt"))
    del ddp_model  # the last DDP wrapper holds the group: its gloo threads would outlive it (part 4 counts them)
    torch.distributed.destroy_process_group()

    # Each main block joins a process group itself and leaves it at the end: give each its own rendezvous store
    # (a fresh port that process 0 serves), since the agent's store still holds the first group's keys.
    os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "False"
    for name in FILES:
        fresh_port(os.path.join(out, name), rank)
        os.chdir(os.path.join(out, name))
        if rank == 0:
            print(f"=== {name}.py", flush=True)
        sys.argv = [f"{name}.py", "--num-iterations", "2", "--prompts-per-iteration", "4", "--eval-size", "8",
                    "--num-minibatches", "2", "--micro-batch-size", "4"]
        trained = runpy.run_path(os.path.join(ROOT, f"{name}.py"), run_name="__main__")["model"]
        checksum = sum(p.double().square().sum().item() for p in trained.parameters())  # DDP keeps the copies equal
        with open(os.path.join(out, name, f"weights_rank{rank}.txt"), "w") as f:
            f.write(repr(checksum))
        sys.stdout.flush()

    from common import runs  # noqa: E402

    flags = ["--num-iterations", "4", "--eval-every", "2", "--prompts-per-iteration", "4", "--eval-size", "8",
             "--num-minibatches", "2", "--save-model"]
    real_end = runs.IterationLog.end_iteration

    def stopped_after_2(self, iteration, *rest):
        real_end(self, iteration, *rest)
        if iteration == 2 and rank == 1:  # one process only: the others must stop with it
            os.kill(os.getpid(), signal.SIGTERM)

    for part, argv in [("straight", flags), ("stopped", flags), ("resumed", ["--resume"])]:
        fresh_port(os.path.join(out, "resume", part), rank)
        os.chdir(os.path.join(out, "resume", "stopped" if part == "resumed" else part))
        runs.IterationLog.end_iteration = stopped_after_2 if part == "stopped" else real_end
        if part == "resumed":
            argv = argv + [os.path.join("runs", os.listdir("runs")[0])]
        sys.argv = ["grpo.py", *argv]
        try:
            runpy.run_path(os.path.join(ROOT, "grpo.py"), run_name="__main__")
        except SystemExit as e:
            if part != "stopped" or e.code != 143:  # SIGTERM's exit status, 128 + 15, after the checkpoint
                raise
            with open(os.path.join(out, "resume", f"stopped_exit_rank{rank}.txt"), "w") as f:
                f.write(str(e.code))
        sys.stdout.flush()

    # The end of a run, on a fresh port: what is left of each process once the main block has returned.
    fresh_port(os.path.join(out, "exit"), rank)
    os.chdir(os.path.join(out, "exit"))
    sys.argv = ["grpo.py", "--num-iterations", "1", "--prompts-per-iteration", "4", "--num-minibatches", "2",
                "--eval-every", "100", "--eval-size", "1000", "--save-model"]
    real_save, saved = policy.save_model, {}

    def slow_save(model, tokenizer, folder, writes):  # a save long enough for the order to show
        real_save(model, tokenizer, folder, writes)
        if writes:
            time.sleep(2)
            saved["at"] = time.time()

    policy.save_model = slow_save
    runpy.run_path(os.path.join(ROOT, "grpo.py"), run_name="__main__")
    returned = time.time()
    threads = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                threads.append(f.read().strip())
        except FileNotFoundError:  # the thread ended meanwhile
            pass
    with open(os.path.join(out, "exit", f"exit_rank{rank}.json"), "w") as f:
        json.dump({"returned": returned, "saved": saved.get("at"),
                   "gloo_threads": sum(t.startswith(("pt_gloo", "gloo")) for t in threads)}, f)
