"""gradfidelity.stats against independent references (textbook formulas via scipy quantiles, statsmodels,
a brute-force noncentral-t power search) and against the study-C worked example."""

import math

import numpy as np
import pytest
from scipy import stats
from statsmodels.stats.weightstats import ttost_paired

from gradfidelity.stats import equivalence_tost, noninferiority, paired_ratio_ci, seeds_for_power
from gradfidelity.stats.intervals import Interval, one_sided_p, t_interval


def test_noninferiority_matches_textbook_bound():
    rng = np.random.default_rng(0)
    bp = rng.uniform(1.5, 1.7, size=7)
    method = bp * (1 + rng.normal(0.008, 0.01, size=7))
    res = noninferiority(method, bp, margin_pct=1.0)
    gaps = 100 * (method - bp) / bp
    upper = gaps.mean() + stats.t.ppf(0.95, 6) * gaps.std(ddof=1) / math.sqrt(7)
    assert res.upper_pct == pytest.approx(upper, rel=1e-12)
    assert res.non_inferior == (upper <= 1.0)
    assert res.n == 7


def test_noninferiority_decides_both_ways():
    bp = np.full(5, 2.0)
    assert noninferiority(bp * np.array([1.001, 1.002, 1.0, 1.0015, 1.0005]), bp).non_inferior
    worse = bp * np.array([1.03, 1.02, 1.025, 1.035, 1.03])
    assert not noninferiority(worse, bp).non_inferior


def test_paired_ratio_ci_is_a_log_t_interval():
    rng = np.random.default_rng(1)
    b = rng.uniform(900, 1100, size=6)
    a = b * np.exp(rng.normal(0.3, 0.02, size=6))
    res = paired_ratio_ci(a, b)
    logr = np.log(a / b)
    half = stats.t.ppf(0.975, 5) * logr.std(ddof=1) / math.sqrt(6)
    assert res.ratio == pytest.approx(math.exp(logr.mean()))
    assert res.low == pytest.approx(math.exp(logr.mean() - half))
    assert res.high == pytest.approx(math.exp(logr.mean() + half))


