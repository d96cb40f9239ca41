"""Each group file computes its own method, and its update and main loop feed that method correctly.

Every expected number here comes from outside the code under test:
- the loss of each file against the paper's formula written out token by token in this file (independent loops,
  float64), value and gradient: clip bounds (ε_low vs ε_high), SAPO's τ by sign of Â, the KL term's sign,
  direction, estimator and aggregation (each file aggregates it like its own policy term: common/EQUATIONS.md
  #eq-97, #eq-100, #eq-102, #eq-109, #eq-119);
- the update step against θ − ∇loss of the formula on log-probs computed directly (tests/fixed_rollouts.py):
  several minibatches and epochs, gradient clipping, filler groups, a filler-only minibatch (no step, Adam untouched);
- the scoring of π_θold and π_ref against log-probs computed directly from the models, at the temperature, with a
  frozen copy and with LoRA adapters switched off;
- DAPO's and GRPO's main loops, run in-process with spies, against what was sampled: dynamic sampling keeps the
  groups whose accuracies differ (not those whose length-shaped rewards differ), the loss mask drops filler groups
  and (with --overlong-filtering) cut responses, advantages are the hand formula of the (shaped) rewards.
"""

import ast
import copy
import math
import sys
import types

import pytest
import torch

import dapo
import dr_grpo
import grpo
import gspo
import sapo
from fixed_rollouts import (TEMPERATURE, as_samples, direct_logprobs, direct_step, draw_epochs, fixed_rollout,
                            forward_of, rows_of, sgd_step, tiny_gpt2, update, update_args)
from common import policy, processes, runs, sampling

MODULES = {"grpo": grpo, "dr_grpo": dr_grpo, "dapo": dapo, "gspo": gspo, "sapo": sapo}
F64 = torch.float64

# Asymmetric hyperparameters, none equal to a default, so that a swapped or defaulted argument shows.
HPARAMS = {
    "grpo": dict(clip_eps=0.15),
    "dr_grpo": dict(clip_eps=0.15, max_new_tokens=9),
    "dapo": dict(clip_eps_low=0.1, clip_eps_high=0.3),
    "gspo": dict(clip_eps_low=0.02, clip_eps_high=0.06),
    "sapo": dict(tau_pos=0.7, tau_neg=2.0),
}
SWAPPED = {
    "grpo": dict(clip_eps=0.3),
    "dr_grpo": dict(clip_eps=0.15, max_new_tokens=6),
    "dapo": dict(clip_eps_low=0.3, clip_eps_high=0.1),
    "gspo": dict(clip_eps_low=0.06, clip_eps_high=0.02),
    "sapo": dict(tau_pos=2.0, tau_neg=0.7),
}


# ---------------------------------------------------------------- the papers' formulas, token by token

def k_estimator(logp, ref, estimator):
    """Schulman (2020): with log_r = log π_ref − log π_θ, k1 = −log_r, k2 = ½ log_r², k3 = e^{log_r} − log_r − 1."""
    log_r = ref - logp
    return {"k1": -log_r, "k2": 0.5 * log_r ** 2, "k3": torch.exp(log_r) - log_r - 1}[estimator]


def formula_loss(name, logprobs, old, advantages, mask, ref=None, beta=0.0, estimator="k3", weights=None, **hp):
    """The negated objective of each method, written out with Python loops over responses and tokens; `weights`: a
    correction's per-token weights (eq. 125), on each token's policy term (GSPO: their geometric mean on the
    response's)."""
    lengths = [int(mask[i].sum()) for i in range(mask.shape[0])]
    real = [[t for t in range(mask.shape[1]) if mask[i, t] > 0] for i in range(mask.shape[0])]
    per_response, total_tokens = [], sum(lengths)
    for i, tokens in enumerate(real):
        a = advantages[i]
        if not tokens:  # a response a correction masked whole: no term, but one of the N responses
            per_response.append(0.0 * a)
            continue
        kl = ([k_estimator(logprobs[i, t], ref[i, t], estimator) for t in tokens] if beta > 0
              else [0.0 * a] * len(tokens))
        if name == "gspo":  # eq. (107), (109): one geometric-mean ratio per response, clipped per response
            s = torch.exp(sum(logprobs[i, t] - old[i, t] for t in tokens) / len(tokens))
            clipped = torch.clamp(s, 1 - hp["clip_eps_low"], 1 + hp["clip_eps_high"])
            w = 1.0 if weights is None else torch.exp(sum(torch.log(weights[i, t]) for t in tokens) / len(tokens))
            per_response.append(torch.minimum(s * a, clipped * a) * w - beta * sum(kl) / len(tokens))
            continue
        terms = []
        for t, kl_t in zip(tokens, kl):
            r = torch.exp(logprobs[i, t] - old[i, t])
            if name == "sapo":  # eq. (117)-(118)
                tau = hp["tau_pos"] if a > 0 else hp["tau_neg"]
                term = 4 / tau * torch.sigmoid(tau * (r - 1)) * a
            else:  # eq. (96), (101)
                low, high = ((hp["clip_eps"], hp["clip_eps"]) if "clip_eps" in hp
                             else (hp["clip_eps_low"], hp["clip_eps_high"]))
                term = torch.minimum(r * a, torch.clamp(r, 1 - low, 1 + high) * a)
            terms.append(term * (1.0 if weights is None else weights[i, t]) - beta * kl_t)
        if name == "dapo":  # eq. (102): every token of the batch weighs 1 / Σ T_i
            per_response.append(sum(terms) / total_tokens)
        elif name == "dr_grpo":  # eq. (100): sum over the response's tokens / T_max
            per_response.append(sum(terms) / hp["max_new_tokens"])
        else:  # eq. (97), (119): mean over the response's tokens
            per_response.append(sum(terms) / len(tokens))
    if name == "dapo":
        return -sum(per_response)
    return -sum(per_response) / len(per_response)


