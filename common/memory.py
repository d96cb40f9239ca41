"""Memory: what each process holds, and how many responses a forward/backward pass takes.

1. `state_parts`: what each process holds before any pass, part by part: the policy's weights,
   their gradients and Adam's moments, DDP's buckets or what FSDP gathers, a reference model, the
   sampler's copy and its lag's versions, the compiled steps' bfloat16 weights. The console's
   "holds" line prints these parts, and the pass budget leaves out their sum.
2. `responses_per_pass`: the most responses per pass within a budget (results/memory.md), or one
   line that refuses a model whose state leaves no room for a single response, with flags that help.
"""

import os
from typing import Optional

import torch

from common.decoding import cast_weights
from common.processes import is_sharded, world_size
from common.sampling import Sampler, sampler_differs

# One response in an update pass, measured on SmolLM2-135M (common/results/memory.md): float32
# [tokens, vocabulary] arrays alive at the peak (logits, their gradient, log-softmax's temporaries),
# and values kept for backward per token, layer and unit of width.
LOGIT_COPIES = 6
ACTIVATION_VALUES = 20
CPU_PASS_BUDGET = 2 * 2**30  # bytes: with the model, Adam and sampling, SmolLM2 stays under 6 GiB


def response_bytes(response_tokens: int, prompt_tokens: int, group_size: int, config,
                   activation_bytes: int) -> float:
    """Estimated memory of one response in an update pass: its logits and their copies, and the
    activations of its tokens and of its share of its group's prompt (read once per group)."""
    text = config.get_text_config()
    logits = response_tokens * text.vocab_size * 4 * LOGIT_COPIES
    tokens = response_tokens + prompt_tokens / group_size
    per_token = text.num_hidden_layers * text.hidden_size * ACTIVATION_VALUES * activation_bytes
    return logits + tokens * per_token


def gathered_weights(model) -> int:
    """The weights an FSDP process holds whole at once: those outside the decoder blocks (the
    root's, kept gathered from its forward to its backward) and two blocks (the one running and the
    next, prefetched). common/processes.py: distribute shards each block, then the root."""
    blocks = max((m for m in model.modules() if isinstance(m, torch.nn.ModuleList)), key=len)
    in_blocks = sum(p.numel() for p in blocks.parameters())
    return sum(p.numel() for p in model.parameters()) - in_blocks + 2 * in_blocks // len(blocks)


def training_state(trained: int, frozen_bytes: float, processes: int,
                   gathered: Optional[int] = None) -> dict[str, float]:
    """Bytes of the training state each process holds, by part: 16 a trained weight (its float32
    value, gradient and Adam's two moments), DDP's buckets 4 more on several processes, the frozen
    weights as stored (`frozen_bytes` in all). Under --fsdp (`gathered` given) the 16 bytes are
    sharded over the processes, and `gathered` weights are held whole in float32."""
    shards = processes if gathered is not None else 1
    parts = {"the policy's weights": trained * 4 / shards + frozen_bytes,
             "their gradients": trained * 4 / shards, "Adam's moments": trained * 8 / shards}
    if gathered is not None:
        parts["the weights FSDP gathers at once"] = gathered * 4
    elif processes > 1:
        parts["DDP's gradient buckets"] = trained * 4
    return parts


def state_bytes(trained: int, frozen_bytes: float, processes: int, gathered: Optional[int] = None,
                reference: float = 0.0) -> float:
    """training_state's sum, and a reference model's bytes: for models counted, not loaded
    (common/tools/scale.py)."""
    return sum(training_state(trained, frozen_bytes, processes, gathered).values()) + reference


def state_parts(model, ref_model, args, processes: int, cuda: bool) -> dict[str, float]:
    """What each process holds before any pass, in bytes by part: the training state of the
    loaded policy, its reference model (unless it is the policy), the sampler's copy and its lag's
    versions (Sampler.bytes), and on a GPU the compiled steps' bfloat16 weights: decoding_model's
    copy of the policy, which the evaluations decode with, and of a float32 sampler copy."""
    parameters = list(model.parameters())  # a shard's numel() is the whole parameter's
    trained = sum(p.numel() for p in parameters if p.requires_grad)
    frozen = sum(p.numel() * p.element_size() for p in parameters if not p.requires_grad)
    gathered = gathered_weights(model) if is_sharded(model) else None
    parts = training_state(trained, frozen, processes, gathered)
    if ref_model is not None and ref_model is not model:
        parts["the reference model"] = sum(p.numel() * p.element_size() for p in ref_model.parameters())
    copy, versions = Sampler.bytes(model, args.sampler_dtype, args.sampler_lag)
    if copy:
        parts[f"the sampler's {args.sampler_dtype or 'float32'} copy"] = copy
    if versions:
        parts[f"the {args.sampler_lag} newer versions of its lag"] = versions
    if cuda and args.compile_decoding:  # the policy's own (it evaluates), and a float32 sampler copy's
        casts = 2 if copy and args.sampler_dtype in (None, "float32") else 1  # a 16-bit copy casts none
        parts["the compiled steps' bfloat16 weights"] = casts * 2 * sum(p.numel() for p in cast_weights(model))
    return parts


