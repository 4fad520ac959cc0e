"""analytics.significance on known data: a clear shift is significant, two draws of one
distribution are not, the interval covers the true difference, and results are reproducible."""

from __future__ import annotations

import numpy as np
import pytest

from analytics import significance as sig


def draws(seed, n, mean, sd=100.0):
    return np.random.default_rng(seed).normal(mean, sd, n)


def test_bootstrap_a_clear_shift_is_significant_and_covers_the_true_difference():
    a, b = draws(1, 500, 1000), draws(2, 500, 900)
    for d in (sig.bootstrap_diff(a, b), sig.bootstrap_quantiles(a, b, (0.5,))[0]):
        assert d.significant is True and d.verdict == "significant"
        assert d.low < -100 < d.high and d.high < 0


def test_bootstrap_two_draws_of_one_distribution_are_not_significant():
    a, b = draws(3, 500, 1000), draws(4, 500, 1000)
    for d in (sig.bootstrap_diff(a, b, sig.quantile_statistic(0.95)), *sig.bootstrap_quantiles(a, b, (0.5, 0.95, 0.99))):
        assert d.significant is False and d.verdict == "not significant"
        assert d.low <= 0 <= d.high


def test_bootstrap_is_reproducible_and_seeded():
    a, b = draws(5, 300, 10), draws(6, 300, 11)
    assert sig.bootstrap_diff(a, b) == sig.bootstrap_diff(a, b)
    assert sig.bootstrap_diff(a, b, seed=1) != sig.bootstrap_diff(a, b, seed=2)


def test_bootstrap_interval_coverage_is_near_95_percent():
    covered = 0
    for i in range(60):
        a, b = draws(100 + i, 200, 50, 10), draws(200 + i, 200, 53, 10)
        d = sig.bootstrap_diff(a, b, resamples=400)
        covered += d.low <= 3 <= d.high
    assert covered >= 52  # 95 % of 60 = 57; a broken interval covers far less


def test_welch_and_t_quantile():
    assert sig.t_quantile_975(10) == pytest.approx(2.228, abs=0.005)
    assert sig.t_quantile_975(30) == pytest.approx(2.042, abs=0.002)
    assert sig.t_two_sided_p(2.228, 10) == pytest.approx(0.05, abs=0.004)
    shifted = sig.welch_diff(100, 4.5, 0.09, 100, 3.5, 0.09)
    assert shifted.significant and shifted.low < -1 < shifted.high
    same = sig.welch_diff(100, 4.5, 0.09, 100, 4.51, 0.09)
    assert same.significant is False and same.p_value > 0.5
    a, b = draws(7, 50, 0, 1), draws(8, 80, 0.8, 2)
    d = sig.welch_diff(50, a.mean(), a.var(ddof=1), 80, b.mean(), b.var(ddof=1))
    assert d.estimate == pytest.approx(b.mean() - a.mean())
    assert sig.welch_diff(1, 1.0, 0.0, 5, 2.0, 1.0) is sig.NONE


def test_two_proportions():
    d = sig.proportion_diff(50, 1000, 100, 1000)
    assert d.significant and d.low < 0.05 < d.high
    assert sig.proportion_diff(50, 1000, 52, 1000).significant is False
    assert sig.proportion_diff(0, 10, 0, 10).p_value == 1.0
    assert sig.proportion_diff(0, 0, 1, 10) is sig.NONE


def test_holm_adjusts_step_down_and_keeps_order():
    diffs = [sig.Diff(1, 0.5, 1.5, p, "x") for p in (0.01, 0.04, 0.03)]
    adjusted = [d.p_adjusted for d in sig.holm(diffs)]
    assert adjusted == pytest.approx([0.03, 0.06, 0.06])
    out = sig.holm(diffs)
    assert out[0].significant is True and out[1].significant is False  # 0.04 alone would be


def test_order_statistic_bootstrap_matches_resampling():
    """The Beta draw of a resample's quantile gives the same interval as resampling the array."""
    a, b = draws(9, 400, 1000), draws(10, 400, 950)
    fast = sig.bootstrap_quantiles(a, b, (0.95,), resamples=4000)[0]
    slow = sig.bootstrap_diff(a, b, lambda x: np.quantile(x, 0.95, axis=1, method="inverted_cdf"), resamples=4000)
    assert fast.low == pytest.approx(slow.low, abs=12) and fast.high == pytest.approx(slow.high, abs=12)
    assert fast.estimate == pytest.approx(slow.estimate, abs=1e-9)


def test_bootstrap_quantile_interval_coverage():
    covered = 0
    for i in range(60):
        a, b = draws(300 + i, 300, 100, 10), draws(400 + i, 300, 104, 10)
        d = sig.bootstrap_quantiles(a, b, (0.5,))[0]
        covered += d.low <= 4 <= d.high
    assert covered >= 52
