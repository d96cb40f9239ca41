"""Toy problems computed exactly and checked by sampling: two failures behind trust regions, and a length bias.

Sources: TRPO, J. Schulman, S. Levine, P. Moritz, M. Jordan, P. Abbeel (2015), arXiv:1502.05477, §2-3 (the
local approximation L_π); S. Kakade, J. Langford (2002), ICML (the performance difference identity).
The derivations step by step: common/EQUATIONS.md#sec-toy-pathologies.

1. A surrogate that predicts a gain while the return collapses. Three states: at s0, a0 ends the episode
   and a1 moves to s1; at s1, g pays +1 and b pays -M. The old policy π almost never goes to s1
   (π(a1|s0) = η = 1e-4) and rarely plays b there (π(b|s1) = η2 = 1e-3). The new policy π' always goes
   to s1 and always plays b: its return is -γM = -90. The surrogate L_π(π') weights each state's
   advantages by how often *π* visits it, so it sees the gain at s0 (under π, going to s1 pays) and
   barely sees the loss at s1: it predicts +0.8. The exact change weights them by the visits of *π'*.

2. Correcting for that with trajectory importance weights is unbiased but hopeless. Reweighting an
   episode by w(τ) = Π_t π'(a_t)/π(a_t) keeps E[w] = 1, but with Bernoulli policies p = 0.5 (behaviour)
   and q = 0.9 (target) Var[w] = 1.64^H - 1 grows exponentially with the horizon H. And the sample
   variance does not warn you: the variance lives in rare episodes with huge weights, which a finite
   batch seldom contains, so for long horizons the estimate comes out far too small.

3. GRPO's 1/|o_i| makes wrong answers longer and right ones shorter, but only if the policy can tell them
   apart. GRPO (Shao et al. 2024, arXiv:2402.03300) averages each response's token losses, so response i gets
   (Â_i/|o_i|) ∇log π(o_i), eq. (97) of common/EQUATIONS.md; Dr. GRPO (Liu et al. 2025, arXiv:2503.20783)
   divides by a constant T_max, eq. (100), and DAPO (Yu et al. 2025, arXiv:2503.14476) by the tokens of the
   batch, eq. (102). A tabular length policy, with correctness given and the length drawn from softmax logits
   after right and after wrong answers, shows it: under GRPO a wrong response (Â < 0) is pushed down less the
   longer it is, a right one (Â > 0) up more the shorter it is. Dr. GRPO's expected gradient is exactly zero,
   DAPO's tiny (its weight 1/Σ_j L_j barely depends on L_i). If instead one set of logits serves both (length
   cannot depend on correctness), every method's expected gradient is exactly zero: the Â of a group sum to
   zero and are independent of the lengths. So the bias needs a policy whose length can follow correctness,
   which a small language model may never learn (then the lengths only wander).

Examples 1 and 2 are computed exactly first (policy evaluation by a linear solve, enumeration of trajectories
and of the binomial count of 1-actions), then checked by Monte Carlo, once per --seeds value. Example 3
computes its expected gradients in closed form and by enumerating every outcome of a small batch, then
trains the length policy by SGD, once per method and --seeds value.

    python -m common.lab.toys                              # writes runs/lab/toy_pathologies.png
    python -m common.lab.toys --out /tmp/lab --seeds 1 2 3 4 5
    python -m common.lab.toys length-bias                  # writes runs/lab/length_bias_toy.png

Only numpy is needed; the figure needs matplotlib (imported lazily).
"""

import argparse
import itertools
import math
import os
import sys

import numpy as np

# ----------------------------------------------------------------------------------------------------------
# Example 1: the three-state MDP. States s0, s1 and an absorbing END; two actions per state,
# (a0, a1) at s0 and (g, b) at s1; END has one action (index 0, probability 1 under every policy).
S0, S1, END = 0, 1, 2
GAMMA, M, ETA, ETA2 = 0.9, 100.0, 1e-4, 1e-3
NEXT = np.array([[END, S1], [END, END], [END, END]])  # [S, A] deterministic transitions s' = NEXT[s, a]
R = np.array([[0.0, 0.0], [1.0, -M], [0.0, 0.0]])  # [S, A] r(s, a)


def policy(p_a1, p_b):
    """π(a|s) as an [S, A] table, from π(a1|s0) and π(b|s1)."""
    return np.array([[1 - p_a1, p_a1], [1 - p_b, p_b], [1.0, 0.0]])


PI = policy(ETA, ETA2)  # the old policy: rarely to s1, rarely b there
PI_NEW = policy(1.0, 1.0)  # the candidate: a1 then b, always


