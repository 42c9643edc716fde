"""The one-step delay measured as lost compute: the effective compute fraction f(T) (issue 25).

f(T) = S* / T, where T is the async run's budget in steps and S* the budget a *sync* run needs to reach the async
run's final validation loss. S* is read off a sync length sweep in which every budget is a run with its own full
schedule (warm-up, constant phase, decay): a point on one run's decaying curve is not what a run of that length
would reach (round 2's `extra_steps` read 16.5% lost steps off one AdamW curve where the length sweep said about
41%). Between two budgets the final loss is interpolated linearly in log(steps), the axis on which loss curves are
closest to straight. 1 - f(T) is the compute the delay costs: 0.25 means the async run got what a sync run gets
from three quarters of the steps.

Why a fraction and not a gap in nats: a nats gap shrinks as every optimizer approaches its loss floor, whatever the
delay does (round 2: the embedded corpus's floor made every gap vanish), and it cannot be compared across
optimizers whose curves have different slopes. Compute is the currency of the paper's question (is the async
pipeline's throughput worth its delay?), and it does not shrink merely because the loss curve flattens.

The transient gate (issue 37): a comparison at budget T means something only after the early transient (where the
delay's cost still changes with T) and before saturation (where the sync loss no longer moves, so any two runs tie).
It is an equivalence test, so that noisy data cannot pass it: f(2T) - f(T) must be shown to lie within
+-EQUIVALENCE_MARGIN by a paired TOST. Its reasons say what the data show (`drift_label`, issue 47): "rises with the
budget" or "falls with the budget" (the interval excludes 0: f moves with the budget, more seeds would not make it
pass), "too few seeds" (it includes 0 and is wider than the margin), "no clear change", and "saturated" (only when the
sync loss does not fall from T to 2T: the paired fall's interval reaches 0). Round 5 (issue 47) no longer decides
the claims on this gate (claims.py: the budget rule); the tables show it as a reading.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gradfidelity.stats.intervals import t_interval

INSIDE, BELOW, ABOVE = "inside", "below_sweep", "above_sweep"
# The equivalence margin of f(2T) - f(T), in units of f (issue 37, fixed before the round-4 run): 5 points of
# compute, the size B7 already calls "does not grow".
EQUIVALENCE_MARGIN = 0.05


@dataclass(frozen=True)
class Fraction:
    """f = S*/T, or nan with `where` saying on which side of the sync sweep the target lies."""

    value: float
    where: str

    @property
    def lost(self) -> float:
        """The compute the delay costs, 1 - f."""
        return 1.0 - self.value


def sync_envelope(budgets: Sequence[int], sync_final: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """The sweep in budget order with its final losses made non-increasing (running minimum): a larger budget that
    ends higher than a smaller one is noise near the floor, and the smallest budget that reaches a loss is what a
    sync run would need."""
    b, v = np.asarray(budgets, dtype=float), np.asarray(sync_final, dtype=float)
    if b.ndim != 1 or b.shape != v.shape or len(b) < 2:
        raise ValueError(f"a sync length sweep needs >= 2 budgets with one final loss each, got {b!r} / {v!r}")
    if (b <= 0).any() or len(set(b.tolist())) != len(b):
        raise ValueError(f"sync budgets must be positive and distinct, got {b.tolist()}")
    if not np.isfinite(v).all():
        raise ValueError(f"sync final losses must be finite (a diverged sync run is handled before), got {v}")
    order = np.argsort(b)
    return b[order], np.minimum.accumulate(v[order])


def effective_fraction(budgets: Sequence[int], sync_final: Sequence[float], target: float, T: float) -> Fraction:
    """f = S*/T with S* the sync budget whose final loss equals `target` (the async run's final loss at budget T),
    interpolated linearly in log(steps) on the sync sweep's envelope. Outside the sweep f is not extrapolated:
    nan with where = below_sweep (the async run is worse than the smallest sync budget) or above_sweep (better
    than the largest)."""
    if not math.isfinite(target) or T <= 0:
        raise ValueError(f"target {target!r} and T {T!r} must be finite and positive")
    b, env = sync_envelope(budgets, sync_final)
    if target > env[0]:
        return Fraction(math.nan, BELOW)
    if target < env[-1]:
        return Fraction(math.nan, ABOVE)
    i = int(np.argmax(env <= target))
    if env[i] == target:  # exactly a budget's loss: that budget, without a round trip through the logarithm
        return Fraction(float(b[i] / T), INSIDE)
    frac = (env[i - 1] - target) / (env[i - 1] - env[i])  # env[i-1] > target >= env[i]
    log_s = math.log(b[i - 1]) + frac * (math.log(b[i]) - math.log(b[i - 1]))
    return Fraction(float(math.exp(log_s) / T), INSIDE)


@dataclass(frozen=True)
class TransientGate:
    passed: bool
    reason: str  # "" when passed, else drift_label's label and/or "saturated" (joined by ", ")
    detail: str
    tost_p: float  # the TOST p value (the larger of the two one-sided p values): equivalence iff < alpha


def tost_confidence(level: float) -> float:
    """The two-sided confidence of the interval a TOST at the registry's `level` reads: alpha = 1 - level per
    one-sided test, so the (1 - 2 alpha) interval (0.90 at 0.95), the textbook equivalence interval."""
    return 2.0 * level - 1.0


def drift_label(low: float, high: float, margin: float) -> str:
    """What an interval of a change with the budget shows (issue 47; round 4 called an interval wider than 2 x margin
    "noisy" even when it excluded 0, i.e. when f demonstrably moved): "rises with the budget" / "falls with the
    budget" when it excludes 0; "too few seeds" when it includes 0 and its half-width exceeds `margin` (more seeds
    would narrow it); else "no clear change" (it includes 0 and is narrower: neither a move nor its absence is
    shown)."""
    if low > 0:
        return "rises with the budget"
    if high < 0:
        return "falls with the budget"
    return "too few seeds" if (high - low) / 2 > margin else "no clear change"


def transient_gate(f_T: Sequence[float], f_2T: Sequence[float], sync_T: Sequence[float],
                   sync_2T: Sequence[float], level: float, margin: float = EQUIVALENCE_MARGIN) -> TransientGate:
    """Is budget T past the early transient and short of saturation? Paired per seed:
    - left the transient: a paired TOST shows f(2T) - f(T) within +-margin (stats.paired.equivalence_tost: the
      (2 level - 1) t interval inside the margin; its p value from statsmodels' ttost_paired, which the interval
      agrees with); else the label says what the data show (`drift_label`, issue 47): "rises with the budget" or
      "falls with the budget" when the interval excludes 0, "too few seeds" when it includes 0 and its half-width
      exceeds the margin, "no clear change" when it includes 0, is that narrow and still reaches past the margin;
    - not saturated: the `level` t interval of the paired sync fall sync(T) - sync(2T) lies above 0."""
    from statsmodels.stats.weightstats import ttost_paired

    from gradfidelity.stats.paired import equivalence_tost

    f1, f2 = np.asarray(f_T, float), np.asarray(f_2T, float)
    s1, s2 = np.asarray(sync_T, float), np.asarray(sync_2T, float)
    if not (len(f1) == len(f2) == len(s1) == len(s2)) or len(f1) < 2:
        raise ValueError("the transient gate needs >= 2 paired seeds with every value")
    if not all(np.isfinite(x).all() for x in (f1, f2, s1, s2)):
        raise ValueError("the transient gate needs finite values (f outside the sweep is handled before)")
    eq = equivalence_tost(f2, f1, margin, confidence=tost_confidence(level))
    p = float(ttost_paired(f2, f1, -margin, margin)[0]) if np.ptp(f2 - f1) > 0 else float(not eq["equivalent"])
    width = eq["ci_high"] - eq["ci_low"]
    drift = "" if eq["equivalent"] else drift_label(eq["ci_low"], eq["ci_high"], margin)
    fall = t_interval(s1 - s2, level)
    moving = fall.low is not None and fall.low > 0.0
    reasons = [r for r in (drift, "" if moving else "saturated") if r]
    detail = (f"f(2T) - f(T) {eq['mean_diff']:+.3f} [{eq['ci_low']:+.3f}, {eq['ci_high']:+.3f}] "
              f"({tost_confidence(level):.0%} interval, width {width:.3f}) against the margin +-{margin:g}: "
              f"{'equivalent' if eq['equivalent'] else drift} (TOST p {p:.3g}); sync loss falls "
              f"{fall.estimate:.4f} [{fall.low:.4f}, {fall.high:.4f}] from T to 2T"
              f"{'' if moving else ' (does not fall)'}")
    return TransientGate(not reasons, ", ".join(reasons), detail, p)