def random_batch(seed, n=8, width=5, spread=0.5):
    """float64 log-probs with ratios on both sides of every clip bound, lengths 1..width, junk in the padding."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (n,), generator=g)
    lengths[0] = width
    mask = (torch.arange(width) < lengths.unsqueeze(1)).to(F64)
    old = -2 * torch.rand(n, width, generator=g, dtype=F64) - 0.2
    logprobs = old + spread * (2 * torch.rand(n, width, generator=g, dtype=F64) - 1)
    ref = logprobs + 0.7 * torch.randn(n, width, generator=g, dtype=F64)
    logprobs = torch.where(mask.bool(), logprobs, torch.tensor(3.0, dtype=F64))
    advantages = torch.randn(n, generator=g, dtype=F64)
    advantages[:2] = torch.tensor([1.3, -0.8], dtype=F64)
    return logprobs, old, advantages, mask, ref


def value_and_grad(fn, logprobs):
    x = logprobs.detach().clone().requires_grad_(True)
    value = fn(x)
    (grad,) = torch.autograd.grad(value, x)
    return value.detach(), grad


@pytest.mark.parametrize("beta, estimator", [(0.0, "k3"), (0.1, "k1"), (0.1, "k2"), (0.1, "k3")])
@pytest.mark.parametrize("name", list(MODULES))
def test_loss_is_the_papers_formula(name, beta, estimator):
    """policy_loss = the method's formula (value and gradient), with each file's own clip bounds or τ, and the
    KL term subtracted from the objective (sign), as KL(π_θ ‖ π_ref) (direction), aggregated like the policy term."""
    module, hp = MODULES[name], HPARAMS[name]
    for seed in (0, 1):
        logprobs, old, advantages, mask, ref = random_batch(seed)
        if name == "gspo":  # its ε are small: put the sequence ratios log s_i on both sides of both bounds
            log_s = torch.tensor([0.04, -0.04, 0.01, -0.01, 0.08, -0.08, 0.0, 0.03], dtype=F64)
            current = ((logprobs - old) * mask).sum(1) / mask.sum(1)
            logprobs = torch.where(mask.bool(), logprobs + (log_s - current).unsqueeze(1), logprobs)

        def code(x):
            return module.policy_loss(x, old, advantages, mask, ref_logprobs=ref, beta=beta, kl_estimator=estimator,
                                      **hp)

        def paper(x, **other):
            return formula_loss(name, x, old, advantages, mask, ref=ref, beta=beta, estimator=estimator,
                                **{**hp, **other})

        loss, grad = value_and_grad(code, logprobs)
        expected_loss, expected_grad = value_and_grad(paper, logprobs)
        torch.testing.assert_close(loss, expected_loss, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(grad, expected_grad, rtol=1e-10, atol=1e-12)
        # the data must tell the bounds (or temperatures, or T_max) apart, or the comparison proves little
        swapped_loss, swapped_grad = value_and_grad(lambda x: paper(x, **SWAPPED[name]), logprobs)
        assert not torch.allclose(swapped_grad, expected_grad, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("name", list(MODULES))
def test_a_corrections_weights_are_taken_where_the_formula_says(name):
    """A sampler that is not π_θold: policy_loss with per-token weights (common/sampling.py: correct, token-tis) is the
    formula with each token's policy term weighed (GSPO: the response's, by the geometric mean of its tokens'
    weights), the KL term not; weights of 1 change nothing."""
    module, hp = MODULES[name], HPARAMS[name]
    logprobs, old, advantages, mask, ref = random_batch(3)
    weights = 0.3 + 1.7 * torch.rand(mask.shape, generator=torch.Generator().manual_seed(4), dtype=F64)

    def code(x, w):
        return module.policy_loss(x, old, advantages, mask, ref_logprobs=ref, beta=0.1, weights=w, **hp)

    loss, grad = value_and_grad(lambda x: code(x, weights), logprobs)
    expected_loss, expected_grad = value_and_grad(
        lambda x: formula_loss(name, x, old, advantages, mask, ref=ref, beta=0.1, weights=weights, **hp), logprobs)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-10, atol=1e-12)
    assert code(logprobs, torch.ones_like(mask)) == code(logprobs, None)
    assert not torch.allclose(loss, code(logprobs, None))


@pytest.mark.parametrize("name", list(MODULES))
def test_a_weight_rounded_to_0_takes_its_responses_terms_out_and_nothing_is_nan(name):
    """sequence-mis weighs a response by Π ρ (common/sampling.py: correct), which float32 rounds to 0 below e^-103,
    as on a long response of a stale sampler: that response's policy terms then weigh 0 (GSPO: the geometric mean
    of its weights, taken through their log, is 0), with padding beside its tokens, and the loss and gradient are the
    formula's, finite."""
    module, hp = MODULES[name], HPARAMS[name]
    logprobs, old, advantages, mask, ref = random_batch(3)
    short = int((mask.sum(1) < mask.shape[1]).nonzero()[0])  # a response with padding after its tokens
    weights = torch.ones_like(mask)
    weights[short] = 0.0
    loss, grad = value_and_grad(lambda x: module.policy_loss(x, old, advantages, mask, weights=weights, **hp), logprobs)
    expected_loss, expected_grad = value_and_grad(
        lambda x: formula_loss(name, x, old, advantages, mask, weights=weights, **hp), logprobs)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    torch.testing.assert_close(loss, expected_loss, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-10, atol=1e-12)
    assert torch.equal(grad[short], torch.zeros_like(grad[short]))


@pytest.mark.parametrize("name", list(MODULES))
def test_a_response_masked_whole_adds_nothing_but_counts(name):
    """A correction may mask every token of a response (common/sampling.py's sequence-mis, sequence-geo-reject):
    the response adds nothing to the objective, value or gradient, and still counts among the N of the mean over
    responses (DAPO: its normaliser counts tokens). Its advantage is not 0, so a sequence ratio exp(0) = 1 left in
    would show."""
    module, hp = MODULES[name], HPARAMS[name]
    logprobs, old, advantages, mask, ref = random_batch(5)
    mask[2] = 0
    assert advantages[2] != 0

    def code(x):
        return module.policy_loss(x, old, advantages, mask, ref_logprobs=ref, beta=0.1, **hp)

    loss, grad = value_and_grad(code, logprobs)
    expected_loss, expected_grad = value_and_grad(
        lambda x: formula_loss(name, x, old, advantages, mask, ref=ref, beta=0.1, **hp), logprobs)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", list(MODULES))
def test_kl_term_alone_sign_direction_and_aggregation(name):
    """At ratio 1 with Â = 0 only the KL term is left: loss = +β × the method's aggregate of k3(π_θ, π_ref) ≥ 0,
    and its gradient pulls log π_θ towards log π_ref (KL(π_θ ‖ π_ref), not the reverse)."""
    logprobs, old, _, mask, ref = random_batch(5)
    zero = torch.zeros(mask.shape[0], dtype=F64)
    module, hp = MODULES[name], HPARAMS[name]
    loss, grad = value_and_grad(
        lambda x: module.policy_loss(x, x.detach(), zero, mask, ref_logprobs=ref, beta=0.5, **hp), logprobs)
    k3 = (torch.exp(ref - logprobs) - (ref - logprobs) - 1) * mask
    lengths = mask.sum(1)
    aggregate = {"dapo": k3.sum() / lengths.sum(), "dr_grpo": (k3.sum(1) / hp.get("max_new_tokens", 1)).mean()}
    expected = aggregate.get(name, (k3.sum(1) / lengths).mean())
    torch.testing.assert_close(loss, 0.5 * expected, rtol=1e-10, atol=1e-12)
    # d/dlogπ [e^{ref−logπ} − (ref−logπ) − 1] = 1 − e^{ref−logπ}: positive where logπ > ref, so descent lowers it
    direction = torch.sign((1 - torch.exp(ref - logprobs)) * mask)
    assert torch.equal(torch.sign(grad), direction)


