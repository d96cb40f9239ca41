"""The two toy failures of common/lab/toys.py (common/EQUATIONS.md#sec-toy-pathologies): exact numbers and MC checks."""

import math

import numpy as np
import pytest

from common.lab import toys
from common.lab.toys import PI, PI_NEW, mixture


def test_three_state_mdp_exact_numbers():
    assert toys.J(PI) == pytest.approx(8.091e-5, rel=1e-10)
    assert toys.J(PI_NEW) == pytest.approx(-90.0, rel=1e-12)
    assert toys.surrogate_gain(PI_NEW, PI) == pytest.approx(0.79994, abs=1e-5)
    # two independent routes to J: enumerated trajectories and the Bellman linear solve
    for alpha in (0.0, 0.3, 1.0):
        pi = mixture(PI, PI_NEW, alpha)
        assert toys.J(pi) == pytest.approx(toys.evaluate(pi)[0][toys.S0], rel=1e-12)
    _, _, A = toys.evaluate(PI)
    assert A[toys.S0, 1] == pytest.approx((1 - toys.ETA) * toys.GAMMA * 0.899, rel=1e-12)
    assert A[toys.S1, 1] == pytest.approx(-(1 + toys.M) * (1 - toys.ETA2), rel=1e-12)
    d = toys.occupancy(PI)
    assert d.sum() == pytest.approx(1.0)
    assert d[toys.S1] == pytest.approx((1 - toys.GAMMA) * toys.GAMMA * toys.ETA, rel=1e-12)


def test_performance_difference_identity_holds_exactly_and_the_surrogate_does_not():
    true_change = toys.J(PI_NEW) - toys.J(PI)
    assert toys.performance_difference(PI_NEW, PI) == pytest.approx(true_change, rel=1e-12)
    assert toys.surrogate_gain(PI_NEW, PI) > 0 > true_change  # the surrogate gets even the sign wrong
    rng = np.random.default_rng(0)  # and the identity holds for any pair of policies, not just this one
    for _ in range(5):
        pi, pi_new = toys.policy(*rng.uniform(0.01, 0.99, 2)), toys.policy(*rng.uniform(0.01, 0.99, 2))
        assert toys.performance_difference(pi_new, pi) == pytest.approx(toys.J(pi_new) - toys.J(pi), rel=1e-10)


def test_surrogate_matches_the_return_to_first_order_only():
    alpha = 1e-7  # TRPO §2: L_π and J agree in value and slope at π, so small steps are safe
    slope = (toys.J(mixture(PI, PI_NEW, alpha)) - toys.J(PI)) / alpha
    assert slope == pytest.approx(toys.surrogate_gain(PI_NEW, PI), rel=1e-4)
    pi_half = mixture(PI, PI_NEW, 0.5)
    assert toys.surrogate_gain(pi_half, PI) - (toys.J(pi_half) - toys.J(PI)) > 20


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_monte_carlo_return_within_four_standard_errors(seed):
    rng = np.random.default_rng(seed)
    for alpha in (0.0, 0.25, 0.5, 1.0):
        pi = mixture(PI, PI_NEW, alpha)
        G = toys.sample_returns(pi, 100_000, rng)
        se = G.std(ddof=1) / math.sqrt(len(G))
        assert abs(G.mean() - toys.J(pi)) <= 4 * se + 1e-12, (alpha, G.mean(), toys.J(pi), se)


def test_trajectory_weight_variance_closed_form_and_enumeration():
    assert toys.step_second_moment(0.5, 0.9) == pytest.approx(1.64, rel=1e-12)
    for H in (1, 2, 5, 10, 20):
        mean, var = toys.moments_w_enumerated(0.5, 0.9, H)
        assert mean == pytest.approx(1.0, rel=1e-12)  # unbiased: E[w] = 1
        assert toys.var_w(0.5, 0.9, H) == pytest.approx(1.64**H - 1, rel=1e-12)
        assert var == pytest.approx(1.64**H - 1, rel=1e-10)


def test_closed_form_matches_enumeration_for_other_p_and_q():
    rng = np.random.default_rng(0)
    for p, q in rng.uniform(0.05, 0.95, (5, 2)):
        for H in (1, 3, 7):
            mean, var = toys.moments_w_enumerated(p, q, H)
            assert mean == pytest.approx(1.0, rel=1e-12)
            assert var == pytest.approx(toys.var_w(p, q, H), rel=1e-9, abs=1e-12)


