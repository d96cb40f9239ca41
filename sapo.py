"""SAPO: Soft Adaptive Policy Optimization (Gao et al. 2025, arXiv 2511.20347).

PPO without a critic, for language models. For each prompt x the frozen behaviour policy π_θold
samples a group of G responses, a verifiable reward R scores each one, and the group is its own
baseline: every token of response i shares the advantage Â_i. The policy maximises a surrogate that
keeps the ratios π_θ/π_θold near 1; a KL penalty of weight β can also keep it near the starting
model π_ref:

    Â_i = (R_i − mean_j R_j) / sqrt(var_j R_j + δ)                    eq. (90)-(91)
    r_{i,t} = π_θ(y_t | x, y_<t) / π_θold(y_t | x, y_<t)               eq. (95)
    f(r) = 4/τ σ(τ (r − 1)),  τ = τ_pos if Â_i > 0 else τ_neg          eq. (117)-(118)
    J = 1/G Σ_i 1/T_i Σ_t f(r_{i,t}) Â_i − β KL(π_θ ‖ π_ref)           eq. (119)

(δ = 1e-6 only keeps a group of equal rewards from dividing by zero; σ is the logistic sigmoid.)
The equation numbers are those of the repo's equation page, common/EQUATIONS.md.
The group baseline replaces PPO's learned critic V_φ, which for an LLM would be a second model of
the same size. The paper trains without the KL term (β = 0); with --beta > 0 it is the k3 estimator
per token (Schulman 2020, "Approximating KL divergence"), averaged like the policy term.

What changes from grpo.py, and why (SAPO paper): the clip is a hard gate (eq. 116): a token
whose ratio left [1 − ε, 1 + ε] gives no gradient at all, one inside gives its full gradient; tight
clips waste signal, loose ones admit unstable steps. SAPO's f has slope d f/d r = 4σ(x)(1 − σ(x))
= sech²(x/2), x = τ (r − 1) (eq. 120): 1 at r = 1, so on-policy SAPO has GRPO's gradient,
then smoothly smaller, never exactly 0, as r leaves 1. τ_neg > τ_pos damps
negative-advantage tokens faster, which the paper finds more stable. τ_pos = 1.0, τ_neg = 1.05
(the paper's values); no KL penalty by default (β = 0).

One iteration: sample B prompts → G responses each from π_θold → rewards → group advantages → log-probs
under π_θold and π_ref, without gradients → E epochs of minibatch gradient steps on the loss (several
steps, so the ratio leaves 1) → log. The G responses of a group share their prompt: it is read once when
sampling, scoring and updating, and minibatches hold whole groups. The same file runs on several GPUs
(torchrun, data parallel) and with LoRA: see common/GUIDE.md. Sections tagged [METHOD] are where the sibling
files differ; those tagged [SHARED] are identical in all five (tests/test_group_crossfile.py keeps them
so). What is not the method lives in common/: loading a model, prompts and torchrun in common/llm.py;
logging, evaluations and checkpoints in common/runs.py.

    python sapo.py                                   # embedded tiny model, offline, CPU (common/results/group.md)
    python sapo.py --model Qwen/Qwen2.5-0.5B-Instruct   # GPU, real-model defaults (lr 1e-6, 256 tokens)
    torchrun --nproc_per_node 4 sapo.py --model Qwen/Qwen2.5-0.5B-Instruct --lora-rank 16 ...    # 4 GPUs
"""

import contextlib
import copy
import os
import random
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Literal, NamedTuple, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from common import llm, runs
from common.tasks import EVAL_SEED, get_task