# ---------------------------------------------------------------- the responses of one pass

def pass_budget(gpu_memory: Optional[int], state: Optional[float]) -> float:
    """Bytes an update pass may take. On a CPU (gpu_memory None): a fixed budget, at most an eighth
    of the machine. On a GPU: half of what 90 % of the card leaves after the training state; the
    other half is for sampling, the allocator's slack and what the estimate misses."""
    if gpu_memory is None:
        return min(CPU_PASS_BUDGET, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 8)
    return (0.9 * gpu_memory - state) / 2


def pass_size(minibatch: int, group_size: int, per_response: float, budget: float) -> int:
    """The most responses per pass whose estimate fits the budget, among the sizes that divide the
    minibatch: whole groups where one fits (a pass then reads each prompt once); at least 1."""
    sizes = [n for n in range(1, minibatch + 1)
             if minibatch % n == 0 and (n % group_size == 0 or n < group_size)]
    return max([n for n in sizes if n * per_response <= budget], default=1)


def what_helps(args) -> str:
    """The flags that would make room, from where the run stands: each of them shrinks the state or
    the pass."""
    helps = []
    if args.fsdp:
        helps.append("shard over more cards (torchrun --nproc_per_node)")
    elif args.lora_rank == 0:  # --fsdp refuses LoRA, whose trained state is small already
        helps += ["train LoRA adapters (--lora-rank 16)",
                  "shard over cards (torchrun --nproc_per_node N, --fsdp)"]
    if sampler_differs(args.sampler_dtype, args.sampler_lag):
        helps.append("sample with the policy itself (no --sampler-dtype, --sampler-lag 0)")
    if args.compile_decoding:
        helps.append("decode eagerly (--no-compile-decoding: no bfloat16 copy of the weights)")
    return ", ".join(helps + ["lower --max-new-tokens"])


def refuse_what_does_not_fit(budget: float, per_response: float, state: Optional[float], gpu_memory,
                             helps: str) -> None:
    if gpu_memory is not None and budget < per_response:  # one line, not an out-of-memory error
        raise SystemExit(
            f"error: the training state ({state / 2**30:.1f} GiB) leaves less than a pass of one "
            f"response (an estimated {per_response / 2**30:.1f} GiB, twice over: sampling) in 90 % "
            f"of the card's {gpu_memory / 2**30:.0f} GiB: {helps}")


def responses_per_pass(args, model, ref_model, prompt_tokens: int) -> tuple[int, list[str]]:
    """--micro-batch-size, or left unset: the most responses per pass that fit the memory budget (the
    step is the same at any size: gradient accumulation), with the console's line of arithmetic.
    Typed or not, a state that leaves no room for one response is refused."""
    processes = world_size()
    device = next(model.parameters()).device
    per_response = response_bytes(args.max_new_tokens, prompt_tokens, args.group_size, model.config,
                                  2 if device.type == "cuda" else 4)
    gpu_memory = state = None  # a CPU's budget is fixed
    if device.type == "cuda":
        gpu_memory = torch.cuda.get_device_properties(device).total_memory
        state = sum(state_parts(model, ref_model, args, processes, cuda=True).values())
    budget = pass_budget(gpu_memory, state)
    refuse_what_does_not_fit(budget, per_response, state, gpu_memory, what_helps(args))
    if args.micro_batch_size is not None:
        return args.micro_batch_size, []
    minibatch = args.prompts_per_iteration // processes // args.num_minibatches * args.group_size
    size = pass_size(minibatch, args.group_size, per_response, budget)
    return size, [f"--micro-batch-size {size}  (responses per pass: the most of the minibatch of "
                  f"{minibatch} within {budget / 2**30:.1f} GiB, at an estimated "
                  f"{per_response / 2**20:,.0f} MiB each for {args.max_new_tokens} + "
                  f"{prompt_tokens}/{args.group_size} tokens; common/results/memory.md)"]
