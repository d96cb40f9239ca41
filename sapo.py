"""SAPO: Soft Adaptive Policy Optimization (Gao et al. 2025, arXiv 2511.20347).

PPO without a critic, for language models. For each prompt x the frozen policy π_θold
samples a group of G responses, a verifiable reward R scores each, and the group is its
own baseline: every token of response i shares the advantage Â_i. The policy maximises a
surrogate that keeps the ratios π_θ/π_θold near 1; a KL penalty of weight β can also keep
it near the starting model π_ref:

    Â_i = (R_i − mean_j R_j) / sqrt(var_j R_j + δ)                    eq. (90)-(91)
    r_{i,t} = π_θ(y_t | x, y_<t) / π_θold(y_t | x, y_<t)               eq. (95)
    f(r) = 4/τ σ(τ (r − 1)),  τ = τ_pos if Â_i > 0 else τ_neg          eq. (117)-(118)
    J = 1/G Σ_i 1/T_i Σ_t f(r_{i,t}) Â_i − β KL(π_θ ‖ π_ref)           eq. (119)

δ = 1e-6 keeps equal rewards from dividing by zero; σ is the logistic sigmoid; the equation
numbers are common/EQUATIONS.md's. The group replaces PPO's critic V_φ, for an LLM a second
model of its size. The paper trains without the KL term (β = 0); with --beta > 0 it is k3
per token (Schulman 2020), averaged like the policy term.

What changes from grpo.py, and why (SAPO paper): the clip is a hard gate (eq. 116): a token
whose ratio left [1 − ε, 1 + ε] gives no gradient at all, one inside gives its full gradient; tight
clips waste signal, loose ones admit unstable steps. SAPO's f has slope d f/d r = 4σ(x)(1 − σ(x))
= sech²(x/2), x = τ (r − 1) (eq. 120): 1 at r = 1, so on-policy SAPO has GRPO's gradient,
then smoothly smaller, never exactly 0, as r leaves 1. τ_neg > τ_pos damps
negative-advantage tokens faster, which the paper finds more stable. τ_pos = 1.0, τ_neg = 1.05
(the paper's values); no KL penalty by default (β = 0).

One iteration (the main loop at the end): sample B prompts → G responses each from π_θold
→ rewards → group advantages → log-probs under π_θold and π_ref → E epochs of minibatch
steps on the loss → log. [METHOD] sections are where the siblings differ, [SHARED] ones
the same in all five (tests/test_group_crossfile.py); the rest is in common/ (policy.py:
the model and its flags, sampling.py, decoding.py, processes.py, runs.py, checkpoints.py).

    python sapo.py                                     # the embedded tiny model, offline
    python sapo.py --model Qwen/Qwen2.5-0.5B-Instruct  # a real model: defaults per machine
    torchrun --nproc_per_node 4 sapo.py --model Qwen/Qwen2.5-0.5B-Instruct  # common/GUIDE.md
"""

import contextlib
import copy
import os
import random
from collections import defaultdict
from dataclasses import dataclass
from typing import Literal, NamedTuple, Optional

import common  # noqa: F401  (before torch: a Ctrl-C while it loads, common/__init__.py)
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from common import decoding, memory, policy, processes, runs, sampling
from common.checkpoints import Checkpoints
from common.tasks import EVAL_SEED, get_task

BETA = 0.0  # the paper trains without the KL penalty


