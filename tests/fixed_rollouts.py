"""A fixed rollout batch on a tiny random GPT-2, the same in every process that builds it from the same seeds,
and the update it must produce computed directly from the loss formula, without the file's update loop.
Shared by the gradient-accumulation and the two-process tests (and the torchrun workers' ports); not a test
file itself."""

import os
import socket
import time

import torch

from common.processes import draw_minibatches

GROUP_SIZE = 4
MAX_NEW_TOKENS = 8  # T_max of Dr. GRPO; the responses are this wide
TEMPERATURE = 0.7  # ≠ 1, so an update that forgot the temperature would score other log-probs


def tiny_gpt2(seed: int = 0):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=40, n_positions=32, n_embd=16, n_layer=1, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def method_kwargs(module, args) -> dict:
    """The method's own keyword arguments of policy_loss, read from its Args."""
    names = {"clip_eps", "clip_eps_low", "clip_eps_high", "tau_pos", "tau_neg", "max_new_tokens"}
    return {name: getattr(args, name) for name in names if name in module.policy_loss.__code__.co_varnames}


def direct_logprobs(model, prompt_ids, prompt_mask, responses, mask, group_size=GROUP_SIZE):
    """log π(y_t | ...) at TEMPERATURE, written out independently of the files' response_logits/token_logprobs:
    each response with its own copy of its group's prompt, [prompt; response] in one pass, padding masked."""
    sequences = torch.cat([prompt_ids.repeat_interleave(group_size, dim=0), responses], dim=1)
    attention_mask = torch.cat([prompt_mask.repeat_interleave(group_size, dim=0), mask.long()], dim=1)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=sequences, attention_mask=attention_mask, position_ids=position_ids).logits
    logits = logits[:, prompt_ids.shape[1] - 1 : -1].float() / TEMPERATURE
    return torch.log_softmax(logits, dim=-1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)


def fixed_rollout(module, model, num_groups: int = 4, seed: int = 1, no_signal: tuple = ()):
    """Left-padded prompts (one per group), responses of unequal lengths (some all padding), off-policy old
    log-probs (so clips act), a reference that differs from the policy (so the KL term acts), and group advantages
    of random 0/1 rewards; the groups numbered in `no_signal` get equal rewards (advantages exactly 0)."""
    generator = torch.Generator().manual_seed(seed)
    n, prompt_len = num_groups * GROUP_SIZE, 5
    prompt_lengths = torch.randint(2, prompt_len + 1, (num_groups,), generator=generator)
    prompt_mask = (torch.arange(prompt_len) >= prompt_len - prompt_lengths.unsqueeze(1)).long()
    prompt_ids = torch.randint(1, 40, (num_groups, prompt_len), generator=generator) * prompt_mask  # padding is 0
    lengths = torch.randint(1, MAX_NEW_TOKENS + 1, (n,), generator=generator)
    lengths[3] = MAX_NEW_TOKENS
    mask = (torch.arange(MAX_NEW_TOKENS) < lengths.unsqueeze(1)).float()
    responses = torch.randint(1, 40, (n, MAX_NEW_TOKENS), generator=generator) * mask.long()
    with torch.no_grad():
        logprobs = direct_logprobs(model, prompt_ids, prompt_mask, responses, mask)
    old_logprobs = logprobs + 0.3 * torch.randn(logprobs.shape, generator=generator)
    ref_logprobs = logprobs + 0.5 * torch.randn(logprobs.shape, generator=generator)
    rewards = torch.randint(0, 2, (n,), generator=generator).float()
    rewards[:GROUP_SIZE] = torch.tensor([1.0, 0.0, 0.0, 1.0])  # at least one group with signal
    for group in no_signal:
        rewards[group * GROUP_SIZE : (group + 1) * GROUP_SIZE] = float(group % 2)  # all right or all wrong
    advantages = module.compute_advantages(rewards, GROUP_SIZE)
    return module.Rollout(prompt_ids, prompt_mask, responses, mask, advantages, old_logprobs, ref_logprobs)


def as_samples(module, rollout):
    """The rollout's batch as the Samples that scoring reads: no response cut, and a sampler whose own log-probs
    (and entropies) are 0, so that a response no pass scores shows as 0."""
    zeros = torch.zeros_like(rollout.mask)
    return module.Samples(rollout.prompt_ids, rollout.prompt_mask, rollout.responses, rollout.mask,
                          torch.zeros(len(rollout.mask), dtype=torch.bool), zeros, zeros.clone())


