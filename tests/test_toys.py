"""The two toy failures of common/toys.py (common/EQUATIONS.md#sec-toy-pathologies): exact numbers and MC checks."""

import math

import numpy as np
import pytest

from common import toys
from common.toys import PI, PI_NEW, mixture


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
    pytest.importorskip("matplotlib")
    path = toys.main(["--out", str(tmp_path), "--seeds", "1", "--episodes", "1000", "--samples", "1000"])
    out = capsys.readouterr().out
    assert path == str(tmp_path / "toy_pathologies.png") and (tmp_path / "toy_pathologies.png").stat().st_size > 0
    assert "8.091e-05" in out and "+0.799938" in out and "-90.00008091" in out