@dataclass
class Args(policy.ModelArgs):
    # Sampling
    group_size: int = 8
    """G: responses sampled per prompt (eq. 88); the group is the baseline, so G >= 2"""
    prompts_per_iteration: Optional[int] = None
    """B: prompts per iteration over all processes; None: 32 (8: a real LLM on a CPU)"""
    num_iterations: Optional[int] = None
    """sample-then-update iterations; None: 150 (24 for a real model on a CPU)"""
    max_new_tokens: Optional[int] = None
    """response length cap; None: 8 embedded, 256 for a real LLM (16 on a CPU)"""
    temperature: float = 1.0
    """sampling temperature; log-probs are computed at the same temperature"""
    # Optimisation
    update_epochs: int = 1
    """E: passes over each rollout batch"""
    num_minibatches: int = 4
    """optimiser steps per epoch; with > 1 the ratio leaves 1, so the clip acts"""
    micro_batch_size: Optional[int] = None
    """responses per forward/backward pass (gradient accumulation); None: what fits"""
    learning_rate: Optional[float] = None
    """Adam's, linear decay to 0; None: 3e-4 embedded, real LLM 1e-6 (CPU 1e-5), LoRA 1e-5 (2e-4)"""
    max_grad_norm: float = 1.0
    """global gradient-norm clip"""
    # The objective: what the sibling files change
    beta: Optional[float] = None
    """β: weight of the KL penalty to π_ref (0: none runs); None: 0, the paper's"""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """per-token KL estimate (kl_penalty): k1, k2, or k3, which is unbiased and >= 0"""
    tau_pos: float = 1.0
    """gate temperature for tokens of positive-advantage responses (eq. 118)"""
    tau_neg: float = 1.05
    """gate temperature for tokens of negative-advantage responses (eq. 118); > tau_pos: faster"""


# ------------------------------------------------ [METHOD] advantages, KL penalty, loss

def compute_advantages(rewards: Tensor, group_size: int) -> Tensor:
    """eq. (90)-(91): Â_i = (R_i − mean) / sqrt(population variance + δ) within each group
    of G consecutive rows of `rewards` [N]. Equal rewards have no signal: Â = 0, never NaN."""
    grouped = rewards.view(-1, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    # a float mean of equal values (0.3, say) may round: make such groups exactly 0
    centred = centred.masked_fill((grouped == grouped[:, :1]).all(1, keepdim=True), 0.0)
    std = torch.sqrt(centred.pow(2).mean(dim=1, keepdim=True) + 1e-6)
    return (centred / std).view(-1)


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, estimator: str = "k3") -> Tensor:
    """Per-token estimate of KL(π_θ ‖ π_ref) from the policy's samples (Schulman 2020): with
    log_r = log π_ref − log π_θ, k1 = −log_r (unbiased, may be < 0), k2 = ½ log_r², and
    k3 = e^{log_r} − log_r − 1 (unbiased and ≥ 0; the default, as in GRPO)."""
    log_r = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
    if estimator == "k1":
        return -log_r
    if estimator == "k2":
        return 0.5 * log_r.pow(2)
    return torch.exp(log_r) - log_r - 1.0


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    ref_logprobs: Optional[Tensor] = None,
    beta: float = BETA,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    kl_estimator: Literal["k1", "k2", "k3"] = "k3",
    weights: Optional[Tensor] = None,
) -> Tensor:
    """The negated SAPO objective, eq. (119), to minimise.

    logprobs, old_logprobs, ref_logprobs, mask, weights: [N, T] over response tokens (mask:
    1 on real tokens, EOS included); advantages: [N], one per response, for all its tokens."""
    # eq. (95): token-level ratio; clamping the log-ratio keeps exp from overflowing
    ratio = torch.exp((logprobs - old_logprobs).clamp(-20.0, 20.0))
    adv = advantages.unsqueeze(1)
    # eq. (118): the temperature depends on the sign of the response's advantage
    tau = torch.where(adv > 0, adv.new_tensor(tau_pos), adv.new_tensor(tau_neg))
    # eq. (117): soft gate instead of the clip; its slope in r is 1 at r = 1 and decays smoothly
    per_token = 4 / tau * torch.sigmoid(tau * (ratio - 1)) * adv
    if weights is not None:  # eq. (125): a sampler that is not π_θold, corrected
        per_token = per_token * weights
    if ref_logprobs is not None and beta > 0:
        per_token = per_token - beta * kl_penalty(logprobs, ref_logprobs, kl_estimator)
    # eq. (119): mean over each response's tokens (1/T_i), then over the responses (1/G)
    return -((per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)).mean()


