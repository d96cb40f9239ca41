"""Classic control: the pure functions of vpg.py, a2c.py, trpo.py, ppo.py and the relations between them.

The relations: PPO inside the clip band = -TRPO surrogate; grad PPO = grad VPG at ratio 1; compute_gae is the
same in every file and matches a hand-computed example with a truncation and a termination; conjugate
gradient solves an SPD system; log-probs and entropies match their closed forms; the worked clip example.
"""
import importlib
import inspect
import math

import gymnasium as gym
import pytest
import torch
from conftest import CLASSIC

FILES = CLASSIC
MODULES = {name: importlib.import_module(name) for name in FILES}
vpg, a2c, trpo, ppo = (MODULES[n] for n in FILES)


def test_import_has_no_side_effects():
    # importing must not parse the command line, build envs or write logs: only definitions
    for mod in MODULES.values():
        assert hasattr(mod, "Args") and hasattr(mod, "compute_gae")
        assert not hasattr(mod, "envs") and not hasattr(mod, "writer")


@pytest.mark.parametrize("name", ["compute_gae", "normalize", "layer_init", "mlp", "Agent", "Adam", "make_envs"])
def test_shared_code_is_identical_in_all_files(name):
    # the files share these verbatim, so that `diff ppo.py a2c.py` shows only the algorithm
    sources = {f: inspect.getsource(getattr(MODULES[f], name)) for f in FILES}
    assert len(set(sources.values())) == 1, f"{name} differs between files"


# ---------------------------------------------------------------------------------------------
# compute_gae, eq. (80)-(81)


def test_compute_gae_hand_example_with_truncation_and_termination():
    """One env, NEXT_STEP autoreset, gamma = 0.9, lambda = 0.5.

    t=0  obs s0                       r=1                      V=1.0
    t=1  obs s1, TRUNCATED here       r=1 + 0.9 * V(final)=2.8 V=0.5   (V(final obs) = 2.0)
    t=2  obs = final obs (dones=1)    r=0, reset step          V=2.0   (dropped from the loss)
    t=3  obs s0'                      r=1                      V=0.4
    t=4  obs s1', TERMINATED here     r=1                      V=0.3
    t=5  obs = final obs (dones=1)    r=0, reset step          V=0.7
    next obs = new episode (next_done=0), V=0.6
    """
    g, lam = 0.9, 0.5
    rewards = torch.tensor([1.0, 1 + g * 2.0, 0.0, 1.0, 1.0, 0.0])[:, None]
    values = torch.tensor([1.0, 0.5, 2.0, 0.4, 0.3, 0.7])[:, None]
    dones = torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0, 1.0])[:, None]
    next_value, next_done = torch.tensor([0.6]), torch.tensor([0.0])
    # by hand: termination cuts the return, truncation bootstraps from V(final obs) = 2.0
    a4 = 1 - 0.3  # terminated: delta = r - V, nothing after it
    a3 = (1 + g * 0.3 - 0.4) + g * lam * a4
    a1 = 1 + g * 2.0 - 0.5  # truncated: r + gamma V(final) - V, and the recursion stops here
    a0 = (1 + g * 0.5 - 1.0) + g * lam * a1
    for name, mod in MODULES.items():
        adv, ret = mod.compute_gae(rewards, values, dones, next_value, next_done, g, lam)
        keep = dones[:, 0] == 0  # the reset steps t=2 and t=5 never enter the loss
        expected = torch.tensor([a0, a1, a3, a4])
        torch.testing.assert_close(adv[keep, 0], expected, msg=name)
        torch.testing.assert_close(ret[keep, 0], expected + values[keep, 0], msg=name)  # eq. (81)
    assert (a0, a1, a3, a4) == pytest.approx((1.485, 2.3, 1.185, 0.7))


