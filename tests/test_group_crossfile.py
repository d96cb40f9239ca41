"""Cross-file relations between the group methods: grpo.py, dr_grpo.py, dapo.py, gspo.py, sapo.py (and ppo.py).

The four siblings are copies of grpo.py changed only where their method changes, so their
losses must agree wherever the change does not act, and differ in a known way where it does:

    GRPO on one-token responses  = PPO's clipped loss                      (eq. 96-97 vs eq. 78-79)
    GSPO on one-token responses  = GRPO                                    (eq. 107: s_i = r_i when T_i = 1)
    DAPO, ε_high = ε_low         = GRPO on equal lengths, else token weights T_i·N/ΣT   (eq. 101-102)
    Dr. GRPO, T_i = T_max        = GRPO, else a factor T_i/T_max per response          (eq. 100)
    at ratio 1: ∇GRPO = ∇SAPO = ∇GSPO                                      (eq. 111, 112, 122)
    GRPO advantages × group std = Dr. GRPO advantages                      (eq. 90-91, 98)
    SAPO's gate sech²(τ(r−1)/2): 1 at r = 1, smaller away from 1, never 0  (eq. 117-122)
    DAPO: micro-batches with the whole batch's token count = the whole batch (eq. 102)
    DAPO: dynamic sampling keeps signal groups only; the overlong penalty is 0 / linear / −1

plus the worked numbers of the equation page and the numerical edge cases (no NaN). Equations are numbered as in
common/EQUATIONS.md. Where two methods must agree, they agree to float64 precision: the
tensors are float64 and the tolerances tight. Padding tokens carry junk log-probs on purpose, so a loss
that let padding leak in would fail.
"""

import ast
import inspect
import os
import re

import pytest
import torch

import dapo
import dr_grpo
import grpo
import gspo
import sapo
from common import checkpoints, policy, processes, runs, sampling
from conftest import ROOT

MODULES = {"grpo": grpo, "dr_grpo": dr_grpo, "dapo": dapo, "gspo": gspo, "sapo": sapo}
F64 = torch.float64


# What a reader must see in each file to follow the method, kept verbatim so that `diff grpo.py X` shows only X's
# method. (What is not the method lives once in common/: policy, sampling, processes, runs, checkpoints.)
SHARED = ["kl_penalty", "reference_model", "Forward", "sample_token", "response_logits",
          "Samples", "token_logprobs", "logprobs_of", "response_mask", "sample", "evaluate", "Rollout",
          "score_responses"]
RUNTIME = [checkpoints, policy, processes, runs, sampling]


@pytest.mark.parametrize("name", SHARED)
def test_shared_code_is_identical_in_all_files(name):
    sources = {file: inspect.getsource(getattr(module, name)) for file, module in MODULES.items()}
    assert len(set(sources.values())) == 1, f"{name} differs between files: {sorted(sources)}"


@pytest.mark.parametrize("file", MODULES)
def test_every_function_a_file_defines_is_used_there(file):
    # a reader meets no definition that the file never calls (gspo.py alone needs a masked mean per response)
    source = inspect.getsource(MODULES[file])
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            assert len(re.findall(rf"\b{node.name}\b", source)) > 1, f"{file}.py defines {node.name} and never uses it"


def test_no_file_redefines_the_shared_plumbing():
    # loading, prompts, torchrun and logging are imported from common/, never copied back into a file
    for runtime in RUNTIME:
        plumbing = {name for name, value in vars(runtime).items()
                    if callable(value) and getattr(value, "__module__", "") == runtime.__name__}
        for file, module in MODULES.items():
            for name in plumbing:
                value = getattr(module, name, None)
                assert value is None or value is getattr(runtime, name), f"{file}.py defines its own {name}"


def main_block(module) -> list[str]:
    """The statements of a file's `if __name__ == "__main__":` block, as code (comments left out)."""
    tree = ast.parse(inspect.getsource(module))
    (main,) = [node for node in tree.body if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)]
    return [ast.unparse(statement) for statement in main.body]


def test_the_main_block_is_the_same_in_every_file_and_in_dapo_where_its_method_does_not_act():
    # the method lives in the functions above the main block: a run's plumbing is the same in every file, so a
    # torchrun launch of one file tests the start and the end of a run for all five (tests/test_group_distributed.py)
    blocks = {file: main_block(module) for file, module in MODULES.items()}
    assert blocks["dr_grpo"] == blocks["gspo"] == blocks["sapo"] == blocks["grpo"]
    ending = blocks["grpo"][blocks["grpo"].index("log.close()") - 1:]
    assert blocks["dapo"][-len(ending):] == ending and blocks["dapo"][:2] == blocks["grpo"][:2]


def close(actual, expected, tol=1e-12):
    """Equal to float64 precision."""
    torch.testing.assert_close(actual, expected, rtol=tol, atol=tol)