@pytest.mark.parametrize("name", ["grpo", "dapo", "gspo"])
def test_log_ratio_clamp_keeps_far_tokens_finite(name):
    """A log-ratio of ±30 is clamped to ±20 before exp (far-off-policy tokens cannot overflow); within ±20 no clamp."""
    module = MODULES[name]
    hp = {"grpo": dict(clip_eps=0.2), "dapo": dict(clip_eps_low=0.2, clip_eps_high=0.28),
          "gspo": dict(clip_eps_low=0.2, clip_eps_high=0.28)}[name]
    mask = torch.ones(2, 1, dtype=F64)
    old = torch.zeros(2, 1, dtype=F64)
    # Â < 0 with r far above 1 and Â > 0 with r far below: min() picks the unclipped r·Â, so the clamp shows
    for log_ratio, expected_ratio in ((30.0, math.exp(20.0)), (10.0, math.exp(10.0)), (-30.0, math.exp(-20.0))):
        logprobs = torch.tensor([[log_ratio], [log_ratio]], dtype=F64)
        advantages = torch.tensor([-1.0, -1.0] if log_ratio > 0 else [1.0, 1.0], dtype=F64)
        loss = module.policy_loss(logprobs, old, advantages, mask, beta=0.0, **hp)
        torch.testing.assert_close(loss, -(expected_ratio * advantages[0]), rtol=1e-12, atol=0)


# ---------------------------------------------------------------- the update step: minibatches, epochs, clipping

def params_of(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("name", list(MODULES))
def test_minibatches_and_epochs_are_sequential_steps_on_shuffled_halves(name):
    """2 epochs × 2 minibatches = 4 plain steps, each on half of a fresh permutation of the groups (one
    torch.randperm per epoch, groups kept whole), the ratio measured against the fixed π_θold. Gradients do not
    leak from one step into the next."""
    module = MODULES[name]
    model = tiny_gpt2()
    rollout = fixed_rollout(module, model)
    # every hyperparameter away from its default, so that a call that forgot one would take another step
    # (GSPO: bounds that this rollout's sequence ratios straddle)
    hp = dict(HPARAMS[name], **({"clip_eps_low": 0.13, "clip_eps_high": 0.05} if name == "gspo" else {}))
    args = update_args(module, num_minibatches=2, update_epochs=2, beta=0.1, kl_estimator="k2", **hp)
    expected_model = copy.deepcopy(model)
    torch.manual_seed(2)  # sgd_step seeds 2 before drawing the minibatches
    orders = [torch.randperm(len(rollout.prompt_ids)) for _ in range(2)]
    for order in orders:
        for half in (order[:2], order[2:]):
            step = direct_step(module, expected_model, rows_of(module, rollout, half), args)
            with torch.no_grad():
                for name_, p in expected_model.named_parameters():
                    p.copy_(step[name_])
    actual = sgd_step(module, model, rollout, args)
    for name_, p in expected_model.named_parameters():
        torch.testing.assert_close(actual[name_], p.detach(), atol=1e-6, rtol=0, msg=name_)


@pytest.mark.parametrize("name", list(MODULES))
def test_update_without_a_reference(name):
    """β = 0: the rollout has no reference log-probs, and the step is that of the loss without a KL term."""
    module = MODULES[name]
    model = tiny_gpt2()
    rollout = fixed_rollout(module, model)._replace(ref_logprobs=None)
    initial = params_of(model)
    expected = direct_step(module, model, rollout, update_args(module, beta=0.0))
    actual = sgd_step(module, model, rollout, update_args(module, 2, beta=0.0))
    assert any(not torch.equal(expected[n], initial[n]) for n in initial)
    for n in expected:
        torch.testing.assert_close(actual[n], expected[n], atol=1e-6, rtol=0, msg=n)


@pytest.mark.parametrize("name", list(MODULES))
def test_gradient_norm_is_clipped_to_max_grad_norm(name):
    """With --max-grad-norm c below the gradient's norm, the SGD step is −∇ · c / (‖∇‖ + 1e-6) (torch's clip)."""
    module = MODULES[name]
    model = tiny_gpt2()
    rollout = fixed_rollout(module, model)
    initial = params_of(model)
    full = direct_step(module, model, rollout, update_args(module))
    grads = {n: initial[n] - full[n] for n in full}
    norm = torch.sqrt(sum(g.pow(2).sum() for g in grads.values()))
    c = float(norm) / 10
    actual = sgd_step(module, model, rollout, update_args(module, max_grad_norm=c))
    for n in grads:
        torch.testing.assert_close(actual[n], initial[n] - grads[n] * c / (norm + 1e-6), atol=1e-7, rtol=1e-5, msg=n)


@pytest.mark.parametrize("micro_batch_size", [None, 2])
def test_dapo_filler_groups_get_no_gradient(micro_batch_size):
    """Groups out of the loss mask with Â = 0 (dynamic sampling's filler) change nothing: the step on the whole
    rollout equals the step on the other groups alone, and the eq. (102) token count is that of the others."""
    model = tiny_gpt2()
    rollout = fixed_rollout(dapo, model)
    filler = torch.tensor([False, True, False, True]).repeat_interleave(4)
    masked = rollout._replace(mask=rollout.mask * (~filler).unsqueeze(1), advantages=rollout.advantages * ~filler)
    expected = direct_step(dapo, model, rows_of(dapo, rollout, [0, 2]), update_args(dapo))
    actual = sgd_step(dapo, model, masked, update_args(dapo, micro_batch_size))
    for n in expected:
        torch.testing.assert_close(actual[n], expected[n], atol=1e-6, rtol=0, msg=n)


def adam_update(module, model, rollout, args, skip: bool, seed: int = 3):
    """Parameters, Adam state and stats after an update at learning rate 1e-2, on minibatches drawn with or
    without the skip of groups without signal (the same groups in the same order: the skip only leaves some out)."""
    # eps 1e-4, not 1e-8: a gradient that is 0 in exact arithmetic (GPT-2's key bias: softmax ignores a shift) comes out
    # as rounding noise of ~1e-10, which Adam would blow up to ±lr whichever order the sums were taken in
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, eps=1e-4)
    torch.manual_seed(seed)
    epochs = [processes.draw_minibatches(rollout.advantages, args.group_size, num_minibatches=args.num_minibatches,
                                         micro_batch_size=args.micro_batch_size, skip_no_signal=skip)
              for epoch in range(args.update_epochs)]
    stats = module.update_policy(model, optimizer, rollout, epochs, args, forward_of(module, args))
    return params_of(getattr(model, "module", model)), optimizer.state_dict()["state"], stats  # DDP wraps the model


