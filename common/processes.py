"""Several processes under torchrun: what a group file needs to run on N GPUs (or N CPU processes).

1. `start` and `finish`: join the process group (NCCL between GPUs, gloo between CPU processes) and leave it
   together. A plain `python grpo.py` is process 0 of 1 and joins nothing.
2. `distribute`: the model the update runs. DDP by default (a whole copy in every process); with --fsdp,
   torch's FSDP2 (weights, gradients and Adam's state sharded), whose sampling runs `in_lockstep`;
   `gradient_sync` lets DDP reduce once per optimiser step.
3. `draw_minibatches`: one epoch's minibatches of whole groups, as many passes on every process.
4. Reductions across processes: `global_mean`, `global_fraction`, `global_max`.
5. `said_once_per_machine`: a bad flag's line printed once per machine, not by every process.

None of it is a method: every group file runs the same processes the same way, so it lives here once.
"""

import contextlib
import importlib
import os
from typing import NamedTuple, Optional

import torch
from torch import Tensor


def world_size() -> int:
    """How many processes train: the process group's size, or before it exists, how many torchrun
    started (1 without torchrun)."""
    if torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


@contextlib.contextmanager
def said_once_per_machine():
    """Errors every process finds alike (a bad flag): the first process of each machine (LOCAL_RANK 0) prints the
    line; the others leave with the same status, silently. Otherwise torchrun shows the line once per process,
    sometimes glued into one. Not process 0 alone: what a check reads may differ by machine (a --resume folder,
    a W&B login), and each machine's console must say why its processes left."""
    try:
        yield
    except SystemExit as e:
        if isinstance(e.code, str) and os.environ.get("LOCAL_RANK", "0") != "0":
            raise SystemExit(1) from None
        raise


def start(use_cuda: bool) -> tuple[int, int, torch.device]:
    """(rank, number of processes, device); under torchrun, join the process group first."""
    processes = world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = use_cuda and torch.cuda.is_available()
    device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
    if processes == 1:
        return 0, 1, device
    if cuda:
        torch.cuda.set_device(device)
    # torch.distributed.nn reads group.WORLD once, at import: imported after the group exists, it would
    # hold the group past destroy_process_group (see finish)
    importlib.import_module("torch.distributed.nn")
    torch.distributed.init_process_group("nccl" if cuda else "gloo")
    return torch.distributed.get_rank(), processes, device


def finish() -> None:
    """Leave the process group, every process together; the caller has dropped its DDP wrapper.

    Process 0 still evaluates and saves when the others reach the end: the barrier waits for it.
    destroy_process_group then drops the group's last reference, so that gloo's threads end with it.
    A thread that outlived the interpreter would abort the process (SIGABRT), and torchrun would
    kill process 0 mid-evaluation.
    """
    if not torch.distributed.is_initialized():
        return
    nccl = torch.distributed.get_backend() == "nccl"
    torch.distributed.barrier(device_ids=[torch.cuda.current_device()] if nccl else None)
    torch.distributed.destroy_process_group()


def distribute(model, fsdp: bool, processes: int):
    """The model the update runs; sampling and scoring use `model` itself.

    One process: the model. Under torchrun, DDP: a wrapper around a whole copy in every process,
    which averages the gradients of the processes in backward(). With --fsdp, the model itself,
    sharded by FSDP2: each decoder block, then the rest, split over the processes. A pass gathers
    a block's weights just before it runs and frees them after. Build the optimiser afterwards.
    """
    if processes == 1:
        return model
    if not fsdp:
        return torch.nn.parallel.DistributedDataParallel(model)
    from torch.distributed.fsdp import fully_shard

    blocks = max((m for m in model.modules() if isinstance(m, torch.nn.ModuleList)), key=len)
    for block in blocks:
        fully_shard(block)
    fully_shard(model, reshard_after_forward=False)  # the root: needed again at once, by backward
    return model


def is_sharded(model) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def local(p: Tensor) -> Tensor:
    """A parameter's values on this process: all of them, or under --fsdp its shard."""
    return p.to_local() if hasattr(p, "to_local") else p


