"""Pairing by seed on runs.csv: the one look-up the tables, figures and claims of study B share.

Seed k of every cell has the same initialisation and batch order, so every statistic is computed per seed first
(gap = variant - sync on that seed, a difference or ratio of gaps, an EF recovery %, a Spearman correlation) and only
then summarised over seeds. Only `lr~tuned` cells enter (the LR grid is lr_select.py's).

A seed on which any run a statistic needs diverged (or is missing) is dropped from that statistic (`Paired.dropped`),
counted and named by the claims and the tables: never averaged away silently.

The sync plateau gate (issue 13): a gap taken while the sync loss still falls measures progress, not robustness to
delay. For every optimizer a claim compares, the sync loss must change over the last 10% of the steps
(`plateau_delta`, mean over the paired seeds) by less than a quarter of that optimizer's gap (mean, absolute), or
of 1% of its sync loss when the gap is smaller than that (B2's own threshold for "small": asking for a flatter
curve than that would leave every near-zero gap unmeasurable). Else the claim is not measured, with the numbers.

EF recovery % = 100 (async - async_EF) / (async - sync), per seed. Extra steps = how many more steps the sync run
needed after reaching the async run's final loss (T - the first step, linearly interpolated on the validation
curve, at which sync reached it); nan when async ends below sync's final loss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from gradfidelity.claims.evidence import gate
from gradfidelity.errors import UserError
from gradfidelity.studies.async_pp.config import StudyConfig
from gradfidelity.studies.async_pp.plan import TUNED, default_momentum, main_head

PLATEAU_SHARE = 0.25  # the sync change over the last 10% must be below this share of the gap
PLATEAU_FLOOR = 0.01  # ... or of this fraction of the sync loss when the gap is smaller (B2's threshold)


@dataclass(frozen=True)
class Spec:
    """One tuned-LR cell without its seed; momentum None = the optimizer's default, steps None = train.steps,
    head None = the model's (main sweeps)."""

    optimizer: str
    schedule: str = "sync"
    mitigation: str = "none"
    depth: int = 1
    momentum: float | None = None
    steps: int | None = None
    head: str | None = None

    def label(self) -> str:
        s = self.schedule + ("" if self.mitigation == "none" else f"+{self.mitigation}")
        extra = (f" P{self.depth}" if self.schedule.startswith("pipedream") else "") \
            + ("" if self.momentum is None else f" mom {self.momentum:g}") \
            + ("" if self.steps is None else f" {self.steps} steps") \
            + ("" if self.head is None else f" {self.head} head")
        return f"{self.optimizer} {s}{extra}"


@dataclass
class Paired:
    """Final losses (and sync plateau changes) of several cells on the seeds where every one of them finished."""

    seeds: list[int]
    loss: dict[str, np.ndarray]
    dropped: dict[int, list[str]] = field(default_factory=dict)  # seed -> the runs that diverged / are missing
    sources: list[str] = field(default_factory=list)
    plateau: dict[str, np.ndarray] = field(default_factory=dict)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.loss[name]

    @property
    def n(self) -> int:
        return len(self.seeds)

    @property
    def diverged(self) -> int:
        return len(self.dropped)

    def dropped_note(self) -> str:
        if not self.dropped:
            return ""
        return "; dropped " + ", ".join(f"seed {s} ({', '.join(why)})" for s, why in sorted(self.dropped.items()))

    def per_seed(self, values) -> str:
        return ", ".join(f"s{s} {v:.4g}" for s, v in zip(self.seeds, values, strict=True))