@dataclass
class Args(llm.ModelArgs):
    # Sampling
    group_size: int = 8
    """G: responses sampled per prompt (eq. 88); the group is the baseline, so G >= 2"""
    prompts_per_iteration: Optional[int] = None
    """B: prompts per iteration, over all processes (B * G responses); None: 32 (8 for a real model on a CPU)"""
    num_iterations: Optional[int] = None
    """number of sample-then-update iterations; None: 150 (24 for a real model on a CPU)"""
    max_new_tokens: Optional[int] = None
    """response length cap; None: 8 for the embedded models, 256 for a real LLM (16 on a CPU)"""
    temperature: float = 1.0
    """sampling temperature; log-probs are computed at the same temperature"""
    # Optimisation
    update_epochs: int = 1
    """E: passes over each rollout batch"""
    num_minibatches: int = 4
    """optimiser steps per epoch; > 1 step per rollout lets the ratio leave 1, so the clip acts"""
    micro_batch_size: Optional[int] = None
    """responses per forward/backward pass on a process (gradient accumulation); None: as many as fit in memory"""
    learning_rate: Optional[float] = None
    """Adam's, decayed linearly to 0; None: 3e-4 for the embedded models; a real LLM: 1e-6 on a GPU, 1e-5 on a CPU"""
    max_grad_norm: float = 1.0
    """global gradient-norm clip"""
    # The objective: what the sibling files change
    beta: float = 0.0
    """β: weight of the KL penalty to the reference model; 0 needs no reference model"""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """per-token KL estimator: k1 = log(π/π_ref), k2 = ½ log²(π/π_ref), k3 = π_ref/π − log(π_ref/π) − 1"""
    tau_pos: float = 1.0
    """gate temperature for tokens of positive-advantage responses (eq. 118)"""
    tau_neg: float = 1.05
    """gate temperature for tokens of negative-advantage responses (eq. 118); > tau_pos damps them faster"""


# ---------------------------------------------------------------- [METHOD] advantages, KL penalty, loss

def compute_advantages(rewards: Tensor, group_size: int) -> Tensor:
    """eq. (90)-(91): Â_i = (R_i − mean) / sqrt(population variance + δ), within each group.

    `rewards` is [N] with the G responses of a prompt in consecutive rows. A group whose
    rewards are all equal carries no signal: its advantages are exactly 0 (δ keeps it from NaN).
    """
    grouped = rewards.view(-1, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    # A float mean of equal values (e.g. 0.3) can be off by rounding: make such groups exactly 0.
    centred = centred.masked_fill((grouped == grouped[:, :1]).all(dim=1, keepdim=True), 0.0)
    std = torch.sqrt(centred.pow(2).mean(dim=1, keepdim=True) + 1e-6)
    return (centred / std).view(-1)


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, estimator: str = "k3") -> Tensor:
    """Per-token estimate of KL(π_θ ‖ π_ref) from tokens sampled by the policy (Schulman 2020).

    With log_r = log π_ref − log π_θ: k1 = −log_r (unbiased, can be negative), k2 = ½ log_r²,
    k3 = e^{log_r} − log_r − 1 (unbiased and always ≥ 0; the default, as in GRPO).
    """
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
    beta: float = 0.0,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    kl_estimator: Literal["k1", "k2", "k3"] = "k3",
) -> Tensor:
    """The negated SAPO objective, eq. (119), to minimise.

    logprobs, old_logprobs, ref_logprobs, mask: [N, T] over response tokens (mask 1 on real tokens,
    EOS included); advantages: [N], one per response, shared by all its tokens.
    """
    # eq. (95): token-level ratio. Clamping the log-ratio keeps a far-off-policy token from overflowing exp.
    ratio = torch.exp((logprobs - old_logprobs).clamp(-20.0, 20.0))
    adv = advantages.unsqueeze(1)
    # eq. (118): the temperature depends on the sign of the response's advantage
    tau = torch.where(adv > 0, adv.new_tensor(tau_pos), adv.new_tensor(tau_neg))
    # eq. (117): soft gate instead of the clip; its slope in r is 1 at r = 1 and decays smoothly
    per_token = 4 / tau * torch.sigmoid(tau * (ratio - 1)) * adv
    if ref_logprobs is not None and beta > 0:
        per_token = per_token - beta * kl_penalty(logprobs, ref_logprobs, kl_estimator)
    # eq. (119): mean over each response's tokens (1/T_i; 0 for an all-padding row), then over the responses (1/G)
    return -((per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)).mean()