def mixture(pi, pi_new, alpha):
    """π_α(a|s) = (1 - α) π(a|s) + α π'(a|s): the straight path from π (α = 0) to π' (α = 1)."""
    return (1 - alpha) * pi + alpha * pi_new


def transitions(pi):
    """P_π[s, s'] = Σ_a π(a|s) 1[NEXT[s, a] = s']."""
    P = np.zeros((3, 3))
    np.add.at(P, (np.arange(3)[:, None].repeat(2, 1), NEXT), pi)
    return P


def evaluate(pi):
    """V^π from the Bellman equation V = r_π + γ P_π V (a linear solve), then Q^π and A^π = Q^π - V^π."""
    V = np.linalg.solve(np.eye(3) - GAMMA * transitions(pi), (pi * R).sum(1))
    Q = R + GAMMA * V[NEXT]  # [S, A]
    return V, Q, Q - V[:, None]


def occupancy(pi):
    """d_π(s) = (1 - γ) Σ_t γ^t Pr(s_t = s | π), i.e. (1 - γ) ρ0ᵀ (I - γ P_π)⁻¹ with ρ0 = s0."""
    rho0 = np.eye(3)[S0]
    return (1 - GAMMA) * np.linalg.solve((np.eye(3) - GAMMA * transitions(pi)).T, rho0)


def trajectories(pi, s=S0, prob=1.0, G=0.0, discount=1.0):
    """Every episode from s as (probability, discounted return); the tree is finite, so J is an exact sum."""
    if s == END:
        return [(prob, G)]
    return [t for a in range(2) if pi[s, a] > 0
            for t in trajectories(pi, NEXT[s, a], prob * pi[s, a], G + discount * R[s, a], discount * GAMMA)]


def J(pi):
    """J(π) = E[Σ_t γ^t r_t], summed over the enumerated trajectories (evaluate(pi)[0][S0] agrees)."""
    return sum(prob * G for prob, G in trajectories(pi))


def ratio(pi_new, pi):
    """π'(a|s)/π(a|s) where π(a|s) > 0; π' must put no mass where π puts none (else no ratio exists)."""
    assert np.all(pi_new[pi == 0] == 0), "π' is not absolutely continuous with respect to π"
    return np.divide(pi_new, pi, out=np.zeros_like(pi), where=pi > 0)


def surrogate_gain(pi_new, pi):
    """L_π(π') - J(π) = 1/(1-γ) E_{s~d_π, a~π}[π'(a|s)/π(a|s) A^π(s, a)]  (TRPO §2, the local approximation)."""
    _, _, A = evaluate(pi)
    d = occupancy(pi)  # the OLD policy's visits: what makes L estimable from π's data, and what makes it blind
    return (d[:, None] * pi * ratio(pi_new, pi) * A).sum() / (1 - GAMMA)


def performance_difference(pi_new, pi):
    """J(π') - J(π) = 1/(1-γ) E_{s~d_π', a~π'}[A^π(s, a)]  (Kakade & Langford 2002): exact, but needs π' visits."""
    _, _, A = evaluate(pi)
    return (occupancy(pi_new)[:, None] * pi_new * A).sum() / (1 - GAMMA)


def sample_returns(pi, n, rng):
    """Discounted returns of n episodes from s0 under π, simulated step by step, all episodes at once."""
    s = np.full(n, S0)
    G = np.zeros(n)
    discount = 1.0
    while (s != END).any():
        a = (rng.random(n) < pi[s, 1]).astype(int)  # two actions: a = 1 with probability π(1|s); END plays 0
        G += discount * R[s, a]
        s = NEXT[s, a]
        discount *= GAMMA
    return G


# ----------------------------------------------------------------------------------------------------------
# Example 2: trajectory importance weights. Behaviour π(1) = p, target π'(1) = q, H independent steps.
P_BEHAVIOUR, Q_TARGET = 0.5, 0.9


def step_second_moment(p, q):
    """E_{a~π}[(π'(a)/π(a))²] = q²/p + (1-q)²/(1-p); 1.64 for p = 0.5, q = 0.9 (above 1 whenever p ≠ q)."""
    return q**2 / p + (1 - q) ** 2 / (1 - p)


def var_w(p, q, H):
    """Var[w] = E[w²] - E[w]² = (per-step second moment)^H - 1: the steps are independent and E[w] = 1."""
    return step_second_moment(p, q) ** H - 1