def batch(seed, num_responses=12, max_len=6, lengths=None, spread=0.4):
    """Random float64 rollout: old_logprobs, logprobs, advantages, mask [N, T] with per-response lengths.

    Log-ratios are uniform in ±spread (ratios 0.67..1.49 by default, so ε = 0.2 clips some tokens on both
    sides); padding positions get junk log-probs (+5 and −7) that a correct loss never looks at.
    """
    g = torch.Generator().manual_seed(seed)
    if lengths is None:
        lengths = torch.randint(1, max_len + 1, (num_responses,), generator=g)
        lengths[0] = max_len  # the longest response fills the tensor, as in a real rollout
    lengths = torch.as_tensor(lengths)
    mask = (torch.arange(max_len).unsqueeze(0) < lengths.unsqueeze(1)).to(F64)
    old = -3 * torch.rand(len(lengths), max_len, generator=g, dtype=F64)
    logprobs = old + spread * (2 * torch.rand(len(lengths), max_len, generator=g, dtype=F64) - 1)
    old = torch.where(mask.bool(), old, torch.tensor(-7.0, dtype=F64))
    logprobs = torch.where(mask.bool(), logprobs, torch.tensor(5.0, dtype=F64))
    advantages = torch.randn(len(lengths), generator=g, dtype=F64)
    return old, logprobs, advantages, mask


def loss_and_grad(module, logprobs, old, advantages, mask, **kwargs):
    """(loss, d loss / d logprobs) of `module.policy_loss`."""
    logprobs = logprobs.detach().clone().requires_grad_(True)
    loss = module.policy_loss(logprobs, old, advantages, mask, **kwargs)
    (grad,) = torch.autograd.grad(loss, logprobs)
    return loss.detach(), grad


def assert_clip_acts(logprobs, old, mask, eps):
    """Guard: the data must put some real tokens outside [1 − ε, 1 + ε], or a clip relation is vacuous."""
    ratio = torch.exp(logprobs - old)
    assert (((ratio < 1 - eps) | (ratio > 1 + eps)) & mask.bool()).any()
    assert (((ratio > 1 - eps) & (ratio < 1 + eps)) & mask.bool()).any()


# ---------------------------------------------------------------- 1. GRPO on one-token responses = PPO

@pytest.mark.parametrize("clip_eps", [0.1, 0.2, 0.3])
@pytest.mark.parametrize("width", [1, 4])  # width 4: one real token, then three padding tokens
def test_grpo_one_token_equals_ppo(clip_eps, width):
    """With T_i = 1 the per-response mean of eq. (97) is the token itself, so GRPO's loss is PPO's
    clipped surrogate (eq. 78-79) averaged over responses, negated: same value, same gradient."""
    import ppo

    old, logprobs, advantages, mask = batch(1, num_responses=64, max_len=width, lengths=[1] * 64)
    assert_clip_acts(logprobs, old, mask, clip_eps)
    loss, grad = loss_and_grad(grpo, logprobs, old, advantages, mask, beta=0.0, clip_eps=clip_eps)

    lp = logprobs[:, 0].clone().requires_grad_(True)
    ppo_loss = ppo.policy_loss(lp, old[:, 0], advantages, clip_eps)
    (ppo_grad,) = torch.autograd.grad(ppo_loss, lp)
    close(loss, ppo_loss.detach())
    close(grad[:, 0], ppo_grad)
    assert torch.equal(grad[:, 1:], torch.zeros_like(grad[:, 1:]))  # padding gets no gradient


# ---------------------------------------------------------------- 2. GSPO on one-token responses = GRPO

@pytest.mark.parametrize("beta", [0.0, 0.1])
@pytest.mark.parametrize("width", [1, 4])
def test_gspo_one_token_equals_grpo(beta, width):
    """With T_i = 1 GSPO's sequence ratio s_i = exp(mean_t log r_{i,t}) (eq. 107) is the token ratio r_i,
    and the per-response clip of eq. (109) is GRPO's token clip of eq. (96): GSPO = GRPO when
    ε_low = ε_high = ε. The KL term then agrees too (one token: per-response mean = the token)."""
    old, logprobs, advantages, mask = batch(2, num_responses=64, max_len=width, lengths=[1] * 64)
    ref = old + torch.randn(old.shape, generator=torch.Generator().manual_seed(3), dtype=F64)
    assert_clip_acts(logprobs, old, mask, 0.2)
    g_loss, g_grad = loss_and_grad(grpo, logprobs, old, advantages, mask, ref_logprobs=ref, beta=beta, clip_eps=0.2)
    s_loss, s_grad = loss_and_grad(gspo, logprobs, old, advantages, mask, ref_logprobs=ref, beta=beta,
                                   clip_eps_low=0.2, clip_eps_high=0.2)
    close(s_loss, g_loss)
    close(s_grad, g_grad)