@pytest.mark.parametrize("micro_batch_size", [None, 3])
@pytest.mark.parametrize("name", list(MODULES))
def test_skipping_groups_without_signal_changes_neither_the_step_nor_the_logs(name, micro_batch_size):
    """β = 0, Adam, 3 epochs of 4 minibatches, 8 groups of which 5 have no signal (so some minibatches have none),
    micro-batches of 3 (a partial last one): skipping the groups without signal gives the parameters, Adam's state
    and the logged loss and clip fraction of running them all, up to float summation order."""
    module = MODULES[name]
    model = tiny_gpt2()
    rollout = fixed_rollout(module, model, num_groups=8, no_signal=(1, 2, 4, 5, 7))
    args = update_args(module, micro_batch_size, beta=0.0, num_minibatches=4, update_epochs=3, **HPARAMS[name])
    skipped = adam_update(module, copy.deepcopy(model), rollout, args, skip=True)
    every = adam_update(module, copy.deepcopy(model), rollout, args, skip=False)
    assert any(not torch.equal(skipped[0][n], p) for n, p in params_of(model).items())  # the update moved
    for n in every[0]:
        torch.testing.assert_close(skipped[0][n], every[0][n], atol=1e-6, rtol=0, msg=n)
    for p in every[1]:
        for k in every[1][p]:
            torch.testing.assert_close(skipped[1][p][k], every[1][p][k], atol=1e-6, rtol=1e-5, msg=k)
    for tag in ("policy_loss", "grad_norm", "gate" if name == "sapo" else "clipfrac"):
        assert skipped[2][tag] == pytest.approx(every[2][tag], rel=1e-5, abs=1e-7), tag


@pytest.mark.parametrize("name", list(MODULES))
def test_logged_loss_and_clip_fraction_do_not_depend_on_the_micro_batches(name):
    """The logged policy loss is each minibatch's loss (mean over its steps) and the clip fraction (SAPO: mean
    gate) is over all the update's tokens with signal: the same whatever --micro-batch-size, and the same as
    written out here from the formula on the whole minibatch (the first step: ratio against the fixed π_θold)."""
    module = MODULES[name]
    # GSPO: ranges whose two bounds each split this rollout's sequence ratios (0.86-1.49), so that both act
    hparams = dict(HPARAMS[name], **(dict(clip_eps_low=0.1, clip_eps_high=0.2) if name == "gspo" else {}))
    model = tiny_gpt2()
    rollout = fixed_rollout(module, model)
    logged = [adam_update(module, copy.deepcopy(model), rollout, update_args(module, size, beta=0.0, **hparams),
                          skip=True)[2] for size in (None, 2, 4)]
    for stats in logged[1:]:
        for tag in logged[0]:
            assert stats[tag] == pytest.approx(logged[0][tag], rel=1e-5, abs=1e-7), tag
    logprobs = direct_logprobs(model, rollout.prompt_ids, rollout.prompt_mask, rollout.responses, rollout.mask).detach()
    expected_loss = formula_loss(name, logprobs.double(), rollout.old_logprobs.double(), rollout.advantages.double(),
                                 rollout.mask.double(), **hparams)
    assert logged[0]["policy_loss"] == pytest.approx([float(expected_loss)], rel=1e-5)
    ratio = torch.exp(logprobs - rollout.old_logprobs)
    if name == "gspo":  # a response's tokens share its sequence ratio
        ratio = torch.exp(((logprobs - rollout.old_logprobs) * rollout.mask).sum(1) / rollout.mask.sum(1)).unsqueeze(1)
    hp = hparams
    low, high = ((hp.get("clip_eps", 0), hp.get("clip_eps", 0)) if "clip_eps" in hp
                 else (hp.get("clip_eps_low"), hp.get("clip_eps_high")))
    signal = rollout.mask * (rollout.advantages != 0).unsqueeze(1)
    if name == "sapo":
        tau = torch.where(rollout.advantages.unsqueeze(1) > 0, hp["tau_pos"], hp["tau_neg"])
        per_token = 4 * torch.sigmoid(tau * (ratio - 1)) * (1 - torch.sigmoid(tau * (ratio - 1)))
    else:
        per_token = ((ratio < 1 - low) | (ratio > 1 + high)).float()
    fraction = float((per_token * signal).sum() / signal.sum())
    assert 0 < fraction < 1 or name == "sapo"  # the clip acts on some tokens, not all
    assert logged[0]["gate" if name == "sapo" else "clipfrac"] == pytest.approx([fraction], rel=1e-5)


@pytest.mark.parametrize("name", list(MODULES))
def test_logged_kl_is_the_token_mean_of_the_estimator_over_the_whole_update(name):
    """β > 0: kl_ref is the KL estimator's mean over every token of every response (those without signal too: the
    KL term acts on them), whatever the micro-batches; at the single step here π_θ = π_θold. β = 0 logs none."""
    module = MODULES[name]
    model = tiny_gpt2()
    rollout = fixed_rollout(module, model, no_signal=(1,))
    logged = [adam_update(module, copy.deepcopy(model), rollout, update_args(module, size, **HPARAMS[name]),
                          skip=False)[2] for size in (None, 2)]
    logprobs = direct_logprobs(model, rollout.prompt_ids, rollout.prompt_mask, rollout.responses, rollout.mask).detach()
    log_r = (rollout.ref_logprobs - logprobs).double()
    k3 = torch.exp(log_r) - log_r - 1  # the k3 estimator (Schulman 2020; the equation page), written out
    expected = float((k3 * rollout.mask).sum() / rollout.mask.sum())
    for stats in logged:
        assert stats["kl_ref"] == pytest.approx([expected], rel=1e-5)
    no_kl = adam_update(module, copy.deepcopy(model), rollout, update_args(module, beta=0.0, **HPARAMS[name]),
                        skip=True)[2]
    assert "kl_ref" not in no_kl