def check_args(args: Args, world_size: int = 1) -> None:
    """Refuse bad input with one clear line, before anything heavy is loaded (the shared flags: common/llm.py)."""
    groups_per_process = args.prompts_per_iteration // world_size
    minibatch = groups_per_process // max(args.num_minibatches, 1) * args.group_size  # responses
    llm.refuse_bad_args(args, [
        (args.group_size >= 2, f"--group-size must be >= 2 (the group is the baseline), got {args.group_size}"),
        (args.prompts_per_iteration >= 1, f"--prompts-per-iteration must be >= 1, got {args.prompts_per_iteration}"),
        (args.prompts_per_iteration % world_size == 0,
         f"--prompts-per-iteration must be divisible by the {world_size} processes (whole groups live on one process), "
         f"got {args.prompts_per_iteration}"),
        (args.num_iterations >= 1, f"--num-iterations must be >= 1, got {args.num_iterations}"),
        (args.max_new_tokens is None or args.max_new_tokens >= 1,
         f"--max-new-tokens must be >= 1, got {args.max_new_tokens}"),
        (args.temperature > 0, f"--temperature must be > 0, got {args.temperature}"),
        (args.update_epochs >= 1, f"--update-epochs must be >= 1, got {args.update_epochs}"),
        (args.num_minibatches >= 1 and groups_per_process % args.num_minibatches == 0,
         f"--num-minibatches must be >= 1 and divide the {groups_per_process} groups (prompts) per iteration"
         f"{f' of each of the {world_size} processes' if world_size > 1 else ''}, since a minibatch holds whole groups,"
         f" got {args.num_minibatches}"),
        (args.micro_batch_size is None or (args.micro_batch_size >= 1 and minibatch % args.micro_batch_size == 0),
         f"--micro-batch-size must be >= 1 and divide the minibatch size {minibatch}"
         f"{' per process' if world_size > 1 else ''}, got {args.micro_batch_size}"),
        (args.learning_rate is None or args.learning_rate > 0,
         f"--learning-rate must be > 0, got {args.learning_rate}"),
        (args.max_grad_norm > 0, f"--max-grad-norm must be > 0, got {args.max_grad_norm}"),
        (args.beta >= 0, f"--beta must be >= 0, got {args.beta}"),
        (args.kl_estimator in ("k1", "k2", "k3"),
         f"--kl-estimator must be one of k1, k2, k3, got {args.kl_estimator!r}"),
        (args.tau_pos > 0, f"--tau-pos must be > 0, got {args.tau_pos}"),
        (args.tau_neg > 0, f"--tau-neg must be > 0, got {args.tau_neg}"),
    ])


# ---------------------------------------------------------------- [SHARED] the reference policy of the KL term

def reference_model(model, args: Args, bf16: bool = False):
    """π_ref of the KL term, frozen at the starting policy; β = 0 needs none.

    With LoRA it is the policy itself with its adapters switched off while it scores (see
    `reference_scoring`): the starting model, at no memory cost. Otherwise a frozen copy, whose
    linear layers are stored in bfloat16 when the forward passes run under bfloat16 autocast.
    """
    if args.beta == 0:
        return None
    if args.lora_rank > 0:
        return model
    ref_model = copy.deepcopy(model).eval().requires_grad_(False)
    if bf16:
        llm.frozen_weights_to_bfloat16(ref_model)
    return ref_model


def reference_scoring(ref_model, args: Args):
    """The context in which ref_model scores tokens as π_ref: adapters off with LoRA, nothing to do otherwise."""
    return ref_model.disable_adapter() if args.lora_rank > 0 else contextlib.nullcontext()


# ---------------------------------------------------------------- [SHARED] sampling responses: each prompt read once

def response_mask(responses: Tensor, eos_ids: Tensor) -> tuple[Tensor, Tensor]:
    """mask [N, T]: 1 up to and including the first EOS; truncated [N]: no EOS within max_new_tokens.

    Built from lengths, never by comparing with pad_id: with pad = eos (gpt2) that would drop the
    EOS itself, and the model would never learn to stop.
    """
    is_eos = torch.isin(responses, eos_ids)
    truncated = ~is_eos.any(dim=1)
    first_eos = torch.where(truncated, responses.shape[1] - 1, is_eos.int().argmax(dim=1))
    positions = torch.arange(responses.shape[1], device=responses.device)
    return (positions.unsqueeze(0) <= first_eos.unsqueeze(1)).float(), truncated


class Samples(NamedTuple):
    """B prompts and their N = B * G sampled responses: response i answers prompt i // G."""

    prompt_ids: Tensor  # [B, P] left-padded prompts
    prompt_mask: Tensor  # [B, P]
    responses: Tensor  # [N, T]
    mask: Tensor  # [N, T] 1 up to and including the end of the answer (EOS, or a base model's stop string)
    truncated: Tensor  # [N] no end within max_new_tokens
    entropies: Tensor  # [N, T] entropy of π_θold where each token was sampled, for logging
    logprobs: Tensor  # [N, T] log π_θold of each sampled token as the sampler computed it (a cache, token by token)