@contextlib.contextmanager
def in_lockstep(model):
    """Under --fsdp, sampling: every process runs as many forward passes as the one that runs most.

    A forward gathers each block's weights from every process, so the processes' forwards pair up,
    whatever their inputs; yet each samples its own responses, which end after another number of
    steps (DAPO: after another number of rounds). Each forward first tells the others one is coming;
    a process done with its own then runs one of a single token for each of theirs. Its weights are
    held whole one block at a time, never all at once. Without --fsdp: nothing."""
    if not is_sharded(model):
        yield
        return
    def announce(module, inputs) -> None:  # (a hook that returns a value replaces the inputs)
        global_max(1.0)

    # before FSDP's own hook, which gathers the root's weights: the first collective of a forward
    coming = model.register_forward_pre_hook(announce, prepend=True)
    try:
        yield
    finally:
        coming.remove()
        with torch.no_grad():
            token = torch.zeros(1, 1, dtype=torch.long, device=next(model.parameters()).device)
            while global_max(0.0) > 0:  # another process's forward is coming: join it
                model(input_ids=token, use_cache=False)


def gradient_sync(model, last: bool):
    """DDP reduces gradients in every backward; within one optimiser step, only the last needs it."""
    if last or not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return contextlib.nullcontext()
    return model.no_sync()


# ---------------------------------------------------------------- reductions across processes

def _reduce(values: list[float], op) -> Tensor:
    """float64 values reduced over all processes (themselves in one process)."""
    total = torch.tensor(values, dtype=torch.float64)
    if torch.distributed.is_initialized():
        nccl = torch.distributed.get_backend() == "nccl"  # NCCL reduces GPU tensors only, gloo CPU ones
        total = total.to("cuda" if nccl else "cpu")
        torch.distributed.all_reduce(total, op=op)
    return total.cpu()


def global_mean(value: float) -> float:
    """Mean of a per-process number over all processes: what process 0 logs is the whole batch's."""
    processes = world_size()
    return _reduce([value], torch.distributed.ReduceOp.SUM).item() / processes


def global_fraction(part: float, whole: float) -> float:
    """Σ part / Σ whole over all processes; 0 when the whole is 0."""
    total = _reduce([part, whole], torch.distributed.ReduceOp.SUM)
    return (total[0] / total[1]).item() if total[1] > 0 else 0.0


def global_max(value: float) -> float:
    """The largest of a per-process number over all processes."""
    return _reduce([value], torch.distributed.ReduceOp.MAX).item()


# ---------------------------------------------------------------- the update's minibatches

class Minibatch(NamedTuple):
    """One optimiser step: its responses, and the passes (micro-batches) that run them."""

    rows: Tensor  # [minibatch size] indices of its responses
    passes: list[Tensor]  # at most --micro-batch-size responses each; with β = 0, groups with signal


def draw_minibatches(
    advantages: Tensor,
    group_size: int,
    num_minibatches: int,
    micro_batch_size: Optional[int],
    skip_no_signal: bool,
) -> list[Minibatch]:
    """One epoch's minibatches, of whole groups drawn at random.

    A group stays whole: its responses share their prompt, which a pass then reads once. With
    skip_no_signal (β = 0), groups whose advantages are all 0 run no pass: every term of the loss
    is multiplied by Â, so they add exactly 0. DDP's backward is collective, so every process runs
    as many groups: the most of any process, topped up with groups without signal.
    """
    groups = advantages.view(-1, group_size)  # [B, G]
    has_signal = (groups != 0).any(dim=1)  # [B]
    offsets = torch.arange(group_size, device=advantages.device)
    minibatches = []
    for chosen in torch.randperm(len(groups), device=advantages.device).chunk(num_minibatches):
        run = chosen
        if skip_no_signal:
            count = int(global_max(int(has_signal[chosen].sum())))
            signal_first = torch.argsort((~has_signal[chosen]).int(), stable=True)
            run = chosen[signal_first][:count]
        rows, run_rows = ((g.unsqueeze(1) * group_size + offsets).flatten() for g in (chosen, run))
        passes = list(run_rows.split(micro_batch_size or len(rows))) if len(run_rows) else []
        minibatches.append(Minibatch(rows, passes))
    return minibatches
