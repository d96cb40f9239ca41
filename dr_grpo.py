"""Dr. GRPO: GRPO Done Right (seed 000, §5.4.1).

PPO without a critic, for language models. For each prompt x the frozen behaviour policy π_θold
samples a group of G responses, a verifiable reward R scores each one, and the group is its own
baseline: every token of response i shares the advantage Â_i. The policy maximises a surrogate
that keeps the ratios π_θ/π_θold near 1, with a KL penalty to the frozen starting model π_ref:

    Â_i = R_i − mean_j R_j                                             eq. (98)
    r_{i,t} = π_θ(y_t | x, y_<t) / π_θold(y_t | x, y_<t)               eq. (95)
    ℓ_{i,t} = min(r_{i,t} Â_i, clip(r_{i,t}, 1 − ε, 1 + ε) Â_i)        eq. (96)
    J = 1/G Σ_i 1/T_max Σ_t ℓ_{i,t} − β KL(π_θ ‖ π_ref)                eq. (99)-(100)

The group baseline replaces PPO's learned critic V_φ, which for an LLM would be a second model
of the same size. The KL term is the k3 estimator per token (seed 002 §6.2), averaged like the
policy term.

What changes from grpo.py, and why (Dr. GRPO paper): two normalisations of GRPO bias it.
Dividing by the group's reward std (eq. 91) up-weights questions whose answers barely differ,
too easy or too hard: a question-difficulty bias, so eq. (98) keeps only the mean baseline.
Averaging token losses per response (1/T_i) gives each token of a short response more weight:
right short answers are pushed up harder and wrong long answers pushed down less, so wrong
answers drift longer. Eq. (100) sums a response's token losses and divides by a constant,
T_max = --max-new-tokens. The paper trains without the KL penalty: β = 0 by default.

One iteration (§5.3.2): sample B prompts → G responses each from π_θold (one batched `generate`
call) → rewards → group advantages → log-probs under π_θold and π_ref, without gradients →
E epochs of minibatch gradient steps on the loss (several steps, so the ratio leaves 1) → log.

    python dr_grpo.py                                # embedded tiny model, offline, CPU, ~2 minutes
    python dr_grpo.py --model Qwen/Qwen2.5-0.5B-Instruct --max-new-tokens 64 --learning-rate 1e-6   # GPU
"""

import copy
import os
import random
import time
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
import tyro
from torch import Tensor

from common.tasks import TASKS

HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass
class Args:
    model: str = "common/tiny_model"
    """Hugging Face causal LM: a hub id (e.g. gpt2) or a local folder. The default is the embedded tiny model."""
    task: str = "addition"
    """verifiable task from common/tasks.py: addition (the only one the tiny model knows), subtraction, multiplication"""
    group_size: int = 8
    """G: responses sampled per prompt (eq. 88); the group is the baseline, so G >= 2"""
    prompts_per_iteration: int = 32
    """B: prompts per iteration; each iteration trains on B * G responses"""
    num_iterations: int = 150
    """number of sample-then-update iterations"""
    max_new_tokens: int = 8
    """response length cap; the tiny model's answers take at most 5 tokens (4 digits + EOS)"""
    temperature: float = 1.0
    """sampling temperature; log-probs are computed at the same temperature"""
    update_epochs: int = 1
    """E: passes over each rollout batch"""
    num_minibatches: int = 4
    """optimiser steps per epoch; > 1 step per rollout lets the ratio leave 1, so the clip acts"""
    micro_batch_size: Optional[int] = None
    """responses per forward/backward pass (gradient accumulation, to fit memory); default: the whole minibatch"""
    learning_rate: float = 3e-4
    """Adam learning rate, decayed linearly to 0 over the run (3e-4 suits the tiny model; ~1e-6 for real LLMs)"""
    max_grad_norm: float = 1.0
    """global gradient-norm clip"""
    beta: float = 0.0
    """β: weight of the KL penalty to the reference model (eq. 100); 0 (the paper's choice) loads no reference model"""
    kl_estimator: str = "k3"
    """per-token KL estimator: k1 = log(π/π_ref), k2 = ½ log²(π/π_ref), k3 = π_ref/π − log(π_ref/π) − 1"""
    clip_eps: float = 0.2
    """ε of the clipped surrogate (eq. 96)"""
    eval_every: int = 10
    """evaluate on the held-out split every this many iterations (and at the start and the end)"""
    eval_size: int = 200
    """held-out prompts per evaluation"""
    seed: int = 1
    """seed of random, numpy and torch (prompts, sampling, initial state)"""
    cuda: bool = True
    """use the GPU (with bfloat16 autocast) when there is one"""
    save_model: bool = False
    """save the trained model and tokenizer under runs/{run_name}/model"""