def check_args(args: Args, world_size: int = 1) -> None:
    """Refuse bad input in one line, before anything heavy (shared flags: policy.py)."""
    groups = args.prompts_per_iteration // world_size  # on each process
    minibatch = groups // max(args.num_minibatches, 1) * args.group_size  # responses
    each = f" of each of the {world_size} processes" if world_size > 1 else ""
    policy.refuse_bad_args(args, [  # (it holds, what it must be); then ", got <value>"
        (args.group_size >= 2, "--group-size must be >= 2 (the group is the baseline)"),
        (args.prompts_per_iteration >= 1, "--prompts-per-iteration must be >= 1"),
        (args.prompts_per_iteration % world_size == 0, "--prompts-per-iteration must be "
         f"divisible by the {world_size} processes (a group lives on one)"),
        (args.num_iterations >= 1, "--num-iterations must be >= 1"),
        (args.max_new_tokens is None or args.max_new_tokens >= 1, "--max-new-tokens must be >= 1"),
        (args.temperature > 0, "--temperature must be > 0"),
        (args.update_epochs >= 1, "--update-epochs must be >= 1"),
        (args.num_minibatches >= 1 and groups % args.num_minibatches == 0,
         f"--num-minibatches must be >= 1 and divide the {groups} groups (prompts) per "
         f"iteration{each}, since a minibatch holds whole groups"),
        (args.micro_batch_size is None or args.micro_batch_size >= 1 and minibatch % args.micro_batch_size == 0,
         f"--micro-batch-size must be >= 1 and divide the minibatch of {minibatch} responses{each}"),
        (args.learning_rate is None or args.learning_rate > 0, "--learning-rate must be > 0"),
        (args.max_grad_norm > 0, "--max-grad-norm must be > 0"),
        (args.beta >= 0, "--beta must be >= 0"),
        (args.kl_estimator in ("k1", "k2", "k3"), "--kl-estimator must be k1, k2 or k3"),
        (args.tau_pos > 0, "--tau-pos must be > 0"),
        (args.tau_neg > 0, "--tau-neg must be > 0"),
    ])


# ------------------------------------------------ [SHARED] the reference policy, a pass

def reference_model(model, args: Args, bf16: bool = False):
    """π_ref of the KL term, frozen at the starting policy; β = 0 needs none. With LoRA, the
    policy itself with its adapters off while it scores: the starting model, for no memory.
    Otherwise a frozen copy (its linear layers in bfloat16 under bfloat16 autocast)."""
    if args.beta == 0:
        return None
    if args.lora_rank > 0:
        return model
    ref_model = copy.deepcopy(model).eval().requires_grad_(False)
    if bf16:
        policy.frozen_weights_to_bfloat16(ref_model)
    return ref_model


class Forward(NamedTuple):  # how a pass runs, decided once at start-up
    autocast: torch.autocast  # bfloat16 on a GPU; off on a CPU
    share_prompt: bool  # each prompt read once per group


# ------------------------------------------------ [SHARED] sampling: each prompt read once

LOGITS_PER_CHUNK = 2**24  # logits read at a time (64 MiB), not all [N, T, vocab]