def moments_w_enumerated(p, q, H):
    """E[w] and Var[w] summed over k, the number of 1-actions, k ~ Binomial(H, p) under π."""
    k = np.arange(H + 1)
    prob = np.array([math.comb(H, j) for j in range(H + 1)], dtype=float) * p**k * (1 - p) ** (H - k)
    w = (q / p) ** k * ((1 - q) / (1 - p)) ** (H - k)  # every trajectory with k ones has the same weight
    mean = (prob * w).sum()
    return mean, (prob * w**2).sum() - mean**2


def sample_weights(p, q, H, n, rng):
    """[n, H] weights: column h - 1 holds w of the first h steps of n episodes sampled from π."""
    ones = rng.random((n, H)) < p  # [n, H] a_t = 1
    return np.cumprod(np.where(ones, q / p, (1 - q) / (1 - p)), axis=1)  # [n, H]


# ----------------------------------------------------------------------------------------------------------
def pyplot():
    """matplotlib.pyplot with a file backend, imported only when a figure is drawn."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("error: the figure needs matplotlib: pip install matplotlib")
    return plt


def save(fig, path):
    """Write the figure as PNG, atomically: a reader never sees half a file."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path + ".tmp", format="png", dpi=120)
    os.replace(path + ".tmp", path)
    pyplot().close(fig)


def plot(path, alphas, J_path, L_path, mc_alphas, mc_means, Hs, mc_vars, p, q):
    """Left: true return and surrogate along π_α. Right: Var[w] vs H, closed form and Monte Carlo."""
    plt = pyplot()

    def median_and_range(x):  # [seeds, points] -> median, and its distance to min and max for errorbar
        med = np.median(x, 0)
        return med, np.stack([med - x.min(0), x.max(0) - med])

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    left.plot(alphas, L_path, label="surrogate L_π(π_α)")
    left.plot(alphas, J_path, label="true return J(π_α)")
    med, err = median_and_range(mc_means)
    left.errorbar(mc_alphas, med, yerr=err, fmt="o", color="k", ms=4, capsize=3, label="Monte Carlo (median, range)")
    left.set(xlabel="α (0: old policy π, 1: new policy π')", ylabel="return", title="The surrogate misses the collapse")
    left.legend(loc="upper right", bbox_to_anchor=(1, 0.96), fontsize="small")
    zoom = left.inset_axes([0.1, 0.1, 0.38, 0.36])  # near α = 0 the two agree: small steps are safe
    near = alphas <= 0.02
    zoom.plot(alphas[near], L_path[near])
    zoom.plot(alphas[near], J_path[near])
    zoom.axhline(J_path[0], color="gray", lw=0.5)
    zoom.set_title("α ≤ 0.02", fontsize=8)
    zoom.tick_params(labelsize=7)
    right.semilogy(Hs, var_w(p, q, Hs), label=f"exact ({step_second_moment(p, q):.2f}^H - 1)")
    med, err = median_and_range(mc_vars)
    right.errorbar(Hs, med, yerr=err, fmt="o", color="k", ms=4, capsize=3, label="sample variance (median, range)")
    right.set(xlabel="horizon H", ylabel="Var[w]", title=f"Trajectory weights, p = {p}, q = {q}")
    right.xaxis.get_major_locator().set_params(integer=True)
    right.legend()
    fig.tight_layout()
    save(fig, path)