def check_args(args: Args) -> None:
    """Refuse bad input with one clear line, before anything heavy is loaded (DESIGN §7)."""
    batch = args.prompts_per_iteration * args.group_size
    minibatch = batch // max(args.num_minibatches, 1)
    checks = [
        (args.task in TASKS, f"--task must be one of {', '.join(TASKS)}, got {args.task!r}"),
        (args.group_size >= 2, f"--group-size must be >= 2 (the group is the baseline), got {args.group_size}"),
        (args.prompts_per_iteration >= 1, f"--prompts-per-iteration must be >= 1, got {args.prompts_per_iteration}"),
        (args.num_iterations >= 1, f"--num-iterations must be >= 1, got {args.num_iterations}"),
        (args.max_new_tokens >= 1, f"--max-new-tokens must be >= 1, got {args.max_new_tokens}"),
        (args.temperature > 0, f"--temperature must be > 0, got {args.temperature}"),
        (args.update_epochs >= 1, f"--update-epochs must be >= 1, got {args.update_epochs}"),
        (args.num_minibatches >= 1 and batch % args.num_minibatches == 0,
         f"--num-minibatches must be >= 1 and divide the {batch} responses per iteration, got {args.num_minibatches}"),
        (args.micro_batch_size is None or (args.micro_batch_size >= 1 and minibatch % args.micro_batch_size == 0),
         f"--micro-batch-size must be >= 1 and divide the minibatch size {minibatch}, got {args.micro_batch_size}"),
        (args.learning_rate > 0, f"--learning-rate must be > 0, got {args.learning_rate}"),
        (args.max_grad_norm > 0, f"--max-grad-norm must be > 0, got {args.max_grad_norm}"),
        (args.beta >= 0, f"--beta must be >= 0, got {args.beta}"),
        (args.kl_estimator in ("k1", "k2", "k3"), f"--kl-estimator must be one of k1, k2, k3, got {args.kl_estimator!r}"),
        (0 < args.clip_eps < 1, f"--clip-eps must be in (0, 1), got {args.clip_eps}"),
        (args.eval_every >= 1, f"--eval-every must be >= 1, got {args.eval_every}"),
        (args.eval_size >= 1, f"--eval-size must be >= 1, got {args.eval_size}"),
    ]
    for ok, message in checks:
        if not ok:
            raise SystemExit(f"error: {message}")


def compute_advantages(rewards: Tensor, group_size: int) -> Tensor:
    """eq. (98): Â_i = R_i − mean, within each group; no division by the std (no difficulty bias).

    `rewards` is [N] with the G responses of a prompt in consecutive rows. A group whose
    rewards are all equal carries no signal: its advantages are exactly 0.
    """
    grouped = rewards.view(-1, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    # A float mean of equal values (e.g. 0.3) can be off by rounding: make such groups exactly 0.
    centred = centred.masked_fill((grouped == grouped[:, :1]).all(dim=1, keepdim=True), 0.0)
    return centred.view(-1)


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, estimator: str = "k3") -> Tensor:
    """Per-token estimate of KL(π_θ ‖ π_ref) from tokens sampled by the policy (seed 002 §6.2, seed 004).

    With log_r = log π_ref − log π_θ: k1 = −log_r (unbiased, can be negative), k2 = ½ log_r²,
    k3 = e^{log_r} − log_r − 1 (unbiased and always ≥ 0; the default, as in GRPO).
    """
    log_r = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
    if estimator == "k1":
        return -log_r
    if estimator == "k2":
        return 0.5 * log_r.pow(2)
    return torch.exp(log_r) - log_r - 1.0


