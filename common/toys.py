"""The two toy failures behind trust regions, computed exactly and checked by Monte Carlo.

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

Everything is computed exactly first (policy evaluation by a linear solve, enumeration of trajectories
and of the binomial count of 1-actions), then checked by Monte Carlo, once per --seeds value.

    python -m common.toys                              # writes common/results/lab/toy_pathologies.png
    python -m common.toys --out /tmp/lab --seeds 1 2 3 4 5

Only numpy is needed; the figure needs matplotlib (imported lazily).
"""

import argparse
import math
import os

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
def plot(path, alphas, J_path, L_path, mc_alphas, mc_means, Hs, mc_vars, p, q):
    """Left: true return and surrogate along π_α. Right: Var[w] vs H, closed form and Monte Carlo."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("error: the figure needs matplotlib: pip install matplotlib")

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
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path + ".tmp", format="png", dpi=120)
    os.replace(path + ".tmp", path)  # atomic: a reader never sees half a file
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join("common", "results", "lab"), help="folder for the figure")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="one Monte Carlo run per seed")
    parser.add_argument("--episodes", type=int, default=100_000, help="Example 1: episodes per α and seed")
    parser.add_argument("--samples", type=int, default=100_000, help="Example 2: episodes per seed")
    parser.add_argument("--max-horizon", type=int, default=20, help="Example 2: H = 1 .. this")
    args = parser.parse_args(argv)
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

    path = os.path.join(args.out, "toy_pathologies.png")
    alphas = np.linspace(0, 1, 501)
    J_path = np.array([J(mixture(PI, PI_NEW, a)) for a in alphas])
    L_path = np.array([J(PI) + surrogate_gain(mixture(PI, PI_NEW, a), PI) for a in alphas])
    plot(path, alphas, J_path, L_path, mc_alphas, mc_means, Hs, mc_vars, p, q)
    print(f"\nwrote {path}")
    return path


if __name__ == "__main__":
    main()