def _tost_reference(a, b, bound):
    """The 90% CI of mean(a - b) from scipy's t quantile, and statsmodels' TOST p-value (max of the two one-sided)."""
    d = np.asarray(a) - np.asarray(b)
    half = stats.t.ppf(0.95, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
    pvalue, _, _ = ttost_paired(np.asarray(a), np.asarray(b), -bound, bound)
    return d.mean() - half, d.mean() + half, pvalue


@pytest.mark.parametrize(("seed", "shift", "bound", "equivalent"), [
    (2, 0.0005, 0.005, True),    # small difference, CI well inside +-bound
    (3, 0.0005, 0.0008, False),  # same kind of data, bound narrower than the CI
    (4, 0.006, 0.005, False),    # the difference itself is beyond the bound
])
def test_tost_ci_and_decision_against_scipy_and_statsmodels(seed, shift, bound, equivalent):
    rng = np.random.default_rng(seed)
    a = rng.normal(1.30, 0.004, size=8)
    b = a - shift + rng.normal(0.0, 0.001, size=8)
    ours = equivalence_tost(a, b, bound=bound)
    low, high, pvalue = _tost_reference(a, b, bound)
    assert ours["ci_low"] == pytest.approx(low, rel=1e-10)
    assert ours["ci_high"] == pytest.approx(high, rel=1e-10)
    assert ours["mean_diff"] == pytest.approx(float(np.mean(a - b)), rel=1e-12)
    assert ours["equivalent"] is equivalent
    assert bool(pvalue < 0.05) is equivalent  # statsmodels' TOST decides the same on the same data


def test_tost_ci_ends_are_where_statsmodels_one_sided_pvalues_hit_alpha():
    """Independent of the t quantile: with the bounds set to our CI ends, each one-sided test has p = 0.05."""
    rng = np.random.default_rng(5)
    a = rng.normal(1.30, 0.004, size=6)
    b = a + rng.normal(0.001, 0.002, size=6)
    ours = equivalence_tost(a, b, bound=1.0)
    _, (_, p_low, _), (_, p_high, _) = ttost_paired(a, b, ours["ci_low"], ours["ci_high"])
    assert p_low == pytest.approx(0.05, rel=1e-8)
    assert p_high == pytest.approx(0.05, rel=1e-8)


def test_tost_max_abs_ci():
    """max_abs_ci is the CI end farthest from 0, and the smallest bound at which the pair is equivalent."""
    rng = np.random.default_rng(6)
    b = rng.normal(1.30, 0.004, size=8)
    straddles = b + rng.normal(0.0, 0.002, size=8)
    below = b - 0.004 + rng.normal(0.0, 0.001, size=8)
    res = equivalence_tost(straddles, b, bound=0.01)
    assert res["ci_low"] < 0 < res["ci_high"]
    assert res["max_abs_ci"] == max(-res["ci_low"], res["ci_high"])
    res = equivalence_tost(below, b, bound=0.01)
    assert res["ci_high"] < 0  # entirely negative: the far end is the low one
    low, _, _ = _tost_reference(below, b, 0.01)
    assert res["max_abs_ci"] == pytest.approx(-low, rel=1e-10)
    for a in (straddles, below):
        m = equivalence_tost(a, b, bound=1.0)["max_abs_ci"]
        assert equivalence_tost(a, b, bound=1.001 * m)["equivalent"]
        assert not equivalence_tost(a, b, bound=0.999 * m)["equivalent"]


def test_exact_seeds_match_brute_force_noncentral_t():
    mean, sd, margin = 0.5, 1.2, 1.0
    got = seeds_for_power(mean, sd, margin)["exact_t"]
    d = (margin - mean) / sd

    def power(n):
        crit = stats.t.ppf(0.95, n - 1)
        return 1 - stats.nct.cdf(crit, n - 1, d * math.sqrt(n))

    n = 2
    while power(n) < 0.8:
        n += 1
    assert got == n


def test_exact_seeds_when_the_solver_fails_to_bracket():
    """A huge effect needs the minimum n; statsmodels' root finder returns NaN there, ours must not."""
    got = seeds_for_power(0.0, 0.01, 1.0)
    assert got["exact_t"] == 2
    assert seeds_for_power(1.2, 1.0, 1.0)["exact_t"] == math.inf  # true gap beyond the margin: never


def test_statistics_refuse_nan_from_diverged_runs():
    with pytest.raises(ValueError, match="non-finite"):
        noninferiority([1.0, float("nan")], [1.0, 1.0])
    with pytest.raises(ValueError, match="at least 2"):
        paired_ratio_ci([1.0], [1.0])


@pytest.mark.parametrize("n", [2, 3, 5, 11])
def test_t_interval_is_scipys_t_interval(n):
    x = np.random.default_rng(n).normal(0.3, 2.0, size=n)
    iv = t_interval(x, 0.9)
    low, high = stats.t.interval(0.9, n - 1, loc=x.mean(), scale=stats.sem(x))
    assert (iv.estimate, iv.n, iv.level) == (pytest.approx(x.mean()), n, 0.9)
    assert (iv.low, iv.high) == (pytest.approx(low, rel=1e-12), pytest.approx(high, rel=1e-12))
    assert iv.fmt(2) == f"[{iv.low:.2f}, {iv.high:.2f}]"


def test_t_interval_edge_cases():
    assert t_interval([1.5, 1.5, 1.5], 0.95) == Interval(1.5, 1.5, 1.5, 0.95, 3)  # a constant series: a point
    one = t_interval([2.0], 0.95)
    assert (one.low, one.high, one.fmt()) == (None, None, "n/a")
    with pytest.raises(ValueError, match="non-finite"):
        t_interval([1.0, float("inf")], 0.95)
    with pytest.raises(ValueError, match="no values"):
        t_interval([], 0.95)


def test_one_sided_p_is_scipys():
    x = [0.4, 1.1, -0.2, 0.9]
    assert one_sided_p(x) == pytest.approx(stats.ttest_1samp(x, 0.0, alternative="greater").pvalue)
    assert one_sided_p(x, "less") == pytest.approx(1 - one_sided_p(x))


def test_effect_floors_on_hand_made_values():
    """Study A's A6 (issue 46): the floors of a mean effect and of a per-seed |effect| on a zero-effect control."""
    from gradfidelity.stats.effects import per_seed_floor, zero_effect_floor

    # [0, 2]: the one split compares 0 with 2 (|difference| 2, one pair), scaled to 2 pairs by sqrt(1/2)
    assert zero_effect_floor([0.0, 2.0]) == pytest.approx(2.0 / math.sqrt(2.0))
    # [0, 2, 4]: ordered pairs of distinct seeds |0-2| |0-4| |2-4| twice each: mean 8/3
    assert per_seed_floor([0.0, 2.0, 4.0]) == pytest.approx(8.0 / 3.0)
    with pytest.raises(ValueError, match="non-finite"):
        zero_effect_floor([1.0, math.nan])


def test_effect_floors_match_the_normal_theory_on_simulated_outcomes():
    """Outcomes N(0, 1) per seed, an arm with no effect: a mean paired effect over n = 8 seeds has sd sqrt(2/8), so
    E|mean| = sqrt(2/pi) / 2 = 0.399 (falls with n); a per-seed |effect| has E|X - X'| = 2 / sqrt(pi) = 1.128 (does
    not). The split-half floor and the pair floor reproduce both on average."""
    from gradfidelity.stats.effects import per_seed_floor, zero_effect_floor

    rng = np.random.default_rng(7)
    samples = rng.standard_normal((400, 8))
    assert np.mean([zero_effect_floor(v) for v in samples]) == pytest.approx(math.sqrt(2 / math.pi) / 2, rel=0.06)
    assert np.mean([per_seed_floor(v) for v in samples]) == pytest.approx(2 / math.sqrt(math.pi), rel=0.04)
