"""The power of a claim's decision: how likely its interval is to clear its threshold (either way) at n seeds, and
the n at which that probability reaches 80%.

A claim is decided on the two-sided t interval, at level L, of the mean of its per-seed values x_1..x_n:
m +- c s / sqrt(n), c = t_{(1+L)/2, n-1} (stats.intervals.t_interval).

- Against one threshold t0 (sides "gt", "lt") the verdict is decided, reproduced or not reproduced, when the interval
  excludes t0: |m - t0| / (s / sqrt(n)) > c, which is the two-sided one-sample t test at alpha = 1 - L rejecting.
  At a true mean mu and sd sigma that statistic is noncentral t with n - 1 df and noncentrality
  (mu - t0) sqrt(n) / sigma, so the probability of a decision is that test's two-sided power, both tails:
  statsmodels' TTestPower.
- Against a band [lo, hi] (sides "outside", "inside") the verdict is decided when the interval lies wholly outside the
  band (below lo, or above hi) or wholly inside it. The two outside events are noncentral t tails against lo and hi
  (scipy.stats.nct). The inside event, lo <= m - c s/sqrt(n) and m + c s/sqrt(n) <= hi, is a TOST's power: it needs
  the joint law of m and s, for which statsmodels has no class, so it is integrated over s (m ~ N(mu, sigma^2/n)
  independent of s, s^2 (n-1) / sigma^2 ~ chi^2_{n-1}; Owen's Q by quadrature). `band_event_probabilities` computes
  all three events by that one integral: the tests hold it against the noncentral t tails.

Which side of the threshold the claim's truth lies on does not matter for "decided": only which verdict it decides.
The plan reads the measured mean and sd as the true ones ("at the measured effect"); `sd_interval` gives the sd's own
chi-square interval, over which the needed n moves.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import integrate, stats
from statsmodels.stats.power import TTestPower

SIDES = ("gt", "lt", "outside", "inside")
BANDS = ("outside", "inside")
TARGET_POWER = 0.80
# Past this many seeds a plan is no plan at this scale: the table prints "> CAP" instead of a number.
CAP = 1000


def _band(threshold, side: str) -> tuple[float, float]:
    """(lo, hi): a band's ends, or a single threshold as the band [t0, t0]."""
    if side not in SIDES:
        raise ValueError(f"unknown side {side!r} (one of {', '.join(SIDES)})")
    if side in BANDS:
        lo, hi = (float(v) for v in threshold)
        if not lo <= hi:
            raise ValueError(f"band [{lo}, {hi}] is not ordered")
        return lo, hi
    if isinstance(threshold, (list, tuple)):
        raise ValueError(f"side {side!r} needs one threshold, got {threshold!r}")
    return float(threshold), float(threshold)


def _check(sd: float, n, level: float) -> None:
    if not (math.isfinite(sd) and sd > 0):
        raise ValueError(f"power needs a positive finite sd, got {sd}")
    if np.any(np.asarray(n) < 2):
        raise ValueError("an interval needs n >= 2")
    if not 0 < level < 1:
        raise ValueError(f"level {level} is not in (0, 1)")


def crit(n, level: float):
    """c: the t quantile of the two-sided interval at `level` with n - 1 df."""
    return stats.t.ppf((1 + level) / 2, np.asarray(n) - 1)


def _far_tail(tail, nc):
    """scipy's noncentral t returns NaN for some tails far beyond the bulk (noncentrality ~ 7 and more). The tail
    P[T < -c] of T = (Z + nc) / S (c, S > 0) is at most Phi(-nc), since T < -c needs Z + nc < 0; `nc` is passed
    with the sign that makes this the bound (-nc for an upper tail P[T > c]). Where the bound is below 1e-9 a NaN
    is read as 0; anywhere else it is an error, not a guess."""
    tail = np.array(tail, dtype=float)
    bad = np.isnan(tail)
    if bad.any():
        bound = stats.norm.sf(np.broadcast_to(nc, tail.shape)[bad])
        if not (bound <= 1e-9).all():
            raise ValueError(f"noncentral t tail is NaN where Phi(-nc) = {bound.max():.3g} does not bound it")
        tail[bad] = 0.0
    return tail


def tail_probabilities(mean: float, sd: float, n, lo: float, hi: float, level: float):
    """(P[interval wholly below lo], P[interval wholly above hi]) at true mean and sd: noncentral t tails."""
    _check(sd, n, level)
    n = np.asarray(n, dtype=float)
    c, df = crit(n, level), n - 1
    nc_lo, nc_hi = (mean - lo) * np.sqrt(n) / sd, (mean - hi) * np.sqrt(n) / sd
    below = _far_tail(stats.nct.cdf(-c, df, nc_lo), nc_lo)
    above = _far_tail(stats.nct.sf(c, df, nc_hi), -nc_hi)
    return (below, above) if n.ndim else (float(below), float(above))