class Gaps:
    """Paired-by-seed loss look-ups on runs.csv (one row per run: the cell keys, seed, status, final_val_loss)."""

    def __init__(self, runs: pd.DataFrame, cfg: StudyConfig):
        self.runs, self.cfg = runs, cfg.need("seeds", "model", "train", "sweeps")
        self.steps = cfg.train.steps
        self.seeds = list(range(cfg.seeds))
        self.head = main_head(cfg)
        self._index: dict[tuple, tuple[float, str, str, float]] = {}
        cols = set(runs.columns)
        for row in runs.to_dict("records"):
            if row.get("lr", TUNED) != TUNED:
                continue  # the LR grid
            key = self._key(row["optimizer"], row.get("head", self.head), row["schedule"], row["mitigation"],
                            row["depth"], row["momentum"], row["steps"], row["seed"])
            if key in self._index:
                raise UserError(f"runs table: two runs of {key}")
            loss = float(row["final_val_loss"])
            status = row["status"] if math.isfinite(loss) else "diverged"
            run_dir = row["run_dir"] if "run_dir" in cols and isinstance(row["run_dir"], str) else ""
            plateau = float(row["plateau_delta"]) if "plateau_delta" in cols else math.nan
            self._index[key] = (loss, status, run_dir, plateau)

    @staticmethod
    def _key(optimizer, head, schedule, mitigation, depth, momentum, steps, seed) -> tuple:
        return (optimizer, head, schedule, mitigation, int(depth), round(float(momentum), 6), int(steps), int(seed))

    def _cell(self, spec: Spec, seed: int) -> tuple[float, str, str, float]:
        mom = default_momentum(spec.optimizer) if spec.momentum is None else spec.momentum
        depth = spec.depth if spec.schedule.startswith("pipedream") else 1
        key = self._key(spec.optimizer, spec.head or self.head, spec.schedule, spec.mitigation, depth, mom,
                        spec.steps or self.steps, seed)
        return self._index.get(key, (math.nan, "missing", "", math.nan))

    def paired(self, specs: dict[str, Spec]) -> Paired:
        seeds, loss, plateau, dropped, sources = [], {k: [] for k in specs}, {k: [] for k in specs}, {}, []
        for seed in self.seeds:
            got, bad = {}, []
            for name, spec in specs.items():
                value, status, run_dir, pl = self._cell(spec, seed)
                if run_dir:
                    sources.append(run_dir)
                if status != "ok":
                    bad.append(f"{spec.label()} {status}")
                got[name] = (value, pl)
            if bad:
                dropped[seed] = bad
                continue
            seeds.append(seed)
            for name, (value, pl) in got.items():
                loss[name].append(value)
                plateau[name].append(pl)
        return Paired(seeds, {k: np.asarray(v, dtype=float) for k, v in loss.items()}, dropped,
                      list(dict.fromkeys(sources)), {k: np.asarray(v, dtype=float) for k, v in plateau.items()})

    def gap(self, optimizer, schedule="2bw", mitigation="none", depth=1, momentum=None, steps=None,
            head=None) -> float:
        """Mean over paired seeds of (variant - sync); NaN if no seed has both runs finished (figures)."""
        p = self.paired({"v": Spec(optimizer, schedule, mitigation, depth, momentum, steps, head),
                         "sync": Spec(optimizer, momentum=momentum, steps=steps, head=head)})
        return float((p["v"] - p["sync"]).mean()) if p.n else math.nan


def ef_recovery(sync, asyn, ef):
    """100 (async - EF) / (async - sync), elementwise; NaN where async <= sync (nothing to recover) or NaN input."""
    sync, asyn, ef = (np.asarray(x, dtype=float) for x in (sync, asyn, ef))
    gap = asyn - sync
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(gap > 0, 100.0 * (asyn - ef) / np.where(gap > 0, gap, 1.0), np.nan)
    return float(out) if out.ndim == 0 else out


def extra_steps(steps, val_loss, target: float) -> float:
    """T - (first step, linearly interpolated, at which the sync curve reaches `target`); nan if it never does.

    `steps`/`val_loss`: the sync run's validation curve (ascending steps, the last = T)."""
    s, v = np.asarray(steps, dtype=float), np.asarray(val_loss, dtype=float)
    if len(s) == 0 or not np.isfinite(target) or v[-1] > target:
        return math.nan
    i = int(np.argmax(v <= target))
    if i == 0:
        return float(s[-1] - s[0])
    # v[i-1] > target >= v[i]: interpolate between the two evaluations
    frac = (v[i - 1] - target) / (v[i - 1] - v[i])
    return float(s[-1] - (s[i - 1] + frac * (s[i] - s[i - 1])))


def plateau_limit(gap_mean: float, sync_mean: float) -> float:
    """The largest |sync change over the last 10% of steps| the gate accepts: a quarter of |gap|, or of 1% of
    the sync loss when the gap is smaller than that."""
    return PLATEAU_SHARE * max(abs(gap_mean), PLATEAU_FLOOR * sync_mean)


def plateau_gate(p: Paired, items: list[tuple[str, str, np.ndarray]]) -> list[dict]:
    """The sync plateau gate for the optimizers of a claim: items = (label, sync cell name in p, per-seed gap)."""
    if p.n == 0:
        return []
    ok, parts = True, []
    for label, sync_name, gaps in items:
        delta = float(np.mean(p.plateau[sync_name]))
        limit = plateau_limit(float(np.mean(gaps)), float(np.mean(p[sync_name])))
        passed = math.isfinite(delta) and abs(delta) < limit
        ok &= passed
        parts.append(f"{label}: sync changed {delta:.4g} over the last 10% of steps, limit {limit:.4g} "
                     f"({'ok' if passed else 'not plateaued'})")
    return [gate("sync_plateau", ok, "; ".join(parts))]

