"""Across host types, a trajectory-chaotic metric is judged as one more seed of its arm, and only where a claim reads
it and it can fail.

Why: study A's small models on sampled generations leave their trajectory at the first rounding difference, so a
rerun on another CPU is a new draw, not a perturbation (measured: results/cpu/reference/drift_hosts_amd_vs_intel.csv,
where `fixed/relift/seed0` scores acc_id 46.3 against 32.5 committed, inside the spread of the committed seeds
32.5-46.2). No per-metric tolerance learned from one pair of hosts is sound for such a metric. What is sound: the
rerun is one more sample of its arm, so it must fall inside the committed seeds' prediction interval for that arm.

The interval (normal model, Student t):  mean +- t(1 - alpha/2, n - 1) * s * sqrt(1 + 1/n),  over the arm's n
committed seeds (the run's cell with its seed left out), s their sample standard deviation.

What is judged (round 6, issue 58):
- The metrics a claim reads (the study's `rules.CLAIM_METRICS`: metric -> its range, e.g. an accuracy 0-100). The
  level is one family over those comparisons: alpha = FAMILY_ALPHA / m for the m claim-metric comparisons of one
  check (Bonferroni), so a correct artifact fails the check with probability at most FAMILY_ALPHA. Round 5 spent
  the family on every metric, token counts included, which no claim reads: the accuracies' intervals grew wider
  than their whole range and could not fail.
- An interval that holds the metric's whole range cannot fail: the verdict says "cannot fail", never "ok".
- Every other chaotic metric is a reading: its rule shows the arm's 95% interval and whether the rerun is inside;
  it neither passes nor fails.
- A run whose upstream run (study A's base model, which every arm starts from) differs from its committed record is
  "another base": the committed seeds' spread is conditional on one base, so their interval does not hold a rerun
  that started elsewhere (round 6 measured it: every study-A run on a new host type pretrains its own base).
An arm whose committed seeds all agree (a count, a constant) is compared exactly; an arm with fewer than MIN_SEEDS
committed seeds has no distribution to judge by and stays "not comparable".

Each study declares its chaotic metrics in its rules module (`CHAOTIC_ACROSS_HOSTS`: metric names, or "*" for all),
from a measurement, and a chaotic study the metrics its claims read (`CLAIM_METRICS`);
tests/test_reference_seeds.py checks the declarations against the committed drift tables and runs tables.
"""

from __future__ import annotations

import importlib
import math
import re

import pandas as pd
from scipy import stats

from gradfidelity.errors import UserError

FAMILY_ALPHA = 0.05  # the chance that a correct rerun fails any one of the check's claim-metric comparisons
READING_ALPHA = 0.05  # the level of a reading's interval (shown, never judged)
MIN_SEEDS = 3
_SEED = re.compile(r"/seed\d+$")
ONE_MORE_SEED = "one more seed"  # the rule's prefix in the comparison table (and what the summary line counts)
READING = "reading"  # the verdict of a chaotic metric no claim reads
CANNOT_FAIL = "cannot fail"  # the verdict of an interval that holds the metric's whole range
ANOTHER_BASE = "another base"  # the verdict of a run whose upstream record differs from the committed one


def _rules_module(study: str):
    try:
        return importlib.import_module(f"gradfidelity.studies.{study}.rules")
    except ModuleNotFoundError:
        return None


def chaotic_metrics(study: str) -> frozenset[str]:
    """The metrics `study` declares chaotic across host types (its rules.CHAOTIC_ACROSS_HOSTS; "*": every metric)."""
    return frozenset(getattr(_rules_module(study), "CHAOTIC_ACROSS_HOSTS", ()))


def is_chaotic(study: str, metric: str) -> bool:
    declared = chaotic_metrics(study)
    return "*" in declared or metric in declared


def claim_metrics(study: str) -> dict[str, tuple[float, float]]:
    """metric -> its range (low, high), for the metrics `study`'s claims read (its rules.CLAIM_METRICS). A study
    with chaotic metrics must declare them: without the declaration nothing says which comparisons can decide."""
    declared = getattr(_rules_module(study), "CLAIM_METRICS", None)
    if declared is None:
        if chaotic_metrics(study):
            raise UserError(f"studies/{study}/rules.py declares chaotic metrics (CHAOTIC_ACROSS_HOSTS) but not "
                            "CLAIM_METRICS, the metrics its claims read with their ranges: check-reference cannot "
                            "tell a claim's metric from a reading")
        return {}
    return {str(m): (float(lo), float(hi)) for m, (lo, hi) in dict(declared).items()}


def arm_of(run_id: str) -> str:
    """The run's arm: its cell without the seed (results/.../fixed/relift/seed0 -> results/.../fixed/relift)."""
    return _SEED.sub("", str(run_id))


def prediction_interval(values: list[float], alpha: float) -> tuple[float, float]:
    """The two-sided (1 - alpha) prediction interval of one more draw, from `values` (n >= 2)."""
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = stats.t.ppf(1 - alpha / 2, n - 1) * sd * math.sqrt(1 + 1 / n)
    return mean - half, mean + half


def arm_values(committed_all: pd.DataFrame, run_id: str, metric: str) -> list[float]:
    """The committed seeds' values of `metric` in the arm of `run_id` (finished runs with a value)."""
    col = f"metric_{metric}"
    if col not in committed_all.columns:
        return []
    arms = committed_all["run_id"].map(arm_of)
    rows = committed_all[(arms == arm_of(run_id)) & (committed_all["status"] == "ok")]
    return [float(v) for v in pd.to_numeric(rows[col], errors="coerce").dropna()]


def judge(committed_value, rerun_value, values: list[float], alpha: float,
          value_range: tuple[float, float] | None = None) -> tuple[str, str]:
    """(rule, verdict) for a claim's chaotic metric across hosts: inside the arm's prediction interval -> ok; an
    interval that holds the whole `value_range` -> "cannot fail"."""
    n = len(values)
    if n < MIN_SEEDS:
        return f"{ONE_MORE_SEED}: {n} committed seeds", "not comparable"
    if max(values) == min(values):
        return f"{ONE_MORE_SEED}: every seed equal (n={n})", "ok" if float(rerun_value) == values[0] else "MISMATCH"
    low, high = prediction_interval(values, alpha)
    rule = f"{ONE_MORE_SEED}: {100 * (1 - alpha):.5g}% PI [{low:.4g}, {high:.4g}] (n={n})"
    if value_range is not None and low <= value_range[0] and high >= value_range[1]:
        return f"{rule} holds the whole range [{value_range[0]:g}, {value_range[1]:g}]", CANNOT_FAIL
    return rule, "ok" if low <= float(rerun_value) <= high else "MISMATCH"


def reading(rerun_value, values: list[float]) -> str:
    """The rule text of a reading: the arm's 95% interval and where the rerun falls (never a verdict)."""
    if len(values) < MIN_SEEDS or max(values) == min(values):
        return f"{READING}: no claim reads it ({len(values)} committed seeds)"
    low, high = prediction_interval(values, READING_ALPHA)
    where = "inside" if low <= float(rerun_value) <= high else "outside"
    return (f"{READING}: no claim reads it; {where} the arm's {100 * (1 - READING_ALPHA):g}% PI "
            f"[{low:.4g}, {high:.4g}] (n={len(values)})")
