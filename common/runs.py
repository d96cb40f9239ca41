"""The life of a run, the same for every group file: its name and folder, the console and TensorBoard, the
evaluation schedule, checkpoints that resume bit for bit, and stopping cleanly.

1. `parse_args` and `folder`: the command line (with --resume, the resumed run's own flags), and the run's folder,
   runs/{task}__{file}[-{exp_name}]__{model}__{seed}__{time}, or the folder given to --resume, from any folder.
2. `IterationLog`: phase timings and a status line that moves during long phases, TensorBoard tags, one console
   line per iteration, the held-out evaluations on their schedule, and the one-line errors of a run that cannot
   go on (an unwritable folder, a GPU out of memory).
3. `Checkpoints`: --save-every, --resume, and SIGINT (Ctrl-C) or SIGTERM (a scheduler's preemption), which end the
   iteration in progress, write a checkpoint and stop with one line saying how to resume; the process then exits
   with 128 + the signal's number (130, 143), as a shell or a scheduler expects of a stopped program.

A checkpoint holds everything the run draws from, so a resumed run is the uninterrupted one: the trained weights
(with LoRA, the adapters), Adam's state, the iteration, the resolved flags, and every random state (Python's,
NumPy's, torch's on the CPU and the GPU, the prompt sampler's: one file per process). It is written to a new
folder, then named the latest: a kill mid-write leaves the previous checkpoint whole.
"""

import contextlib
import io
import math
import os
import random
import re
import shutil
import signal
import sys
import threading
import time
from typing import Callable

import numpy as np
import torch

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from common.llm import global_mean, is_sharded

# Flags a resumed run may change (the rest are the run's, or the resumed run would not be the same run).
MAY_CHANGE_ON_RESUME = ("resume", "num_iterations", "save_every", "eval_every", "eval_size", "eval_samples", "cuda")
STATUS_EVERY = 15.0  # seconds between the status lines of a long phase


def parse_args(args_class):
    """The command line as an `args_class` (tyro: one flag per field, its docstring as help). With --resume, the
    resumed run's own flags are the defaults, and a typed flag may change only what a resumed run may change.
    A value tyro cannot read is one line, as every other bad value is; a pipe closed early (`python grpo.py --help
    | head`) ends the program quietly, as it does `cat`. Until Checkpoints takes them over, Ctrl-C or SIGTERM (while
    the model loads, say) stop the program at once with one line and 128 + the signal's number."""
    import tyro

    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, stop_before_training)
    argv = sys.argv[1:]
    resume = next((value for flag, value in zip(argv, argv[1:] + [None]) if flag == "--resume"), None)
    resume = resume or next((a.split("=", 1)[1] for a in argv if a.startswith("--resume=")), None)
    default = None
    if resume is not None:
        saved = saved_state(resume)
        refuse_another_method(resume, saved.get("method"))
        default = args_class(**{k: v for k, v in saved["args"].items() if k in args_class.__dataclass_fields__})
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):  # tyro draws its errors in a box: one line of it is said below
            args = tyro.cli(args_class, config=(tyro.conf.DisallowNone,), **({"default": default} if default else {}))
    except SystemExit as e:
        if e.code in (0, None):
            raise
        raise SystemExit(f"error: {tyro_error_line(errors.getvalue())}") from None
    if resume is not None:
        refuse_changed_flags(saved["args"], args)
    return args


def stop_before_training(number, frame) -> None:
    """A signal before the first iteration has begun: nothing trained, nothing to save, no traceback. (Ctrl-C under
    torchrun arrives twice, the terminal's SIGINT and torchrun's SIGTERM: the second is ignored while this exits.)"""
    for other in (signal.SIGINT, signal.SIGTERM):
        signal.signal(other, signal.SIG_IGN)
    print(f"\n{signal.Signals(number).name}: stopped before training began; nothing was trained or saved", flush=True)
    raise SystemExit(128 + number)