def rows_of(module, rollout, groups):
    """The rollout of the groups `groups` (a list or a slice of group indices), in that order."""
    groups = torch.arange(len(rollout.prompt_ids))[groups]
    rows = (groups.unsqueeze(1) * GROUP_SIZE + torch.arange(GROUP_SIZE)).flatten()
    return module.Rollout(rollout.prompt_ids[groups], rollout.prompt_mask[groups],
                          *(None if x is None else x[rows] for x in rollout[2:]))


def shard(module, rollout, rank: int, world_size: int):
    """The groups of process `rank`: whole groups, equal shares."""
    num_groups = len(rollout.prompt_ids)
    return rows_of(module, rollout, slice(rank * num_groups // world_size, (rank + 1) * num_groups // world_size))


def update_args(module, micro_batch_size=None, **overrides):
    """One optimiser step on the whole batch: one epoch, one minibatch; no gradient clipping in the way."""
    fields = dict(update_epochs=1, num_minibatches=1, micro_batch_size=micro_batch_size, beta=0.04, max_grad_norm=1e9,
                  temperature=TEMPERATURE, max_new_tokens=MAX_NEW_TOKENS, group_size=GROUP_SIZE)
    return module.Args(**{**fields, **overrides})


def draw_epochs(rollout, args):
    """The update's minibatches, drawn as the main loop draws them."""
    return [draw_minibatches(rollout.advantages, args.group_size, num_minibatches=args.num_minibatches,
                             micro_batch_size=args.micro_batch_size, skip_no_signal=args.beta == 0)
            for epoch in range(args.update_epochs)]


def forward_of(module, args, autocast=None):
    """How the main loop runs a pass for these flags: autocast (none by default), each prompt read once unless
    gradient checkpointing or FSDP is on."""
    autocast = autocast or torch.autocast("cpu", enabled=False)
    return module.Forward(autocast, share_prompt=not (args.gradient_checkpointing or args.fsdp))


def update(module, model, optimizer, rollout, args, autocast=None):
    """One update_policy call on minibatches drawn as the main loop draws them; returns its stats."""
    return module.update_policy(model, optimizer, rollout, draw_epochs(rollout, args), args,
                                forward_of(module, args, autocast))


def sgd_step(module, model, rollout, args, seed: int = 2) -> dict:
    """Parameters after one update_policy call with SGD at learning rate 1: θ − ∇loss."""
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    torch.manual_seed(seed)
    update(module, model, optimizer, rollout, args)
    target = getattr(model, "module", model)  # DDP wraps the model
    return {name: p.detach().clone() for name, p in target.named_parameters()}


def direct_step(module, model, rollout, args) -> dict:
    """θ − ∇loss with the loss computed in one piece on the whole batch, straight from policy_loss (with the
    rollout's correction weights, if any)."""
    logprobs = direct_logprobs(model, rollout.prompt_ids, rollout.prompt_mask, rollout.responses, rollout.mask)
    loss = module.policy_loss(logprobs, rollout.old_logprobs, rollout.advantages, rollout.mask,
                              ref_logprobs=rollout.ref_logprobs, beta=args.beta, kl_estimator=args.kl_estimator,
                              weights=rollout.weights, **method_kwargs(module, args))
    grads = torch.autograd.grad(loss, list(model.parameters()))
    return {name: (p - g).detach() for (name, p), g in zip(model.named_parameters(), grads)}


def fresh_port(folder: str, rank: int) -> None:
    """MASTER_PORT for the next process group of a torchrun worker (each run's main block joins one): a port the
    system says is free, which process 0 writes into `folder` (new for each group, made here) and the others read.
    A fixed offset from torchrun's own port failed once in a run of the suite (process 0 could not open its store
    there): ports near torchrun's are among those the system hands out to other sockets, gloo's included."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "port")
    if rank == 0:
        with socket.socket() as probe:
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        with open(path + ".tmp", "w") as f:
            f.write(str(port))
        os.replace(path + ".tmp", path)  # whole when the others see it
    while not os.path.exists(path):
        time.sleep(0.05)
    with open(path) as f:
        os.environ["MASTER_PORT"] = f.read()