def inside_probability(mean: float, sd: float, n, lo: float, hi: float, level: float):
    """P[lo <= low and high <= hi]: the interval wholly inside [lo, hi] (a TOST's power), by quadrature over s;
    `n` may be an array (one vector quadrature for all)."""
    _check(sd, n, level)
    ns = np.atleast_1d(np.asarray(n, dtype=float))
    c, se, df = crit(ns, level), sd / np.sqrt(ns), ns - 1
    # the interval fits the band only while c s / sqrt(n) <= (hi - lo) / 2: beyond that quantile of s it is 0, so
    # the integral runs over s's quantiles p in [0, p_max], mapped onto q in [0, 1] for every n at once
    s_max = (hi - lo) * np.sqrt(ns) / (2 * c)
    p_max = stats.chi2.cdf(df * (s_max / sd) ** 2, df)

    def given_s(q: float) -> np.ndarray:
        s = sd * np.sqrt(stats.chi2.ppf(q * p_max, df) / df)
        half = c * s / np.sqrt(ns)
        fits = stats.norm.cdf((hi - half - mean) / se) - stats.norm.cdf((lo + half - mean) / se)
        return p_max * np.maximum(0.0, fits)

    value = integrate.quad_vec(given_s, 0.0, 1.0, epsabs=1e-10, epsrel=1e-8, norm="max")[0]
    return value if np.ndim(n) else float(value[0])


def band_event_probabilities(mean: float, sd: float, n: int, lo: float, hi: float, level: float
                             ) -> tuple[float, float, float]:
    """(below, inside, above), each by the same quadrature over s: the independent path the tests hold the
    noncentral t tails and `inside_probability` against."""
    _check(sd, n, level)
    c, se = float(crit(n, level)), sd / math.sqrt(n)

    def half(p: float) -> float:
        return c * sd * math.sqrt(stats.chi2.ppf(p, n - 1) / (n - 1)) / math.sqrt(n)

    def quad(f) -> float:
        return float(integrate.quad(f, 0.0, 1.0, epsabs=1e-10, epsrel=1e-8, limit=200)[0])

    below = quad(lambda p: stats.norm.cdf((lo - half(p) - mean) / se))
    above = quad(lambda p: stats.norm.sf((hi + half(p) - mean) / se))
    inside = quad(lambda p: max(0.0, stats.norm.cdf((hi - half(p) - mean) / se)
                                - stats.norm.cdf((lo + half(p) - mean) / se)))
    return below, inside, above


def decision_probability(mean: float, sd: float, n, threshold, side: str, level: float):
    """P[the verdict is decided, either way] at n seeds (a number or an array) when the per-seed values have this
    true mean and sd. One threshold: statsmodels' two-sided t test power. A band: the noncentral t tails plus the
    inside integral."""
    lo, hi = _band(threshold, side)
    ns = np.asarray(n, dtype=float)
    _check(sd, ns, level)
    if side in BANDS:
        below, above = tail_probabilities(mean, sd, ns, lo, hi, level)
        out = below + above + inside_probability(mean, sd, ns, lo, hi, level)
    else:
        d = abs(mean - lo) / sd
        with np.errstate(invalid="ignore"):
            out = np.array(TTestPower().power(effect_size=d, nobs=ns, alpha=1 - level, alternative="two-sided"),
                           dtype=float)
        bad = np.isnan(out)
        if bad.any():  # statsmodels adds scipy's far tail, NaN far out: that tail is bounded, the near one is not
            nb = np.broadcast_to(ns, out.shape)[bad]
            near = stats.nct.sf(crit(nb, level), nb - 1, d * np.sqrt(nb))
            out[bad] = near + _far_tail(np.full_like(near, np.nan), d * np.sqrt(nb))
    return out if np.ndim(n) else float(out)


def seeds_to_decide(mean: float, sd: float, threshold, side: str, level: float, power: float = TARGET_POWER,
                    cap: int = CAP) -> int | None:
    """The smallest n (>= 2) at which the verdict is decided with probability >= `power`; None past `cap`.
    An sd of 0 (identical seeds: a zero-width interval) decides at any n unless the mean sits on a threshold."""
    lo, hi = _band(threshold, side)
    if sd == 0:
        return None if mean in (lo, hi) else 2
    ns = np.arange(2, cap + 1)
    reached = np.flatnonzero(decision_probability(mean, sd, ns, threshold, side, level) >= power)
    return int(ns[reached[0]]) if len(reached) else None


def sd_interval(sd: float, n: int, level: float = 0.95) -> tuple[float, float]:
    """The per-seed sd's own two-sided chi-square interval from n seeds (normal data)."""
    if n < 2:
        raise ValueError("an sd interval needs n >= 2")
    df = n - 1
    return (sd * math.sqrt(df / stats.chi2.ppf((1 + level) / 2, df)),
            sd * math.sqrt(df / stats.chi2.ppf((1 - level) / 2, df)))


def expected_verdict(mean: float, threshold, side: str) -> str:
    """The verdict the interval decides when it decides at this true mean: 'reproduced', 'not reproduced', or ''
    for a mean on a threshold (the plan cannot say which)."""
    lo, hi = _band(threshold, side)
    if mean in (lo, hi):
        return ""
    holds = {"gt": mean > lo, "lt": mean < lo, "outside": mean < lo or mean > hi,
             "inside": lo < mean < hi}[side]
    return "reproduced" if holds else "not reproduced"