def test_gspo_and_grpo_differ_on_longer_responses_as_geometric_vs_arithmetic_mean():
    """How GSPO differs from GRPO on T_i > 1, with no clipping active (ε large): GRPO weights response i by
    the arithmetic mean of its token ratios (eq. 97), GSPO by their geometric mean s_i (eq. 107, 109)."""
    old, logprobs, advantages, mask = batch(4)
    ratio, lengths = torch.exp(logprobs - old) * mask, mask.sum(1)
    arithmetic = ratio.sum(1) / lengths
    geometric = torch.exp(((logprobs - old) * mask).sum(1) / lengths)
    close(grpo.policy_loss(logprobs, old, advantages, mask, beta=0.0, clip_eps=0.99), -(arithmetic * advantages).mean())
    close(gspo.policy_loss(logprobs, old, advantages, mask, clip_eps_low=0.99, clip_eps_high=100.0),
          -(geometric * advantages).mean())
    assert (arithmetic[lengths > 1] > geometric[lengths > 1]).all()  # AM > GM: the two losses really differ


# ---------------------------------------------------------------- 3. DAPO with ε_high = ε_low = GRPO on equal lengths

@pytest.mark.parametrize("beta", [0.0, 0.1])
@pytest.mark.parametrize("clip_eps", [0.1, 0.2])
def test_dapo_symmetric_clip_equal_lengths_equals_grpo(clip_eps, beta):
    """eq. (102) divides the sum over all tokens by ΣT_i; with every T_i = T that is N·T, and eq. (97)'s
    1/N Σ_i 1/T Σ_t is the same number. With ε_high = ε_low the clips (eq. 96, 101) are the same too.
    (β > 0: the KL term is aggregated like the policy term in both files, so it agrees as well.)"""
    old, logprobs, advantages, mask = batch(5, lengths=[6] * 12)
    ref = old + torch.randn(old.shape, generator=torch.Generator().manual_seed(6), dtype=F64)
    assert_clip_acts(logprobs, old, mask, clip_eps)
    g_loss, g_grad = loss_and_grad(grpo, logprobs, old, advantages, mask, ref_logprobs=ref, beta=beta,
                                   clip_eps=clip_eps)
    d_loss, d_grad = loss_and_grad(dapo, logprobs, old, advantages, mask, ref_logprobs=ref, beta=beta,
                                   clip_eps_low=clip_eps, clip_eps_high=clip_eps)
    close(d_loss, g_loss)
    close(d_grad, g_grad)


def test_dapo_unequal_lengths_reweights_grpo_by_token_count():
    """How DAPO differs with unequal lengths (eq. 97 vs 102): GRPO gives response i the weight 1/N split
    over its T_i tokens, DAPO gives each token 1/ΣT. So DAPO's loss is the T_i-weighted mean of GRPO's
    per-response losses, and its gradient is GRPO's times T_i·N/ΣT, row by row."""
    old, logprobs, advantages, mask = batch(7)
    lengths, n = mask.sum(1), mask.shape[0]
    assert lengths.unique().numel() > 2
    g_loss, g_grad = loss_and_grad(grpo, logprobs, old, advantages, mask, beta=0.0, clip_eps=0.2)
    d_loss, d_grad = loss_and_grad(dapo, logprobs, old, advantages, mask, clip_eps_low=0.2, clip_eps_high=0.2)
    per_response = torch.stack([grpo.policy_loss(logprobs[i:i + 1], old[i:i + 1], advantages[i:i + 1], mask[i:i + 1],
                                                 beta=0.0, clip_eps=0.2) for i in range(n)])
    close(g_loss, per_response.mean())
    close(d_loss, (lengths * per_response).sum() / lengths.sum())
    close(d_grad, g_grad * (lengths * n / lengths.sum()).unsqueeze(1))
    assert not torch.allclose(d_loss, g_loss)


# ---------------------------------------------------------------- 4. Dr. GRPO with all lengths = T_max = GRPO

@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_dr_grpo_full_length_equals_grpo(beta):
    """eq. (100) divides each response's token sum by the constant T_max; when every T_i = T_max that is
    eq. (97)'s 1/T_i, so given the same advantages (and the same ε) Dr. GRPO's loss is GRPO's."""
    t_max = 6
    old, logprobs, advantages, mask = batch(8, lengths=[t_max] * 12)
    ref = old + torch.randn(old.shape, generator=torch.Generator().manual_seed(9), dtype=F64)
    assert_clip_acts(logprobs, old, mask, 0.2)
    g_loss, g_grad = loss_and_grad(grpo, logprobs, old, advantages, mask, ref_logprobs=ref, beta=beta, clip_eps=0.2)
    d_loss, d_grad = loss_and_grad(dr_grpo, logprobs, old, advantages, mask, ref_logprobs=ref, beta=beta,
                                   clip_eps=0.2, max_new_tokens=t_max)
    close(d_loss, g_loss)
    close(d_grad, g_grad)


