"""The life of a run, the same for every group file: its flags, its folder, the console, TensorBoard.

1. `parse_args` and `folder`: the command line (with --resume, the resumed run's own flags), and
   the run's folder, runs/{task}__{file}[-{exp_name}]__{model}__{seed}__{time}, or --resume's.
2. `IterationLog`: the main loop's schedule (time each phase, log each iteration, evaluate when
   due), with a room per job: `Board` writes TensorBoard's files (and W&B's mirror), `Clock` times
   the phases with a status line during long ones, `Console` prints what a user reads. A run that
   cannot go on says so in one line (an unwritable folder, a GPU out of memory).
3. `rollout_stats` and `sampler_gap`: what one iteration's samples look like, in the tags every
   group file logs. Checkpoints and stopping: common/checkpoints.py.
"""

import contextlib
import importlib.util
import io
import math
import os
import re
import signal
import sys
import threading
import time
from typing import Callable, Optional

import torch
from torch import Tensor

from common.checkpoints import refuse_another_method, refuse_changed_flags, saved_state
from common.memory import state_parts
from common.perf import Roofline, work
from common.processes import (global_fraction, global_max, global_mean, in_lockstep, said_once_per_machine,
                              world_size)
from common.sampling import sampler_differs

STATUS_EVERY = 15.0  # seconds between the status lines of a long phase


@said_once_per_machine()
def parse_args(args_class):
    """The command line as an `args_class` (tyro: one flag per field, its docstring as help).

    With --resume, the resumed run's own flags are the defaults, and a typed flag may change only
    what a resumed run may change. A value tyro cannot read is one line, as every other bad value
    is; a pipe closed early (`python grpo.py --help | head`) ends the program quietly. Until
    Checkpoints takes them over, Ctrl-C or SIGTERM (while the model loads, say) stop the program at
    once, with one line and 128 + the signal's number.
    """
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
        fields = args_class.__dataclass_fields__
        default = args_class(**{k: v for k, v in saved["args"].items() if k in fields})
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):  # tyro draws its errors in a box: one line of it is said
            config = (tyro.conf.DisallowNone,)
            args = tyro.cli(args_class, config=config, **({"default": default} if default else {}))
    except SystemExit as e:
        if e.code in (0, None):
            raise
        message = tyro_error_line(errors.getvalue())
        if message.startswith("Unrecognized options"):
            message = unknown_flags_line(argv, args_class) or message
        raise SystemExit(f"error: {message}") from None
    if resume is not None:
        refuse_changed_flags(saved["args"], args, saved["iteration"])
    if getattr(args, "track", False) and importlib.util.find_spec("wandb") is None:
        raise SystemExit("error: --track logs to Weights & Biases, an optional install: "
                         "pip install wandb==0.31.0")
    if getattr(args, "track", False) and not wandb_can_log_in():
        raise SystemExit(f"error: --track needs a Weights & Biases login: {WANDB_LOGIN}")
    return args


WANDB_LOGIN = ("run `wandb login`, set WANDB_API_KEY, or set WANDB_MODE=offline "
               "(and `wandb sync` later)")


def wandb_can_log_in() -> bool:
    """False when W&B would stop the run at its start for want of a login: no key in the
    environment or in ~/.netrc (`wandb login` writes it), and no terminal to ask for one."""
    if os.environ.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun"):
        return True  # nothing leaves the machine: no login needed
    keys = ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE")
    if sys.stdin.isatty() or any(os.environ.get(key) for key in keys):
        return True
    try:
        from wandb.sdk.lib.wbauth import wbnetrc

        host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")
        return bool(wbnetrc.read_netrc_auth(host=host))
    except Exception:  # another version of wandb: it will say so itself
        return True


def stop_before_training(number, frame) -> None:
    """A signal before the first iteration began: nothing trained, nothing to save, no traceback.
    (Ctrl-C under torchrun arrives twice, the terminal's SIGINT and torchrun's SIGTERM.)"""
    for other in (signal.SIGINT, signal.SIGTERM):
        signal.signal(other, signal.SIG_IGN)
    name = signal.Signals(number).name
    print(f"\n{name}: stopped before training began; nothing was trained or saved", flush=True)
    raise SystemExit(128 + number)


