"""Comparing the sizes of two effects measured on the same seeds (study A's A6: is the aggregation bug's effect
smaller than the optimizer bug's?), and the noise floor of such a comparison.

Why not the mean of per-seed |effect| (rounds 2-4): where an outcome is chaotic across seeds (study A's SFT accuracy
is a take-off whose step varies by seed), a perturbation of no systematic effect still moves each seed's outcome by
about the seed-to-seed spread, so E|per-seed effect| stays at that spread however many seeds there are: the
statistic sits at its own noise floor. The size of an *effect* is the size of its mean, |E[x]|, whose estimate's
noise falls as 1/sqrt(n).

"|E[a]| < E[d]" (a smaller than a positive d) holds exactly when both linear contrasts E[d] - E[a] and E[d] + E[a]
are positive; each is a paired mean with a t interval, so the claim is an intersection-union test of the two
(claims.evidence.weakest), whose noise falls as 1/sqrt(n).

`zero_effect_floor` measures the floor of |mean effect| on a zero-effect control: two disjoint halves of one arm's
seeds compared as two arms (the effect is 0 by construction), |mean(half 1) - mean(half 2)| over every split, scaled
from n/2 pairs to n by sqrt(1/2); `per_seed_floor` is the floor of the old statistic, mean |a_i - a_j| over ordered
pairs of distinct seeds.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from gradfidelity.stats.intervals import finite


def zero_effect_floor(values, n: int | None = None) -> float:
    """Mean |mean(half 1) - mean(half 2)| over every split of `values` (one arm's seeds) into two halves of equal
    size, scaled to n paired seeds (default: len(values)) as 1/sqrt(n): the noise of a mean effect's size when the
    effect is 0."""
    v = finite(values, "zero_effect_floor")
    half = len(v) // 2
    if half < 1:
        raise ValueError("zero_effect_floor: needs >= 2 seeds")
    idx = range(len(v))
    diffs = [abs(v[list(a)].mean() - v[[i for i in idx if i not in a]][:half].mean())
             for a in itertools.combinations(idx, half)]
    return float(np.mean(diffs)) * math.sqrt(half / (n or len(v)))


def per_seed_floor(values) -> float:
    """Mean |v_i - v_j| over ordered pairs of distinct seeds: the old statistic's per-seed |effect| when an arm is
    another draw of the same outcome (zero systematic effect)."""
    v = finite(values, "per_seed_floor")
    if len(v) < 2:
        raise ValueError("per_seed_floor: needs >= 2 seeds")
    return float(np.mean([abs(a - b) for a, b in itertools.permutations(v, 2)]))