def test_sample_variance_matches_short_horizons_and_underestimates_long_ones():
    H = np.arange(1, 21)
    mc = np.stack([toys.sample_weights(0.5, 0.9, 20, 100_000, np.random.default_rng(s)).var(0, ddof=1)
                   for s in (1, 2, 3)])  # [seeds, H]
    ratio = np.median(mc, 0) / toys.var_w(0.5, 0.9, H)
    assert np.all(np.abs(ratio[:3] - 1) < 0.05), ratio[:3]
    assert ratio[-1] < 0.5, ratio[-1]  # the heavy tail is rarely sampled


def test_sampled_weights_are_unbiased_for_other_p_and_q():
    p, q = 0.3, 0.6  # p != 1/2, so that π(0) = 1 - p and π(1) = p cannot be mixed up unnoticed
    w = toys.sample_weights(p, q, 3, 200_000, np.random.default_rng(0))  # [n, H]
    se = w.std(0, ddof=1) / math.sqrt(len(w))
    assert np.all(np.abs(w.mean(0) - 1) < 4 * se), (w.mean(0), se)
    assert np.allclose(w.var(0, ddof=1), toys.var_w(p, q, np.arange(1, 4)), rtol=0.05)


def test_main_prints_the_numbers_and_writes_the_figure(tmp_path, capsys):
    path = toys.main(["--out", str(tmp_path), "--seeds", "1", "--episodes", "1000", "--samples", "1000"])
    out = capsys.readouterr().out
    assert path == str(tmp_path / "toy_pathologies.png") and (tmp_path / "toy_pathologies.png").stat().st_size > 0
    assert "8.091e-05" in out and "+0.799938" in out and "-90.00008091" in out


# ---------------------------------------------------------------------------------------------------------
# Example 3: the length bias of GRPO's 1/|o_i| (a tabular length policy; row 0 after wrong, row 1 after right)


def test_advantages_follow_the_files():
    rewards = np.array([1.0, 0.0, 0.0, 0.0])
    centred = rewards - 0.25
    assert np.allclose(toys.group_advantages(rewards, "grpo"), centred / math.sqrt(0.1875 + 1e-6), rtol=1e-15)
    assert np.allclose(toys.group_advantages(rewards, "dapo"), centred / math.sqrt(0.1875 + 1e-6), rtol=1e-15)
    assert np.allclose(toys.group_advantages(rewards, "dr_grpo"), centred, rtol=1e-15)
    for method in toys.METHODS:  # a group of equal rewards has no signal, exactly
        assert np.all(toys.group_advantages(np.ones(8), method) == 0)
        assert np.all(toys.group_advantages(np.zeros(8), method) == 0)


def test_grpo_expected_gradient_lengthens_wrong_and_shortens_right():
    theta = np.zeros((2, toys.L_MAX))  # the uniform start, L = 1 .. 40, 16 groups of 8, p = 0.5
    g = toys.expected_gradient(theta, "grpo")
    a = toys.branch_advantages("grpo")
    assert a[1] == pytest.approx(-a[0]) and a[1] > 0.4
    rate = toys.mean_length_rate(theta, g)
    assert rate[0] > 0.01 and rate[1] < -0.01  # wrong responses grow longer, right ones shorter
    assert g[1, 0] > 0 > g[0, 0]  # θ[right, L=1] pushed up, θ[wrong, L=1] down
    # right row: up exactly where 1/L beats its mean E[1/L] = H_40/40, i.e. for L <= 9; the wrong row mirrors it
    lengths = np.arange(1, toys.L_MAX + 1)
    assert np.array_equal(g[1] > 0, lengths <= 9) and np.allclose(g[0], -g[1], rtol=1e-12)