def main(argv=None):
    parser = argparse.ArgumentParser(description="Examples 1 and 2: the two toy failures behind trust regions "
                                     "(example 3: python -m common.lab.toys length-bias --help)")
    parser.add_argument("--out", default=os.path.join("runs", "lab"), help="folder for the figure")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="one Monte Carlo run per seed")
    parser.add_argument("--episodes", type=int, default=100_000, help="Example 1: episodes per α and seed")
    parser.add_argument("--samples", type=int, default=100_000, help="Example 2: episodes per seed")
    parser.add_argument("--max-horizon", type=int, default=20, help="Example 2: H = 1 .. this")
    args = parser.parse_args(argv)
    # a sample variance needs two episodes; H = 0 has no weight to vary
    for flag, value, least in (("--episodes", args.episodes, 1), ("--samples", args.samples, 2),
                               ("--max-horizon", args.max_horizon, 1), ("--seeds", min(args.seeds), 0)):
        if value < least:
            parser.error(f"{flag} must be >= {least}, got {value}")
    seeds = " ".join(map(str, args.seeds))

    V, Q, A = evaluate(PI)
    d, d_new = occupancy(PI), occupancy(PI_NEW)
    print(f"Example 1: three-state MDP, γ = {GAMMA}, M = {M:g}, π(a1|s0) = η = {ETA:g}, π(b|s1) = η2 = {ETA2:g}")
    print(f"  J(π)  = {J(PI):.6g}  (policy evaluation: {V[S0]:.6g})   J(π') = {J(PI_NEW):.6g}")
    print(f"  A^π(s0, a1) = {A[S0, 1]:.6g}   A^π(s1, b) = {A[S1, 1]:.6g}")
    print(f"  d_π(s0) = {d[S0]:.4g}  d_π(s1) = {d[S1]:.4g}   d_π'(s0) = {d_new[S0]:.4g}  d_π'(s1) = {d_new[S1]:.4g}")
    print(f"  surrogate L_π(π') - J(π)        = {surrogate_gain(PI_NEW, PI):+.6f}   (weights by d_π: predicts a gain)")
    print(f"  identity with d_π' (exact)      = {performance_difference(PI_NEW, PI):+.8f}")
    print(f"  true change J(π') - J(π)        = {J(PI_NEW) - J(PI):+.8f}")

    mc_alphas = np.array([0.0, 0.25, 0.5, 0.75, 1.0])
    mc_means = np.zeros((len(args.seeds), len(mc_alphas)))  # [seeds, α]
    mc_ses = np.zeros_like(mc_means)
    for i, seed in enumerate(args.seeds):
        rng = np.random.default_rng(seed)
        for j, alpha in enumerate(mc_alphas):
            G = sample_returns(mixture(PI, PI_NEW, alpha), args.episodes, rng)
            mc_means[i, j], mc_ses[i, j] = G.mean(), G.std(ddof=1) / math.sqrt(len(G))
    print(f"  along π_α, Monte Carlo with {args.episodes} episodes per α, seeds {seeds}: median [min, max] of the mean")
    for j, alpha in enumerate(mc_alphas):
        pi_alpha = mixture(PI, PI_NEW, alpha)
        print(f"    α = {alpha:4.2f}   L = {J(PI) + surrogate_gain(pi_alpha, PI):+9.5g}   J = {J(pi_alpha):+11.6g}   "
              f"MC {np.median(mc_means[:, j]):+11.6g} [{mc_means[:, j].min():+.6g}, {mc_means[:, j].max():+.6g}]"
              f"  ± {np.median(mc_ses[:, j]):.2g} (s.e.)")

    p, q, Hs = P_BEHAVIOUR, Q_TARGET, np.arange(1, args.max_horizon + 1)
    print(f"\nExample 2: trajectory weights, behaviour p = {p}, target q = {q}, per-step E[ratio²] = "
          f"{step_second_moment(p, q):.4g}")
    mc_vars = np.stack([sample_weights(p, q, Hs[-1], args.samples, np.random.default_rng(seed)).var(0, ddof=1)
                        for seed in args.seeds])  # [seeds, H]
    print(f"  Monte Carlo: sample variance of {args.samples} weights per seed, seeds {seeds}: median [min, max]")
    print("     H   exact 1.64^H-1   enumeration   E[w]         Monte Carlo                     MC/exact")
    for h, v in zip(Hs, mc_vars.T):
        mean, var = moments_w_enumerated(p, q, int(h))
        print(f"    {h:2d}   {var_w(p, q, h):14.6g}   {var:11.6g}   {mean:.6f}   "
              f"{np.median(v):10.4g} [{v.min():9.4g}, {v.max():9.4g}]   {np.median(v) / var_w(p, q, h):6.3f}")
    short = Hs[np.median(mc_vars, 0) < 0.5 * var_w(p, q, Hs)]
    if len(short):
        print(f"  From H = {short[0]} on, the median sample variance is below half the true one: the variance sits in")
        print(f"  rare episodes with huge weights (w = {q / p:.1f}^H when every action is 1, probability {p}^H),")
        print("  which a finite batch seldom contains: the estimate under-reports its own unreliability, and")
        print("  the rare batch that does catch one overshoots (the max column).")

    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "toy_pathologies.png")
    alphas = np.linspace(0, 1, 501)
    J_path = np.array([J(mixture(PI, PI_NEW, a)) for a in alphas])
    L_path = np.array([J(PI) + surrogate_gain(mixture(PI, PI_NEW, a), PI) for a in alphas])
    plot(path, alphas, J_path, L_path, mc_alphas, mc_means, Hs, mc_vars, p, q)
    print(f"\nwrote {path}")
    return path