@torch.no_grad()
def sample(model, tokenizer, task, prompts: list[str], args: Args, device, num_samples: int, greedy=False,
           generator: Optional[torch.Generator] = None):
    """num_samples responses to each prompt, drawn token by token from π_θold with a KV cache.

    The responses of a group share their prompt, so it is read once: prefill runs each prompt through the model
    (the head all prompts share, once) and keeps its keys and values, copied num_samples times into a cache that
    each decoding step, one new token of every response, writes in place. `greedy`: True, or [num_samples] flags
    saying which responses of each prompt take the most likely token. `generator`: the draws' random numbers.
    """
    texts = llm.format_prompts(tokenizer, task, prompts, args.few_shot, args.system_prompt)
    stop = llm.answer_stop(tokenizer, task, args.few_shot)
    # a chat template already holds its special tokens
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=tokenizer.chat_template is None)
    prompt_ids, prompt_mask = enc["input_ids"].to(device), enc["attention_mask"].to(device)  # [B, P]
    eos_ids = torch.tensor(llm.eos_token_ids(model, tokenizer), device=device)
    # Prefill: each prompt once, the head all prompts share once (common/llm.py: read_prompts, decoding_cache).
    prefill, prefill_mask = llm.read_prompts(model, prompt_ids, prompt_mask)
    cache = llm.decoding_cache(model, prefill.past_key_values, num_samples, args.max_new_tokens)  # [B, ..] -> [N, ..]
    logits = prefill.logits[:, -1].float().repeat_interleave(num_samples, dim=0)  # [N, vocab]
    attention_mask = prefill_mask.repeat_interleave(num_samples, dim=0)  # [N, cached columns], then one per step
    next_position = attention_mask.sum(dim=1, keepdim=True)  # [N, 1]
    ended = torch.zeros(len(logits), dtype=torch.bool, device=device)
    greedy = torch.as_tensor(greedy, device=device).expand(num_samples).repeat(len(prompts))  # [N]
    tokens, entropies, logprobs = [], [], []
    for step in range(args.max_new_tokens):
        # Sample from π_θold itself at the temperature: no top-k, top-p or repetition penalty, whatever the model's
        # generation_config says, or the behaviour policy would not be the one whose log-probs the update uses.
        token, logprob, entropy = llm.draw(logits / args.temperature, greedy, generator)  # exact: one uniform a row
        entropies.append(entropy)
        logprobs.append(logprob)
        tokens.append(token.masked_fill(ended, tokenizer.pad_token_id))  # an ended response is padded
        ended = ended | torch.isin(token, eos_ids)
        if stop is not None:
            ended = ended | llm.holds_stop(tokenizer, torch.stack(tokens, dim=1), stop)
        if ended.all():
            break
        # Decode: the new token of every response, its keys and values added to the cache.
        attention_mask = F.pad(attention_mask, (0, 1), value=1)
        logits = model(input_ids=tokens[-1].unsqueeze(1), attention_mask=attention_mask,
                       position_ids=next_position + step, past_key_values=cache, use_cache=True).logits[:, -1].float()
    responses = torch.stack(tokens, dim=1)  # [N, T]
    mask, truncated = response_mask(responses, eos_ids)
    if stop is not None:  # a base model's answer ends at the stop string (the token that completes it included)
        mask, stopped = llm.stop_mask(tokenizer, responses, mask, stop)
        truncated = truncated & ~stopped  # an answer that ended is not cut short, even in the last column
    return Samples(prompt_ids, prompt_mask, responses, mask, truncated, torch.stack(entropies, dim=1),
                   torch.stack(logprobs, dim=1))


@torch.no_grad()
def evaluate(model, tokenizer, task, eval_prompts, args: Args, device, autocast) -> tuple[Tensor, Tensor]:
    """Held-out rewards: of --eval-samples responses per prompt sampled at the training temperature (what RL
    optimises), [prompts, k], and of one greedy response, [prompts, 1]. Sampled with random numbers of its own, the
    same at every evaluation, so that no evaluation flag changes a number of training."""
    prompts, targets = [p for p, _ in eval_prompts], [t for _, t in eval_prompts]
    model.eval()
    generator = torch.Generator(device).manual_seed(EVAL_SEED)
    k = args.eval_samples  # one prefill of each prompt serves k sampled responses, then a greedy one (the last)
    with autocast:
        samples = sample(model, tokenizer, task, prompts, args, device, k + 1, torch.arange(k + 1) == k, generator)
    texts = llm.decode(tokenizer, samples.responses, samples.mask)
    graded = [task.reward(text, target) for text, target in zip(texts, [t for t in targets for _ in range(k + 1)])]
    rewards = torch.tensor(graded).view(len(prompts), k + 1)
    return rewards[:, :k], rewards[:, k:]


