"""The effective compute fraction f(T) and the transient gate on hand-made curves (issues 25, 37): a known multiplier,
and the gate's equivalence test on passing, transient, noisy and saturated pairs; the references are written out here
(closed-form curves, scipy's t interval and t distribution, statsmodels' ttost_paired)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from gradfidelity.studies.async_pp.compute_fraction import (
    ABOVE,
    BELOW,
    EQUIVALENCE_MARGIN,
    INSIDE,
    drift_label,
    effective_fraction,
    sync_envelope,
    transient_gate,
)

BUDGETS = [100, 200, 400, 800, 1600]


def log_linear(s):
    """A sync sweep whose final loss is exactly linear in log(steps): interpolation is exact on it."""
    return 4.0 - 0.3 * np.log(np.asarray(s, float))


@pytest.mark.parametrize("c", [0.125, 0.3, 0.6, 1.0, 1.5])
def test_a_known_multiplier_is_recovered(c):
    """The async run at T = 800 ends where a sync run of c x T steps ends: f = c."""
    T = 800
    f = effective_fraction(BUDGETS, log_linear(BUDGETS), float(log_linear(c * T)), T)
    assert f.where == INSIDE and math.isclose(f.value, c, rel_tol=1e-12)
    assert math.isclose(f.lost, 1 - c, abs_tol=1e-12)


def test_a_power_law_curve_is_close_and_brackets_the_truth():
    """On a power-law curve (not linear in log steps) the log interpolation lies between the two budgets and near
    the truth: within 5% for a sweep that doubles."""
    def curve(s):
        return 1.5 + 20.0 * np.asarray(s, float) ** -0.5
    T, c = 800, 0.45
    f = effective_fraction(BUDGETS, curve(BUDGETS), float(curve(c * T)), T)
    assert 200 / T <= f.value <= 400 / T and abs(f.value / c - 1) < 0.05


def test_outside_the_sweep_is_not_extrapolated():
    loss = log_linear(BUDGETS)
    assert effective_fraction(BUDGETS, loss, loss[0] + 0.01, 800).where == BELOW
    assert effective_fraction(BUDGETS, loss, loss[-1] - 0.01, 800).where == ABOVE
    assert math.isnan(effective_fraction(BUDGETS, loss, loss[-1] - 0.01, 800).value)
    assert effective_fraction(BUDGETS, loss, loss[-1], 800).value == 2.0  # exactly the largest budget


def test_a_noisy_floor_takes_the_smallest_budget_that_reaches_it():
    """A larger budget ending higher than a smaller one (noise at the floor): the envelope is the running minimum,
    so the target is reached at the first budget that gets there."""
    b, env = sync_envelope([400, 100, 200], [2.0, 2.5, 1.9])
    assert b.tolist() == [100, 200, 400] and env.tolist() == [2.5, 1.9, 1.9]
    assert effective_fraction([100, 200, 400], [2.5, 1.9, 2.0], 1.9, 400).value == 0.5
    with pytest.raises(ValueError, match="distinct"):
        sync_envelope([100, 100], [2.0, 1.9])
    with pytest.raises(ValueError, match="finite"):
        sync_envelope([100, 200], [2.0, math.nan])


def _t_ci(x, level):
    x = np.asarray(x, float)
    h = stats.t.ppf(0.5 + level / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return x.mean() - h, x.mean() + h


SYNC_T, SYNC_2T = [3.00, 3.02, 2.98, 3.01, 2.99], [2.80, 2.83, 2.79, 2.80, 2.78]  # falls about 0.2 nats


def _tost_p(d, margin):
    """The TOST p value written out: the larger of the two one-sided t tests' p values (against -margin, +margin)."""
    d = np.asarray(d, float)
    se = d.std(ddof=1) / math.sqrt(len(d))
    t_low, t_high = (d.mean() + margin) / se, (d.mean() - margin) / se
    return max(stats.t.sf(t_low, len(d) - 1), stats.t.cdf(t_high, len(d) - 1))


def test_a_settled_unsaturated_pair_passes_by_equivalence():
    f_T = [0.60, 0.55, 0.62, 0.58, 0.61]
    f_2T = [0.59, 0.56, 0.60, 0.59, 0.60]
    g = transient_gate(f_T, f_2T, SYNC_T, SYNC_2T, 0.95)
    lo, hi = _t_ci(np.subtract(f_2T, f_T), 0.90)  # TOST at alpha 0.05 reads the 90% interval
    assert g.passed and g.reason == "" and f"[{lo:+.3f}, {hi:+.3f}]" in g.detail
    assert -EQUIVALENCE_MARGIN < lo and hi < EQUIVALENCE_MARGIN
    # the interval method and statsmodels' ttost_paired agree with the p value written out, and with each other
    assert g.tost_p == pytest.approx(_tost_p(np.subtract(f_2T, f_T), EQUIVALENCE_MARGIN), rel=1e-9)
    assert g.tost_p < 0.05