def tyro_error_line(box: str) -> str:
    """The message of tyro's error box in one line ("Error parsing --seed: invalid literal for int() with base 10:
    '1.5'" becomes "--seed must be an integer, got '1.5'")."""
    body = []
    for line in box.splitlines()[1:]:  # the first line holds the box's title
        text = line.strip().strip("│").strip()
        separator = not text.strip("─-")
        if separator and body:
            break
        if not separator:
            body.append(text)
    message = " ".join(body).rstrip(".")
    parsing = re.match(r"Error parsing (--[\w-]+): (.*)", message)
    if not parsing:
        return message
    flag, detail = parsing.groups()
    value = re.search(r"'([^']*)'\]?$", detail)
    kind = "an integer" if ("int()" in detail or "INT" in detail) else "a number" if "FLOAT" in detail else None
    return f"{flag} must be {kind}, got {value.group(1)!r}" if value and kind else f"{flag}: {detail}"


def folder(args, task_name: str, script: str) -> str:
    """The run's folder, the same on every process: the one given to --resume (relative to where the command runs,
    as typed), else a new one under runs/ that tells runs apart by task, method (and --exp-name), model, seed and
    start time."""
    if args.resume:
        return os.path.normpath(args.resume)
    method = os.path.basename(script).removesuffix(".py") + (f"-{args.exp_name}" if args.exp_name else "")
    model = os.path.basename(os.path.normpath(args.model)).removesuffix(".gguf")
    base = os.path.join("runs", f"{task_name}__{method}__{model}__{args.seed}__{int(time.time())}")
    run_dir, copy = base, 2
    while os.path.exists(run_dir):  # two runs started in the same second
        run_dir, copy = f"{base}-{copy}", copy + 1
    if torch.distributed.is_initialized():  # the processes may straddle a second: process 0's name for all
        shared = [run_dir]
        torch.distributed.broadcast_object_list(shared, src=0)
        run_dir = shared[0]
    return run_dir


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from n samples of which c are right: 1 − C(n − c, k) / C(n, k) (Chen et al.
    2021, arXiv 2107.03374), the chance that k of the n samples, drawn without replacement, hold a right one."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


# ---------------------------------------------------------------- the console, TensorBoard and the evaluations

def local(p):
    """A parameter's values on this process: all of them, or under --fsdp its shard."""
    return p.to_local() if hasattr(p, "to_local") else p


def print_start(run_dir: str, model, device, world_size: int, responses_per_iteration: int, defaults: list[str],
                first_prompt: str, args) -> None:
    """The first lines of a run: its folder and size, each flag left to a default with the value chosen and why,
    and what the model reads."""
    num_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    print(f"{run_dir}: {num_trainable:,} trained parameters on {world_size} × {device.type}, "
          f"{responses_per_iteration} responses per iteration")
    weights, trained = (sum(local(p).numel() * p.element_size() for p in model.parameters() if keep(p)) / 2**20
                        for keep in (lambda p: True, lambda p: p.requires_grad))
    # Adam keeps two moments of each trained weight; under torchrun DDP every process holds all, --fsdp its shards
    print(f"each process holds the policy's weights ({weights:,.1f} MB), their gradients ({trained:,.1f} MB) and "
          f"Adam's state ({2 * trained:,.1f} MB), {weights + 3 * trained:,.1f} MB before any activation")
    for line in defaults:
        print(f"default {line}")
    print(f"the model reads (first held-out prompt): {first_prompt!r}")
    if args.gradient_checkpointing:  # a checkpointed layer keeps no KV cache to share
        print("--gradient-checkpointing: each response is scored with its own copy of its prompt")


OUT_OF_MEMORY = ("error: the GPU ran out of memory in the {phase} phase: lower --micro-batch-size (responses per "
                 "forward pass), add --gradient-checkpointing, train LoRA adapters (--lora-rank 16) or lower "
                 "--max-new-tokens")


