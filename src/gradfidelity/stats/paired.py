"""Paired non-inferiority, paired ratio intervals, equivalence and sample size.

Conventions (study C, Lex 2026; docs/sources.md, section "Study C"): per paired seed,
gap% = 100 * (method - baseline) / baseline, where lower is better (bits per byte); the method is non-inferior iff
the one-sided 95% upper confidence bound of the mean gap is at most the margin (1 point). The bound comes from
scipy's one-sample t test, not from a hand-rolled quantile; two-sided intervals are the project's one
`stats.intervals.t_interval`. Throughput ratios are compared on the log scale (a
ratio's natural scale), then exponentiated.

Every function refuses NaN/inf input: a diverged run must be handled explicitly by the caller, never averaged away.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats
from statsmodels.stats.power import TTestPower

from gradfidelity.stats.intervals import t_interval


def _paired(a, b, what: str) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"{what}: paired samples must be 1-D and of equal length, got {a.shape} and {b.shape}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError(f"{what}: non-finite values (a diverged run?) must be handled before the statistics")
    if len(a) < 2:
        raise ValueError(f"{what}: needs at least 2 paired seeds, got {len(a)}")
    return a, b


@dataclass(frozen=True)
class NonInferiority:
    n: int
    mean_gap_pct: float
    sd_gap_pct: float
    upper_pct: float
    margin_pct: float
    non_inferior: bool
    gaps_pct: tuple[float, ...]

    def as_dict(self) -> dict:
        return asdict(self)


def noninferiority(method, baseline, margin_pct: float = 1.0, confidence: float = 0.95) -> NonInferiority:
    """Paired non-inferiority on per-seed gap% (lower metric is better)."""
    m, b = _paired(method, baseline, "noninferiority")
    gaps = 100.0 * (m - b) / b
    res = stats.ttest_1samp(gaps, popmean=margin_pct, alternative="less")
    upper = float(res.confidence_interval(confidence).high)  # one-sided: (-inf, upper]
    return NonInferiority(n=len(gaps), mean_gap_pct=float(gaps.mean()), sd_gap_pct=float(gaps.std(ddof=1)),
                          upper_pct=upper, margin_pct=margin_pct, non_inferior=upper <= margin_pct,
                          gaps_pct=tuple(float(g) for g in gaps))


@dataclass(frozen=True)
class RatioCI:
    n: int
    ratio: float  # geometric mean of the per-seed ratios
    low: float
    high: float
    sd_log: float

    def as_dict(self) -> dict:
        return asdict(self)


def paired_ratio_ci(a, b, confidence: float = 0.95) -> RatioCI:
    """Ratio a/b (e.g. method throughput / baseline throughput) with a two-sided t interval on log ratios."""
    a, b = _paired(a, b, "paired_ratio_ci")
    if (a <= 0).any() or (b <= 0).any():
        raise ValueError("paired_ratio_ci: ratios need positive values")
    logr = np.log(a / b)
    ci = t_interval(logr, confidence)
    # math.exp, as claims.evidence.paired_ratio: a table and its claim show one interval to the last bit
    return RatioCI(n=len(logr), ratio=math.exp(ci.estimate), low=math.exp(ci.low), high=math.exp(ci.high),
                   sd_log=float(logr.std(ddof=1)))


def equivalence_tost(a, b, bound: float, confidence: float = 0.90) -> dict:
    """Two one-sided tests for |mean(a - b)| < bound: equivalent iff the (1 - 2 alpha) CI lies inside +-bound."""
    a, b = _paired(a, b, "equivalence_tost")
    d = a - b
    ci = t_interval(d, confidence)
    low, high = ci.low, ci.high
    return {"n": len(d), "mean_diff": float(d.mean()), "ci_low": low, "ci_high": high, "bound": bound,
            "max_abs_ci": max(abs(low), abs(high)), "equivalent": -bound < low and high < bound}


def implied_sd(mean_gap: float, upper: float, n: int, confidence: float = 0.95) -> float:
    """Per-seed sd implied by a reported mean and one-sided upper bound: upper = mean + t(conf, n-1) sd / sqrt(n)."""
    return (upper - mean_gap) * math.sqrt(n) / float(stats.t.ppf(confidence, n - 1))


def seeds_for_power(mean_gap: float, sd: float, margin: float = 1.0, alpha: float = 0.05,
                    power: float = 0.80) -> dict:
    """Paired seeds needed to show non-inferiority (one-sided) when the true mean gap is `mean_gap`.

    normal: ((z_{1-alpha} + z_{power}) sd / (margin - mean))^2, the textbook approximation;
    exact_t: the smallest n whose noncentral-t power reaches `power` (statsmodels' TTestPower), rounded up.
    """
    if not margin > mean_gap:
        return {"normal": math.inf, "exact_t": math.inf}
    effect = (margin - mean_gap) / sd
    normal = ((stats.norm.ppf(1 - alpha) + stats.norm.ppf(power)) / effect) ** 2
    return {"normal": float(normal), "exact_t": _exact_t_seeds(effect, alpha, power, normal)}


def _exact_t_seeds(effect: float, alpha: float, power: float, normal: float) -> int | float:
    """Smallest n with noncentral-t power >= `power`. statsmodels' root finder returns NaN when its bracket fails
    (tiny n for huge effects); then the power curve is searched directly, n by n, from 2 (it is monotone in n)."""
    solver = TTestPower()
    with warnings.catch_warnings():  # a failed bracket is handled below, not printed
        warnings.simplefilter("ignore")
        exact = solver.solve_power(effect_size=effect, alpha=alpha, power=power, alternative="larger")
    if exact is not None and math.isfinite(float(exact)):
        return int(math.ceil(float(exact)))
    if normal > 1e6:
        return math.inf
    for n in range(2, int(normal) + 100):
        if solver.power(effect_size=effect, nobs=n, alpha=alpha, alternative="larger") >= power:
            return n
    return math.inf
