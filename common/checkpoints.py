"""Checkpoints that resume bit for bit, and stopping cleanly: the same for every group file.

`Checkpoints` writes {run}/checkpoint-{iteration}/ with --save-every, after the last iteration, and
when SIGINT (Ctrl-C) or SIGTERM (a scheduler's preemption) asks to stop: the iteration in progress
ends, a checkpoint is written, and the process exits with 128 + the signal's number (130, 143).

A checkpoint holds everything the run draws from, so a resumed run is the uninterrupted one: the
trained weights (with LoRA, the adapters), Adam's state, the iteration, the resolved flags, the
weights a lagging sampler still samples with, and every random state (Python's, NumPy's, torch's,
the prompt sampler's: one file per process). It is written to a new folder, then named the latest:
a kill mid-write leaves the previous one whole.
"""

import os
import random
import shutil
import signal
import sys
import time

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from common.processes import global_max, is_sharded, world_size

# Flags a resumed run may change: the others are the run's own.
MAY_CHANGE_ON_RESUME = (
    "resume", "num_iterations", "save_every", "eval_every", "eval_size", "eval_samples", "cuda",
    "track", "wandb_project_name", "wandb_entity",
)


class Checkpoints:
    """{run}/checkpoint-{iteration}/ and the file {run}/latest that names the newest one.

    Process 0 writes what the processes share (the trained weights, Adam's state, the iteration,
    the flags, the method's file); every process writes its own random states. SIGINT and SIGTERM
    only ask to stop: the iteration in progress ends, a checkpoint is written, and the run stops
    (a second signal stops at once, without one).
    """

    def __init__(self, run_dir: str, model, optimizer, rng: random.Random, args, sampler=None):
        self.folder = run_dir
        self.model, self.optimizer, self.rng, self.args = model, optimizer, rng, args
        self.sampler = sampler  # the weights that sample (common/sampling.py: Sampler), when not the policy
        self.rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        self.stop_asked, self.first_signal, self.signal_number = False, None, 0
        self.stopping = False  # a stop was asked on some process: every process stops together
        self.iteration = 0  # the last one done
        signal.signal(signal.SIGINT, self._ask_to_stop)
        signal.signal(signal.SIGTERM, self._ask_to_stop)

    def _ask_to_stop(self, number, frame) -> None:
        # Ctrl-C under torchrun reaches a process twice within a moment (the terminal's, torchrun's)
        if self.first_signal is not None and time.time() - self.first_signal > 2:
            print(f"stopped at once during iteration {self.iteration + 1}, without a checkpoint; "
                  f"{self.how_to_resume()}", file=sys.stderr, flush=True)
            raise SystemExit(128 + self.signal_number)
        if self.first_signal is None:
            self.first_signal, self.stop_asked, self.signal_number = time.time(), True, number
            if self.rank == 0:
                print(f"\n{signal.Signals(number).name}: stopping after iteration {self.iteration + 1} "
                      f"with a checkpoint (again to stop at once, without one){torchrun_kills()}", flush=True)

    def how_to_resume(self) -> str:
        """The command that resumes the run from its latest checkpoint, or why there is none."""
        if not os.path.exists(os.path.join(self.folder, "latest")):
            return "no checkpoint was written, so there is nothing to resume: start the run again"
        return f"resume with: {launcher(self.processes())} {sys.argv[0]} --resume {self.folder}"

    @staticmethod
    def processes() -> int:
        return world_size()

    def trained(self) -> dict:
        """The weights training changes (with LoRA, only the adapters), by name."""
        return {name: p.detach() for name, p in self.model.named_parameters() if p.requires_grad}

    def save(self, iteration: int) -> None:
        """Write checkpoint-{iteration}/ whole, then name it the latest, then remove the older ones."""
        path = os.path.join(self.folder, f"checkpoint-{iteration}")
        distributed, sharded = torch.distributed.is_initialized(), is_sharded(self.model)
        if self.rank == 0:
            shutil.rmtree(path + ".tmp", ignore_errors=True)
            os.makedirs(path + ".tmp")
            state = dict(iteration=iteration, args=vars(self.args), method=os.path.basename(sys.argv[0]),
                         processes=self.processes(), weights=None if sharded else self.trained(),
                         optimizer=None if sharded else self.optimizer.state_dict(),
                         sampler=self.sampler.state_dict() if self.sampler else {})
            torch.save(state, os.path.join(path + ".tmp", "state.pt"))
        if distributed:
            torch.distributed.barrier()  # the folder exists before the others write into it
        if sharded:  # --fsdp: each process writes its shards of the weights and of Adam's state
            weights, optimizer = get_state_dict(self.model, self.optimizer)
            shards = os.path.join(path + ".tmp", "shards")
            dcp.save({"weights": weights, "optimizer": optimizer}, checkpoint_id=shards)
        randoms = dict(python=random.getstate(), numpy=np.random.get_state(), torch=torch.get_rng_state(),
                       cuda=torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                       sampler=self.rng.getstate())
        torch.save(randoms, os.path.join(path + ".tmp", f"random-{self.rank}.pt"))
        if distributed:
            torch.distributed.barrier()  # every process has written before it is named the latest
        if self.rank == 0:
            shutil.rmtree(path, ignore_errors=True)  # this iteration's, from before a resume
            os.replace(path + ".tmp", path)
            with open(os.path.join(self.folder, "latest.tmp"), "w") as f:
                f.write(os.path.basename(path))
            os.replace(os.path.join(self.folder, "latest.tmp"), os.path.join(self.folder, "latest"))
            for old in os.listdir(self.folder):
                if old.startswith("checkpoint-") and old != os.path.basename(path):
                    shutil.rmtree(os.path.join(self.folder, old))
            files = [os.path.join(parent, f) for parent, _, names in os.walk(path) for f in names]
            size = sum(os.path.getsize(f) for f in files) / 2**20
            print(f"checkpoint of iteration {iteration}: {path} ({size:,.0f} MiB)", flush=True)

    def restore(self) -> int:
        """Load the latest checkpoint of --resume into the model, the optimiser and every random
        state; returns the first iteration still to run."""
        path = os.path.join(self.folder, latest_checkpoint(self.folder))
        state = load(self.folder, os.path.join(path, "state.pt"))
        if state.get("processes", self.processes()) != self.processes():
            raise SystemExit(f"error: --resume {self.folder}: a run of {state['processes']} processes, here "
                             f"{self.processes()}; resume it with torchrun --nproc_per_node {state['processes']}")
        if is_sharded(self.model):
            weights, optimizer = get_state_dict(self.model, self.optimizer)
            dcp.load({"weights": weights, "optimizer": optimizer}, checkpoint_id=os.path.join(path, "shards"))
            set_state_dict(self.model, self.optimizer, model_state_dict=weights, optim_state_dict=optimizer)
        else:
            with torch.no_grad():
                for name, weight in self.trained().items():
                    weight.copy_(state["weights"][name])
            self.optimizer.load_state_dict(state["optimizer"])
        randoms = load(self.folder, os.path.join(path, f"random-{self.rank}.pt"))
        random.setstate(randoms["python"])
        np.random.set_state(randoms["numpy"])
        torch.set_rng_state(randoms["torch"])
        if randoms["cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(randoms["cuda"])
        self.rng.setstate(randoms["sampler"])
        if self.sampler:  # a lagging sampler's weights, or a copy of the weights just restored
            self.sampler.load_state_dict(state.get("sampler", {}))
        self.iteration = state["iteration"]
        if self.rank == 0:
            print(f"resumed {self.folder} after iteration {self.iteration} ({path})", flush=True)
            if self.iteration >= self.args.num_iterations:
                print(f"nothing left to do: the run has done its {self.iteration} iterations "
                      f"(--num-iterations N, with N > {self.iteration}, extends it)", flush=True)
        return self.iteration + 1

    def stopped(self) -> bool:
        """Before an iteration: True when a stop was asked on any process before it began (while
        the starting model was evaluated, say). No iteration to finish: the run stops at once."""
        self.stopping = global_max(float(self.stop_asked)) > 0
        if self.stopping and self.rank == 0:
            resume = self.how_to_resume()
            print(f"stopped before iteration {self.iteration + 1}; {resume}", flush=True)
        return self.stopping

    def after(self, iteration: int) -> bool:
        """After an iteration: a checkpoint when --save-every says so (and after the last iteration,
        so that a finished run can be extended) or a stop was asked on any process; True when every
        process must stop now."""
        self.iteration = iteration
        self.stopping = global_max(float(self.stop_asked)) > 0
        due = self.args.save_every and (iteration % self.args.save_every == 0
                                        or iteration == self.args.num_iterations)
        if self.stopping or due:
            self.save(iteration)
        if self.stopping and self.rank == 0:
            print(f"stopped after iteration {iteration}; {self.how_to_resume()}", flush=True)
        return self.stopping

    def exit_if_stopped(self) -> None:
        """The last line of a run: a stopped run exits with 128 + the signal's number (130 for
        SIGINT, 143 for SIGTERM; a process stopped by another's signal: 143), so that
        `python grpo.py && next` does not go on and a scheduler sees a preempted job."""
        if self.stopping:
            raise SystemExit(128 + (self.signal_number or signal.SIGTERM))


def torchrun_kills() -> str:
    """Under torchrun, what its own signal does: it passes it on, then kills the processes once its
    --shutdown-timeout has passed, whether the checkpoint is written or not."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:  # set by torchrun in each process it starts
        return ""
    return ("; torchrun, if it was signalled too, kills the processes after its --shutdown-timeout (30 s by "
            "default: set it above an iteration and a checkpoint, or signal the processes alone)")


def launcher(processes: int) -> str:
    """What starts a run of this many processes. The script follows as typed: from the current folder, as the
    run's folder is (the repository may be elsewhere)."""
    return "python" if processes == 1 else f"torchrun --nproc_per_node {processes}"


def latest_checkpoint(folder: str) -> str:
    """The name of the newest checkpoint of a run folder; one line when there is none."""
    try:
        with open(os.path.join(folder, "latest")) as f:
            name = f.read().strip()
    except OSError:
        if not os.path.isdir(folder):
            raise SystemExit(f"error: --resume {folder}: no such folder (a run's folder, e.g. runs/<run>)") from None
        raise SystemExit(f"error: --resume {folder}: no checkpoint there (a run writes one with --save-every N, "
                         "or when Ctrl-C or SIGTERM stops it)") from None
    if not os.path.isdir(os.path.join(folder, name)):
        raise SystemExit(f"error: --resume {folder}: {os.path.join(folder, 'latest')} names {name!r}, which is "
                         "not there (removed or moved?)")
    return name


def load(folder: str, path: str) -> dict:
    """A file of a checkpoint, or one line naming it when it is missing or damaged."""
    if not os.path.isfile(path):
        raise SystemExit(f"error: --resume {folder}: {path} is missing")
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # a copy cut short, a disk error, another file under that name
        raise SystemExit(f"error: --resume {folder}: {path} cannot be read, the checkpoint is damaged "
                         f"({type(e).__name__})") from None


def saved_state(folder: str) -> dict:
    """The state.pt of the latest checkpoint of the run in `folder`: its flags, its method, ..."""
    return load(folder, os.path.join(folder, latest_checkpoint(folder), "state.pt"))


def refuse_another_method(folder: str, method) -> None:
    """One line when --resume names a run of another group file: its flags are that method's."""
    script = os.path.basename(sys.argv[0])
    if method is not None and method != script:
        raise SystemExit(f"error: --resume {folder}: a run of {method}, not of {script}; resume it with: "
                         f"python {os.path.join(os.path.dirname(sys.argv[0]), method)} --resume {folder}")


def refuse_changed_flags(saved: dict, args, done: int) -> None:
    """A resumed run is the same run: one line naming the first flag that differs and may not, or
    --num-iterations below the `done` iterations of its checkpoint (a run is extended, never cut)."""
    if args.num_iterations < done:
        raise SystemExit(f"error: --resume: --num-iterations {args.num_iterations} is below the checkpoint's "
                         f"iteration {done}: a resumed run goes on from there (--num-iterations {done} or more)")
    for key, value in vars(args).items():
        if key not in MAY_CHANGE_ON_RESUME and key in saved and saved[key] != value:
            flag = "--" + key.replace("_", "-")
            allowed = ", ".join("--" + k.replace("_", "-") for k in MAY_CHANGE_ON_RESUME[1:])
            raise SystemExit(f"error: --resume: {flag} {value} differs from the run's {flag} {saved[key]}; "
                             f"a resumed run may change only {allowed}")