@pytest.mark.parametrize("name", list(MODULES))
def test_a_minibatch_without_signal_skips_its_passes_and_steps_on_zeros(name):
    """β = 0 and every advantage 0: the loss's gradient is exactly 0, so the file skips the forward and backward
    passes; Adam still steps on a zero gradient, as it would have (its momentum moves the weights). The weights and
    Adam's state must equal that step's, computed here by hand. With β > 0 the KL term has a gradient: no skip.
    DAPO's filler-only minibatch (no token in the loss mask) follows the same rule."""
    module = MODULES[name]
    model = tiny_gpt2()
    rollout = fixed_rollout(module, model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    update(module, model, optimizer, rollout, update_args(module, beta=0.0))  # builds momentum
    reference = copy.deepcopy(model)
    reference_optimizer = torch.optim.Adam(reference.parameters(), lr=1e-2)
    reference_optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))  # a copy: load_state_dict shares tensors
    for p in reference.parameters():
        p.grad = torch.zeros_like(p)
    reference_optimizer.step()
    no_signal = rollout._replace(advantages=torch.zeros_like(rollout.advantages))
    if name == "dapo":
        no_signal = no_signal._replace(mask=torch.zeros_like(rollout.mask))
    forwards = []
    hook = model.register_forward_pre_hook(lambda module, inputs: forwards.append(1))
    stats = update(module, model, optimizer, no_signal, update_args(module, beta=0.0))
    assert forwards == [] and stats["grad_norm"] == [0.0]
    for (n, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.equal(p, q), n  # moved by the momentum alone (checked below: the step is not a no-op)
    assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), copy.deepcopy(model).parameters())) or True
    for p, q in zip(model.parameters(), reference.parameters()):
        for k, v in optimizer.state[p].items():
            assert torch.equal(v, reference_optimizer.state[q][k]), k
    update(module, model, optimizer, no_signal, update_args(module, beta=0.04))
    assert len(forwards) > 0  # the KL term to the reference has a gradient: the passes run
    hook.remove()


@pytest.mark.parametrize("name", list(MODULES))
def test_a_pass_looks_its_tokens_up_once(name):
    """A pass runs the shared head, the tails and the responses as three model calls, but looks their tokens up in
    the embedding matrix once (sampling.read_prompts): that matrix (49,152 × 576 for SmolLM2, tied to the output
    layer) then
    gets one dense gradient per pass, not one per call for the backward pass to add up."""
    module = MODULES[name]
    model = tiny_gpt2()
    rollout = fixed_rollout(module, model)
    lookups = []
    hook = model.get_input_embeddings().register_forward_hook(lambda m, args, out: lookups.append(out.shape))
    args = update_args(module, micro_batch_size=8, beta=0.0, num_minibatches=2)
    update(module, model, torch.optim.SGD(model.parameters(), lr=0.1), rollout, args)
    hook.remove()
    assert len(lookups) == 2  # 2 minibatches of one pass each (8 responses, their 2 prompts)


def input_ids(model, kwargs) -> torch.Tensor:
    """The tokens a model call runs, from a forward pre-hook's kwargs: their ids, or where the caller looked their
    embeddings up (sampling.embed), the rows of the embedding matrix those are."""
    if kwargs.get("input_ids") is not None:
        return kwargs["input_ids"]
    embeds = kwargs["inputs_embeds"].detach()
    return torch.cdist(embeds.flatten(0, 1), model.get_input_embeddings().weight).argmin(-1).view(embeds.shape[:2])


@pytest.mark.parametrize("micro_batch_size", [None, 4])
@pytest.mark.parametrize("name", list(MODULES))
def test_with_beta_0_only_the_groups_with_signal_go_through_the_model(name, micro_batch_size, monkeypatch):
    """β = 0: a group whose advantages are all 0 adds nothing to the gradient, so the forward and backward passes
    see only the others, each once per epoch (the step is still the whole batch's: test_group_distributed.py).
    Each pass reads a group's prompt once (sampling.read_prompts), then its responses. With β > 0 the KL term has a
    gradient on every response: all of them go through."""
    module = MODULES[name]
    model = tiny_gpt2()
    rollout = fixed_rollout(module, model, no_signal=(0, 2))
    signal = {tuple(rollout.responses[i, :-1].tolist()) for i in range(16) if rollout.advantages[i] != 0}
    assert len(signal) == 8  # the two groups with signal, 8 distinct rows
    width = rollout.responses.shape[1]
    seen, prompts_read = [], []
    hook = model.register_forward_pre_hook(
        lambda m, args, kwargs: seen.extend(input_ids(m, kwargs).tolist() if kwargs["logits_to_keep"] == width else []),
        with_kwargs=True)
    read_prompts = sampling.read_prompts

    def recording(model, prompt_ids, prompt_mask, *rest, **kwargs):
        prompts_read.extend(tuple(ids[mask.bool()].tolist()) for ids, mask in zip(prompt_ids, prompt_mask))
        return read_prompts(model, prompt_ids, prompt_mask, *rest, **kwargs)

    monkeypatch.setattr(sampling, "read_prompts", recording)
    args = update_args(module, micro_batch_size, beta=0.0, num_minibatches=2, update_epochs=2)
    update(module, model, torch.optim.SGD(model.parameters(), lr=0.1), rollout, args)
    responses = [tuple(ids[1:]) for ids in seen]  # [last prompt token, y...]
    assert sorted(responses) == sorted(list(signal) * 2)
    with_signal = {tuple(rollout.prompt_ids[g][rollout.prompt_mask[g].bool()][:-1].tolist()) for g in (1, 3)}
    assert sorted(prompts_read) == sorted(list(with_signal) * 2)  # two groups with signal, read once per epoch
    seen.clear()
    args = update_args(module, micro_batch_size, beta=0.04, num_minibatches=2, update_epochs=2)
    update(module, model, torch.optim.SGD(model.parameters(), lr=0.1), rollout, args)
    assert len(seen) == 2 * 16
    hook.remove()


# ---------------------------------------------------------------- scoring: π_θold and π_ref at the temperature

def score(module, model, ref_model, rollout, args):
    """score_responses on the rollout's samples, in the passes of a first epoch drawn as the main loop draws it."""
    samples = as_samples(module, rollout)
    return module.score_responses(model, ref_model, samples, draw_epochs(rollout, args)[0], args,
                                  forward_of(module, args))