class IterationLog:
    """Timings, TensorBoard, the console line and the evaluation schedule of a group script's main loop.

    Every process times its phases and joins the cross-process means; process 0 alone writes, prints and
    evaluates. `evaluate()` returns the held-out rewards of k sampled responses per prompt and of a greedy one.
    """

    def __init__(self, run_dir: str, hyperparameters: dict, first_iteration: int, num_iterations: int,
                 eval_every: int, responses_per_iteration: int, is_main: bool, device, whole_weights: Callable,
                 evaluate: Callable[[], tuple]):
        from torch.utils.tensorboard import SummaryWriter

        self.first_iteration, self.num_iterations, self.eval_every = first_iteration, num_iterations, eval_every
        self.responses, self.evaluate, self.is_main, self.device = responses_per_iteration, evaluate, is_main, device
        self.whole_weights = whole_weights  # under --fsdp every process gathers the weights for process 0 to evaluate
        self.folder = run_dir
        self.writer = None
        if is_main:
            try:
                os.makedirs(self.folder, exist_ok=True)
                with open(os.path.join(self.folder, ".writable"), "w"):
                    pass
                os.remove(os.path.join(self.folder, ".writable"))
            except OSError as e:
                raise SystemExit(f"error: cannot write the run's folder {self.folder} ({e.strerror}): run from a "
                                 "folder you can write to (runs/ is made in the current folder)")
            # A resumed run drops what the interrupted one logged after its checkpoint (purge_step).
            self.writer = SummaryWriter(self.folder, purge_step=first_iteration if first_iteration > 1 else None)
            table = "\n".join(f"|{key}|{value}|" for key, value in hyperparameters.items())
            self.writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + table)
        self.start = self.iteration_start = time.time()
        self.iteration, self.seconds = first_iteration - 1, {}
        self.never_right = 0  # iterations in a row, from the start, in which no sampled response was right

    def held_out(self, iteration: int) -> str:
        """Evaluate: accuracy sampled and greedy, and with k samples per prompt, pass@1 and pass@k."""
        with self.phase("evaluate"):
            sampled, greedy = self.evaluate()  # rewards, [prompts, k] and [prompts, 1]
        figures = {"accuracy": sampled.mean().item(), "greedy_accuracy": greedy.mean().item()}
        n = sampled.shape[1]
        if n > 1:
            right = (sampled == 1).sum(dim=1).tolist()
            figures["pass@1"] = sum(pass_at_k(n, c, 1) for c in right) / len(right)
            figures["pass@k"] = sum(pass_at_k(n, c, n) for c in right) / len(right)  # k = n = --eval-samples
        for key, value in figures.items():
            self.writer.add_scalar(f"charts/{key}", value, iteration)
        passes = "".join(f", {key.replace('@k', f'@{n}')} {value:.3f}" for key, value in figures.items() if "@" in key)
        return f"held-out {figures['accuracy']:.3f} (greedy {figures['greedy_accuracy']:.3f}{passes})"

    def begin(self) -> None:
        """Before training: evaluate the starting model (x = 0 on every curve); a resumed run did so before."""
        if self.first_iteration == 1:
            with self.whole_weights():
                if self.is_main:
                    print(f"iteration    0  {self.held_out(0)}  (log: {self.folder})", flush=True)
        self.start = time.time()

    def begin_iteration(self, iteration: int) -> None:
        self.iteration, self.iteration_start, self.seconds = iteration, time.time(), {}

    @contextlib.contextmanager
    def phase(self, name: str):
        """Time one phase of the iteration (generate, logprob, update, evaluate): logged as perf/{name}_seconds.
        A phase that runs long shows a status line, so that a slow run does not look like a hung one; a GPU that
        runs out of memory in it ends the run with one line naming the phase and the flags that cut memory."""
        start, done = time.time(), threading.Event()
        status = threading.Thread(target=self._status, args=(name, start, done), daemon=True) if self.is_main else None
        if status:
            status.start()
        try:
            yield
        except torch.cuda.OutOfMemoryError:
            raise SystemExit(OUT_OF_MEMORY.format(phase=name)) from None
        finally:
            done.set()
            if status:
                status.join()
        self.seconds[name] = time.time() - start

    def _status(self, name: str, start: float, done: threading.Event) -> None:
        """Every STATUS_EVERY seconds of a phase, where it stands: rewritten in place on a terminal, a line in a log."""
        terminal, shown = sys.stdout.isatty(), False
        while not done.wait(STATUS_EVERY):
            line = f"iteration {self.iteration:4d}/{self.num_iterations}  {name}... {time.time() - start:.0f}s"
            print(f"\r{line}" if terminal else line, end="" if terminal else "\n", flush=True)
            shown = True
        if shown and terminal:
            print("\r" + " " * 60 + "\r", end="", flush=True)

    def end_iteration(self, iteration: int, scalars: dict, losses: dict[str, list[float]],
                      learning_rate: float) -> None:
        """Log at x = iterations done: means over all processes, written by process 0, then evaluate when due."""
        elapsed = time.time() - self.iteration_start
        logged = {
            **scalars,
            **{f"losses/{name}": sum(values) / len(values) for name, values in losses.items() if values},
            **{f"perf/{name}_seconds": seconds for name, seconds in self.seconds.items()},
            "perf/iteration_seconds": elapsed,
            "charts/tokens_per_second": scalars["charts/response_length"] * self.responses / elapsed,
            "charts/samples_per_second": self.responses / elapsed,
        }
        if self.device.type == "cuda":
            logged["perf/peak_gpu_memory_gb"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        logged = {tag: global_mean(value) for tag, value in logged.items()}
        due = iteration % self.eval_every == 0 or iteration == self.num_iterations
        with self.whole_weights() if due else contextlib.nullcontext():
            held_out = f"  {self.held_out(iteration)}" if due and self.is_main else ""
        if not self.is_main:
            return
        self.writer.add_scalar("charts/learning_rate", learning_rate, iteration)
        for tag, value in logged.items():
            self.writer.add_scalar(tag, value, iteration)
        done = iteration - self.first_iteration + 1
        eta = (time.time() - self.start) / done * (self.num_iterations - iteration)
        # the update's own statistics (the trust region's, the KL): all but its loss and gradient norm
        update = "".join(f"{name} {logged[f'losses/{name}']:.3f}  " for name in losses
                         if name not in ("policy_loss", "grad_norm") and f"losses/{name}" in logged)
        print(
            f"iteration {iteration:4d}/{self.num_iterations}  accuracy {logged['charts/train_accuracy']:.3f}  "
            f"length {logged['charts/response_length']:.1f}  truncated {logged['charts/truncated_fraction']:.2f}  "
            f"no-signal {logged['charts/zero_signal_fraction']:.2f}  {update}{elapsed:.3g} s/it  "
            f"{logged['charts/tokens_per_second']:,.0f} tok/s  ETA {eta:.0f}s{held_out}", flush=True
        )
        self.warn_if_never_right(logged)

    def warn_if_never_right(self, logged: dict) -> None:
        """Once, when no sampled response has been right in the first 3 iterations: every group is then all wrong,
        so no advantage is ever nonzero and the run can learn nothing."""
        self.never_right = (self.never_right + 1 if logged["charts/train_accuracy"] == 0 and self.never_right >= 0
                            else -1)
        if self.never_right == 3:
            cut = logged["charts/truncated_fraction"]
            print(f"no sampled response has been right in 3 iterations: nothing can be learned. Usual causes: the "
                  f"answer is not in the format the reward reads (see 'the model reads' above; a base model needs "
                  f"--few-shot), --max-new-tokens cuts the answers (truncated {cut:.2f}), or the task is too hard "
                  f"for the model", flush=True)

    def close(self) -> None:
        if self.is_main:
            self.writer.close()


# ---------------------------------------------------------------- checkpoints, resuming, stopping on a signal

class Checkpoints:
    """{run}/checkpoint-{iteration}/ and the file {run}/latest that names the newest one.

    Process 0 writes what the processes share (the trained weights, Adam's state, the iteration, the flags and the
    method's file); every process writes its own random states. SIGINT and SIGTERM only ask to stop: the iteration
    in progress ends, a checkpoint is written, and the run stops (a second signal stops at once, without one).
    """

    def __init__(self, run_dir: str, model, optimizer, sampler: random.Random, args, rank: int):
        self.folder = run_dir
        self.model, self.optimizer, self.sampler, self.args, self.rank = model, optimizer, sampler, args, rank
        self.stop_asked, self.first_signal, self.signal_number = False, None, 0
        self.iteration = 0  # the last one done
        signal.signal(signal.SIGINT, self._ask_to_stop)
        signal.signal(signal.SIGTERM, self._ask_to_stop)

    def _ask_to_stop(self, number, frame) -> None:
        # Ctrl-C under torchrun reaches a process twice within a moment (the terminal's SIGINT, torchrun's SIGTERM)
        if self.first_signal is not None and time.time() - self.first_signal > 2:
            print(f"stopped at once during iteration {self.iteration + 1}, without a checkpoint; "
                  f"{self.how_to_resume()}", file=sys.stderr, flush=True)
            raise SystemExit(128 + self.signal_number)
        if self.first_signal is None:
            self.first_signal, self.stop_asked, self.signal_number = time.time(), True, number
            if self.rank == 0:
                print(f"\n{signal.Signals(number).name}: stopping after iteration {self.iteration + 1} "
                      "with a checkpoint (again to stop at once, without one)", flush=True)

    def how_to_resume(self) -> str:
        """The command that resumes the run from its latest checkpoint, or why there is none."""
        if not os.path.exists(os.path.join(self.folder, "latest")):
            return "no checkpoint was written, so there is nothing to resume: start the run again"
        return f"resume with: python {os.path.basename(sys.argv[0])} --resume {self.folder}"

    @staticmethod
    def processes() -> int:
        return torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1

    def trained(self) -> dict:
        """The weights training changes (with LoRA, only the adapters), by name."""
        return {name: p.detach() for name, p in self.model.named_parameters() if p.requires_grad}

    def save(self, iteration: int) -> None:
        """Write checkpoint-{iteration}/ in full, then name it the latest, then remove the older ones."""
        path = os.path.join(self.folder, f"checkpoint-{iteration}")
        distributed, sharded = torch.distributed.is_initialized(), is_sharded(self.model)
        if self.rank == 0:
            shutil.rmtree(path + ".tmp", ignore_errors=True)
            os.makedirs(path + ".tmp")
            state = dict(iteration=iteration, args=vars(self.args), method=os.path.basename(sys.argv[0]),
                         processes=self.processes(), weights=None if sharded else self.trained(),
                         optimizer=None if sharded else self.optimizer.state_dict())
            torch.save(state, os.path.join(path + ".tmp", "state.pt"))
        if distributed:
            torch.distributed.barrier()  # the folder exists before the other processes write into it
        if sharded:  # --fsdp: each process writes its shards of the weights and of Adam's state
            weights, optimizer = get_state_dict(self.model, self.optimizer)
            dcp.save({"weights": weights, "optimizer": optimizer}, checkpoint_id=os.path.join(path + ".tmp", "shards"))
        randoms = dict(python=random.getstate(), numpy=np.random.get_state(), torch=torch.get_rng_state(),
                       cuda=torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                       sampler=self.sampler.getstate())
        torch.save(randoms, os.path.join(path + ".tmp", f"random-{self.rank}.pt"))
        if distributed:
            torch.distributed.barrier()  # every process has written before the checkpoint is named the latest
        if self.rank == 0:
            shutil.rmtree(path, ignore_errors=True)  # the same iteration's checkpoint, from before a resume
            os.replace(path + ".tmp", path)
            with open(os.path.join(self.folder, "latest.tmp"), "w") as f:
                f.write(os.path.basename(path))
            os.replace(os.path.join(self.folder, "latest.tmp"), os.path.join(self.folder, "latest"))
            for old in os.listdir(self.folder):
                if old.startswith("checkpoint-") and old != os.path.basename(path):
                    shutil.rmtree(os.path.join(self.folder, old))
            size = sum(os.path.getsize(os.path.join(parent, f)) for parent, _, files in os.walk(path) for f in files)
            size /= 2**20
            print(f"checkpoint of iteration {iteration}: {path} ({size:,.0f} MB)", flush=True)

    def restore(self) -> int:
        """Load the latest checkpoint of --resume into the model, the optimiser and every random state; returns the
        first iteration still to run."""
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
        random_file = os.path.join(path, f"random-{self.rank}.pt")
        if not os.path.exists(random_file):
            raise SystemExit(f"error: --resume {self.folder}: {random_file} is missing (was the run on as many "
                             "processes? run it with the same torchrun --nproc_per_node)")
        randoms = load(self.folder, random_file)
        random.setstate(randoms["python"])
        np.random.set_state(randoms["numpy"])
        torch.set_rng_state(randoms["torch"])
        if randoms["cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(randoms["cuda"])
        self.sampler.setstate(randoms["sampler"])
        self.iteration = state["iteration"]
        if self.rank == 0:
            print(f"resumed {self.folder} after iteration {self.iteration} ({path})", flush=True)
            if self.iteration >= self.args.num_iterations:
                print(f"nothing left to do: the run has done its {self.iteration} iterations (--num-iterations N, "
                      f"with N > {self.iteration}, extends it)", flush=True)
        return self.iteration + 1

    def stopped(self) -> bool:
        """Before an iteration: True when a stop was asked (on any process) before it began, e.g. while the starting
        model was evaluated. There is no iteration to finish, and the run stops at once."""
        if global_mean(float(self.stop_asked)) == 0:
            return False
        if self.rank == 0:
            print(f"stopped before iteration {self.iteration + 1}; {self.how_to_resume()}", flush=True)
        return True

    def after(self, iteration: int) -> bool:
        """After an iteration: write a checkpoint when --save-every says so (and after the last iteration, so that a
        finished run can be extended) or a stop was asked (on any process); True when the run must stop now."""
        self.iteration = iteration
        stop = global_mean(float(self.stop_asked)) > 0
        due = self.args.save_every and (iteration % self.args.save_every == 0 or iteration == self.args.num_iterations)
        if stop or due:
            self.save(iteration)
        if stop and self.rank == 0:
            print(f"stopped after iteration {iteration}; {self.how_to_resume()}", flush=True)
        return stop

    def exit_if_stopped(self) -> None:
        """The last line of a run: a run stopped by a signal exits with 128 + its number (130 for SIGINT, 143 for
        SIGTERM), so that `python grpo.py && next` does not go on and a scheduler sees a preempted job, not a done
        one."""
        if self.stop_asked:
            raise SystemExit(128 + self.signal_number)


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
        raise SystemExit(f"error: --resume {folder}: {os.path.join(folder, 'latest')} names {name!r}, which is not "
                         "there (removed or moved?)")
    return name


def load(folder: str, path: str) -> dict:
    """A file of a checkpoint, or one line naming it when it is missing or damaged."""
    if not os.path.isfile(path):
        raise SystemExit(f"error: --resume {folder}: {path} is missing")
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # a copy cut short, a disk error, another file under that name: whatever torch says
        raise SystemExit(f"error: --resume {folder}: {path} cannot be read, the checkpoint is damaged "
                         f"({type(e).__name__})") from None


def saved_state(folder: str) -> dict:
    """The state.pt of the latest checkpoint of the run in `folder`: its resolved flags, its method's file, ..."""
    return load(folder, os.path.join(folder, latest_checkpoint(folder), "state.pt"))


def refuse_another_method(folder: str, method) -> None:
    """One line when --resume names a run of another group file: its flags, weights and logs are that method's."""
    script = os.path.basename(sys.argv[0])
    if method is not None and method != script:
        raise SystemExit(f"error: --resume {folder}: a run of {method}, not of {script}; resume it with: "
                         f"python {method} --resume {folder}")


def refuse_changed_flags(saved: dict, args) -> None:
    """A resumed run is the same run: one line naming the first flag that differs from the run's own and may not."""
    for key, value in vars(args).items():
        if key not in MAY_CHANGE_ON_RESUME and key in saved and saved[key] != value:
            flag = "--" + key.replace("_", "-")
            raise SystemExit(f"error: --resume: {flag} {value} differs from the run's {flag} {saved[key]}; a resumed "
                             "run may change only "
                             f"{', '.join('--' + k.replace('_', '-') for k in MAY_CHANGE_ON_RESUME[1:])}")
