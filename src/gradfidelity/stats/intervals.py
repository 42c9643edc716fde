"""The one interval of the project: the mean of independent units with its two-sided t interval, from scipy.

Tables and claims both call `t_interval` at the registry's level (`claims.registry.level_for` or
`claims.registry.interval_level`), so a number shown in a table and the claim decided on it carry one interval.
Non-finite input is refused: a diverged run must be handled by the caller, never averaged away.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class Interval:
    """Mean of n units; `low`/`high` are None with fewer than two units (no interval)."""

    estimate: float
    low: float | None
    high: float | None
    level: float
    n: int

    def fmt(self, digits: int = 1) -> str:
        """`[low, high]`, or "n/a" without an interval."""
        if self.low is None:
            return "n/a"
        return f"[{self.low:.{digits}f}, {self.high:.{digits}f}]"


def finite(values, what: str) -> np.ndarray:
    arr = np.asarray(values, dtype=float).ravel()
    if not np.isfinite(arr).all():
        raise ValueError(f"{what}: non-finite values (a diverged run?) must be handled before the statistics")
    return arr


def t_interval(values, level: float) -> Interval:
    """Mean of `values` with its two-sided t interval at `level` (scipy's one-sample t test's interval).

    Identical units give a zero-width interval at the mean (the t interval of a constant series degenerates).
    """
    x = finite(values, "t_interval")
    if len(x) == 0:
        raise ValueError("t_interval: no values")
    est = float(x.mean())
    if len(x) < 2:
        return Interval(est, None, None, level, 1)
    if float(np.ptp(x)) <= 1e-12 * max(1.0, abs(est)):
        return Interval(est, est, est, level, len(x))
    ci = stats.ttest_1samp(x, popmean=0.0).confidence_interval(level)
    return Interval(est, float(ci.low), float(ci.high), level, len(x))


def one_sided_p(values, alternative: str = "greater") -> float:
    """p value of the one-sample t test of mean 0 against `alternative` (scipy)."""
    x = finite(values, "one_sided_p")
    return float(stats.ttest_1samp(x, popmean=0.0, alternative=alternative).pvalue)