def test_dr_grpo_shorter_responses_scale_by_length_over_t_max():
    """How Dr. GRPO differs with T_i < T_max (eq. 97 vs 100): response i's loss is GRPO's times T_i/T_max,
    so a short response weighs less than in GRPO. Checked per response (each row alone), for the batch
    (the mean of the scaled rows) and for the gradient (each row of ∇GRPO scaled by T_i/T_max)."""
    t_max = 8  # --max-new-tokens; the responses here are 1..6 tokens long, padded to 6
    old, logprobs, advantages, mask = batch(10)
    lengths, n = mask.sum(1), mask.shape[0]
    kw_g, kw_d = dict(beta=0.0, clip_eps=0.2), dict(beta=0.0, clip_eps=0.2, max_new_tokens=t_max)
    grpo_rows = []
    for i in range(n):
        row = (logprobs[i:i + 1], old[i:i + 1], advantages[i:i + 1], mask[i:i + 1])
        grpo_rows.append(grpo.policy_loss(*row, **kw_g))
        close(dr_grpo.policy_loss(*row, **kw_d), grpo_rows[-1] * lengths[i] / t_max)
    g_loss, g_grad = loss_and_grad(grpo, logprobs, old, advantages, mask, **kw_g)
    d_loss, d_grad = loss_and_grad(dr_grpo, logprobs, old, advantages, mask, **kw_d)
    close(d_loss, (torch.stack(grpo_rows) * lengths / t_max).mean())
    close(d_grad, g_grad * (lengths / t_max).unsqueeze(1))
    assert not torch.allclose(d_loss, g_loss)


# ---------------------------------------------------------------- 5. gradients at ratio 1

@pytest.mark.parametrize("seed", [11, 12])
def test_gradient_at_ratio_one_grpo_sapo_gspo_agree(seed):
    """At r = 1 (logprobs = old_logprobs) no clip acts and SAPO's gate is 1, so eq. (112), (122) and (111)
    all give ∂J/∂logπ_{i,t} = Â_i/(N·T_i): GRPO, SAPO and GSPO have the same gradient (eq. 122: with
    one update per rollout the three are the same algorithm). Checked with their default ε and τ too."""
    old, _, advantages, mask = batch(seed)
    expected = -(advantages / mask.sum(1)).unsqueeze(1) * mask / mask.shape[0]
    grads = {}
    for name, kwargs in [("grpo", dict(clip_eps=0.2)), ("sapo", dict(tau_pos=1.0, tau_neg=1.05)),
                         ("sapo_other_tau", dict(tau_pos=0.5, tau_neg=3.0)),
                         ("gspo", dict(clip_eps_low=3e-4, clip_eps_high=4e-4))]:
        module = MODULES[name.split("_other")[0]]
        _, grads[name] = loss_and_grad(module, old, old, advantages, mask, beta=0.0, **kwargs)
    for name, grad in grads.items():
        close(grad, expected, tol=1e-12)


def test_gradient_at_ratio_one_dr_grpo_and_dapo_differ_only_by_aggregation_weights():
    """At r = 1 every token's gradient is Â_i times its aggregation weight: GRPO 1/(N·T_i) (eq. 97),
    Dr. GRPO 1/(N·T_max) (eq. 100), DAPO 1/ΣT (eq. 102). So ∇Dr.GRPO = ∇GRPO · T_i/T_max and
    ∇DAPO = ∇GRPO · T_i·N/ΣT, row by row."""
    t_max = 8
    old, _, advantages, mask = batch(13)
    lengths, n = mask.sum(1), mask.shape[0]
    _, g_grad = loss_and_grad(grpo, old, old, advantages, mask, beta=0.0)
    _, dr_grad = loss_and_grad(dr_grpo, old, old, advantages, mask, max_new_tokens=t_max)
    _, da_grad = loss_and_grad(dapo, old, old, advantages, mask)  # default ε_low = 0.2, ε_high = 0.28
    close(dr_grad, g_grad * (lengths / t_max).unsqueeze(1))
    close(da_grad, g_grad * (lengths * n / lengths.sum()).unsqueeze(1))
    close(da_grad, -advantages.unsqueeze(1) * mask / lengths.sum())


# ---------------------------------------------------------------- 6. Dr. GRPO advantages × std = GRPO advantages

@pytest.mark.parametrize("kind", ["binary", "continuous"])
def test_grpo_advantages_times_group_std_equal_dr_grpo_advantages(kind):
    """eq. (98) is eq. (91) without the division by s_u = sqrt(population variance + ε) of eq. (90)
    (ε = 1e-6 as in grpo.py), so Â_GRPO · s_u = Â_Dr, group by group; equivalently Â_Dr / s_u = Â_GRPO.
    (The tempting reading "Dr. GRPO advantages × group std = GRPO advantages" puts the std on the wrong side.)
    A group of equal rewards gives exactly 0 in both."""
    group_size, g = 6, torch.Generator().manual_seed(14)
    rewards = torch.rand(5 * group_size, generator=g, dtype=F64)
    if kind == "binary":
        rewards = (rewards > 0.5).to(F64)
    rewards[:group_size] = 0.3  # a group of equal rewards
    rewards[group_size:2 * group_size] = torch.tensor([1.0, 0, 0, 0, 0, 0], dtype=F64)  # one right of six
    std = torch.sqrt(rewards.view(-1, group_size).var(dim=1, correction=0) + 1e-6).unsqueeze(1)
    dr = dr_grpo.compute_advantages(rewards, group_size).view(-1, group_size)
    gr = grpo.compute_advantages(rewards, group_size).view(-1, group_size)
    close(gr * std, dr)
    close(dr / std, gr)
    assert (torch.equal(dr[0], torch.zeros(group_size, dtype=F64))
            and torch.equal(gr[0], torch.zeros(group_size, dtype=F64)))
    assert not torch.allclose(dr, gr)  # the std really differs from 1 here