def masked_mean_per_response(values: Tensor, mask: Tensor) -> Tensor:
    """[N, T] → [N]: mean over each response's real tokens; an all-padding row gives 0, not NaN."""
    return (values * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    ref_logprobs: Optional[Tensor] = None,
    beta: float = 0.0,
    clip_eps: float = 0.2,
    max_new_tokens: int = 8,
    kl_estimator: str = "k3",
) -> Tensor:
    """The negated Dr. GRPO objective, eq. (100), to minimise.

    logprobs, old_logprobs, ref_logprobs, mask: [N, T] over response tokens (mask 1 on real tokens,
    EOS included); advantages: [N], one per response, shared by all its tokens.
    """
    # eq. (95): token-level ratio. Clamping the log-ratio keeps a far-off-policy token from overflowing exp.
    ratio = torch.exp((logprobs - old_logprobs).clamp(-20.0, 20.0))
    adv = advantages.unsqueeze(1)
    # eq. (96): token-level clipped surrogate (pessimistic min of the unclipped and clipped terms)
    per_token = torch.min(ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv)
    if ref_logprobs is not None and beta > 0:
        per_token = per_token - beta * kl_penalty(logprobs, ref_logprobs, kl_estimator)
    # eq. (100): sum over the tokens of each response divided by the constant T_max, then mean over responses
    return -((per_token * mask).sum(dim=1) / max_new_tokens).mean()


def resolve_model_path(model: str) -> str:
    """The embedded model is named relative to this file; anything else is a local folder or a hub id."""
    if os.path.isdir(os.path.join(HERE, model)):
        return os.path.join(HERE, model)
    if os.path.isdir(model):
        return model
    if model.startswith((".", "/", "~")) or model.count("/") > 1 or os.sep in model.replace("/", "", 1):
        raise SystemExit(f"error: --model {model!r}: no such folder (and not a hub id like 'gpt2' or 'org/name')")
    return model