def test_a_transient_pair_fails_with_a_narrow_interval_outside_the_margin():
    """f rises by 0.1 from T to 2T on every seed, tightly: the cost still changes with the budget."""
    f_T = [0.30, 0.28, 0.33, 0.31, 0.29]
    g = transient_gate(f_T, [f + 0.10 + 0.005 * i for i, f in enumerate(f_T)], SYNC_T, SYNC_2T, 0.95)
    assert not g.passed and g.reason == "rises with the budget" and g.tost_p > 0.05


def test_a_scattered_pair_fails_as_too_few_seeds_not_as_saturated():
    """Round 3's Lion: the async runs scatter across seeds while the sync loss still falls. The old gate (the
    interval contains 0) passed such data; an equivalence test cannot, and it says why: the interval is wider than
    the whole margin."""
    f_T = [0.41, 0.72, 1.17]
    f_2T = [0.70, 0.45, 0.95]
    g = transient_gate(f_T, f_2T, SYNC_T[:3], SYNC_2T[:3], 0.95)
    lo, hi = _t_ci(np.subtract(f_2T, f_T), 0.90)
    assert lo < 0 < hi and hi - lo > 2 * EQUIVALENCE_MARGIN  # contains 0: the old gate's pass
    assert not g.passed and g.reason == "too few seeds"


def test_drift_labels_say_what_the_interval_shows():
    """Issue 47: round 4 labelled AdamW's change "noisy" although its interval [+0.038, +0.175] excludes 0 (f rises
    with the budget: more seeds would not make the gate pass). The label follows the interval: excludes 0 -> the
    direction; includes 0 and half-width beyond the margin -> too few seeds; else no clear change."""
    assert drift_label(0.038, 0.175, EQUIVALENCE_MARGIN) == "rises with the budget"
    assert drift_label(-0.175, -0.038, EQUIVALENCE_MARGIN) == "falls with the budget"
    assert drift_label(-0.12, 0.09, EQUIVALENCE_MARGIN) == "too few seeds"  # half-width 0.105
    assert drift_label(-0.01, 0.08, EQUIVALENCE_MARGIN) == "no clear change"  # half-width 0.045, reaches past 0.05
    assert drift_label(-0.01, 0.08, 0.04) == "too few seeds"


def test_saturated_only_when_the_sync_loss_does_not_fall():
    """The sync loss at T and 2T ties (a floor): 'saturated', whatever f does; a noisy async gap alone never is."""
    f_T, f_2T = [0.90, 0.95, 1.00], [0.91, 0.95, 0.99]
    flat = [0.226, 0.227, 0.225]
    g = transient_gate(f_T, f_2T, flat, [s + d for s, d in zip(flat, [0.001, -0.002, 0.0005], strict=True)], 0.95)
    assert not g.passed and g.reason == "saturated" and "(does not fall)" in g.detail
    both = transient_gate([0.30, 0.28, 0.33], [0.60, 0.59, 0.61], flat, flat, 0.95)
    assert both.reason == "rises with the budget, saturated"
    with pytest.raises(ValueError, match="paired"):
        transient_gate([0.3], [0.6], [1.0], [0.9], 0.95)


def test_the_interval_method_matches_statsmodels_on_random_pairs():
    """equivalence_tost's decision (the 90% interval inside +-margin) equals statsmodels' ttost_paired p < 0.05."""
    from statsmodels.stats.weightstats import ttost_paired

    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(3, 9))
        f_T = rng.uniform(0.2, 0.9, n)
        f_2T = f_T + rng.normal(rng.uniform(-0.08, 0.08), rng.uniform(0.005, 0.08), n)
        g = transient_gate(f_T, f_2T, SYNC_T[:1] * n, SYNC_2T[:1] * n, 0.95)
        p = ttost_paired(f_2T, f_T, -EQUIVALENCE_MARGIN, EQUIVALENCE_MARGIN)[0]
        assert (g.reason in ("", "saturated")) == (p < 0.05), (f_T, f_2T)