# ----------------------------------------------------------------------------------------------------------
# Example 3: the length bias of GRPO's 1/|o_i|. A tabular "length policy": whether a response is right,
# c ∈ {0 wrong, 1 right}, is given (c ~ Bernoulli(P_RIGHT), the answer is not learned); then its length
# L ∈ {1, ..., L_max} is drawn from softmax(θ[c]). θ is [2, L_max], one row of logits after a wrong answer
# and one after a right answer, so the length *can* depend on correctness; θ with a single row is the
# variant where it cannot (both answers use θ[0]). The reward is c.
#
# One categorical log π(L|c) stands for the L per-token decisions "go on / stop here" of a language model;
# their log-probs sum to log π(L|c). The bias lives in the weight each method puts on a response's token sum,
# not in how that sum is split over tokens, so the simplification keeps what matters. With N = B·G responses:
#   GRPO, eq. (97):      loss = −1/N Σ_i (1/L_i) Σ_t Â_i log π_t = −1/N Σ_i (Â_i / L_i)   log π(L_i|c_i)
#   Dr. GRPO, eq. (100): loss = −1/N Σ_i (1/T_max) Σ_t Â_i log π_t = −1/N Σ_i (Â_i / T_max) log π(L_i|c_i)
#   DAPO, eq. (102):     loss = −1/(Σ_j L_j) Σ_i Â_i log π(L_i|c_i)
# with T_max = L_max, and the sum Σ_j L_j over the responses of signal groups, as dapo.py's loss mask does.
P_RIGHT, L_MAX, GROUP_SIZE, NUM_GROUPS = 0.5, 40, 8, 16
LENGTH_STEPS, LENGTH_STEP_SIZE = 400, 0.1  # SGD steps, and η: the length of a step in θ-space at the start
METHODS = ("grpo", "dr_grpo", "dapo")