def assert_scores(module, model, ref_model, rollout, args, reference):
    """score_responses gives log π_θold of `model` and log π_ref of `reference`, both computed directly here,
    and the two differ (so a swapped or shared scoring would show)."""
    old, ref = score(module, model, ref_model, rollout, args)
    with torch.no_grad():
        expected_old = direct_logprobs(model, rollout.prompt_ids, rollout.prompt_mask, rollout.responses, rollout.mask)
        expected_ref = direct_logprobs(reference, rollout.prompt_ids, rollout.prompt_mask, rollout.responses,
                                       rollout.mask)
    mask = rollout.mask.bool()
    torch.testing.assert_close(old[mask], expected_old[mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ref[mask], expected_ref[mask], atol=1e-5, rtol=1e-5)
    assert (old - ref)[mask].abs().max() > 1e-2  # policy and reference differ here


@pytest.mark.parametrize("name", list(MODULES))
def test_scoring_uses_the_temperature_and_the_reference_model(name):
    """score_responses (in micro-batches) gives log π_θold of the policy and log π_ref of the reference model,
    both at --temperature; the reference is a frozen copy that stays at the start when the policy moves."""
    module = MODULES[name]
    model = tiny_gpt2()
    rollout = fixed_rollout(module, model)
    args = update_args(module, micro_batch_size=4, beta=0.04, lora_rank=0)
    start = copy.deepcopy(model)
    ref_model = module.reference_model(model, args)
    assert module.reference_model(model, update_args(module, beta=0.0)) is None  # β = 0: no reference at all
    with torch.no_grad():  # the policy moves after the reference was made
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    assert_scores(module, model, ref_model, rollout, args, reference=start)


@pytest.mark.parametrize("name", list(MODULES))
def test_scoring_without_a_reference_scores_only_what_the_update_runs(name):
    """β = 0: no reference model, no reference log-probs, and π_θold's log-probs as with one, for the groups with
    signal; a group without signal runs no pass of the update, so it is not scored at all (left at 0)."""
    module = MODULES[name]
    model = tiny_gpt2()
    rollout = fixed_rollout(module, model, no_signal=(1,))
    args = update_args(module, micro_batch_size=8, beta=0.0)
    forwards = []
    hook = model.register_forward_pre_hook(lambda m, args, kwargs: forwards.append(input_ids(m, kwargs).shape),
                                           with_kwargs=True)
    old, ref = score(module, model, None, rollout, args)
    hook.remove()
    assert ref is None
    with torch.no_grad():
        expected = direct_logprobs(model, rollout.prompt_ids, rollout.prompt_mask, rollout.responses, rollout.mask)
    signal = rollout.mask.bool() & (rollout.advantages != 0).unsqueeze(1)
    torch.testing.assert_close(old[signal], expected[signal], atol=1e-5, rtol=1e-5)
    assert torch.equal(old[4:8], torch.zeros(4, 8))  # group 1: no signal, not scored
    assert sum(shape[0] for shape in forwards if shape[1] == rollout.responses.shape[1]) == 12  # 3 groups' responses


@pytest.mark.parametrize("name", list(MODULES))
def test_gradients_are_synchronised_once_per_optimiser_step(name, monkeypatch):
    """Under torchrun only the last micro-batch of a minibatch may all-reduce the gradients (gradient_sync(last=True)):
    one per optimiser step, whatever the micro-batch size. Recorded here in one process."""
    module = MODULES[name]
    flags = []

    def gradient_sync(model, last):
        flags.append(last)
        return module.contextlib.nullcontext()

    monkeypatch.setattr(processes, "gradient_sync", gradient_sync)
    model = tiny_gpt2()
    rollout = fixed_rollout(module, model)
    for micro_batch_size, expected in ((None, [True, True]), (4, [False, True] * 2),
                                       (2, [False, False, False, True] * 2)):
        flags.clear()
        sgd_step(module, model, rollout, update_args(module, micro_batch_size, num_minibatches=2))
        assert flags == expected, micro_batch_size


@pytest.mark.parametrize("name", list(MODULES))
def test_lora_reference_is_the_base_model_with_the_adapters_off(name):
    """With LoRA the reference is the policy with its adapters switched off: log π_ref is the base model's,
    log π_θold the adapted model's (the adapters are made non-zero first, as after training)."""
    module = MODULES[name]
    model = tiny_gpt2()
    base = copy.deepcopy(model)
    rollout = fixed_rollout(module, model)
    args = update_args(module, beta=0.04, lora_rank=1, lora_alpha=8.0)  # rank 1: the smallest rank is still LoRA
    model = policy.add_lora(model, args.lora_rank, args.lora_alpha)
    ref_model = module.reference_model(model, args)
    assert ref_model is model  # no second copy: the reference is the policy with its adapters off
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.add_(0.3 * torch.randn_like(p))
    assert_scores(module, model, ref_model, rollout, args, reference=base)


@pytest.mark.parametrize("share_prompt", [True, False])
def test_response_logits_are_divided_by_the_temperature(share_prompt):
    """response_logits, with the prompt read once per group or with each response (gradient checkpointing),
    gives the log-probs of [prompt; response] written out here, at the temperature."""
    model = tiny_gpt2()
    rollout = fixed_rollout(grpo, model)
    index = torch.arange(16) // 4
    with torch.no_grad():
        for temperature in (TEMPERATURE, 2.5):
            logits = grpo.response_logits(model, rollout.prompt_ids, rollout.prompt_mask, index, rollout.responses,
                                          temperature, share_prompt)
            logprobs = grpo.token_logprobs(logits, rollout.responses)
            # direct_logprobs divides by TEMPERATURE
            expected = direct_logprobs(model, rollout.prompt_ids, rollout.prompt_mask, rollout.responses,
                                       rollout.mask) * TEMPERATURE / temperature
            sequences = torch.cat([rollout.prompt_ids[index], rollout.responses], dim=1)
            attention = torch.cat([rollout.prompt_mask[index], rollout.mask.long()], dim=1)
            raw = model(input_ids=sequences, attention_mask=attention,
                        position_ids=(attention.cumsum(-1) - 1).clamp(min=0)).logits[:, 4:-1] / temperature
            expected = torch.log_softmax(raw, -1).gather(-1, rollout.responses.unsqueeze(-1)).squeeze(-1)
            mask = rollout.mask.bool()
            torch.testing.assert_close(logprobs[mask], expected[mask], atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- the main loops, run in-process with spies

class RecordingTask:
    """The task, with every training-round reward recorded next to the round's responses."""

    def __init__(self, task, log):
        self.task, self.log, self.reward_fn = task, log, task.reward

    def __getattr__(self, name):
        return getattr(self.task, name)

    def reward(self, text, target):
        value = self.reward_fn(text, target)
        if self.log and self.log[-1]["open"]:
            self.log[-1]["accuracies"].append(value)
        return value


def run_main(module, argv, monkeypatch, tmp_path, responses_for=None):
    """Execute the file's main block in a copy of its namespace in which sample(), the task and update_policy()
    are wrapped to record what each sampling round drew and what the update received. `responses_for(prompts,
    tokenizer, args)`, if given, writes the training rounds' responses instead of the model (answer texts, None
    for an answer cut at --max-new-tokens)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [module.__file__, *argv])
    rounds, updates = [], []
    namespace = dict(vars(module), __name__="__main__")
    real_sample, real_update = module.sample, module.update_policy

    def sample(model, prompt_format, prompts, args, device, num_samples, greedy=False, generator=None):
        out = real_sample(model, prompt_format, prompts, args, device, num_samples, greedy, generator)
        training = num_samples == args.group_size and greedy is False
        tokenizer = prompt_format.tokenizer
        if training and responses_for is not None:
            out = designed_round(module, out, responses_for(prompts, tokenizer, args), tokenizer, args)
        rounds.append(dict(open=training, keys=row_keys(out, num_samples), mask=out.mask, truncated=out.truncated,
                           accuracies=[]))
        rounds[-1]["training"] = training
        return out

    def update_policy(model, optimizer, rollout, epochs, args, forward):
        for r in rounds:  # evaluate() samples through the module's own sample(): its rewards are not the round's
            r["open"] = False
        updates.append(rollout)
        return real_update(model, optimizer, rollout, epochs, args, forward)

    def get_task(name, eval_task=None):
        return RecordingTask(module.get_task(name, eval_task), rounds)

    # The file's own functions (dapo.py's dynamic_sampling) must call the recording sample() too: rebind them here.
    for name, value in list(namespace.items()):
        if isinstance(value, types.FunctionType) and value.__globals__ is vars(module):
            namespace[name] = types.FunctionType(value.__code__, namespace, name, value.__defaults__, value.__closure__)
    def rollout_stats(samples, rewards, advantages, accuracies, **rest):
        logged.append(dict(rewards=rewards.tolist(), accuracies=accuracies.tolist()))
        return runs.rollout_stats(samples, rewards, advantages, accuracies, **rest)

    class IterationLog(runs.IterationLog):
        def end_iteration(self, iteration, scalars, *rest):
            logged.append(scalars)
            return super().end_iteration(iteration, scalars, *rest)

    logged = []
    recording_runs = types.SimpleNamespace(**{**vars(runs), "IterationLog": IterationLog,
                                              "rollout_stats": rollout_stats})
    namespace.update(sample=sample, update_policy=update_policy, get_task=get_task, runs=recording_runs)
    tree = ast.parse(open(module.__file__, encoding="utf-8").read())
    (main,) = [node for node in tree.body if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)]
    exec(compile(ast.Module(body=main.body, type_ignores=[]), module.__file__, "exec"), namespace)
    run_main.logged = logged  # what the iteration logged: rollout_stats' inputs, then the scalars
    return [r for r in rounds if r["training"]], updates


def designed_round(module, out, answers, tokenizer, args):
    """The sampled round with its responses replaced: each answer text then EOS, or (None) a cut response of
    --max-new-tokens digits without EOS; the mask and the cut flags recomputed as sample() computes them."""
    rows = [[tokenizer.convert_tokens_to_ids("9")] * args.max_new_tokens if answer is None else
            tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for answer in answers]
    width = max(map(len, rows))  # sampling stops when every row has ended: rounds differ in width
    rows = [ids + [tokenizer.pad_token_id] * (width - len(ids)) for ids in rows]
    responses = torch.tensor(rows, dtype=out.responses.dtype)
    mask, truncated = module.response_mask(responses, torch.tensor([tokenizer.eos_token_id]))
    return out._replace(responses=responses, mask=mask, truncated=truncated, entropies=torch.zeros_like(mask),
                        logprobs=torch.zeros_like(mask))


def row_keys(samples, group_size):
    """Each row as (its prompt tokens, its response tokens), padding left out: identifies a row after reordering."""
    keys = []
    for i, (row, mask) in enumerate(zip(samples.responses.tolist(), samples.mask.tolist())):
        prompt = samples.prompt_ids[i // group_size][samples.prompt_mask[i // group_size].bool()].tolist()
        keys.append((tuple(prompt), tuple(t for t, m in zip(row, mask) if m)))
    return keys


def hand_advantages(rewards, group_size):
    """eq. (90)-(91): (R − group mean) / sqrt(population variance + 1e-6); exactly 0 for a group of equal rewards."""
    out = []
    for start in range(0, len(rewards), group_size):
        group = rewards[start : start + group_size]
        mean = sum(group) / group_size
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / group_size + 1e-6)
        out += [0.0 if len(set(group)) == 1 else (r - mean) / std for r in group]
    return out


def hand_penalty(length, max_new_tokens, buffer):
    """DAPO §3.4: 0 up to max_new_tokens − buffer tokens, then linear down to −1 at max_new_tokens."""
    return min(0.0, max(-1.0, (max_new_tokens - buffer - length) / buffer))


@pytest.mark.parametrize("overlong_filtering, prompts, max_rounds", [(False, 3, 4), (True, 8, 1)])
def test_dapo_main_loop_filters_on_accuracy_and_masks_filler_and_cut_responses(overlong_filtering, prompts, max_rounds,
                                                                              monkeypatch, tmp_path):
    """dapo.py's main loop, one iteration on the embedded model, with rounds of responses written by the test: right
    answers short and long ("85", "1+85": the reward reads the last number), wrong ones, some cut at --max-new-tokens,
    and a length penalty from 2 tokens on. A group of wrong answers of different lengths has different shaped rewards
    but equal accuracy: dynamic sampling drops it (the DAPO recipe filters on accuracy). Rounds go on until B groups
    have signal (or --max-sampling-rounds); the batch is the signal groups in sampling order, then filler; the loss
    mask keeps exactly the rows of signal groups (and, with --overlong-filtering, only their finished responses), all
    their tokens; the advantages are eq. (90)-(91) of the shaped rewards."""
    group_size, max_new_tokens, buffer = 4, 8, 7

    def responses_for(prompts, tokenizer, args):
        """Per group, by the prompt's place in its round: right answers of two lengths and wrong ones (signal);
        wrong answers of different lengths (no signal, yet different shaped rewards); all right (no signal);
        right answers and a cut response (signal, cut)."""
        answers, round_index = [], len(calls)
        calls.append(prompts)
        for i, prompt in enumerate(prompts):
            a, b = prompt.rstrip("=").split("+")
            right, wrong = str(int(a) + int(b)), "0" if int(a) + int(b) else "1"
            cut = None if round_index % 2 == 0 else "11+" + wrong  # every other round without a cut response
            answers += [[right, "1+" + right, wrong, "11+" + wrong], [wrong, "1+" + wrong, cut, wrong],
                        [right] * 4, [right, "1+" + right, cut, wrong]][i % 4]
        return answers

    calls = []
    argv = ["--num-iterations", "1", "--prompts-per-iteration", str(prompts), "--group-size", str(group_size),
            "--max-new-tokens", str(max_new_tokens), "--overlong-buffer", str(buffer),
            "--max-sampling-rounds", str(max_rounds), "--num-minibatches", "1", "--eval-size", "2",
            "--eval-every", "100"]
    if overlong_filtering:
        argv.append("--overlong-filtering")
    rounds, (rollout,) = run_main(dapo, argv, monkeypatch, tmp_path, responses_for)

    # what was sampled, group by group, in sampling order
    keys = [key for r in rounds for key in r["keys"]]
    accuracies = [a for r in rounds for a in r["accuracies"]]
    lengths = [n for r in rounds for n in r["mask"].sum(1).tolist()]
    truncated = [bool(t) for r in rounds for t in r["truncated"]]
    shaped = [2 * a - 1 + hand_penalty(n, max_new_tokens, buffer) for a, n in zip(accuracies, lengths)]  # ±1 + penalty
    groups = [list(range(g, g + group_size)) for g in range(0, len(keys), group_size)]
    signal = [len({accuracies[i] for i in g}) > 1 for g in groups]
    # the case of the DAPO recipe: equal accuracy, different lengths → different shaped rewards, yet no signal
    assert any(len({shaped[i] for i in g}) > 1 and not s for g, s in zip(groups, signal))

    # rounds until B groups have signal, then the batch: signal groups first, then filler, in sampling order
    per_round = [sum(signal[k * prompts : (k + 1) * prompts]) for k in range(len(rounds))]
    expected_rounds = next((k + 1 for k in range(max_rounds) if sum(per_round[: k + 1]) >= prompts), max_rounds)
    assert len(rounds) == expected_rounds
    chosen = ([g for g, s in zip(groups, signal) if s] + [g for g, s in zip(groups, signal) if not s])[:prompts]
    rows = [i for g in chosen for i in g]
    for position, i in enumerate(rows):  # the batch's prompts (one per group) and responses are those rows'
        group = position // group_size
        prompt = tuple(rollout.prompt_ids[group][rollout.prompt_mask[group].bool()].tolist())
        assert (prompt, tuple(rollout.responses[position, : int(lengths[i])].tolist())) == keys[i], position
    if overlong_filtering:  # the flag must have something to do: a cut response in a signal group
        assert any(truncated[i] for g, s in zip(groups, signal) if s for i in g)
    for position, i in enumerate(rows):
        on = signal[groups.index(next(g for g in groups if i in g))] and not (overlong_filtering and truncated[i])
        assert rollout.mask[position].sum() == (lengths[i] if on else 0), (position, keys[i])

    # advantages: the hand formula of the shaped rewards, groups whole; filler groups (no signal) get 0
    expected = torch.tensor(hand_advantages([shaped[i] for i in rows], group_size), dtype=rollout.advantages.dtype)
    mixed = torch.tensor([signal[groups.index(next(g for g in groups if i in g))] for i in rows])
    torch.testing.assert_close(rollout.advantages, expected * mixed, atol=1e-5, rtol=1e-5)

    # what is logged: the task's accuracy next to the shaped reward of the batch rows, how many rounds were sampled
    # and the share of signal groups among all that was sampled
    stats_inputs, scalars = run_main.logged
    assert stats_inputs["accuracies"] == [accuracies[i] for i in rows]
    assert stats_inputs["rewards"] == pytest.approx([shaped[i] for i in rows])
    assert scalars["charts/sampling_rounds"] == len(rounds)
    # a (part, whole) pair, which the log sums over the processes before dividing (the smoke test reads the share)
    assert scalars["charts/mixed_group_fraction"] == (sum(signal), len(signal))


@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("name", list(MODULES))
def test_the_first_minibatch_ratio_is_exactly_one(name, beta, monkeypatch, tmp_path):
    """The main loop scores π_θold in the very passes of the first epoch's update: the first optimiser step sees
    log π_θ equal to log π_θold bit for bit, on every token of every pass (ratio exactly 1, nothing clipped). The
    later steps, after the weights moved, do not."""
    calls = []

    module = MODULES[name]
    real = module.policy_loss

    def policy_loss(logprobs, old_logprobs, advantages, mask, **kwargs):
        calls.append((logprobs.detach().clone(), old_logprobs.clone(), mask.clone()))
        groups.append(advantages.clone())
        return real(logprobs, old_logprobs, advantages, mask, **kwargs)

    groups = []  # the advantages of each pass: one group of 8 (--micro-batch-size = --group-size)
    monkeypatch.setattr(module, "policy_loss", policy_loss)  # what update_policy calls
    argv = ["--num-iterations", "1", "--prompts-per-iteration", "8", "--num-minibatches", "2",
            "--micro-batch-size", "8", "--update-epochs", "2", "--beta", str(beta), "--eval-size", "2",
            "--eval-every", "100"]
    run_main(module, argv, monkeypatch, tmp_path)
    first_step = len(calls) // 4 if beta > 0 else None  # β > 0: every group runs, 4 passes per minibatch
    if beta > 0:
        assert len(calls) == 2 * 8  # the KL term acts on every group: all 8 run in each of the 2 epochs
    else:
        assert all(advantages.abs().sum() > 0 for advantages in groups)  # β = 0: only the groups with signal
    assert len(calls) >= 2
    steps = calls[:first_step] if first_step else calls[:1]
    for logprobs, old_logprobs, mask in steps:
        assert torch.equal(logprobs[mask.bool()], old_logprobs[mask.bool()])
    assert any(not torch.equal(lp[m.bool()], old[m.bool()]) for lp, old, m in calls[len(calls) // 2 :])  # moved


def test_dapo_rewards_a_right_answer_cut_at_the_cap_above_a_wrong_one(monkeypatch, tmp_path):
    """DAPO's reward is ±1 for right and wrong plus the overlong penalty in [−1, 0]. Two groups, a right answer of
    exactly --max-new-tokens tokens (penalty −1) in each: [right at the cap, 3 short wrong ones] and [right at the
    cap, right short, 2 short wrong]. Worked out by hand, rewards [0, −1, −1, −1] and [0, 1, −1, −1], advantages
    (R − mean) / sqrt(var + 1e-6): [1.7320, −0.5773 × 3] and [0.3015, 1.5076, −0.9045, −0.9045]. (With a 0/1
    accuracy instead of ±1, the first group's rewards would be all 0, and the second's right answer at the cap
    would get −0.5773 like the wrong ones.)"""
    max_new_tokens, buffer = 8, 4

    def responses_for(prompts, tokenizer, args):
        answers = []
        for i, prompt in enumerate(prompts):
            a, b = prompt.rstrip("=").split("+")
            right = str(int(a) + int(b))
            at_cap = " " * (max_new_tokens - 1 - len(right)) + right  # with its EOS: exactly max_new_tokens tokens
            wrong = "1" if right != "1" else "2"
            answers += [[at_cap, wrong, wrong, wrong], [at_cap, right, wrong, wrong]][i]
        return answers

    argv = ["--num-iterations", "1", "--prompts-per-iteration", "2", "--group-size", "4", "--max-new-tokens",
            str(max_new_tokens), "--overlong-buffer", str(buffer), "--max-sampling-rounds", "1",
            "--num-minibatches", "1", "--eval-size", "2", "--eval-every", "100"]
    rounds, (rollout,) = run_main(dapo, argv, monkeypatch, tmp_path, responses_for)
    lengths = rounds[0]["mask"].sum(1).tolist()
    assert lengths[0] == lengths[4] == 8 and max(lengths[1:4] + lengths[5:]) <= max_new_tokens - buffer  # no penalty
    assert run_main.logged[0]["rewards"] == pytest.approx([0, -1, -1, -1, 0, 1, -1, -1])
    expected = [1.7320, -0.5773, -0.5773, -0.5773, 0.3015, 1.5076, -0.9045, -0.9045]
    assert rollout.advantages.tolist() == pytest.approx(expected, abs=1e-4)