# ---------------------------------------------------------------- 7. SAPO's soft gate

def sapo_gate(ratios, advantage, **taus):
    """g(r) = d f(r)/d r (eq. 120) by autograd through sapo.policy_loss, on one-token responses.

    With N one-token responses of advantage Â and β = 0, loss = −1/N Σ_i f(r_i) Â, so
    g(r_i) = −N / Â · ∂loss/∂r_i.
    """
    r = ratios.clone().requires_grad_(True)
    n = len(r)
    mask = torch.ones(n, 1, dtype=F64)
    loss = sapo.policy_loss(torch.log(r).unsqueeze(1), torch.zeros(n, 1, dtype=F64),
                            torch.full((n,), float(advantage), dtype=F64), mask, beta=0.0, **taus)
    (grad,) = torch.autograd.grad(loss, r)
    return -n / advantage * grad


def test_sapo_gate_shape():
    """The gate replaces the clip's hard 0/1 gate (eq. 116) with a smooth one (eq. 117-120): 1 at r = 1,
    decreasing monotonically as r moves away from 1 on either side, still > 0 where GRPO's clip gives
    exactly zero gradient (r = 1.5 with Â > 0, r = 0.5 with Â < 0), and, with τ_neg > τ_pos, smaller
    for Â < 0 than for Â > 0 at the same |r − 1| (negative tokens are damped faster)."""
    above, below = torch.linspace(1.0, 4.0, 61, dtype=F64), torch.linspace(1.0, 0.05, 61, dtype=F64)
    for advantage in (1.0, -1.0):
        up, down = sapo_gate(above, advantage), sapo_gate(below, advantage)
        close(up[0], torch.tensor(1.0, dtype=F64), tol=1e-12)
        close(down[0], torch.tensor(1.0, dtype=F64), tol=1e-12)
        assert (up.diff() < 0).all() and (down.diff() < 0).all()  # strictly decaying away from r = 1
        assert (up > 0).all() and (down > 0).all()

    for ratio, advantage in ((1.5, 1.0), (0.5, -1.0)):
        r = torch.tensor([ratio], dtype=F64)
        _, grpo_grad = loss_and_grad(grpo, torch.log(r).unsqueeze(1), torch.zeros(1, 1, dtype=F64),
                                     torch.tensor([advantage], dtype=F64), torch.ones(1, 1, dtype=F64), beta=0.0,
                                     clip_eps=0.2)
        assert grpo_grad.item() == 0.0  # the hard clip: exactly no gradient
        assert sapo_gate(r, advantage).item() > 0.5  # the soft gate: still most of it

    distances = torch.tensor([0.1, 0.3, 0.6, 0.9], dtype=F64)
    for side in (1.0 + distances, 1.0 - distances):
        assert (sapo_gate(side, -1.0, tau_pos=1.0, tau_neg=1.05)
                < sapo_gate(side, 1.0, tau_pos=1.0, tau_neg=1.05)).all()


@pytest.mark.parametrize("tau_pos, tau_neg", [(1.0, 1.05), (0.5, 2.0), (3.0, 3.0)])
def test_sapo_gate_closed_form_is_sech_squared(tau_pos, tau_neg):
    """eq. (120): d/dr [4/τ σ(τ(r−1))] = 4σ(x)(1−σ(x)) = sech²(x/2) with x = τ(r−1): 1 at r = 1 (a form
    without the square would be 0 there). τ is τ_pos for Â > 0, τ_neg otherwise."""
    ratios = torch.tensor([0.05, 0.3, 0.5, 0.8, 0.99, 1.0, 1.01, 1.2, 1.5, 2.0, 5.0], dtype=F64)
    for advantage, tau in ((2.0, tau_pos), (-0.5, tau_neg)):
        x = tau * (ratios - 1)
        gate = sapo_gate(ratios, advantage, tau_pos=tau_pos, tau_neg=tau_neg)
        close(gate, 1 / torch.cosh(x / 2) ** 2, tol=1e-12)
        close(gate, 4 * torch.sigmoid(x) * (1 - torch.sigmoid(x)), tol=1e-12)


# ---------------------------------------------------------------- 8. DAPO micro-batches = the whole batch

