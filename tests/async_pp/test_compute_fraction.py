"""The effective compute fraction f(T) and the transient gate on hand-made curves (issue 25): a known multiplier, a
saturated pair, a transient pair; the references are written out here (closed-form curves, scipy's t interval)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from gradfidelity.studies.async_pp.compute_fraction import (
    ABOVE,
    BELOW,
    INSIDE,
    effective_fraction,
    per_seed_fractions,
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


def test_per_seed_fractions_pair_each_seed_with_its_own_sweep():
    shift = np.array([0.0, 0.05, -0.05])[:, None]
    sync = log_linear(BUDGETS)[None, :] + shift
    asyn = log_linear([0.5 * 800, 0.25 * 800, 0.5 * 800]) + shift[:, 0]
    got = [f.value for f in per_seed_fractions(BUDGETS, sync, asyn, 800)]
    assert np.allclose(got, [0.5, 0.25, 0.5])


def _t_ci(x, level):
    x = np.asarray(x, float)
    h = stats.t.ppf(0.5 + level / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return x.mean() - h, x.mean() + h


def test_a_settled_unsaturated_pair_passes():
    f_T, f_2T = [0.60, 0.55, 0.62], [0.58, 0.59, 0.60]
    sync_T, sync_2T = [3.00, 3.02, 2.98], [2.80, 2.83, 2.79]
    gap = [0.10, 0.12, 0.09]
    g = transient_gate(f_T, f_2T, sync_T, sync_2T, gap, 0.95)
    lo, hi = _t_ci(np.subtract(f_2T, f_T), 0.95)
    assert g.passed and g.reason == "" and f"[{lo:+.3f}, {hi:+.3f}]" in g.detail


def test_a_transient_pair_is_not_measured():
    """f doubles from T to 2T on every seed: the comparison has not left the early transient."""
    g = transient_gate([0.30, 0.28, 0.33], [0.60, 0.59, 0.61], [3.0, 3.02, 2.98], [2.8, 2.83, 2.79],
                       [0.10, 0.12, 0.09], 0.95)
    assert not g.passed and g.reason == "transient"


def test_a_saturated_pair_is_not_measured():
    """The sync loss moves less per doubling than 4 standard errors of the gap (round 2's embedded corpus at its
    entropy floor): any two runs tie there, whatever the delay."""
    gap = [0.004, -0.003, 0.006]
    se = np.std(gap, ddof=1) / math.sqrt(3)
    sync_T = [0.226, 0.227, 0.225]
    sync_2T = [s - 3.9 * se for s in sync_T]
    g = transient_gate([0.9, 0.95, 1.0], [0.92, 0.97, 0.96], sync_T, sync_2T, gap, 0.95)
    assert not g.passed and g.reason == "saturated"
    both = transient_gate([0.3, 0.28, 0.33], [0.6, 0.59, 0.61], sync_T, sync_2T, gap, 0.95)
    assert both.reason == "transient, saturated"
    with pytest.raises(ValueError, match="paired"):
        transient_gate([0.3], [0.6], [1.0], [0.9], [0.1], 0.95)
