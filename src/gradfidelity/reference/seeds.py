"""Across host types, a trajectory-chaotic metric is judged as one more seed of its arm.

Why: study A's small models on sampled generations leave their trajectory at the first rounding difference, so a
rerun on another CPU is a new draw, not a perturbation (measured: results/cpu/reference/drift_hosts_amd_vs_intel.csv,
where `fixed/relift/seed0` scores acc_id 46.3 against 32.5 committed, inside the spread of the committed seeds
32.5-46.2). No per-metric tolerance learned from one pair of hosts is sound for such a metric. What is sound: the
rerun is one more sample of its arm, so it must fall inside the committed seeds' prediction interval for that arm.

The interval (normal model, Student t):  mean +- t(1 - alpha/2, n - 1) * s * sqrt(1 + 1/n),  over the arm's n
committed seeds (the run's cell with its seed left out), s their sample standard deviation. `alpha` is
FAMILY_ALPHA / m for the m chaotic comparisons of one check (Bonferroni): a correct artifact fails the check with
probability at most FAMILY_ALPHA, whatever the number of metrics. An arm whose committed seeds all agree (a count, a
constant) is compared exactly; an arm with fewer than MIN_SEEDS committed seeds has no distribution to judge by and
stays "not comparable".

Each study declares its chaotic metrics in its rules module (`CHAOTIC_ACROSS_HOSTS`: metric names, or "*" for all),
from a measurement; tests/test_reference_seeds.py checks the declarations against the committed drift tables.
"""

from __future__ import annotations

import importlib
import math
import re

import pandas as pd
from scipy import stats

FAMILY_ALPHA = 0.05  # the chance that a correct rerun fails any one of the check's chaotic comparisons
MIN_SEEDS = 3
_SEED = re.compile(r"/seed\d+$")
ONE_MORE_SEED = "one more seed"  # the rule's prefix in the comparison table (and what the summary line counts)


def chaotic_metrics(study: str) -> frozenset[str]:
    """The metrics `study` declares chaotic across host types (its rules.CHAOTIC_ACROSS_HOSTS; "*": every metric)."""
    try:
        module = importlib.import_module(f"gradfidelity.studies.{study}.rules")
    except ModuleNotFoundError:
        return frozenset()
    return frozenset(getattr(module, "CHAOTIC_ACROSS_HOSTS", ()))


def is_chaotic(study: str, metric: str) -> bool:
    declared = chaotic_metrics(study)
    return "*" in declared or metric in declared


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


def judge(committed_value, rerun_value, values: list[float], alpha: float) -> tuple[str, str]:
    """(rule, verdict) for a chaotic metric across hosts: inside the arm's prediction interval -> ok."""
    n = len(values)
    if n < MIN_SEEDS:
        return f"{ONE_MORE_SEED}: {n} committed seeds", "not comparable"
    if max(values) == min(values):
        return f"{ONE_MORE_SEED}: every seed equal (n={n})", "ok" if float(rerun_value) == values[0] else "MISMATCH"
    low, high = prediction_interval(values, alpha)
    verdict = "ok" if low <= float(rerun_value) <= high else "MISMATCH"
    return f"{ONE_MORE_SEED}: {100 * (1 - alpha):.5g}% PI [{low:.4g}, {high:.4g}] (n={n})", verdict