@pytest.mark.parametrize("method", toys.METHODS)
def test_closed_form_matches_exact_enumeration(method):
    rng = np.random.default_rng(0)
    # rows that differ (length follows correctness) for GRPO and Dr. GRPO; DAPO's form needs equal rows
    theta = rng.normal(size=(2, 3)) if method != "dapo" else rng.normal(size=(1, 3)).repeat(2, 0)
    # the last case, B = 2 groups of G = 2: half the groups lack signal, which DAPO's token count must skip
    for p, group_size, num_groups in [(0.5, 4, 1), (0.3, 3, 1), (0.5, 2, 2)]:
        exact = toys.expected_gradient_enumerated(theta, method, p, group_size, num_groups)
        closed = toys.expected_gradient(theta, method, p, group_size, num_groups)
        assert np.allclose(exact, closed, rtol=1e-9, atol=1e-15), (p, group_size, num_groups, exact, closed)
        if method != "dr_grpo":
            assert np.abs(exact).max() > 1e-3  # a bias, and one the enumeration does see


def test_dr_grpo_expected_gradient_is_exactly_zero_for_every_policy():
    rng = np.random.default_rng(1)
    for _ in range(3):
        theta = rng.normal(size=(2, 4))
        assert np.abs(toys.expected_gradient_enumerated(theta, "dr_grpo", 0.4, 4)).max() < 1e-15


@pytest.mark.parametrize("method", toys.METHODS)
def test_no_expected_gradient_when_length_cannot_depend_on_correctness(method):
    theta = np.random.default_rng(2).normal(size=(1, 5))  # one row of logits for right and wrong: G = 4, L = 1 .. 5
    assert np.abs(toys.expected_gradient_enumerated(theta, method, 0.5, 4)).max() < 1e-15
    assert np.abs(toys.expected_gradient_enumerated(theta, method, 0.3, 2, 2)).max() < 1e-15
    assert np.abs(toys.expected_gradient(np.zeros((1, toys.L_MAX)), method)).max() < 1e-15


def test_dapo_bias_has_grpos_sign_but_is_tiny():
    theta = np.zeros((2, toys.L_MAX))
    grpo = toys.mean_length_rate(theta, toys.expected_gradient(theta, "grpo"))
    dapo = toys.mean_length_rate(theta, toys.expected_gradient(theta, "dapo"))
    assert np.all(0 < dapo / grpo) and np.all(dapo / grpo < 0.01), dapo / grpo


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sgd_grpo_lengthens_wrong_shortens_right_and_dr_grpo_stays(seed):
    steps = 200
    ends = {}
    for method in ("grpo", "dr_grpo"):
        lr = toys.LENGTH_STEP_SIZE / toys.step_normaliser(method, 2, np.random.default_rng(0))
        ends[method] = toys.train_length_policy(method, 2, steps, lr, np.random.default_rng(seed))[-1]  # [wrong, right]
    assert ends["grpo"][0] > 23 and ends["grpo"][1] < 2, ends["grpo"]
    assert np.all(np.abs(ends["dr_grpo"] - 20.5) < 1.0), ends["dr_grpo"]


def test_length_bias_main_prints_the_numbers_and_writes_the_figure(tmp_path, capsys):
    path = toys.length_bias_main(["--out", str(tmp_path), "--seeds", "1", "--steps", "5"])
    out = capsys.readouterr().out
    assert path == str(tmp_path / "length_bias_toy.png") and (tmp_path / "length_bias_toy.png").stat().st_size > 0
    assert "-0.463913" in out and "+1.3833e-02" in out and "+2.9420e-05" in out


@pytest.mark.parametrize("main, argv, message", [
    (toys.main, ["--episodes", "0"], "--episodes must be >= 1, got 0"),  # a mean of no episodes: NaN
    (toys.main, ["--samples", "1"], "--samples must be >= 2, got 1"),  # a sample variance of one weight: NaN
    (toys.main, ["--max-horizon", "0"], "--max-horizon must be >= 1, got 0"),  # was an IndexError
    (toys.main, ["--seeds", "1", "-2"], "--seeds must be >= 0, got -2"),
    (toys.length_bias_main, ["--step-size", "-1"], "--step-size must be > 0, got -1.0"),  # would climb the loss
    (toys.length_bias_main, ["--step-size", "nan"], "--step-size must be > 0, got nan"),
    (toys.length_bias_main, ["--seeds", "-1"], "--seeds must be >= 0, got -1"),
])
def test_bad_numbers_get_one_line_before_any_work(main, argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), *argv])
    captured = capsys.readouterr()
    assert message in captured.err and captured.out == "" and not list(tmp_path.iterdir())