@pytest.mark.parametrize("split", [[2, 2, 2, 2, 2, 2], [5, 7], [1, 3, 8]])
def test_dapo_micro_batches_give_the_whole_batch_gradient(split):
    """eq. (102)'s normaliser is the active-token count of the whole optimiser-step batch. If each
    micro-batch divides its token sum by that count (num_active_tokens = the whole mask.sum()), the micro-batch
    losses add up to the whole-batch loss and their gradients to its gradient (gradient accumulation)."""
    old, logprobs, advantages, mask = batch(15)
    assert_clip_acts(logprobs, old, mask, 0.2)
    whole_loss, whole_grad = loss_and_grad(dapo, logprobs, old, advantages, mask)
    total, grads, start = 0.0, [], 0
    for size in split:
        rows = slice(start, start + size)
        loss, grad = loss_and_grad(dapo, logprobs[rows], old[rows], advantages[rows], mask[rows],
                                   num_active_tokens=mask.sum())
        total, start = total + loss, start + size
        grads.append(grad)
    close(total, whole_loss)
    close(torch.cat(grads), whole_grad)


def test_dapo_naive_micro_batch_token_means_differ_when_lengths_differ():
    """The classic mistake with eq. (102): each micro-batch normalised by its own tokens
    (num_active_tokens=None), then weighted by its share of responses as grpo.py does. This equals the
    whole batch only when every micro-batch has the same number of tokens."""
    def naive(lengths):
        old, logprobs, advantages, mask = batch(16, lengths=lengths)
        _, whole = loss_and_grad(dapo, logprobs, old, advantages, mask)
        parts = [loss_and_grad(dapo, logprobs[r], old[r], advantages[r], mask[r])[1] * 0.5
                 for r in (slice(0, 4), slice(4, 8))]
        return whole, torch.cat(parts)

    whole, accumulated = naive([6, 6, 1, 1, 2, 2, 1, 1])  # 14 tokens vs 6 tokens
    assert not torch.allclose(whole, accumulated)
    whole, accumulated = naive([6, 1, 2, 3, 3, 3, 3, 3])  # 12 tokens in each half
    close(whole, accumulated)


# ---------------------------------------------------------------- 9. DAPO dynamic sampling

def test_dapo_filter_keeps_the_groups_whose_accuracy_advantages_are_not_zero():
    """Dynamic sampling drops the groups whose answers are all right or all wrong: their accuracies are equal, so
    the advantages of the accuracies are exactly 0 (eq. 90-91: no gradient). dapo.has_mixed_answers must flag
    exactly the groups with a nonzero advantage under dapo.compute_advantages of the accuracies."""
    group_size, g = 4, torch.Generator().manual_seed(17)
    accuracies = torch.randint(0, 2, (40 * group_size,), generator=g).float()  # many all-0 / all-1 groups
    # seven equal values of 0.1: their float mean is not exactly 0.1, yet the group has no signal
    equal = torch.cat([torch.full((7,), 0.1), torch.tensor([0.1, 0.1, 0.1, 0.2, 0.1, 0.1, 0.1])])
    for r, size in ((accuracies, group_size), (equal, 7)):
        mixed = dapo.has_mixed_answers(r, size)
        nonzero = (dapo.compute_advantages(r, size).view(-1, size) != 0).any(dim=1)
        assert torch.equal(mixed, nonzero)
    assert mixed.tolist() == [False, True]
    assert (~dapo.has_mixed_answers(accuracies, group_size)).sum() > 5  # the test data has groups without signal


def test_dapo_fill_batch_puts_mixed_groups_first():
    """dapo.fill_batch picks the batch's groups: every group with mixed answers (in sampling order) before any
    other, so a batch never holds a group without signal while a group with signal was left out."""
    group_size = 4
    # 6 groups sampled over two rounds; groups 1, 3 and 4 have mixed answers
    accuracies = torch.tensor([1, 1, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1.0])
    mixed = dapo.has_mixed_answers(accuracies, group_size)
    assert mixed.tolist() == [False, True, False, True, True, False]
    assert dapo.fill_batch(mixed, 2).tolist() == [1, 3]  # room for 2 groups: the first two mixed ones
    assert dapo.fill_batch(mixed, 4).tolist() == [1, 3, 4, 0]  # 3 mixed groups, then the first other group fills


def test_dapo_zero_signal_rows_get_no_gradient():
    """A shortfall in dynamic sampling is filled with groups without mixed answers whose loss mask is 0
    (dapo.py: loss_mask = mask * mixed): they add nothing to the loss, its gradient or eq. (102)'s token count."""
    old, logprobs, advantages, mask = batch(18, num_responses=8)
    signal = torch.tensor([1, 1, 1, 1, 0, 0, 0, 0], dtype=F64)
    loss_mask = mask * signal.unsqueeze(1)
    loss, grad = loss_and_grad(dapo, logprobs, old, advantages, loss_mask, num_active_tokens=loss_mask.sum())
    kept, kept_grad = loss_and_grad(dapo, logprobs[:4], old[:4], advantages[:4], mask[:4])
    close(loss, kept)
    close(grad[:4], kept_grad)
    assert torch.equal(grad[4:], torch.zeros_like(grad[4:]))


