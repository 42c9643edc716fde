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


def median_interval(values, level: float) -> Interval:
    """The median of `values` with its distribution-free interval at (at least) `level`: the order statistics
    x_(k) and x_(n+1-k), k the largest rank with P(B < k) <= (1 - level) / 2 for B ~ Binomial(n, 1/2) (scipy). For
    timings, whose spread is one-sided (a busy machine only slows a repeat). Too few values for the level (n < 6
    at 0.95) give no interval."""
    x = np.sort(finite(values, "median_interval"))
    if len(x) == 0:
        raise ValueError("median_interval: no values")
    n, tail = len(x), (1.0 - level) / 2.0
    est = float(np.median(x))
    ranks = [k for k in range(1, n // 2 + 1) if stats.binom.cdf(k - 1, n, 0.5) <= tail]
    if not ranks:
        return Interval(est, None, None, level, n)
    k = max(ranks)
    return Interval(est, float(x[k - 1]), float(x[n - k]), level, n)


def one_sided_p(values, alternative: str = "greater") -> float:
    """p value of the one-sample t test of mean 0 against `alternative` (scipy)."""
    x = finite(values, "one_sided_p")
    return float(stats.ttest_1samp(x, popmean=0.0, alternative=alternative).pvalue)