# ---------------------------------------------------------------- [SHARED] log-probs of the sampled tokens

def response_logits(model, prompt_ids: Tensor, prompt_mask: Tensor, prompt_index: Tensor, responses: Tensor,
                    temperature: float, share_prompt: bool = True) -> Tensor:
    """Logits of the distributions each response token was sampled from, ÷ temperature, in float32: [n, T, vocab].

    Response i answers prompt prompt_index[i] of prompt_ids [B, P]. The responses of a group share their prompt,
    so it is read once: each distinct prompt but its last token runs through the model (the head all share, once),
    with gradient when training, and leaves its keys and values in a cache; every response attends to its copy and runs
    [last prompt token, y_1 .. y_(T−1)], whose T outputs predict y_1 .. y_T. The same log-probs and gradient as
    [prompt; response] run whole, which is what share_prompt=False does (see logprobs_of for when).
    The padding after a response's end needs no mask: causal attention never lets a real token see it.
    These logits are the memory peak: score in micro-batches on big vocabularies.
    """
    cache, inputs_embeds, input_ids = None, None, torch.cat([prompt_ids[prompt_index], responses[:, :-1]], dim=1)
    if share_prompt:
        prompts, prompt_index = torch.unique(prompt_index, return_inverse=True)
        prompt_ids, prompt_mask = prompt_ids[prompts], prompt_mask[prompts]  # [distinct prompts, P]
        input_ids = torch.cat([prompt_ids[prompt_index, -1:], responses[:, :-1]], dim=1)  # [n, T]
        if prompt_ids.shape[1] > 1:  # (a one-token prompt has nothing to cache)
            # cached columns: the shared head, each prompt's own tail (common/llm.py: read_prompts), its last token;
            # the tokens of every call looked up at once (llm.embed: the embedding matrix gets one gradient, not three)
            prompt_embeds, inputs_embeds = llm.embed(model, prompt_ids[:, :-1], input_ids)
            prefill, prefix_mask = llm.read_prompts(model, prompt_ids[:, :-1], prompt_mask[:, :-1], 1, prompt_embeds)
            cache = prefill.past_key_values
            cache.reorder_cache(prompt_index)  # [distinct prompts, ...] -> [n, ...]: each response its prompt's copy
            prompt_mask = F.pad(prefix_mask, (0, 1), value=1)
    attention_mask = F.pad(prompt_mask[prompt_index], (0, responses.shape[1] - 1), value=1)  # [n, P + T − 1]
    logits = model(
        input_ids=input_ids if inputs_embeds is None else None,
        inputs_embeds=inputs_embeds,
        attention_mask=attention_mask,
        position_ids=llm.position_ids(attention_mask)[:, -input_ids.shape[1] :],
        past_key_values=cache,
        use_cache=cache is not None,
        logits_to_keep=responses.shape[1],  # only the T positions that predict response tokens
    ).logits
    # float32 (already so from the float32 output layer), divided in place: a second copy would double the peak
    return logits.float().div_(temperature)