def test_dapo_smoke_run_logs_dynamic_sampling(in_process):
    """dapo.py end to end on the embedded model: the dynamic-sampling tags are written every iteration,
    within their ranges (1 ≤ rounds ≤ --max-sampling-rounds, the share of groups with mixed answers in [0, 1])."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, _ = in_process("dapo", ["--num-iterations", "2", "--prompts-per-iteration", "4", "--eval-size", "8"])
    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    rounds = [e.value for e in acc.Scalars("charts/sampling_rounds")]
    fraction = [e.value for e in acc.Scalars("charts/mixed_group_fraction")]
    assert len(rounds) == 2 and all(1 <= r <= dapo.Args.max_sampling_rounds for r in rounds)
    assert len(fraction) == 2 and all(0.0 <= f <= 1.0 for f in fraction)


# ---------------------------------------------------------------- 10. DAPO's overlong penalty

@pytest.mark.parametrize("max_new_tokens, buffer", [(8, 3), (20, 4), (5, 1)])
def test_overlong_penalty_zero_linear_minus_one(max_new_tokens, buffer):
    """DAPO's soft overlong punishment (DAPO paper §3.4): no penalty up to L_max − L_cache tokens, then linear,
    −1 at L_max: length L_max − L_cache + k gets −k/L_cache; −1 past L_max, the paper's third case (here the cap
    is L_max, so only a caller with longer responses meets it)."""
    start = max_new_tokens - buffer
    lengths = torch.arange(0, max_new_tokens + 4, dtype=torch.float32)
    expected = torch.tensor([0.0 if n <= start else max(-(n - start) / buffer, -1.0) for n in range(len(lengths))])
    penalty = dapo.overlong_penalty(lengths, max_new_tokens, buffer)
    torch.testing.assert_close(penalty, expected, rtol=0, atol=1e-7)
    assert penalty[start].item() == 0.0 and penalty[max_new_tokens].item() == -1.0
    assert penalty[start + 1].item() < 0.0  # the first token past the boundary is already penalised


def test_overlong_penalty_buffer_zero_is_off():
    """--overlong-buffer 0 disables the soft penalty: every length, the cap included, gets 0."""
    lengths = torch.arange(0, 9, dtype=torch.float32)
    assert torch.equal(dapo.overlong_penalty(lengths, 8, 0), torch.zeros(9))


# ---------------------------------------------------------------- 11. worked numbers

@pytest.mark.parametrize("name, kwargs, expected_loss", [
    ("grpo", dict(clip_eps=0.2), 8.0),
    ("dapo", dict(clip_eps_low=0.2, clip_eps_high=0.28), 8.0),
    ("dr_grpo", dict(clip_eps=0.2, max_new_tokens=1), 8.0),
    ("dr_grpo", dict(clip_eps=0.2, max_new_tokens=4), 8.0 / 4),  # eq. (100): one token out of T_max = 4
    ("gspo", dict(clip_eps_low=0.2, clip_eps_high=0.2), 8.0),
])
def test_worked_ppo_clip_example(name, kwargs, expected_loss):
    """The worked clip example of common/EQUATIONS.md#sec-ppo-clip-example: r = 0.5, Â = −10, ε = 0.2 →
    min(rÂ, clip(r, 0.8, 1.2)Â) = min(−5, −8) = −8, constant in θ, so the gradient is 0. On one one-token response
    the loss is +8 (negated), ÷ T_max for Dr. GRPO."""
    logprobs = torch.log(torch.tensor([[0.5, 1.0, 1.0]], dtype=F64))  # one real token, two padding
    mask = torch.tensor([[1.0, 0.0, 0.0]], dtype=F64)
    loss, grad = loss_and_grad(MODULES[name], logprobs, torch.zeros(1, 3, dtype=F64), torch.tensor([-10.0], dtype=F64),
                               mask, beta=0.0, **kwargs)
    close(loss, torch.tensor(expected_loss, dtype=F64))
    assert torch.equal(grad, torch.zeros_like(grad))


def test_worked_ppo_clip_example_in_ppo():
    """The same worked example in ppo.py's policy_loss (the same worked example): loss 8, zero gradient."""
    import ppo

    logprobs = torch.log(torch.tensor([0.5], dtype=F64)).requires_grad_(True)
    loss = ppo.policy_loss(logprobs, torch.zeros(1, dtype=F64), torch.tensor([-10.0], dtype=F64), 0.2)
    close(loss.detach(), torch.tensor(8.0, dtype=F64))
    assert torch.autograd.grad(loss, logprobs)[0].item() == 0.0