def unknown_flags_line(argv: list[str], args_class) -> Optional[str]:
    """Flags the command line has and args_class has not, each with the closest known flag (None:
    no such flag)."""
    import difflib

    known = [f"--{name.replace('_', '-')}" for name in args_class.__dataclass_fields__]
    known += [f"--no-{flag[2:]}" for flag in known]  # a boolean's negation
    typed = [word.split("=", 1)[0] for word in argv if word.startswith("--")]
    said = []
    for flag in (flag for flag in typed if flag not in known):
        close = difflib.get_close_matches(flag, known, n=1)
        said.append(f"{flag} (perhaps {close[0]}?)" if close else flag)
    if not said:
        return None
    return f"unrecognized option{'s' * (len(said) > 1)} {', '.join(said)}; --help lists them all"


def tyro_error_line(box: str) -> str:
    """The message of tyro's error box in one line ("Error parsing --seed: invalid literal for int()
    with base 10: '1.5'" becomes "--seed must be an integer, got '1.5'")."""
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
    """The run's folder, the same on every process: the one given to --resume (as typed), else a
    new one under runs/ named by task, method (and --exp-name), model, seed and start time."""
    if args.resume:
        return os.path.normpath(args.resume)
    method = os.path.basename(script).removesuffix(".py") + (f"-{args.exp_name}" if args.exp_name else "")
    model = os.path.basename(os.path.normpath(args.model)).removesuffix(".gguf")
    base = os.path.join("runs", f"{task_name}__{method}__{model}__{args.seed}__{int(time.time())}")
    run_dir, copy = base, 2
    while os.path.exists(run_dir):  # two runs started in the same second
        run_dir, copy = f"{base}-{copy}", copy + 1
    if torch.distributed.is_initialized():  # the processes may straddle a second: process 0's name
        shared = [run_dir]
        torch.distributed.broadcast_object_list(shared, src=0)
        run_dir = shared[0]
    return run_dir


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from n samples of which c are right: 1 − C(n − c, k) / C(n, k)
    (Chen et al. 2021, arXiv 2107.03374): the chance that k of the n samples hold a right one.
    With fewer than k wrong samples C(n − c, k) is 0 (math.comb's count): every k hold a right one."""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


# ---------------------------------------------------- the console, TensorBoard and the evaluations

OUT_OF_MEMORY = ("error: the GPU ran out of memory in the {phase} phase: lower --micro-batch-size (responses "
                 "per forward pass), add --gradient-checkpointing, train LoRA adapters (--lora-rank 16) or "
                 "lower --max-new-tokens")


class IterationLog:
    """The schedule of a group file's main loop: time each phase, log each iteration, evaluate when due.

    Every process times its phases and joins the cross-process means; process 0 alone writes (Board),
    prints (Console) and evaluates. `evaluate()` returns the held-out rewards of k sampled responses
    per prompt and of a greedy one; under --fsdp the other processes join its forward passes.
    `ref_model` is counted in the memory each process holds.
    """

    def __init__(self, run_dir: str, args, evaluate: Callable[[], tuple], model=None,
                 first_iteration: int = 1, ref_model=None):
        self.args, self.model, self.ref_model, self.evaluate = args, model, ref_model, evaluate
        self.first_iteration, self.folder = first_iteration, run_dir
        self.responses = args.prompts_per_iteration * args.group_size  # over all processes
        self.num_iterations, self.eval_every = args.num_iterations, args.eval_every
        self.is_main = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
        self.cuda = model is not None and next(model.parameters()).device.type == "cuda"
        self.board = Board(run_dir, args, first_iteration) if self.is_main else None
        self.console = Console(run_dir, args.num_iterations)
        self.clock = Clock(self.is_main, args.num_iterations, first_iteration - 1)
        self.roofline = None if model is None else Roofline(model, args, self.cuda)
        self.start = time.time()

    def begin(self, defaults: list[str] = (), prompt_format=None, question: str = "") -> None:
        """Before training: the run's first lines (with what the model reads of `question`), then
        the starting model's evaluation (x = 0 on every curve); a resumed run did so before."""
        if self.is_main and self.model is not None:
            parts = state_parts(self.model, self.ref_model, self.args, world_size(), self.cuda)
            defaults = list(defaults) + prompt_format.default_line()  # --few-shot: once loaded
            self.console.start(self.model, parts, self.responses, defaults,
                               prompt_format.texts([question])[0], self.args.gradient_checkpointing)
        if self.first_iteration == 1:
            held_out = self.held_out(0)
            if self.is_main:
                print(f"iteration    0  {held_out}  (log: {self.folder})", flush=True)
        self.start = time.time()

    def begin_iteration(self, iteration: int) -> None:
        self.clock.begin_iteration(iteration)

    def phase(self, name: str):
        """Time one phase of the iteration (generate, logprob, update, evaluate): Clock.phase."""
        return self.clock.phase(name)

    def held_out(self, iteration: int) -> str:
        """Evaluate: accuracy sampled and greedy; with k samples per prompt, pass@1 and pass@k.
        Process 0 evaluates; under --fsdp the others join its forward passes (in_lockstep)."""
        with self.phase("evaluate"), in_lockstep(self.model):  # no model, no --fsdp: nothing
            if not self.is_main:
                return ""
            sampled, greedy = self.evaluate()  # rewards, [prompts, k] and [prompts, 1]
        figures = {"accuracy": sampled.mean().item(), "greedy_accuracy": greedy.mean().item()}
        n = sampled.shape[1]
        if n > 1:
            right = (sampled == 1).sum(dim=1).tolist()
            figures["pass@1"] = sum(pass_at_k(n, c, 1) for c in right) / len(right)
            figures["pass@k"] = sum(pass_at_k(n, c, n) for c in right) / len(right)  # k = --eval-samples
        self.board.write({f"charts/{key}": value for key, value in figures.items()}, iteration)
        return self.console.held_out(iteration, figures, n)

    def end_iteration(self, iteration: int, scalars: dict, losses: dict[str, list[float]],
                      learning_rate: float) -> None:
        """Log at x = iterations done: means over all processes, written by process 0; then evaluate
        when due. A (part, whole) pair is a fraction of what all processes counted: Σ part / Σ whole."""
        elapsed = time.time() - self.clock.iteration_start
        logged = {
            **scalars,
            **{f"losses/{name}": sum(values) / len(values) for name, values in losses.items() if values},
            **{f"perf/{name}_seconds": seconds for name, seconds in self.clock.seconds.items()},
            "perf/iteration_seconds": elapsed,
            "charts/tokens_per_second": scalars["charts/response_length"] * self.responses / elapsed,
            "charts/samples_per_second": self.responses / elapsed,
        }
        if self.cuda:
            logged["perf/peak_gpu_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30
        if getattr(self.args, "old_logprobs", None) == "sampler":  # π_old is μ: no gap to tell
            logged = {tag: v for tag, v in logged.items() if not tag.startswith("charts/sampler_gap")}
        if self.roofline is not None:  # the work of rollout_stats against the machine's ceilings
            logged.update(self.roofline.figures(logged))
        logged = {tag: global_fraction(*value) if isinstance(value, tuple) else global_mean(value)
                  for tag, value in logged.items()}
        due = iteration % self.eval_every == 0 or iteration == self.num_iterations
        held_out = f"  {self.held_out(iteration)}" if due else ""
        if not self.is_main:
            return
        self.board.write({"charts/learning_rate": learning_rate, **logged}, iteration)
        done = iteration - self.first_iteration + 1
        eta = (time.time() - self.start) / done * (self.num_iterations - iteration)
        self.console.iteration(iteration, logged, losses, self.args, elapsed, eta, held_out)
        if self.roofline is not None and (due or iteration == self.first_iteration):
            print(self.roofline.line(logged), flush=True)
        self.console.warn_if_never_right(logged)

    def close(self) -> None:
        """The run's closing line; the logs closed."""
        if self.is_main:
            self.board.close()
            self.console.end(self.clock.iteration, time.time() - self.start)


class Board:
    """Where the figures go: TensorBoard's event files in the run's folder and, with --track (CleanRL's),
    a Weights & Biases run that mirrors them. Process 0's alone; an unwritable folder is one line."""

    def __init__(self, folder: str, args, first_iteration: int):
        from torch.utils.tensorboard import SummaryWriter

        try:
            os.makedirs(folder, exist_ok=True)
            open(os.path.join(folder, ".writable"), "w").close()
            os.remove(os.path.join(folder, ".writable"))
        except OSError as e:
            raise SystemExit(f"error: cannot write the run's folder {folder} ({e.strerror}): run from "
                             "a folder you can write to (runs/ is made in the current folder)")
        self.track = getattr(args, "track", False)
        if self.track:  # started before the writer, whose event files it mirrors
            import wandb

            # W&B's own folder (./wandb, or $WANDB_DIR) stays outside the run's: W&B copies the event
            # files it mirrors into it (copies of copies would pile up in a folder it watches). The run's
            # folder is named TensorBoard's root: else W&B waits 10 s at the end for another to infer one.
            wandb.tensorboard.unpatch()  # a run before this one in the process may have patched it
            wandb.tensorboard.patch(root_logdir=folder)
            try:
                wandb.init(project=args.wandb_project_name or "policy-gradients", entity=args.wandb_entity,
                           config=vars(args), name=os.path.basename(folder), sync_tensorboard=True)
            except wandb.errors.Error as e:  # a key refused, an unknown entity: one line, no traceback
                raise SystemExit(f"error: --track: Weights & Biases refused the run ({e}); "
                                 f"{WANDB_LOGIN}") from None
        # a resumed run drops what the interrupted one logged after its checkpoint
        self.writer = SummaryWriter(folder, purge_step=first_iteration if first_iteration > 1 else None)
        table = "\n".join(f"|{key}|{value}|" for key, value in vars(args).items())
        self.writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + table)

    def write(self, figures: dict, iteration: int) -> None:
        for tag, value in figures.items():
            self.writer.add_scalar(tag, value, iteration)

    def close(self) -> None:
        self.writer.close()
        if self.track:
            import wandb

            wandb.finish()


class Clock:
    """Each phase's seconds (perf/{phase}_seconds), a status line while a long phase runs, so that a
    slow run does not look like a hung one, and one line when the GPU runs out of memory in a phase:
    the phase and the flags that cut memory."""

    def __init__(self, show: bool, num_iterations: int, iteration: int):
        self.show, self.num_iterations = show, num_iterations  # show: process 0 prints the status
        self.iteration, self.iteration_start, self.seconds = iteration, time.time(), {}

    def begin_iteration(self, iteration: int) -> None:
        self.iteration, self.iteration_start, self.seconds = iteration, time.time(), {}

    @contextlib.contextmanager
    def phase(self, name: str):
        start, done = time.time(), threading.Event()
        status = None
        if self.show:
            status = threading.Thread(target=self._status, args=(name, start, done), daemon=True)
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
        """Every STATUS_EVERY seconds of a phase, where it stands: in place on a terminal, or a line."""
        terminal, shown = sys.stdout.isatty(), False
        while not done.wait(STATUS_EVERY):
            line = f"iteration {self.iteration:4d}/{self.num_iterations}  {name}... {time.time() - start:.0f}s"
            print(f"\r{line}" if terminal else line, end="" if terminal else "\n", flush=True)
            shown = True
        if shown and terminal:
            print("\r" + " " * 60 + "\r", end="", flush=True)


class Console:
    """What a user reads (process 0 prints it): the run's first lines, a line per iteration with the
    held-out figures when due, a warning when nothing is ever right, and a closing line."""

    def __init__(self, folder: str, num_iterations: int):
        self.folder, self.num_iterations = folder, num_iterations
        self.evaluations = []  # (iteration, held-out accuracy, greedy): the closing line's first and last
        self.never_right = 0  # iterations in a row, from the start, with no sampled response right

    def start(self, model, parts: dict, responses: int, defaults: list[str], first_prompt: str,
              checkpointing: bool) -> None:
        """The run's folder and size, what each process holds (common/memory.py: the parts the pass
        sizes count, a shard under --fsdp), each flag left to its default with the value chosen and
        why, and what the model reads."""
        trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
        device = next(model.parameters()).device.type
        print(f"{self.folder}: {trained:,} trained parameters on {world_size()} × {device}, "
              f"{responses} responses per iteration")
        held = [f"{part} ({size / 2**20:,.1f} MiB)" for part, size in parts.items()]
        print(f"each process holds {', '.join(held[:-1])} and {held[-1]}: {sum(parts.values()) / 2**20:,.1f} MiB "
              "before any activation")
        for line in defaults:
            print(f"default {line}")
        print(f"the model reads (first held-out prompt): {first_prompt!r}")
        if checkpointing:  # a checkpointed layer keeps no KV cache to share
            print("--gradient-checkpointing: each response is scored with its own copy of its prompt")

    def held_out(self, iteration: int, figures: dict, n: int) -> str:
        self.evaluations.append((iteration, figures["accuracy"], figures["greedy_accuracy"]))
        passes = "".join(f", {key.replace('@k', f'@{n}')} {value:.3f}"
                         for key, value in figures.items() if "@" in key)
        return f"held-out {figures['accuracy']:.3f} (greedy {figures['greedy_accuracy']:.3f}{passes})"

    def iteration(self, iteration: int, logged: dict, losses: dict, args, elapsed: float, eta: float,
                  held_out: str) -> None:
        # the update's own statistics (clip, gate, KL): all but its loss and gradient norm
        update = "".join(f"{name} {logged[f'losses/{name}']:.3f}  " for name in losses
                         if name not in ("policy_loss", "grad_norm") and f"losses/{name}" in logged)
        sampler = sampler_differs(getattr(args, "sampler_dtype", None), getattr(args, "sampler_lag", 0))
        if sampler and "charts/sampler_gap_mean" in logged:  # how far the sampler is from π_θold
            update += f"sampler-gap {logged['charts/sampler_gap_mean']:.2g}  "
        if "charts/is_ratio_max" in logged:  # the correction: its largest ratio, the shares left out
            update += (f"ρ-max {logged['charts/is_ratio_max']:.3g}  "
                       f"masked {logged['charts/is_masked_fraction']:.2f} "
                       f"(responses {logged['charts/is_masked_response_fraction']:.2f})  ")
        print(
            f"iteration {iteration:4d}/{self.num_iterations}  accuracy {logged['charts/train_accuracy']:.3f}  "
            f"length {logged['charts/response_length']:.1f}  "
            f"truncated {logged['charts/truncated_fraction']:.2f}  "
            f"no-signal {logged['charts/zero_signal_fraction']:.2f}  {update}{elapsed:.3g} s/it  "
            f"{logged['charts/tokens_per_second']:,.0f} tok/s  ETA {eta:.0f}s{held_out}", flush=True
        )

    def warn_if_never_right(self, logged: dict) -> None:
        """Once, when no sampled response was right in the first 3 iterations: every group is then
        all wrong, no advantage is ever nonzero, and the run can learn nothing."""
        never = logged["charts/train_accuracy"] == 0 and self.never_right >= 0
        self.never_right = self.never_right + 1 if never else -1
        if self.never_right == 3:
            cut = logged["charts/truncated_fraction"]
            print("no sampled response has been right in 3 iterations: nothing can be learned. Usual causes: "
                  "the answer is not in the format the reward reads (see 'the model reads' above; a base "
                  f"model needs --few-shot), --max-new-tokens cuts the answers (truncated {cut:.2f}), or the "
                  "task is too hard for the model", flush=True)

    def end(self, iteration: int, seconds: float) -> None:
        """The closing line: the iterations, the held-out accuracy from the first evaluation to the
        last, and where the run is logged."""
        held_out = ""
        if len(self.evaluations) > 1:
            (first, start, greedy_start), (last, end, greedy_end) = self.evaluations[0], self.evaluations[-1]
            held_out = (f"; held-out {start:.3f} (iteration {first}) → {end:.3f} (iteration {last}), "
                        f"greedy {greedy_start:.3f} → {greedy_end:.3f}")
        took = f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"
        logdir = os.path.dirname(self.folder) or "."
        print(f"end: iteration {iteration}/{self.num_iterations} after {took} of training{held_out}; "
              f"curves: tensorboard --logdir {logdir} (this run: {self.folder})", flush=True)


# ---------------------------------------------------- what an iteration's samples look like

def rollout_stats(samples, rewards: Tensor, advantages: Tensor, accuracies: Tensor,
                  old_logprobs=None, first_epoch=None) -> dict:
    """The tags every group file logs of one iteration's samples (this process's share).

    `samples` holds B prompts and their B * G responses; `accuracies` is the task's reward (1 =
    right); `rewards` are what the advantages are computed from (DAPO's differ). With
    `old_logprobs` and the `first_epoch` that scored them: the sampler gap (sampler_gap).
    """
    mask, group_size = samples.mask, len(samples.responses) // len(samples.prompt_ids)
    lengths, right = mask.sum(dim=1).float(), (accuracies == 1).float()
    wrong = 1 - right
    # every process holds as many responses and groups, so a plain mean over processes is the batch's; but not
    # for a figure per right answer or per token, whose count differs by process: those are summed, then divided
    stats = {
        "charts/reward": rewards.mean().item(),
        "charts/train_accuracy": right.mean().item(),
        "charts/response_length": lengths.mean().item(),
        "charts/right_response_length": global_fraction((lengths * right).sum().item(), right.sum().item()),
        "charts/wrong_response_length": global_fraction((lengths * wrong).sum().item(), wrong.sum().item()),
        # a group whose advantages are all 0 teaches nothing (skipped with β = 0)
        "charts/zero_signal_fraction": (advantages.view(-1, group_size) == 0).all(dim=1).float().mean().item(),
        "charts/truncated_fraction": samples.truncated.float().mean().item(),
        "losses/entropy": global_fraction((samples.entropies * mask).sum().item(), mask.sum().item()),
    }
    if old_logprobs is not None:
        stats.update(sampler_gap(samples.logprobs, old_logprobs, mask, first_epoch))
    passes = [inds for minibatch in first_epoch or [] for inds in minibatch.passes]
    return {**stats, **work(samples.prompt_ids, samples.prompt_mask, samples.responses, passes)}


def sampler_gap(sampler_logprobs: Tensor, old_logprobs: Tensor, mask: Tensor, first_epoch: list):
    """|log π_sampler − log π_θold| over the response tokens scored: mean and max, over all processes.

    The same weights, not the same arithmetic: a cache and one token at a time against whole passes,
    bfloat16 on a GPU. The tokens scored are those of the first epoch's passes. With none scored on
    any process, nothing is logged (a gap of 0 would read as perfect agreement).
    """
    scored = torch.zeros(len(mask), dtype=torch.bool, device=mask.device)
    for minibatch in first_epoch:
        for inds in minibatch.passes:
            scored[inds] = True
    tokens = mask * scored.unsqueeze(1)
    gap = (sampler_logprobs - old_logprobs).abs() * tokens
    if global_mean(tokens.sum().item()) == 0:
        return {}
    return {"charts/sampler_gap_mean": global_fraction(gap.sum().item(), tokens.sum().item()),
            "charts/sampler_gap_max": global_max(gap.max().item() if gap.numel() else 0.0)}