def load_policy(name: str, model_path: str, device):
    """Tokenizer and model from a hub id or a folder, ready for left-padded batched generation."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # heavy import: only after the argument checks
    from transformers.utils.logging import disable_progress_bar

    disable_progress_bar()  # one console line per iteration, no loading bars

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        if tokenizer.eos_token_id is None:
            raise SystemExit(f"error: --model {name!r}: its tokenizer has no EOS token, so responses could never end")
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(device)
    except OSError as e:
        raise SystemExit(f"error: --model {name!r} could not be loaded: {str(e).splitlines()[0]}")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token  # gpt2 has no pad token; the response mask does not rely on it
    tokenizer.padding_side = "left"  # generation appends at the right end of every row
    return tokenizer, model


def response_logits(model, sequences: Tensor, attention_mask: Tensor, prompt_len: int, temperature: float) -> Tensor:
    """Logits of the distributions each response token was sampled from, ÷ temperature, in float32: [N, T, vocab].

    `sequences` = left-padded prompts (width prompt_len) followed by the responses. Position ids
    count real tokens only, so a left-padded row sees the positions it would see alone (gpt2 has
    absolute positions). These logits are the memory peak: score in micro-batches on big vocabularies.
    """
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    num_response = sequences.shape[1] - prompt_len
    # Only the logits that predict response tokens are needed: positions prompt_len-1 .. end-1.
    logits = model(
        input_ids=sequences, attention_mask=attention_mask, position_ids=position_ids, logits_to_keep=num_response + 1
    ).logits[:, :-1]
    return logits.float() / temperature


def token_logprobs(logits: Tensor, tokens: Tensor) -> Tensor:
    """log π(y_t | x, y_<t) = logit of y_t − logsumexp of the logits: [N, T], without a [N, T, vocab] log-softmax copy."""
    return logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def entropy(logits: Tensor) -> Tensor:
    """Entropy of π(· | x, y_<t) at each position, for logging: logsumexp(z) − Σ softmax(z)·z, [N, T]."""
    return torch.logsumexp(logits, dim=-1) - (torch.softmax(logits, dim=-1) * logits).sum(-1)


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


def format_prompts(tokenizer, prompts: list[str]) -> list[str]:
    """Plain prompts for base models; the chat template (one user turn) for models that have one."""
    if tokenizer.chat_template is None:
        return prompts
    return [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        for p in prompts
    ]


@torch.no_grad()
def sample(model, tokenizer, prompts: list[str], args: Args, device, num_samples: int, greedy: bool = False):
    """num_samples responses per prompt in one batched `generate` call (left padding, KV cache).

    Returns sequences [N, P+T], attention_mask [N, P+T], prompt_len P, responses [N, T], mask [N, T], truncated [N].
    """
    texts = format_prompts(tokenizer, prompts)  # a chat template already holds its special tokens
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=tokenizer.chat_template is None)
    prompt_ids = enc["input_ids"].repeat_interleave(num_samples, dim=0).to(device)
    prompt_mask = enc["attention_mask"].repeat_interleave(num_samples, dim=0).to(device)
    # Stop at the tokenizer's EOS and at any end token the model's generation config adds (chat models).
    config_eos = model.generation_config.eos_token_id
    config_eos = [] if config_eos is None else config_eos if isinstance(config_eos, list) else [config_eos]
    eos_ids = sorted({tokenizer.eos_token_id, *config_eos})
    # Sample from π_θold itself: no top-k/top-p truncation or repetition penalty, whatever the model's
    # generation_config says, or the behaviour policy would not be the one whose log-probs we compute.
    # generate() derives position_ids from the attention mask, as response_logits does.
    sequences = model.generate(
        input_ids=prompt_ids, attention_mask=prompt_mask, max_new_tokens=args.max_new_tokens,
        do_sample=not greedy, temperature=None if greedy else args.temperature, top_k=None if greedy else 0,
        top_p=None if greedy else 1.0, repetition_penalty=1.0, pad_token_id=tokenizer.pad_token_id, eos_token_id=eos_ids,
    )
    prompt_len = prompt_ids.shape[1]
    responses = sequences[:, prompt_len:]
    eos_ids = torch.tensor(eos_ids, device=device)
    mask, truncated = response_mask(responses, eos_ids)
    attention_mask = torch.cat([prompt_mask, mask.long()], dim=1)
    return sequences, attention_mask, prompt_len, responses, mask, truncated


def decode(tokenizer, responses: Tensor, mask: Tensor) -> list[str]:
    """Response text after the prompt, up to the first EOS."""
    lengths = mask.sum(dim=1).long().tolist()
    return tokenizer.batch_decode([row[:n] for row, n in zip(responses.tolist(), lengths)], skip_special_tokens=True)


@torch.no_grad()
def evaluate(model, tokenizer, task, eval_prompts, args: Args, device, autocast) -> tuple[float, float]:
    """Held-out accuracy: sampled at the training temperature (what RL optimises) and greedy."""
    prompts, targets = [p for p, _ in eval_prompts], [t for _, t in eval_prompts]
    accuracies = []
    for greedy in (False, True):
        with autocast:
            _, _, _, responses, mask, _ = sample(model, tokenizer, prompts, args, device, num_samples=1, greedy=greedy)
        texts = decode(tokenizer, responses, mask)
        accuracies.append(sum(task.reward(t, y) for t, y in zip(texts, targets)) / len(targets))
    return accuracies[0], accuracies[1]


if __name__ == "__main__":
    args = tyro.cli(Args)
    check_args(args)
    model_path = resolve_model_path(args.model)
    run_name = f"{args.task}__{os.path.basename(__file__)[: -len('.py')]}__{args.seed}__{int(time.time())}"

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    # On a GPU: float32 weights (so that small Adam steps are not lost to rounding) and bfloat16 autocast.
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    from torch.utils.tensorboard import SummaryWriter

    tokenizer, model = load_policy(args.model, model_path, device)
    # β > 0: a frozen copy of the starting model is the reference π_ref; β = 0 needs none.
    ref_model = copy.deepcopy(model).eval().requires_grad_(False) if args.beta > 0 else None
    optimizer = torch.optim.Adam(model.parameters(), lr=args.learning_rate)

    task = TASKS[args.task]
    rng = random.Random(args.seed)
    eval_prompts = task.prompts(args.eval_size, random.Random(1234), split="test")  # the same for every run
    writer = SummaryWriter(os.path.join("runs", run_name))
    writer.add_text(
        "hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in vars(args).items())
    )
    batch_size = args.prompts_per_iteration * args.group_size
    minibatch_size = batch_size // args.num_minibatches
    micro_batch_size = args.micro_batch_size or minibatch_size
    num_parameters = sum(p.numel() for p in model.parameters())
    print(f"{run_name}: {num_parameters:,} parameters on {device}, {batch_size} responses per iteration")

    start = time.time()
    for iteration in range(args.num_iterations + 1):
        # Evaluate the starting model, then every eval_every iterations and at the end (x = iterations done).
        if iteration % args.eval_every == 0 or iteration == args.num_iterations:
            model.eval()
            accuracy, greedy_accuracy = evaluate(model, tokenizer, task, eval_prompts, args, device, autocast)
            writer.add_scalar("charts/accuracy", accuracy, iteration)
            writer.add_scalar("charts/greedy_accuracy", greedy_accuracy, iteration)
            print(f"iteration {iteration:4d}  held-out accuracy {accuracy:.3f} (greedy {greedy_accuracy:.3f})")
        if iteration == args.num_iterations:
            break
        iteration_start = time.time()
        # Linear learning-rate decay to 0: the last updates are small, so the policy settles instead of jittering.
        optimizer.param_groups[0]["lr"] = args.learning_rate * (1 - iteration / args.num_iterations)

        # 1-3. Freeze π_θold = π_θ and sample G responses for each of B prompts (eq. 94).
        model.eval()
        pairs = task.prompts(args.prompts_per_iteration, rng)
        with autocast:
            sequences, attention_mask, prompt_len, responses, mask, truncated = sample(
                model, tokenizer, [p for p, _ in pairs], args, device, num_samples=args.group_size
            )
        texts = decode(tokenizer, responses, mask)
        targets = [t for _, t in pairs for _ in range(args.group_size)]
        generate_seconds = time.time() - iteration_start

        # 4. Rewards and group-relative advantages, eq. (98).
        rewards = torch.tensor([task.reward(text, y) for text, y in zip(texts, targets)], device=device)
        advantages = compute_advantages(rewards, args.group_size)

        # Log-probs of the sampled tokens under π_θold and π_ref: fixed targets, no gradient.
        logprob_start = time.time()
        old_logprobs, ref_logprobs, entropies = [], [], []
        with torch.no_grad(), autocast:
            for i in range(0, batch_size, micro_batch_size):
                rows = slice(i, i + micro_batch_size)
                logits = response_logits(model, sequences[rows], attention_mask[rows], prompt_len, args.temperature)
                old_logprobs.append(token_logprobs(logits, responses[rows]))
                entropies.append(entropy(logits))
                if ref_model is not None:
                    logits = response_logits(ref_model, sequences[rows], attention_mask[rows], prompt_len, args.temperature)
                    ref_logprobs.append(token_logprobs(logits, responses[rows]))
        old_logprobs = torch.cat(old_logprobs)
        ref_logprobs = torch.cat(ref_logprobs) if ref_model is not None else None
        mean_entropy = (torch.cat(entropies) * mask).sum() / mask.sum()
        logprob_seconds = time.time() - logprob_start

        # 5. E epochs of minibatch gradient steps on the clipped surrogate (eq. 99-100).
        update_start = time.time()
        model.train()
        stats = {"policy_loss": [], "kl_ref": [], "clipfrac": [], "grad_norm": []}
        for epoch in range(args.update_epochs):
            order = torch.randperm(batch_size, device=device)
            for minibatch_start in range(0, batch_size, minibatch_size):
                minibatch = order[minibatch_start : minibatch_start + minibatch_size]
                optimizer.zero_grad()
                for micro_start in range(0, minibatch_size, micro_batch_size):
                    idx = minibatch[micro_start : micro_start + micro_batch_size]
                    with autocast:
                        logits = response_logits(model, sequences[idx], attention_mask[idx], prompt_len, args.temperature)
                    logprobs = token_logprobs(logits, responses[idx])
                    loss = policy_loss(
                        logprobs, old_logprobs[idx], advantages[idx], mask[idx],
                        ref_logprobs=None if ref_logprobs is None else ref_logprobs[idx],
                        beta=args.beta, clip_eps=args.clip_eps, max_new_tokens=args.max_new_tokens,
                        kl_estimator=args.kl_estimator,
                    )
                    # The loss is a mean over responses: weight each micro-batch by its share of the minibatch.
                    (loss * len(idx) / minibatch_size).backward()
                    with torch.no_grad():
                        ratio = torch.exp((logprobs - old_logprobs[idx]).clamp(-20.0, 20.0))
                        clipped = ((ratio - 1).abs() > args.clip_eps).float()
                        stats["policy_loss"].append(loss.item())
                        stats["clipfrac"].append(((clipped * mask[idx]).sum() / mask[idx].sum().clamp(min=1)).item())
                        if ref_logprobs is not None:
                            kl = kl_penalty(logprobs, ref_logprobs[idx], args.kl_estimator)
                            stats["kl_ref"].append(masked_mean_per_response(kl, mask[idx]).mean().item())
                stats["grad_norm"].append(torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm).item())
                optimizer.step()
        update_seconds = time.time() - update_start

        # Log at x = iterations done; the tags are the same in every group script (DESIGN §6).
        iteration_seconds = time.time() - iteration_start
        num_tokens = mask.sum().item()
        writer.add_scalar("charts/reward", rewards.mean().item(), iteration + 1)
        writer.add_scalar("charts/response_length", mask.sum(dim=1).mean().item(), iteration + 1)
        writer.add_scalar("charts/truncated_fraction", truncated.float().mean().item(), iteration + 1)
        writer.add_scalar("charts/tokens_per_second", num_tokens / iteration_seconds, iteration + 1)
        writer.add_scalar("charts/samples_per_second", batch_size / iteration_seconds, iteration + 1)
        writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], iteration + 1)
        writer.add_scalar("losses/entropy", mean_entropy.item(), iteration + 1)
        for name, values in stats.items():
            if values:
                writer.add_scalar(f"losses/{name}", sum(values) / len(values), iteration + 1)
        writer.add_scalar("perf/generate_seconds", generate_seconds, iteration + 1)
        writer.add_scalar("perf/logprob_seconds", logprob_seconds, iteration + 1)
        writer.add_scalar("perf/update_seconds", update_seconds, iteration + 1)
        elapsed = time.time() - start
        eta = elapsed / (iteration + 1) * (args.num_iterations - iteration - 1)
        print(
            f"iteration {iteration + 1:4d}/{args.num_iterations}  reward {rewards.mean().item():.3f}  "
            f"held-out {accuracy:.3f}  "
            f"length {mask.sum(dim=1).mean().item():.1f}  clipfrac {sum(stats['clipfrac']) / len(stats['clipfrac']):.3f}  "
            f"{num_tokens / iteration_seconds:,.0f} tok/s  ETA {eta:.0f}s"
        )

    if args.save_model:
        # Write to a temporary folder, then rename, so an interrupted save never leaves a half-written model.
        final, tmp = os.path.join("runs", run_name, "model"), os.path.join("runs", run_name, "model.tmp")
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, final)
        print(f"saved to {final}")
    writer.close()