def test_compute_gae_lambda_one_is_discounted_reward_to_go():
    # eq. (38): with lambda = 1 the return target is the Monte-Carlo reward-to-go (VPG), bootstrapped
    # from next_value only when the rollout ends mid-episode
    torch.manual_seed(0)
    T, N, g = 7, 3, 0.97
    rewards, values = torch.randn(T, N), torch.randn(T, N)
    dones = torch.zeros(T, N)
    dones[3, 1] = 1.0  # env 1: an episode ended after step 2
    next_value, next_done = torch.randn(N), torch.tensor([0.0, 0.0, 1.0])
    expected = torch.zeros(T, N)
    for n in range(N):
        running = next_value[n] * (1 - next_done[n])
        for t in reversed(range(T)):
            if t + 1 < T and dones[t + 1, n]:
                running = torch.tensor(0.0)
            running = rewards[t, n] + g * running
            expected[t, n] = running
    for name, mod in MODULES.items():
        _, ret = mod.compute_gae(rewards, values, dones, next_value, next_done, g, 1.0)
        torch.testing.assert_close(ret, expected, msg=name)


def test_compute_gae_same_in_all_files():
    torch.manual_seed(1)
    T, N = 16, 4
    args = (torch.randn(T, N), torch.randn(T, N), (torch.rand(T, N) < 0.2).float(), torch.randn(N),
            torch.tensor([0.0, 1.0, 0.0, 1.0]), 0.99, 0.95)
    ref = ppo.compute_gae(*args)
    for name, mod in MODULES.items():
        out = mod.compute_gae(*args)
        torch.testing.assert_close(out[0], ref[0], msg=name)
        torch.testing.assert_close(out[1], ref[1], msg=name)