def softmax(theta):
    """π(L|row) for L = 1 .. L_max: [K, L_max] from logits θ [K, L_max]."""
    z = np.exp(theta - theta.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def group_advantages(rewards, method):
    """Â over the last axis (one group), as each file's compute_advantages: the group mean is the baseline;
    grpo.py and dapo.py then divide by sqrt(population variance + 1e-6), dr_grpo.py does not (eq. 98).
    With 0/1 rewards a group of equal rewards has a mean equal to them in floating point: its Â is exactly 0."""
    centred = rewards - rewards.mean(-1, keepdims=True)
    if method == "dr_grpo":
        return centred
    return centred / np.sqrt((centred**2).mean(-1, keepdims=True) + 1e-6)


def response_weights(advantages, lengths, method, t_max=L_MAX):
    """w_i with loss = −Σ_i w_i log π(L_i|c_i), for advantages and lengths [..., B, G] (the formulas above)."""
    B, G = advantages.shape[-2:]
    if method == "grpo":
        return advantages / lengths / (B * G)
    if method == "dr_grpo":
        return advantages / t_max / (B * G)
    # dapo: every token of the batch weighs the same. dapo.py masks groups without signal (all Â = 0) out
    # of the loss and out of the token count; the floor only keeps a batch of such groups at 0, not NaN.
    signal = (advantages != 0).any(-1, keepdims=True)  # [..., B, 1]
    tokens = (lengths * signal).sum((-2, -1), keepdims=True)  # [..., 1, 1]
    return advantages / np.maximum(tokens, 1e-6)


def loss_gradient(theta, right, lengths, method):
    """∂loss/∂θ, [..., K, L_max], for batches of correctness `right` (0/1) and `lengths` [..., B, G].

    ∂log π(L|row)/∂θ[row] = e_L − π(·|row) (softmax), so ∂loss/∂θ[k] = −Σ_{i: row_i = k} w_i (e_{L_i} − π(·|k)).
    The leading axes ... hold independent batches: the exact expectations below enumerate them all at once.
    """
    K, T_max = theta.shape
    pi = softmax(theta)
    rows = right if K == 2 else np.zeros_like(right)  # one row: the length cannot depend on correctness
    w = response_weights(group_advantages(right.astype(float), method), lengths, method, T_max)  # [..., B, G]
    score = np.eye(T_max)[lengths - 1] - pi[rows]  # [..., B, G, L_max]
    return -np.einsum("...bgk,...bgl->...kl", np.eye(K)[rows] * w[..., None], score)


def expected_gradient_enumerated(theta, method, p=P_RIGHT, group_size=4, num_groups=1):
    """E[−∂loss/∂θ] for a batch of B groups, summed over all 2^N correctness patterns and L_max^N lengths of
    its N = B·G responses, with their probabilities: exact, and independent of the closed forms below
    (keep N and L_max small: 2^N L_max^N outcomes)."""
    K, T_max = theta.shape
    N = num_groups * group_size
    right = np.array(list(itertools.product((0, 1), repeat=N)))  # [2^N, N]
    lengths = np.array(list(itertools.product(range(1, T_max + 1), repeat=N)))  # [L_max^N, N]
    right = np.repeat(right, len(lengths), 0)  # [2^N L_max^N, N]: every (pattern, lengths) pair once
    lengths = np.tile(lengths, (2**N, 1))
    pi = softmax(theta)
    rows = right if K == 2 else np.zeros_like(right)
    prob = (np.where(right == 1, p, 1 - p) * pi[rows, lengths - 1]).prod(1)  # [outcomes]
    shape = (len(prob), num_groups, group_size)
    grads = loss_gradient(theta, right.reshape(shape), lengths.reshape(shape), method)  # [outcomes, K, L_max]
    return -np.einsum("o,okl->kl", prob, grads)


def branch_advantages(method, p=P_RIGHT, group_size=GROUP_SIZE):
    """a_c = E[1{c_i = c} Â_i] for c = 0, 1, summed over k ~ Binomial(G, p) right answers in the group.
    a_0 + a_1 = E[Â_i] = 0: the Â of a group sum to 0 and the G responses are exchangeable."""
    k = np.arange(group_size + 1)
    prob = np.array([math.comb(group_size, j) for j in k]) * p**k * (1 - p) ** (group_size - k)
    groups = (np.arange(group_size) < k[:, None]).astype(float)  # [G + 1, G]: row k has k right answers
    adv = group_advantages(groups, method)  # [G + 1, G]
    return np.array([(prob * ((1 - groups) * adv).sum(1)).sum(), (prob * (groups * adv).sum(1)).sum()]) / group_size


def sum_distribution(pi, n):
    """Pr(L_1 + ... + L_n = s) for s = 0 .. n L_max, with the L_j independent draws from π (repeated convolution)."""
    dist = np.array([1.0])
    for _ in range(n):
        dist = np.convolve(dist, np.concatenate([[0.0], pi]))
    return dist


def expected_gradient(theta, method, p=P_RIGHT, group_size=GROUP_SIZE, num_groups=NUM_GROUPS):
    """E[−∂loss/∂θ] in closed form, [K, L_max]: the direction SGD moves θ, on average.

    Given c_i, the length L_i is drawn from π(·|c_i) whatever the other answers, so it is independent of Â_i:
      GRPO:     a_c E_{L~π_c}[(1/L)(e_L − π_c)]       ≠ 0: 1/L favours short lengths, times the sign of a_c
      Dr. GRPO: a_c/T_max E_{L~π_c}[e_L − π_c] = 0    the score has mean zero, for every θ
      DAPO:     N a_c E[(e_L − π_c)/(L + S)]          S the tokens of the other responses that count
    With one row (length blind to correctness) the row gets Σ_c of these, and a_0 + a_1 = 0 makes it vanish
    for GRPO and Dr. GRPO; for DAPO too, as π_0 = π_1 there. DAPO's form needs S independent of Â_i, true
    while both rows are equal (as at the uniform start): otherwise enumerate or sample.
    """
    K, T_max = theta.shape
    pi = softmax(theta)[[0, K - 1]]  # [2, L_max]: π(·|wrong), π(·|right)
    a = branch_advantages(method, p, group_size)[:, None]  # [2, 1]
    lengths = np.arange(1, T_max + 1)
    if method == "grpo":
        per_branch = a * pi * (1 / lengths - (pi / lengths).sum(1, keepdims=True))
    elif method == "dr_grpo":
        per_branch = np.zeros_like(pi)  # a_c/T_max (E_{π_c}[e_L] − π_c) = a_c/T_max (π_c − π_c)
    else:
        if not np.allclose(pi[0], pi[1]):
            raise ValueError("DAPO's closed form needs the same length policy after right and wrong answers")
        # S_{-i}: the G − 1 others of i's group (it has signal whenever Â_i ≠ 0) and, of each other group,
        # its G lengths if it has signal (probability q) or nothing.
        q = 1 - p**group_size - (1 - p) ** group_size
        group_tokens = q * sum_distribution(pi[0], group_size)
        group_tokens[0] += 1 - q
        S = sum_distribution(pi[0], group_size - 1)
        for _ in range(num_groups - 1):
            S = np.convolve(S, group_tokens)
        inv = (S[None, :] / (lengths[:, None] + np.arange(len(S))[None, :])).sum(1)  # [L_max]: E_S[1/(L + S)]
        N = num_groups * group_size
        per_branch = N * a * pi * (inv - (pi * inv).sum(1, keepdims=True))
    return per_branch if K == 2 else per_branch.sum(0, keepdims=True)


def mean_length(theta):
    """E[L|row] = Σ_L L π(L|row), [K]."""
    return softmax(theta) @ np.arange(1, theta.shape[1] + 1)


def mean_length_rate(theta, direction):
    """d E[L|row] along a step θ + η·direction, per unit η at η = 0: Σ_L direction_L π_L (L − E[L|row]), [K]."""
    pi = softmax(theta)
    return (direction * pi * (np.arange(1, theta.shape[1] + 1) - mean_length(theta)[:, None])).sum(1)


def sample_batch(theta, rng, p=P_RIGHT, group_size=GROUP_SIZE, num_groups=NUM_GROUPS):
    """One batch: correctness and lengths, each [B, G] (inverse-CDF sampling of L from its row of π)."""
    right = (rng.random((num_groups, group_size)) < p).astype(int)
    rows = right if len(theta) == 2 else np.zeros_like(right)
    cdf = np.cumsum(softmax(theta), 1)[rows]  # [B, G, L_max]
    lengths = 1 + (rng.random((num_groups, group_size, 1)) > cdf).sum(-1)
    return right, np.minimum(lengths, theta.shape[1])  # the min guards against cdf[-1] rounding below 1


def step_normaliser(method, rows, rng, num_batches=256):
    """Mean ‖∂loss/∂θ‖ over batches at the uniform start: each method's learning rate is divided by it.

    The three losses differ in scale by constant factors (1/L_i is 1/T_max = 1/40 only for the longest
    responses; Dr. GRPO's Â lacks the 1/std, about 2 here). Under SGD a constant factor is just a learning
    rate, so with one shared rate Dr. GRPO would stay put merely because its steps are ~20x shorter. With
    this, every method's first steps are equally long (noise included), and only their direction differs.
    """
    theta = np.zeros((rows, L_MAX))
    batches = [sample_batch(theta, rng) for _ in range(num_batches)]
    right, lengths = (np.stack(x) for x in zip(*batches))  # [batches, B, G]
    return np.linalg.norm(loss_gradient(theta, right, lengths, method), axis=(1, 2)).mean()


def train_length_policy(method, rows, steps, lr, rng):
    """Plain SGD from the uniform policy; E[L|wrong] and E[L|right] under π_θ at steps 0 .. steps, [steps + 1, 2].

    SGD, not Adam: with SGD the expected step is −lr · E[∂loss/∂θ], so the exact expected gradients above
    predict the drift; Adam divides each coordinate by its own running gradient size, which turns a zero-mean
    gradient (Dr. GRPO) into steps as large as anyone's and bends the direction of a biased one. The lengths
    are the policy's exact means, not the sampled ones, so the curves carry no sampling noise of their own.
    """
    theta = np.zeros((rows, L_MAX))
    lengths = [mean_length(theta)[[0, rows - 1]]]
    for _ in range(steps):
        right, L = sample_batch(theta, rng)
        theta -= lr * loss_gradient(theta, right, L, method)
        lengths.append(mean_length(theta)[[0, rows - 1]])
    return np.array(lengths)


# The arms of the simulation: (label, method, rows of θ).
LENGTH_ARMS = [("grpo", "grpo", 2), ("dr_grpo", "dr_grpo", 2), ("dapo", "dapo", 2),
               ("grpo, length cannot depend on correctness", "grpo", 1)]


def plot_length_bias(path, curves):
    """Mean length of wrong (left) and right (right) responses vs step: median over seeds, min-max band."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for (label, _, rows), color in zip(LENGTH_ARMS, ["C0", "C1", "C2", "k"]):
        runs = curves[label]  # [seeds, steps + 1, 2]
        x = np.arange(runs.shape[1])
        for branch, ax in enumerate(axes):  # branch 0 (wrong) left, 1 (right) right
            ax.plot(x, np.median(runs[:, :, branch], 0), color=color, ls="--" if rows == 1 else "-", label=label)
            ax.fill_between(x, runs[:, :, branch].min(0), runs[:, :, branch].max(0), color=color, alpha=0.15, lw=0)
    axes[0].set(xlabel="SGD step", ylabel="mean length E[L | c] under π_θ", title="wrong responses (Â < 0)")
    axes[1].set(xlabel="SGD step", title="right responses (Â > 0)")
    axes[0].legend(fontsize="small")
    fig.suptitle(f"Length policy, p(right) = {P_RIGHT}, {NUM_GROUPS} groups of {GROUP_SIZE}: "
                 "median over seeds, band min-max", fontsize=10)
    fig.tight_layout()
    save(fig, path)


def length_bias_main(argv=None):
    parser = argparse.ArgumentParser(description="Example 3: the length bias of GRPO's 1/|o_i| weighting")
    parser.add_argument("--out", default=os.path.join("runs", "lab"), help="folder for the figure")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="one SGD run per arm and seed")
    parser.add_argument("--steps", type=int, default=LENGTH_STEPS, help="SGD steps per run")
    parser.add_argument("--step-size", type=float, default=LENGTH_STEP_SIZE,
                        help="η: each method's learning rate is η / (its mean gradient norm at the start)")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    if not args.step_size > 0:  # 0 would not move, a negative η would climb the loss
        parser.error(f"--step-size must be > 0, got {args.step_size}")
    if min(args.seeds) < 0:  # numpy's generators take no negative seed
        parser.error(f"--seeds must be >= 0, got {min(args.seeds)}")
    seeds = " ".join(map(str, args.seeds))
    theta0, shared0 = np.zeros((2, L_MAX)), np.zeros((1, L_MAX))
    print(f"Example 3: length policy, p(right) = {P_RIGHT}, L = 1 .. {L_MAX}, {NUM_GROUPS} groups of G = {GROUP_SIZE}, "
          f"uniform start (E[L] = {mean_length(theta0)[0]:.1f})")
    print("  exact expected gradient of the objective, E[−∂loss/∂θ], at the start; dE[L]/dη: first-order change of")
    print("  the mean length along it; per step: that times each method's learning rate (its step normaliser)")
    print("    method     row      a_c = E[1{c}Â]   ∂/∂θ[L=1]     ∂/∂θ[L=40]    dE[L]/dη      per step")
    lrs = {}
    for label, method, rows in LENGTH_ARMS:
        lrs[label] = args.step_size / step_normaliser(method, rows, np.random.default_rng(0))
        theta = theta0 if rows == 2 else shared0
        g = expected_gradient(theta, method)
        a = branch_advantages(method) if rows == 2 else [branch_advantages(method).sum()]
        names = ["wrong", "right"] if rows == 2 else ["shared"]
        for row, name in enumerate(names):
            rate = mean_length_rate(theta, g)[row]
            print(f"    {method if rows == 2 else method + '*':9}  {name:7}  {a[row]:+14.6f}   {g[row, 0]:+.4e}   "
                  f"{g[row, -1]:+.4e}   {rate:+.4e}   {rate * lrs[label]:+.3e}")
    print("    (* one row: the length cannot depend on correctness; a_c is then a_0 + a_1)")
    small = np.random.default_rng(0).normal(size=(2, 5))
    print("  exact enumeration, one group of G = 4, L = 1 .. 5, random θ: max |E[−∂loss/∂θ]|")
    for method in METHODS:
        blind = np.abs(expected_gradient_enumerated(small[:1], method)).max()
        can_tell = np.abs(expected_gradient_enumerated(small, method)).max()
        print(f"    {method:8}  length can depend on correctness: {can_tell:.3e}   cannot: {blind:.1e}")

    curves = {}
    for label, method, rows in LENGTH_ARMS:
        curves[label] = np.stack([train_length_policy(method, rows, args.steps, lrs[label], np.random.default_rng(seed))
                                  for seed in args.seeds])  # [seeds, steps + 1, 2]
    print("  (with one row the expected gradient is zero at every θ, not only at the start; GRPO's 1/L still makes")
    print("  the logits of short lengths the noisiest, so single runs of that arm can wander far, mostly shorter)")
    print(f"  SGD, {args.steps} steps, η = {args.step_size}, seeds {seeds}: E[L|c] at the start and the end, "
          "median [min, max]")
    for label, _, _ in LENGTH_ARMS:
        start, end = curves[label][:, 0], curves[label][:, -1]  # [seeds, 2]
        wrong, right = (f"{np.median(start[:, c]):4.1f} -> {np.median(end[:, c]):5.2f} "
                        f"[{end[:, c].min():5.2f}, {end[:, c].max():5.2f}]" for c in (0, 1))
        print(f"    {label:42}  lr {lrs[label]:9.4g}   wrong {wrong}   right {right}")

    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "length_bias_toy.png")
    plot_length_bias(path, curves)
    print(f"\nwrote {path}")
    return path


if __name__ == "__main__":
    if sys.argv[1:2] == ["length-bias"]:
        length_bias_main(sys.argv[2:])
    else:
        main()