def token_logprobs(logits: Tensor, tokens: Tensor) -> Tensor:
    """log π(y_t | x, y_<t) = logit of y_t − logsumexp of the logits: [N, T], without a [N, T, vocab] log-softmax copy.
    A few positions at a time, so logsumexp's temporaries are [positions, vocab]: the logits alone are the peak."""
    positions = max(1, llm.LOGITS_PER_CHUNK // logits.shape[-1])
    flat_logits, flat_tokens = logits.flatten(0, 1), tokens.flatten()  # [N*T, vocab], [N*T]
    return torch.cat([
        chunk.gather(-1, chunk_tokens.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(chunk, dim=-1)
        for chunk, chunk_tokens in zip(flat_logits.split(positions), flat_tokens.split(positions))
    ]).view_as(tokens)


def logprobs_of(model, batch, inds: Tensor, args: Args, autocast) -> Tensor:
    """log π of the sampled tokens of the responses `inds` of a batch (Samples or Rollout), in one pass: [n, T]."""
    # a checkpointed layer keeps no cache; FSDP frees a block's weights once its responses' backward pass is done
    share_prompt = not (args.gradient_checkpointing or args.fsdp)
    with autocast:
        logits = response_logits(model, batch.prompt_ids, batch.prompt_mask, inds // args.group_size,
                                 batch.responses[inds], args.temperature, share_prompt)
    return token_logprobs(logits, batch.responses[inds])


class Rollout(NamedTuple):
    """What the update needs of one iteration's samples, on this process: B prompts, N = B * G responses."""

    prompt_ids: Tensor  # [B, P] left-padded prompts; response i answers prompt i // G
    prompt_mask: Tensor  # [B, P]
    responses: Tensor  # [N, T]
    mask: Tensor  # [N, T] 1 on the tokens the loss sees (EOS included, padding excluded)
    advantages: Tensor  # [N]
    old_logprobs: Tensor  # [N, T] log π_θold of the sampled tokens
    ref_logprobs: Optional[Tensor]  # [N, T] log π_ref, or None when β = 0


@torch.no_grad()
def score_responses(model, ref_model, samples: Samples, first_epoch: list[llm.Minibatch], args: Args, autocast):
    """Log-probs of the sampled tokens under π_θold (the model as it sampled) and π_ref, [N, T] each (π_ref: None
    when β = 0): fixed targets of the update, no gradient. Scored in the very passes of the first epoch's update,
    since GPU kernels round by shape: the first ratio is then exactly 1. Responses that no pass runs (β = 0, no
    signal) are not scored: their log-probs are left at 0, and Â = 0 makes them irrelevant."""
    old_logprobs = torch.zeros(samples.responses.shape, device=samples.responses.device)
    ref_logprobs = None if ref_model is None else torch.zeros_like(old_logprobs)
    model.eval()
    for inds in [inds for minibatch in first_epoch for inds in minibatch.passes]:
        old_logprobs[inds] = logprobs_of(model, samples, inds, args, autocast)
        if ref_model is not None:
            with reference_scoring(ref_model, args):
                ref_logprobs[inds] = logprobs_of(ref_model, samples, inds, args, autocast)
    return old_logprobs, ref_logprobs


# ---------------------------------------------------------------- [METHOD] the update: minibatches of whole groups

def update_policy(model, optimizer, rollout: Rollout, epochs: list[list[llm.Minibatch]], args: Args, autocast) -> dict:
    """Step 5: E epochs of minibatch gradient steps on the loss; returns the update's stats.

    `epochs` holds each epoch's minibatches of whole groups (common/llm.py: draw_minibatches), so that a pass
    reads each prompt once. A minibatch is one optimiser step, computed in passes (micro-batches) whose gradients
    add up to the minibatch's. With β = 0 the groups without signal run no pass, since they would add exactly 0;
    the optimiser still steps, on zeros if no group had signal, as it would have after running them (Adam's
    momentum moves the weights). Under torchrun `model` is wrapped in DDP, which averages the gradients of the
    processes: their shards are equal in size, so the step is the one-process step on the whole batch.
    """
    trainable = [p for p in model.parameters() if p.requires_grad]
    model.train()  # dropout is off (disable_dropout); train mode only enables gradient checkpointing
    stats = {"policy_loss": [], "grad_norm": []}
    sums = defaultdict(float)  # token counts over all passes, for the fractions below
    for minibatches in epochs:
        for minibatch in minibatches:
            optimizer.zero_grad()
            step_loss = 0.0  # the minibatch's loss, whichever passes compute it
            for number, inds in enumerate(minibatch.passes):
                with llm.gradient_sync(model, last=number == len(minibatch.passes) - 1):
                    logprobs = logprobs_of(model, rollout, inds, args, autocast)
                    old_logprobs, mask = rollout.old_logprobs[inds], rollout.mask[inds]
                    ref_logprobs = None if rollout.ref_logprobs is None else rollout.ref_logprobs[inds]
                    loss = policy_loss(
                        logprobs, old_logprobs, rollout.advantages[inds], mask,
                        ref_logprobs=ref_logprobs,
                        beta=args.beta,
                        tau_pos=args.tau_pos,
                        tau_neg=args.tau_neg,
                        kl_estimator=args.kl_estimator,
                    )
                    # The loss is a mean over responses: weight each pass by its share of the minibatch.
                    loss = loss * len(inds) / len(minibatch.rows)
                    loss.backward()
                step_loss += loss.item()
                with torch.no_grad():
                    ratio = torch.exp((logprobs - old_logprobs).clamp(-20.0, 20.0))
                    # the mean gate f'(r) = 4σ(x)(1 − σ(x)) (eq. 120): 1 on-policy, smaller as r leaves 1
                    tau = torch.where(rollout.advantages[inds].unsqueeze(1) > 0, args.tau_pos, args.tau_neg)
                    gate = 4 * torch.sigmoid(tau * (ratio - 1)) * (1 - torch.sigmoid(tau * (ratio - 1)))
                    # the tokens the trust region acts on: those of responses with signal (Â ≠ 0)
                    signal = mask * (rollout.advantages[inds] != 0).unsqueeze(1)
                    sums["signal_tokens"] += signal.sum().item()
                    sums["gate"] += (gate * signal).sum().item()
                    if ref_logprobs is not None:
                        sums["tokens"] += mask.sum().item()
                        sums["kl"] += (kl_penalty(logprobs, ref_logprobs, args.kl_estimator) * mask).sum().item()
            if not minibatch.passes:  # no group with signal on any process: the gradient is 0
                for p in trainable:
                    p.grad = torch.zeros_like(p)
            stats["policy_loss"].append(step_loss)
            stats["grad_norm"].append(torch.nn.utils.clip_grad_norm_(trainable, args.max_grad_norm).item())
            optimizer.step()
    # Token fractions of the whole update, over all processes: whatever the passes, the same numbers.
    stats["gate"] = [llm.global_fraction(sums["gate"], sums["signal_tokens"])]
    if args.beta > 0:
        stats["kl_ref"] = [llm.global_fraction(sums["kl"], sums["tokens"])]
    return stats


if __name__ == "__main__":
    args = runs.parse_args(Args)  # the command line; with --resume, the run's own flags
    defaults = llm.resolve_defaults(args)  # the flags left unset whose value depends on the model's scale
    check_args(args, world_size=int(os.environ.get("WORLD_SIZE", "1")))
    model_path = llm.resolve_model_path(args.model)
    rank, world_size, device = llm.init_distributed(args.cuda)
    is_main = rank == 0  # process 0 alone evaluates, logs, prints and saves
    task = get_task(args.task, args.eval_task)
    run_dir = runs.folder(args, task.name, __file__)  # runs/<a new name>, or the folder given to --resume

    # Each process samples other responses; the weights start equal (DDP copies process 0's).
    random.seed(args.seed + rank)
    np.random.seed(args.seed + rank)
    torch.manual_seed(args.seed + rank)
    # On a GPU: float32 trainable weights (so that small Adam steps are not lost to rounding), bfloat16 autocast, the
    # output layer in float32, and the frozen weights (LoRA's base model, the reference copy) stored in bfloat16.
    bf16 = device.type == "cuda"
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)

    tokenizer, model = llm.load_policy(args.model, model_path, device, args.float32_logits)
    if args.gradient_checkpointing:
        model.activation_checkpointing_enable()  # active in train mode only: the update, not sampling
    if args.lora_rank > 0:
        model = llm.add_lora(model, args.lora_rank, args.lora_alpha)
        if bf16:
            llm.frozen_weights_to_bfloat16(model)
    ref_model = reference_model(model, args, bf16)
    # Under torchrun, DDP (a copy per process) or --fsdp (the model sharded): common/llm.py, distribute.
    train_model = llm.distribute(model, args.fsdp, world_size)  # generation and scoring use `model` itself
    # fused: each step one kernel over all the parameters (CPU and GPU), not a loop of small ones; the same update
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=args.learning_rate, fused=True)

    eval_prompts = task.prompts(args.eval_size, random.Random(EVAL_SEED), split="test")  # the same for every run
    eval_texts = llm.format_prompts(tokenizer, task, [p for p, _ in eval_prompts], args.few_shot, args.system_prompt)
    prompt_tokens = llm.check_prompt_length(tokenizer, model, task, eval_prompts, args.few_shot, args.system_prompt,
                                            args.max_new_tokens)  # the longest prompt, held-out or training
    # --micro-batch-size left unset: as many responses per pass as a memory budget holds; the step is the same
    defaults += llm.resolve_pass_size(args, model, ref_model, prompt_tokens, device, world_size)
    rng = random.Random(args.seed + rank)
    prompts_per_process = args.prompts_per_iteration // world_size
    batch_size = prompts_per_process * args.group_size  # responses per iteration on this process
    # --save-every and --resume; Ctrl-C or SIGTERM ends the iteration in progress, writes a checkpoint and stops.
    checkpoints = runs.Checkpoints(run_dir, model, optimizer, rng, args, rank)
    first_iteration = checkpoints.restore() if args.resume else 1  # weights, Adam, every random state
    log = runs.IterationLog(run_dir, asdict(args), first_iteration, args.num_iterations, args.eval_every,
                            batch_size * world_size, is_main, device, lambda: llm.whole_weights(model),
                            lambda: evaluate(model, tokenizer, task, eval_prompts, args, device, autocast))
    if is_main:  # the run's folder and size, each default chosen and why, what the model reads
        runs.print_start(run_dir, model, device, world_size, batch_size * world_size,
                         defaults + llm.few_shot_line(tokenizer, task, args.few_shot), eval_texts[0], args)
    log.begin()

    for iteration in range(first_iteration, args.num_iterations + 1):
        if checkpoints.stopped():  # Ctrl-C or SIGTERM while the starting model was evaluated: nothing to finish
            break
        log.begin_iteration(iteration)
        # Linear learning-rate decay to 0: the last updates are small, so the policy settles instead of jittering.
        optimizer.param_groups[0]["lr"] = args.learning_rate * (1 - (iteration - 1) / args.num_iterations)

        # 1-3. Freeze π_θold = π_θ and sample G responses for each of this process's B / N prompts (eq. 94).
        with log.phase("generate"), llm.whole_weights(model):  # (--fsdp: gathered once for every step)
            model.eval()
            pairs = task.prompts(prompts_per_process, rng)
            with autocast:
                samples = sample(model, tokenizer, task, [p for p, _ in pairs], args, device,
                                 num_samples=args.group_size)
            texts = llm.decode(tokenizer, samples.responses, samples.mask)
        targets = [target for _, target in pairs for _ in range(args.group_size)]

        # 4. Rewards and group-relative advantages, eq. (90)-(91).
        rewards = torch.tensor([task.reward(text, target) for text, target in zip(texts, targets)], device=device)
        advantages = compute_advantages(rewards, args.group_size)

        # The update's minibatches are drawn first, so that π_θold is scored in the very passes of the first epoch.
        epochs = [
            llm.draw_minibatches(advantages, args.group_size, args.num_minibatches, args.micro_batch_size,
                                 args.beta == 0)
            for epoch in range(args.update_epochs)
        ]
        # Log-probs of the sampled tokens under π_θold and π_ref: fixed targets, no gradient.
        with log.phase("logprob"):
            old_logprobs, ref_logprobs = score_responses(model, ref_model, samples, epochs[0], args, autocast)

        # 5. E epochs of minibatch gradient steps on the soft-gated surrogate (eq. 117-119).
        rollout = Rollout(samples.prompt_ids, samples.prompt_mask, samples.responses, samples.mask, advantages,
                          old_logprobs, ref_logprobs)
        with log.phase("update"):
            stats = update_policy(train_model, optimizer, rollout, epochs, args, autocast)

        # Log: the same tags in every group file, means over all processes; evaluate when due (common/runs.py).
        scalars = llm.rollout_stats(rewards, rewards, advantages, samples.mask, samples.truncated, samples.entropies,
                                    args.group_size)
        scalars.update(llm.sampler_gap(samples.logprobs, old_logprobs, samples.mask, epochs[0]))
        log.end_iteration(iteration, scalars, stats, optimizer.param_groups[0]["lr"])
        if checkpoints.after(iteration):  # a checkpoint when due; True when a stop was asked
            break

    if args.save_model and not checkpoints.stop_asked:  # replaces the model of a run extended; process 0 writes
        llm.save_model(model, tokenizer, os.path.join(run_dir, "model"), is_main)
    log.close()
    del train_model  # DDP holds the process group: finish_distributed must drop its last reference
    llm.finish_distributed()  # every process leaves the group together, once process 0 has evaluated and saved
    checkpoints.exit_if_stopped()  # 130 after Ctrl-C, 143 after SIGTERM: a stopped run is not a finished one