@pytest.mark.parametrize("name", FILES)
def test_normalize_never_nan(name):
    norm = MODULES[name].normalize
    assert torch.equal(norm(torch.full((5,), 3.0)), torch.zeros(5))  # zero spread
    assert torch.equal(norm(torch.tensor([7.0])), torch.zeros(1))  # a single sample
    x = norm(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert abs(x.mean().item()) < 1e-6 and abs(x.std(correction=0).item() - 1) < 1e-5


# ---------------------------------------------------------------------------------------------
# Policy losses: the relations between files


def _batch(seed=0, n=64, band=None):
    gen = torch.Generator().manual_seed(seed)
    old = torch.randn(n, generator=gen) - 1.0
    if band is None:
        logratio = torch.zeros(n)
    else:  # ratios strictly inside (1 - band, 1 + band)
        logratio = torch.log(1 + (2 * torch.rand(n, generator=gen) - 1) * band * 0.99)
    adv = torch.randn(n, generator=gen)
    return old + logratio, old, adv


def test_ppo_inside_band_equals_negated_trpo_surrogate():
    clip_eps = 0.2
    logprobs, old, adv = _batch(band=clip_eps)
    ratio = (logprobs - old).exp()
    assert ((ratio > 1 - clip_eps) & (ratio < 1 + clip_eps)).all() and not torch.allclose(ratio, torch.ones_like(ratio))
    torch.testing.assert_close(ppo.policy_loss(logprobs, old, adv, clip_eps), -trpo.surrogate(logprobs, old, adv))


def test_ppo_outside_band_differs_from_trpo():
    # sanity check of the test above: with ratios far outside the band the clip must act
    logprobs, old, adv = _batch()
    logprobs = old + torch.where(adv > 0, 1.0, -1.0)  # every ratio moved in its "improving" direction
    assert ppo.policy_loss(logprobs, old, adv, 0.2) > -trpo.surrogate(logprobs, old, adv) + 0.1


def _grad(loss_fn, logprobs):
    x = logprobs.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(loss_fn(x), x)
    return g


def test_ppo_trpo_vpg_a2c_gradients_equal_at_ratio_one():
    # at theta = theta_old the ratio is 1 and grad r = grad log pi: every surrogate gives the
    # policy gradient -mean(A grad log pi) of eq. (39)/(47) (common/EQUATIONS.md#sec-ratio-gradient)
    logprobs, old, adv = _batch(seed=3)
    g_vpg = _grad(lambda x: vpg.policy_loss(x, adv), logprobs)
    torch.testing.assert_close(g_vpg, -adv / len(adv))
    torch.testing.assert_close(_grad(lambda x: a2c.policy_loss(x, adv), logprobs), g_vpg)
    torch.testing.assert_close(_grad(lambda x: ppo.policy_loss(x, old, adv, 0.2), logprobs), g_vpg)
    torch.testing.assert_close(_grad(lambda x: -trpo.surrogate(x, old, adv), logprobs), g_vpg)


def test_seed_clip_worked_example():
    # the worked clip example (common/EQUATIONS.md#sec-ppo-clip-example)
    # r = 0.5, A = -10, eps = 0.2: min(-5, -8) = -8, and the gradient is 0
    logprob = torch.log(torch.tensor([0.5])).requires_grad_(True)
    loss = ppo.policy_loss(logprob, torch.zeros(1), torch.tensor([-10.0]), 0.2)
    assert loss.item() == pytest.approx(8.0)  # the loss is the negated objective -(-8)
    (g,) = torch.autograd.grad(loss, logprob)
    assert g.item() == 0.0
    # and the mirror case: A > 0, r = 1.5 > 1 + eps: objective (1 + eps) A, also no gradient
    logprob = torch.log(torch.tensor([1.5])).requires_grad_(True)
    loss = ppo.policy_loss(logprob, torch.zeros(1), torch.tensor([10.0]), 0.2)
    assert loss.item() == pytest.approx(-12.0)
    assert torch.autograd.grad(loss, logprob)[0].item() == 0.0


# ---------------------------------------------------------------------------------------------
# TRPO's solver


def test_conjugate_gradient_solves_spd_system():
    gen = torch.Generator().manual_seed(0)
    m = torch.randn(6, 6, generator=gen, dtype=torch.float64)
    A = m @ m.T + 6 * torch.eye(6, dtype=torch.float64)
    x_true = torch.randn(6, generator=gen, dtype=torch.float64)
    b = A @ x_true
    calls = []

    def fvp(v):
        calls.append(1)
        return A @ v

    x = trpo.conjugate_gradient(fvp, b, iters=6)  # exact in dim(b) steps, up to rounding
    torch.testing.assert_close(x, x_true)
    assert len(calls) <= 6
    x2 = trpo.conjugate_gradient(fvp, b, iters=2)  # a few steps already reduce the residual
    assert (A @ x2 - b).norm() < b.norm()


def test_conjugate_gradient_on_fisher_of_categorical():
    # the Fisher-vector product used in trpo.py: Hessian of the mean KL at theta_old
    torch.manual_seed(0)
    agent = trpo.Agent(3, gym.spaces.Discrete(3))
    params = list(agent.actor.parameters())
    obs = torch.randn(32, 3)
    with torch.no_grad():
        old = agent.get_dist(obs)
    kl = torch.distributions.kl_divergence(old, agent.get_dist(obs)).mean()
    grad_kl = trpo.flat_grad(kl, params, create_graph=True)

    def fvp(v):
        return trpo.flat_grad(grad_kl @ v, params, retain_graph=True) + 0.1 * v

    v = torch.randn(grad_kl.numel())
    u = torch.randn(grad_kl.numel())
    assert (u @ fvp(v)).item() == pytest.approx((v @ fvp(u)).item(), rel=1e-4)  # symmetric
    assert (v @ fvp(v)).item() > 0  # positive definite (with damping)
    b = torch.randn(grad_kl.numel())
    x = trpo.conjugate_gradient(fvp, b, iters=50)
    assert (fvp(x) - b).norm() < 1e-2 * b.norm()


# ---------------------------------------------------------------------------------------------
# Policies: closed forms of log-probs and entropies


@pytest.mark.parametrize("name", FILES)
def test_categorical_logprob_and_entropy(name):
    torch.manual_seed(0)
    agent = MODULES[name].Agent(4, gym.spaces.Discrete(3))
    obs = torch.randn(5, 4)
    dist = agent.get_dist(obs)
    actions = dist.sample()
    p = torch.softmax(agent.actor(obs), dim=-1)
    torch.testing.assert_close(dist.log_prob(actions), p.gather(1, actions[:, None]).squeeze(1).log())
    torch.testing.assert_close(dist.entropy(), -(p * p.log()).sum(-1))
    # a fresh actor is near-uniform (last layer scaled by 0.01): entropy close to log 3
    assert dist.entropy().min() > 0.99 * math.log(3)


@pytest.mark.parametrize("name", FILES)
def test_gaussian_logprob_and_entropy(name):
    torch.manual_seed(0)
    agent = MODULES[name].Agent(3, gym.spaces.Box(-2.0, 2.0, (2,)))
    with torch.no_grad():
        agent.actor_logstd.copy_(torch.tensor([-0.5, 0.3]))
    obs = torch.randn(5, 3)
    dist = agent.get_dist(obs)
    actions = torch.randn(5, 2)
    mean, std = agent.actor(obs), torch.tensor([-0.5, 0.3]).exp()
    log_density = -((actions - mean) ** 2) / (2 * std**2) - std.log() - 0.5 * math.log(2 * math.pi)
    torch.testing.assert_close(dist.log_prob(actions), log_density.sum(-1))
    entropy = (0.5 + 0.5 * math.log(2 * math.pi) + std.log()).sum()
    torch.testing.assert_close(dist.entropy(), entropy.expand(5))
    # the log-std is a parameter of the actor, not a function of the state
    assert dist.log_prob(actions).shape == (5,) and "actor_logstd" in dict(agent.named_parameters())


@pytest.mark.parametrize("name", FILES)
def test_orthogonal_init_and_separate_networks(name):
    torch.manual_seed(0)
    agent = MODULES[name].Agent(4, gym.spaces.Discrete(2))
    w = agent.critic[0].weight  # 64 x 4, orthogonal columns scaled by sqrt(2)
    torch.testing.assert_close(w.T @ w, 2 * torch.eye(4), atol=1e-5, rtol=0)
    assert agent.actor[-1].weight.norm() < 0.05  # actor head scaled by 0.01
    assert not set(map(id, agent.actor.parameters())) & set(map(id, agent.critic.parameters()))


@pytest.mark.parametrize("name", FILES)
def test_adam_matches_torch_optim(name):
    torch.manual_seed(0)
    net_a = MODULES[name].mlp(3, 2, out_std=1.0)
    net_b = MODULES[name].mlp(3, 2, out_std=1.0)
    net_b.load_state_dict(net_a.state_dict())
    ours = MODULES[name].Adam(net_a.parameters(), lr=1e-2)
    ref = torch.optim.Adam(net_b.parameters(), lr=1e-2, eps=1e-5)
    for step in range(5):
        x = torch.randn(8, 3)
        for net, opt in ((net_a, ours), (net_b, ref)):
            opt.zero_grad()
            net(x).pow(2).mean().backward()
            opt.step()
    for pa, pb in zip(net_a.parameters(), net_b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=1e-5, atol=1e-6)


def test_far_off_policy_ratios_stay_finite():
    """Ratios of exp(±50) and beyond (numerical edge cases):
    PPO's loss and TRPO's surrogate stay finite, gradients too."""
    import ppo
    import trpo

    logprobs = torch.tensor([100.0, -100.0, 50.0, -50.0], requires_grad=True)
    old, advantages = torch.zeros(4), torch.tensor([1.0, -1.0, -1.0, 1.0])
    for value in (ppo.policy_loss(logprobs, old, advantages, 0.2), trpo.surrogate(logprobs, old, advantages)):
        (grad,) = torch.autograd.grad(value, logprobs)
        assert torch.isfinite(value) and torch.isfinite(grad).all()