@pytest.mark.parametrize("tau_pos, tau_neg", [(1.0, 1.05), (0.2, 5.0)])
@pytest.mark.parametrize("advantage", [1.0, -1.0, 3.0, -0.25])
def test_sapo_gate_is_one_at_ratio_one(advantage, tau_pos, tau_neg):
    """Seed eq. (120) at r = 1: g = 4σ(0)(1 − σ(0)) = 1 for any τ, so on-policy SAPO has GRPO's gradient."""
    gate = sapo_gate(torch.ones(3, dtype=F64), advantage, tau_pos=tau_pos, tau_neg=tau_neg)
    close(gate, torch.ones(3, dtype=F64), tol=1e-12)


def test_sapo_computes_in_the_input_dtype():
    """In float64 SAPO's gate must be sech²(τ(r − 1)/2) to float64 precision with τ exactly as given
    (like every other file's loss, nothing inside policy_loss may drop to float32); τ_neg = 1.05 and
    τ_pos = 0.3 are not float32 numbers, so a float32 τ (or a float32 τ cast back to float64) fails."""
    ratios = torch.tensor([0.5, 1.0, 2.0], dtype=F64)
    for advantage, tau in ((1.0, 0.3), (-1.0, 1.05)):
        close(sapo_gate(ratios, advantage, tau_pos=0.3, tau_neg=1.05), 1 / torch.cosh(tau * (ratios - 1) / 2) ** 2)


# ---------------------------------------------------------------- 12. no NaN on the edge cases

def edge_case_batch(dtype):
    """Rows: a group of equal rewards (Â = 0), an all-padding response, log-ratios of ±50 (and ±100,
    past float32's exp range, so an unclamped exp would give inf), whole responses that far off (GSPO's
    sequence ratio), and ref_logprobs as far off (for β > 0)."""
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0], dtype=dtype)  # group 1: all equal
    old = torch.zeros(8, 4, dtype=dtype)
    far = torch.tensor([50.0, -50.0, 100.0, -100.0], dtype=dtype)
    near = torch.tensor([0.0, 0.1, -0.1, 0.0], dtype=dtype)
    logprobs = torch.stack([near] * 4 + [far, far, torch.full((4,), -100.0, dtype=dtype),
                                         torch.full((4,), 100.0, dtype=dtype)])
    ref = logprobs + far
    mask = torch.ones(8, 4, dtype=dtype)
    mask[1], mask[5, 2:] = 0.0, 0.0  # row 1: all padding; row 5: two real tokens; rows 6, 7: every token far off
    return rewards, logprobs, old, ref, mask


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("beta", [0.0, 0.5])
@pytest.mark.parametrize("name", list(MODULES))
def test_no_nan_on_edge_cases(name, beta, dtype):
    """Numerical edge cases: equal rewards in a group, an all-padding response, ratios of exp(±50) and a reference
    far off (β > 0) give finite advantages, losses and gradients in every file, with its default hyperparameters;
    equal rewards give advantages exactly 0, and a batch that is all padding gives a finite loss too."""
    module = MODULES[name]
    rewards, logprobs, old, ref, mask = edge_case_batch(dtype)
    advantages = module.compute_advantages(rewards, 4)
    assert torch.equal(advantages[:4], torch.zeros(4, dtype=dtype))
    assert torch.isfinite(advantages).all()
    # seven rewards of 0.1 have a float mean that is not exactly 0.1: still exactly 0, not ±1e-8 / sqrt(ε)
    assert torch.equal(module.compute_advantages(torch.full((7,), 0.1, dtype=dtype), 7), torch.zeros(7, dtype=dtype))
    for m in (mask, torch.zeros_like(mask)):
        loss, grad = loss_and_grad(module, logprobs, old, advantages, m, ref_logprobs=ref, beta=beta)
        assert torch.isfinite(loss), (name, loss)
        assert torch.isfinite(grad).all(), (name, grad)
        assert torch.equal(grad * (1 - m), torch.zeros_like(grad))  # padding never gets a gradient


def test_every_file_steps_a_fused_adam_which_makes_the_update_of_the_loop():
    """Each file builds torch's fused Adam (one kernel over all the parameters, on a CPU and a GPU); after 20 steps on
    the same gradients its weights are those of Adam's loop over the parameters within float32 rounding."""
    for file in MODULES:
        source = open(os.path.join(ROOT, f"{file}.py")).read()
        assert re.search(r"optimizer = torch\.optim\.Adam\([^\n]*fused=True\)", source), file
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(50, 30, generator=generator), torch.randn(30, generator=generator)]
    fused = [torch.nn.Parameter(w.clone()) for w in weights]
    loop = [torch.nn.Parameter(w.clone()) for w in weights]
    optimizers = [torch.optim.Adam(fused, lr=1e-2, fused=True), torch.optim.Adam(loop, lr=1e-2, foreach=False)]
    for step in range(20):
        gradients = [torch.randn(w.shape, generator=generator) for w in weights]
        for params, optimizer in zip((fused, loop), optimizers):
            for p, g in zip(params, gradients):
                p.grad = g.clone()
            optimizer.step()
    for a, b, w in zip(fused, loop, weights):
        assert not torch.equal(a, w)  # they moved
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