def sample_token(logits: Tensor, greedy: Tensor, u: Tensor):
    """A token from softmax(logits) for each row of [N, vocab] (the likeliest where `greedy`),
    its log-probability and the row's entropy. Exact, with one uniform u [N, 1] per row in
    float64: the first token whose cumulative probability exceeds u. (torch.multinomial draws
    one random number per vocabulary entry, which on a CPU costs more than the model.)"""
    rows = max(1, LOGITS_PER_CHUNK // logits.shape[-1])
    if len(logits) > rows:  # a few rows at a time: temporaries of [rows, vocab]
        parts = zip(logits.split(rows), greedy.split(rows), u.split(rows))
        drawn = [sample_token(*part) for part in parts]
        return tuple(torch.cat(values) for values in zip(*drawn))
    log_pi = torch.log_softmax(logits, dim=-1)
    pi = log_pi.exp()
    cdf = pi.cumsum(dim=-1, dtype=torch.float64)  # [N, vocab], non-decreasing
    # how many bounds are <= u: never a token of probability 0
    drawn = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(1)
    drawn = drawn.clamp(max=logits.shape[-1] - 1)  # u rounded up to the sum: once in 2^53
    token = torch.where(greedy, logits.argmax(dim=-1), drawn)
    logprob = log_pi.gather(1, token.unsqueeze(1)).squeeze(1)
    return token, logprob, torch.special.entr(pi).sum(dim=-1)


def response_mask(responses: Tensor, eos_ids: Tensor) -> tuple[Tensor, Tensor]:
    """mask [N, T]: 1 up to and including the first EOS; truncated [N]: no EOS at all. Built
    from lengths, never by comparing with pad_id: with pad = eos (gpt2) that would drop the
    EOS itself, and the model would never learn to stop."""
    is_eos = torch.isin(responses, eos_ids)
    truncated = ~is_eos.any(dim=1)
    first_eos = torch.where(truncated, responses.shape[1] - 1, is_eos.int().argmax(dim=1))
    positions = torch.arange(responses.shape[1], device=responses.device)
    return (positions.unsqueeze(0) <= first_eos.unsqueeze(1)).float(), truncated


class Samples(NamedTuple):
    """B prompts and their N = B * G responses: response i answers prompt i // G."""
    prompt_ids: Tensor  # [B, P] left-padded prompts
    prompt_mask: Tensor  # [B, P]
    responses: Tensor  # [N, T]
    mask: Tensor  # [N, T] 1 up to the end of the answer, included
    truncated: Tensor  # [N] no end within max_new_tokens
    entropies: Tensor  # [N, T] entropy of π_θold where each token was drawn, logged
    logprobs: Tensor  # [N, T] log π_θold of each token, as the sampler computed it


@torch.no_grad()
def sample(model, prompt_format, questions: list[str], args: Args, device, num_samples: int,
           greedy=False, generator: Optional[torch.Generator] = None) -> Samples:
    """num_samples responses to each question, drawn token by token from π_θold. `greedy`:
    True, or [num_samples] flags: which responses of a prompt take the likeliest token.
    `prompt_format` (common/sampling.py): what the model reads, where an answer ends."""
    prompt_ids, prompt_mask = prompt_format.encode(questions, device)  # [B, P], left-padded
    eos_ids = torch.tensor(prompt_format.eos_ids, device=device)
    # Prefill reads each prompt once, its keys and values copied for its G responses; each
    # step reads the last token of every response (common/decoding.py: --compile-decoding).
    decoder = decoding.Decoder(model, prompt_ids, prompt_mask, repeats=num_samples,
                               new_tokens=args.max_new_tokens, draw=sample_token,
                               compiled=args.compile_decoding)
    ended = torch.zeros(len(decoder.logits), dtype=torch.bool, device=device)
    greedy = torch.as_tensor(greedy, device=device).expand(num_samples).repeat(len(questions))
    tokens, entropies, logprobs = [], [], []
    for _ in range(args.max_new_tokens):
        u = torch.rand(len(ended), 1, dtype=torch.float64, device=device, generator=generator)
        # π_θold itself at the temperature: no top-k, top-p or repetition penalty
        last = tokens[-1] if tokens else None
        token, logprob, entropy = decoder.step(last, greedy, u, args.temperature)
        entropies.append(entropy)
        logprobs.append(logprob)
        tokens.append(token.masked_fill(ended, prompt_format.pad_id))  # padded once ended
        ended = ended | torch.isin(token, eos_ids)
        if prompt_format.stop is not None and decoder.asks():  # reading the tokens waits for the device
            ended = ended | prompt_format.holds_stop(torch.stack(tokens, dim=1))
        if decoder.finished(ended):  # all ended (asked every few tokens when compiled)
            break
    responses = torch.stack(tokens[: decoder.steps], dim=1)  # [N, T]
    mask, truncated = response_mask(responses, eos_ids)
    if prompt_format.stop is not None:  # a base model's answer ends at its stop string
        mask, stopped = prompt_format.stop_mask(responses, mask)
        truncated = truncated & ~stopped  # an ended answer is not cut, even at the cap
    entropies, logprobs = (torch.stack(v[: decoder.steps], dim=1) for v in (entropies, logprobs))
    return Samples(prompt_ids, prompt_mask, responses, mask, truncated, entropies, logprobs)


@torch.no_grad()
def evaluate(model, prompt_format, task, eval_pairs, args: Args, device, forward: Forward):
    """Held-out rewards of --eval-samples responses per question at the training temperature
    (what RL optimises), [questions, k], and of a greedy one, [questions, 1]. Its random
    numbers are its own, the same each time: no evaluation flag changes training."""
    questions, targets = [q for q, _ in eval_pairs], [t for _, t in eval_pairs]
    model.eval()
    generator = torch.Generator(device).manual_seed(EVAL_SEED)
    k = args.eval_samples
    greedy = torch.arange(k + 1) == k  # one prefill serves k samples and a greedy one
    with forward.autocast:
        samples = sample(model, prompt_format, questions, args, device, k + 1, greedy, generator)
    texts = prompt_format.decode(samples.responses, samples.mask)
    graded = [task.reward(text, t) for text, t in zip(texts, [t for t in targets for _ in greedy])]
    rewards = torch.tensor(graded).view(len(questions), k + 1)
    return rewards[:, :k], rewards[:, k:]


# ------------------------------------------------ [SHARED] log-probs of the sampled tokens

def response_logits(model, prompt_ids: Tensor, prompt_mask: Tensor, prompt_index: Tensor,
                    responses: Tensor, temperature: float, share_prompt: bool = True) -> Tensor:
    """Logits of the distribution each response token was drawn from, ÷ temperature.
    Response i answers prompt prompt_index[i] of prompt_ids [B, P]. The model reads [prompt,
    y_1 .. y_(T−1)]; its last T outputs predict y_1 .. y_T: [n, T, vocab], the memory peak.
    With share_prompt each distinct prompt runs once, into a cache its responses attend to.
    Padding after a response needs no mask: causal attention hides it from real tokens."""
    cache, inputs_embeds = None, None
    input_ids = torch.cat([prompt_ids[prompt_index], responses[:, :-1]], dim=1)  # [n, P+T−1]
    attention_mask = F.pad(prompt_mask[prompt_index], (0, responses.shape[1] - 1), value=1)
    if share_prompt and prompt_ids.shape[1] > 1:  # a one-token prompt: nothing to cache
        prompts, prompt_index = torch.unique(prompt_index, return_inverse=True)
        heads = prompt_ids[prompts, :-1]  # each prompt but its last token: [b, P − 1]
        last = prompt_ids[prompts][prompt_index, -1:]
        input_ids = torch.cat([last, responses[:, :-1]], dim=1)  # [n, T]
        # the heads into a cache; the inputs' embeddings looked up with theirs
        prefill, cached, inputs_embeds = sampling.read_prompts(
            model, heads, prompt_mask[prompts, :-1], input_ids)
        cache = prefill.past_key_values
        cache.reorder_cache(prompt_index)  # [b, ...] -> [n, ...]
        # [n, cached + T]: 1 on the cached prompt tokens, 0 on padding, then the inputs
        attention_mask = F.pad(cached[prompt_index], (0, input_ids.shape[1]), value=1)
    positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # left padding shifts none
    logits = model(
        input_ids=input_ids if inputs_embeds is None else None,
        inputs_embeds=inputs_embeds,
        attention_mask=attention_mask,
        position_ids=positions[:, -input_ids.shape[1] :],
        past_key_values=cache,
        use_cache=cache is not None,
        logits_to_keep=responses.shape[1],  # the T positions that predict response tokens
    ).logits
    # float32 (the output layer's), divided in place: a copy would double the peak
    return logits.float().div_(temperature)


def token_logprobs(logits: Tensor, tokens: Tensor) -> Tensor:
    """log π(y_t | x, y_<t) = logit of y_t − logsumexp of the logits: [N, T], with no
    log-softmax copy. A few positions at a time: logsumexp's temporaries are [positions, vocab]."""
    positions = max(1, LOGITS_PER_CHUNK // logits.shape[-1])
    flat_logits, flat_tokens = logits.flatten(0, 1), tokens.flatten()  # [N*T, vocab], [N*T]
    return torch.cat([
        chunk.gather(-1, y.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(chunk, dim=-1)
        for chunk, y in zip(flat_logits.split(positions), flat_tokens.split(positions))
    ]).view_as(tokens)


def logprobs_of(model, batch, inds: Tensor, args: Args, forward: Forward) -> Tensor:
    """log π of the sampled tokens of responses `inds` of a Samples or Rollout: [n, T]."""
    with forward.autocast:
        logits = response_logits(model, batch.prompt_ids, batch.prompt_mask,
                                 inds // args.group_size, batch.responses[inds],
                                 args.temperature, forward.share_prompt)
    return token_logprobs(logits, batch.responses[inds])


class Rollout(NamedTuple):
    """What the update needs of an iteration's samples on this process (N = B * G)."""
    prompt_ids: Tensor  # [B, P] left-padded prompts; response i answers prompt i // G
    prompt_mask: Tensor  # [B, P]
    responses: Tensor  # [N, T]
    mask: Tensor  # [N, T] 1 on the tokens the loss sees (EOS included, padding excluded)
    advantages: Tensor  # [N]
    old_logprobs: Tensor  # [N, T] log π_θold of the sampled tokens
    ref_logprobs: Optional[Tensor]  # [N, T] log π_ref, or None when β = 0
    weights: Optional[Tensor] = None  # [N, T] a correction's weights (eq. 125), or None


@torch.no_grad()
def score_responses(model, ref_model, samples: Samples, first_epoch, args: Args, forward):
    """log π_θold (the model as it sampled) and log π_ref (None when β = 0) of the sampled
    tokens, [N, T], scored in the first epoch's very passes: GPU kernels round by shape, so
    the first ratio is exactly 1. Responses no pass runs (Â = 0) keep the sampler's."""
    old_logprobs = samples.logprobs.clone()  # kept with --old-logprobs sampler (eq. 128)
    ref_logprobs = None if ref_model is None else torch.zeros_like(old_logprobs)
    model.eval()
    for inds in [inds for minibatch in first_epoch for inds in minibatch.passes]:
        if args.old_logprobs != "sampler":  # rescored by the trainer
            old_logprobs[inds] = logprobs_of(model, samples, inds, args, forward)
        if ref_model is not None:  # with LoRA, π_ref is the policy with its adapters off
            with ref_model.disable_adapter() if args.lora_rank > 0 else contextlib.nullcontext():
                ref_logprobs[inds] = logprobs_of(ref_model, samples, inds, args, forward)
    return old_logprobs, ref_logprobs


# ------------------------------------------------ [METHOD] the update: minibatches of groups

def update_policy(model, optimizer, rollout: Rollout, epochs, args: Args, forward) -> dict:
    """Step 5: E epochs of minibatch steps on the loss; returns the update's stats. `epochs`:
    each epoch's minibatches of whole groups (common/processes.py), each one optimiser step
    in passes whose gradients add up. Under torchrun DDP averages equal shards: one step."""
    trainable = [p for g in optimizer.param_groups for p in g["params"]]  # --fsdp: shards
    model.train()  # dropout is off (policy.py): train mode only turns checkpointing on
    stats = {"policy_loss": [], "grad_norm": []}
    sums = defaultdict(float)  # token counts over all passes, for the fractions below
    for minibatches in epochs:
        for minibatch in minibatches:
            optimizer.zero_grad()
            step_loss = 0.0  # the minibatch's loss, whichever passes compute it
            for number, inds in enumerate(minibatch.passes):
                with processes.gradient_sync(model, last=number == len(minibatch.passes) - 1):
                    logprobs = logprobs_of(model, rollout, inds, args, forward)
                    old_logprobs, mask = rollout.old_logprobs[inds], rollout.mask[inds]
                    ref_logprobs = None if rollout.ref_logprobs is None else rollout.ref_logprobs[inds]
                    loss = policy_loss(
                        logprobs, old_logprobs, rollout.advantages[inds], mask,
                        ref_logprobs=ref_logprobs,
                        beta=args.beta,
                        tau_pos=args.tau_pos,
                        tau_neg=args.tau_neg,
                        kl_estimator=args.kl_estimator,
                        weights=None if rollout.weights is None else rollout.weights[inds],
                    )
                    # a mean over responses: each pass weighs its share of the minibatch
                    loss = loss * len(inds) / len(minibatch.rows)
                    loss.backward()
                step_loss += loss.item()
                with torch.no_grad():
                    ratio = torch.exp((logprobs - old_logprobs).clamp(-20.0, 20.0))
                    # the mean gate f'(r) = 4σ(x)(1 − σ(x)) (eq. 120): 1 on-policy, smaller as r leaves 1
                    tau = torch.where(rollout.advantages[inds].unsqueeze(1) > 0, args.tau_pos, args.tau_neg)
                    gate = 4 * torch.sigmoid(tau * (ratio - 1)) * (1 - torch.sigmoid(tau * (ratio - 1)))
                    # the tokens the clip acts on: those of responses with signal (Â ≠ 0)
                    signal = mask * (rollout.advantages[inds] != 0).unsqueeze(1)
                    sums["signal_tokens"] += signal.sum().item()
                    sums["gate"] += (gate * signal).sum().item()
                    if ref_logprobs is not None:
                        sums["tokens"] += mask.sum().item()
                        kl = kl_penalty(logprobs, ref_logprobs, args.kl_estimator)
                        sums["kl"] += (kl * mask).sum().item()
            if not minibatch.passes:  # no group with signal anywhere: a zero gradient
                for p in trainable:
                    p.grad = torch.zeros_like(p)
            stats["policy_loss"].append(step_loss)
            grad_norm = torch.nn.utils.clip_grad_norm_(trainable, args.max_grad_norm)
            stats["grad_norm"].append(grad_norm.item())
            optimizer.step()
    # fractions of the whole update's tokens, over all processes: the same for any passes
    stats["gate"] = [processes.global_fraction(sums["gate"], sums["signal_tokens"])]
    if args.beta > 0:
        stats["kl_ref"] = [processes.global_fraction(sums["kl"], sums["tokens"])]
    return stats


if __name__ == "__main__":
    args = runs.parse_args(Args)  # the command line; with --resume, the run's own flags
    defaults = policy.resolve_defaults(args, beta=BETA)  # per model and machine
    check_args(args, world_size=processes.world_size())
    rank, world_size, device = processes.start(args.cuda)  # torchrun: join the group
    task = get_task(args.task, args.eval_task)
    run_dir = runs.folder(args, task.name, __file__)  # runs/<a new name>, or --resume's

    # Each process samples its own responses; the weights start equal (DDP copies them).
    random.seed(args.seed + rank)
    np.random.seed(args.seed + rank)
    torch.manual_seed(args.seed + rank)
    # A GPU runs bfloat16 autocast; weights and Adam stay float32 (common/GUIDE.md).
    bf16 = device.type == "cuda"
    # a checkpointed layer keeps no cache; FSDP frees a block's weights after its backward
    share_prompt = not (args.gradient_checkpointing or args.fsdp)
    forward = Forward(torch.autocast(device.type, torch.bfloat16, enabled=bf16), share_prompt)

    tokenizer, model = policy.load(args, device)  # dropout off, the rest as flagged
    ref_model = reference_model(model, args, bf16)
    train_model = processes.distribute(model, args.fsdp, world_size)  # DDP or FSDP2
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(trained, lr=args.learning_rate, fused=True)
    sampler = sampling.Sampler(model, args.sampler_dtype, args.sampler_lag)

    prompt_format = sampling.PromptFormat(tokenizer, task, args.few_shot, args.system_prompt,
                                          model=model)
    eval_pairs = task.prompts(args.eval_size, random.Random(EVAL_SEED), split="test")
    longest = prompt_format.check_lengths([q for q, _ in eval_pairs], args.max_new_tokens)
    # responses per pass: as typed, or what the memory holds (the same step)
    micro_batch_size, why = memory.responses_per_pass(args, model, ref_model, longest)
    rng = random.Random(args.seed + rank)
    prompts_per_process = args.prompts_per_iteration // world_size
    # --save-every, --resume; Ctrl-C or SIGTERM: the iteration ends, a checkpoint is saved
    checkpoints = Checkpoints(run_dir, model=model, optimizer=optimizer, rng=rng, args=args,
                              sampler=sampler)
    first_iteration = checkpoints.restore() if args.resume else 1  # weights, Adam, RNGs
    log = runs.IterationLog(
        run_dir, args, model=model, ref_model=ref_model, first_iteration=first_iteration,
        evaluate=lambda: evaluate(model, prompt_format, task, eval_pairs, args, device, forward),
    )
    log.begin(defaults + why, prompt_format, eval_pairs[0][0])

    for iteration in range(first_iteration, args.num_iterations + 1):
        if checkpoints.stopped():  # Ctrl-C or SIGTERM while the first evaluation ran
            break
        log.begin_iteration(iteration)
        # Linear learning-rate decay to 0: the last updates are small, the policy settles.
        done = (iteration - 1) / args.num_iterations
        optimizer.param_groups[0]["lr"] = args.learning_rate * (1 - done)

        # 1-3. Freeze π_θold = π_θ; sample G responses to each prompt (eq. 94).
        with log.phase("generate"), sampler.ready() as behaviour:  # π_θold, or μ
            pairs = task.prompts(prompts_per_process, rng)
            with forward.autocast:
                samples = sample(behaviour, prompt_format, [q for q, _ in pairs], args, device, args.group_size)
            texts = prompt_format.decode(samples.responses, samples.mask)
        targets = [target for _, target in pairs for _ in range(args.group_size)]

        # 4. Rewards and group-relative advantages, eq. (90)-(91).
        graded = [task.reward(text, target) for text, target in zip(texts, targets)]
        rewards = torch.tensor(graded, device=device)
        advantages = compute_advantages(rewards, args.group_size)

        # The minibatches first: π_θold is scored in the very passes of the first epoch.
        epochs = [processes.draw_minibatches(
            advantages,
            args.group_size,
            num_minibatches=args.num_minibatches,
            micro_batch_size=micro_batch_size,
            skip_no_signal=args.beta == 0,  # with a KL term, every group acts on the loss
        ) for epoch in range(args.update_epochs)]
        # Log-probs of the sampled tokens under π_θold and π_ref: fixed targets.
        with log.phase("logprob"):
            old_logprobs, ref_logprobs = score_responses(model, ref_model, samples, epochs[0],
                                                         args, forward)

        # 5. E epochs of minibatch gradient steps on the soft-gated surrogate (eq. 117-119).
        rollout = Rollout(samples.prompt_ids, samples.prompt_mask, samples.responses,
                          samples.mask, advantages, old_logprobs, ref_logprobs)
        # A sampler μ ≠ π_θold: each token weighed or masked by π_θold/μ (eq. 124-127).
        rollout, figures = sampling.correct(rollout, samples.logprobs, args.correction,
                                            args.correction_cap)
        with log.phase("update"):
            stats = update_policy(train_model, optimizer, rollout, epochs, args, forward)
            sampler.refresh()  # the new weights, or those of --sampler-lag updates ago

        # Log: the same tags in all five files, means over processes; evaluate when due.
        scalars = runs.rollout_stats(samples, rewards, advantages, accuracies=rewards,
                                     old_logprobs=old_logprobs, first_epoch=epochs[0])
        log.end_iteration(iteration, scalars | figures, stats, optimizer.param_groups[0]["lr"])
        if checkpoints.after(iteration):  # a checkpoint when due; True if asked to stop
            break

    if args.save_model and not checkpoints.stopping:  # process 0 writes (again if extended)
        policy.save_model(model, tokenizer, os.path.join(run_dir, "model"), rank == 0)
    log.close()
    del train_model  # DDP holds the process group: its last reference goes before finish
    processes.finish()  # all leave together, once process 0 has evaluated and saved
    checkpoints.exit_if_stopped()  # 130 after Ctrl-C, 143 after SIGTERM: not finished
