"""From run directories to the study's tables, figures and claim evidence.

Pairing: seed k of every cell has the same initialisation and batch order, so every statistic is computed per seed
first (gap = variant - sync on that seed, a ratio of gaps, an EF recovery %, a Spearman correlation) and only then
summarised over seeds, with an interval (`gradfidelity.claims.evidence`) at the registry's level for the claim.

A seed on which any run a statistic needs diverged (or is missing) is dropped from that statistic, counted in the
record's `diverged` and named in its detail, and the tables name it in their `diverged` column: never averaged
away silently. A per-seed ratio whose denominator is <= 0 on some seed (a gap that is not positive) is undefined:
the claim is then not measured, with the reason, rather than a number made of the other seeds.

EF recovery % = 100 (async - async_EF) / (async - sync), per seed.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from gradfidelity.claims.evidence import (
    level_for,
    mean_ci,
    not_measured,
    paired_difference,
    paired_ratio,
    weakest,
    with_parts,
)
from gradfidelity.errors import UserError
from gradfidelity.harness.io import atomic_write_csv, atomic_write_json
from gradfidelity.studies.async_pp.plan import KEYS, cells, default_momentum

MAIN_VARIANTS = [("2bw", "error_feedback"), ("2bw", "taylor"), ("2bw", "sync_start"), ("2bw", "sync_cooldown")]
CLAIM_IDS = ("B1", "B1-abs", "B2", "B3", "B4", "B5-muon", "B5-adamw", "B6", "B7", "B8", "B9-sync_start",
             "B9-sync_cooldown", "B9-taylor")
SCALE_ENV = "GRADFIDELITY_SCALE"  # the harness records a run's scale from this variable (harness/run.py)


# ----------------------------------------------------------------------------------------------- aggregation
def aggregate(cfg: dict, root: str, runs_csv: str, curves_csv: str, scale: str | None = None) -> None:
    """Every planned cell's metrics.json, read through the harness loader, -> runs.csv + curves.csv.

    `scale` (default: $GRADFIDELITY_SCALE) must be the scale every run was made at: stale runs are refused.
    """
    from gradfidelity.harness.results import load_run_records

    planned = cells(cfg)  # validates the config before anything is read
    scale = scale or os.environ.get(SCALE_ENV)
    if not scale:
        raise UserError(f"async-pp-aggregate: no scale given (pass --scale or set {SCALE_ENV})")
    paths = [Path(c.metrics(root)) for c in planned]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise UserError(f"{len(missing)} planned run(s) have no metrics.json (train them first), e.g. {missing[0]}")
    tokens_per_step = int(cfg["train"]["batch_size"]) * int(cfg["train"]["seq_len"])
    rows, curve_rows = [], []
    for c, rec in zip(planned, load_run_records(paths, scale=scale), strict=True):
        if rec.get("seed") != c.seed:
            raise UserError(f"{rec['path']}: records seed {rec.get('seed')!r}, its directory says {c.seed}")
        ok = rec["status"] == "ok"
        m = rec["metrics"]
        key = asdict(c)
        rows.append({**key, "status": rec["status"], "final_val_loss": float(m["final_val_loss"]) if ok else math.nan,
                     "diverged_at_step": math.nan if ok else m.get("diverged_at_step", math.nan),
                     "tokens": c.steps * tokens_per_step, "step_s": (rec.get("timing") or {}).get("step_s", math.nan),
                     "scale": rec["scale"], "run_dir": rec["run_dir"], "path": rec["path"]})
        for step, tokens, val in (m.get("curve") or []) if ok else []:
            curve_rows.append({**key, "step": step, "tokens": tokens, "val_loss": val})
    atomic_write_csv(pd.DataFrame(rows), runs_csv)
    atomic_write_csv(pd.DataFrame(curve_rows, columns=[*KEYS, "seed", "step", "tokens", "val_loss"]), curves_csv)


# ----------------------------------------------------------------------------------------------- pairing
@dataclass(frozen=True)
class Spec:
    """One cell without its seed; momentum None = the optimizer's default, steps None = train.steps."""

    optimizer: str
    schedule: str = "sync"
    mitigation: str = "none"
    depth: int = 1
    momentum: float | None = None
    steps: int | None = None

    def label(self) -> str:
        s = self.schedule + ("" if self.mitigation == "none" else f"+{self.mitigation}")
        extra = (f" P{self.depth}" if self.schedule.startswith("pipedream") else "") \
            + ("" if self.momentum is None else f" mom {self.momentum:g}") \
            + ("" if self.steps is None else f" {self.steps} steps")
        return f"{self.optimizer} {s}{extra}"


@dataclass
class Paired:
    """Final losses of several cells on the seeds where every one of them finished (status ok, finite loss)."""

    seeds: list[int]
    loss: dict[str, np.ndarray]
    dropped: dict[int, list[str]] = field(default_factory=dict)  # seed -> the runs that diverged / are missing
    sources: list[str] = field(default_factory=list)

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

    def __init__(self, runs: pd.DataFrame, cfg: dict):
        self.runs, self.cfg = runs, cfg
        self.steps = int(cfg["train"]["steps"])
        self.seeds = list(range(int(cfg["seeds"])))
        self._index: dict[tuple, tuple[float, str, str]] = {}
        has_dir = "run_dir" in runs.columns
        for row in runs.itertuples(index=False):
            key = self._key(row.optimizer, row.schedule, row.mitigation, row.depth, row.momentum, row.steps,
                            row.seed)
            if key in self._index:
                raise UserError(f"runs table: two runs of {key}")
            loss = float(row.final_val_loss)
            status = row.status if math.isfinite(loss) else "diverged"
            run_dir = row.run_dir if has_dir and isinstance(row.run_dir, str) else ""
            self._index[key] = (loss, status, run_dir)

    @staticmethod
    def _key(optimizer, schedule, mitigation, depth, momentum, steps, seed) -> tuple:
        return (optimizer, schedule, mitigation, int(depth), round(float(momentum), 6), int(steps), int(seed))

    def _cell(self, spec: Spec, seed: int) -> tuple[float, str, str]:
        mom = default_momentum(self.cfg, spec.optimizer) if spec.momentum is None else spec.momentum
        depth = spec.depth if spec.schedule.startswith("pipedream") else 1
        key = self._key(spec.optimizer, spec.schedule, spec.mitigation, depth, mom, spec.steps or self.steps, seed)
        return self._index.get(key, (math.nan, "missing", ""))

    def paired(self, specs: dict[str, Spec]) -> Paired:
        seeds, loss, dropped, sources = [], {k: [] for k in specs}, {}, []
        for seed in self.seeds:
            got, bad = {}, []
            for name, spec in specs.items():
                value, status, run_dir = self._cell(spec, seed)
                if run_dir:
                    sources.append(run_dir)
                if status != "ok":
                    bad.append(f"{spec.label()} {status}")
                got[name] = value
            if bad:
                dropped[seed] = bad
                continue
            seeds.append(seed)
            for name, value in got.items():
                loss[name].append(value)
        return Paired(seeds, {k: np.asarray(v, dtype=float) for k, v in loss.items()}, dropped,
                      list(dict.fromkeys(sources)))

    def gap(self, optimizer, schedule="2bw", mitigation="none", depth=1, momentum=None, steps=None) -> float:
        """Mean over paired seeds of (variant - sync); NaN if no seed has both runs finished (figures)."""
        p = self.paired({"v": Spec(optimizer, schedule, mitigation, depth, momentum, steps),
                         "sync": Spec(optimizer, momentum=momentum, steps=steps)})
        return float((p["v"] - p["sync"]).mean()) if p.n else math.nan


def ef_recovery(sync, asyn, ef):
    """100 (async - EF) / (async - sync), elementwise; NaN where async <= sync (nothing to recover) or NaN input."""
    sync, asyn, ef = (np.asarray(x, dtype=float) for x in (sync, asyn, ef))
    gap = asyn - sync
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(gap > 0, 100.0 * (asyn - ef) / np.where(gap > 0, gap, 1.0), np.nan)
    return float(out) if out.ndim == 0 else out


# ----------------------------------------------------------------------------------------------- tables
def _mean(x) -> float:
    x = np.asarray(x, dtype=float)
    return float(x.mean()) if len(x) and np.isfinite(x).all() else math.nan


def _diverged_cell(p: Paired) -> str:
    return "; ".join(f"seed {s}: {', '.join(why)}" for s, why in sorted(p.dropped.items())) or "none"


def main_table(g: Gaps) -> pd.DataFrame:
    rows = []
    for opt in g.cfg["sweeps"]["main"]["optimizers"]:
        p = g.paired({"sync": Spec(opt), "2bw": Spec(opt, "2bw"), "ef": Spec(opt, "2bw", "error_feedback")})
        rows.append({"optimizer": opt, "sync": _mean(p["sync"]), "async_2bw": _mean(p["2bw"]),
                     "async_ef": _mean(p["ef"]), "gap": _mean(p["2bw"] - p["sync"]),
                     "gap_ef": _mean(p["ef"] - p["sync"]),
                     "ef_recovery_pct": _mean(ef_recovery(p["sync"], p["2bw"], p["ef"])),
                     "seeds": p.n, "diverged": _diverged_cell(p)})
    return pd.DataFrame(rows)


def mitigations_table(g: Gaps) -> pd.DataFrame:
    rows = []
    for opt in g.cfg["sweeps"]["main"]["optimizers"]:
        specs = {"sync": Spec(opt), "2bw": Spec(opt, "2bw")} | {mit: Spec(opt, s, mit) for s, mit in MAIN_VARIANTS}
        p = g.paired(specs)
        base = p["2bw"] - p["sync"]
        row = {"optimizer": opt, "gap_2bw": _mean(base)}
        for _, mit in MAIN_VARIANTS:
            gm = p[mit] - p["sync"]
            row[f"gap_{mit}"] = _mean(gm)
            row[f"ratio_{mit}"] = _mean(gm / base) if p.n and (base > 0).all() else math.nan
        rows.append({**row, "seeds": p.n, "diverged": _diverged_cell(p)})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------------- claims
def _stat(cid: str, p: Paired, values, what: str, sources: list[str], **kw) -> dict:
    """mean_ci over the per-seed `values` of paired seeds `p`, with the seeds, the dropped ones and the sources."""
    src = p.sources + sources
    if p.n == 0:
        return not_measured(f"{what}: no seed has every run finished{p.dropped_note()}", sources=src,
                            diverged=p.diverged)
    return mean_ci(values, level_for(cid), detail=f"{what}, per seed: {p.per_seed(values)}{p.dropped_note()}",
                   sources=src, diverged=p.diverged, **kw)


def _undefined(p: Paired, what: str, sources: list[str], why: str) -> dict:
    return not_measured(f"{what} undefined: {why}{p.dropped_note()}", n=p.n, sources=p.sources + sources,
                        diverged=p.diverged)


def _gaps(p: Paired, opts) -> dict[str, np.ndarray]:
    return {o: p[f"{o}/2bw"] - p[f"{o}/sync"] for o in opts}


def _main_specs(opts, variants=(("2bw", "none"),)) -> dict[str, Spec]:
    out = {}
    for o in opts:
        out[f"{o}/sync"] = Spec(o)
        for s, m in variants:
            out[f"{o}/{s}" + ("" if m == "none" else f"+{m}")] = Spec(o, s, m)
    return out


def _b1(g: Gaps, src: list[str]) -> dict[str, dict]:
    p = g.paired(_main_specs(("adamw", "muon")))
    gaps = _gaps(p, ("adamw", "muon"))
    ga, gm = gaps["adamw"], gaps["muon"]
    out = {"B1-abs": _stat("B1-abs", p, ga, "AdamW gap (2bw - sync), nats", src)}
    what = "AdamW gap / Muon gap (geometric mean over seeds, interval on the log ratios)"
    if p.n == 0:
        out["B1"] = _stat("B1", p, [], what, src)
    elif not ((ga > 0).all() and (gm > 0).all()):
        out["B1"] = _undefined(p, what, src, f"a gap is <= 0 on some seed (adamw {p.per_seed(ga)}; muon "
                                             f"{p.per_seed(gm)})")
    else:
        out["B1"] = paired_ratio(ga, gm, level_for("B1"), sources=p.sources + src, diverged=p.diverged,
                                 detail=f"{what}; per seed adamw {p.per_seed(ga)}; muon {p.per_seed(gm)}"
                                        f"{p.dropped_note()}")
    return out


def _b2(g: Gaps, src: list[str]) -> dict:
    p = g.paired(_main_specs(("muon",)))
    return _stat("B2", p, (p["muon/2bw"] - p["muon/sync"]) / p["muon/sync"], "Muon gap / Muon sync loss", src)


def _b3(g: Gaps, src: list[str]) -> dict:
    mid = ("soap", "adan", "lion")
    p = g.paired(_main_specs(("adamw", "muon", *mid)))
    gaps = _gaps(p, ("adamw", "muon", *mid))
    lo, hi = np.minimum(gaps["muon"], gaps["adamw"]), np.maximum(gaps["muon"], gaps["adamw"])
    count = sum(((lo <= gaps[o]) & (gaps[o] <= hi)).astype(float) for o in mid)
    what = ("count of SOAP, Adan, Lion with a gap between Muon's and AdamW's; gaps per seed: "
            + "; ".join(f"{o} {p.per_seed(gaps[o])}" for o in ("muon", "adamw", *mid)) + "; count")
    return _stat("B3", p, count, what, src)


def _b4(g: Gaps, src: list[str]) -> dict:
    sw = g.cfg["sweeps"]["momentum"]
    opts, moms = list(sw["optimizers"]), [float(m) for m in sw["momenta"]]
    specs = {f"{o}/{s}/{m}": Spec(o, s, momentum=m) for o in opts for m in moms for s in ("sync", "2bw")}
    p = g.paired(specs)
    what = f"mean over {', '.join(opts)} of Spearman(momentum, gap) over momenta {moms}"
    rhos, constant = [], []
    for i in range(p.n):
        per_opt = []
        for o in opts:
            gaps = [p[f"{o}/2bw/{m}"][i] - p[f"{o}/sync/{m}"][i] for m in moms]
            if len(set(gaps)) == 1:  # Spearman's rho is undefined for a constant input
                constant.append(f"seed {p.seeds[i]} {o}")
                continue
            per_opt.append(float(spearmanr(moms, gaps).statistic))
        rhos.append(float(np.mean(per_opt)) if len(per_opt) == len(opts) else math.nan)
    if len(moms) < 2 or constant:
        return _undefined(p, what, src, "fewer than two momenta" if len(moms) < 2
                          else f"gap constant over momentum for {', '.join(constant)}")
    return _stat("B4", p, rhos, what, src)


def _b5(g: Gaps, opt: str, cid: str, src: list[str]) -> dict:
    p = g.paired({"sync": Spec(opt), "2bw": Spec(opt, "2bw"), "ef": Spec(opt, "2bw", "error_feedback")})
    what = f"{opt} EF recovery % = 100 (async - async_EF) / (async - sync)"
    gap = p["2bw"] - p["sync"]
    if p.n and not (gap > 0).all():
        return _undefined(p, what, src, f"async <= sync on some seed (gap per seed {p.per_seed(gap)})")
    return _stat(cid, p, ef_recovery(p["sync"], p["2bw"], p["ef"]), what, src)


def _b6(g: Gaps, src: list[str]) -> dict:
    sw = g.cfg["sweeps"]["depth"]
    depths, level = sorted(int(P) for P in sw["depths"]), level_for("B6")
    if "pipedream" not in sw["schedules"]:
        rec = not_measured("the depth sweep has no 'pipedream' schedule", sources=src)
        return with_parts({"growth": rec, "excess": rec}, detail=rec["detail"], sources=src)
    growth, excess, sources, dropped = {}, {}, list(src), set()
    for o in sw["optimizers"]:
        pd_specs = {f"P{P}": Spec(o, "pipedream", depth=P) for P in depths}
        p = g.paired({"sync": Spec(o), "2bw": Spec(o, "2bw"), **pd_specs})
        sources += p.sources
        dropped |= set(p.dropped)
        kw = {"sources": p.sources + src, "diverged": p.diverged}
        gap = {k: p[k] - p["sync"] for k in ("2bw", *pd_specs)}
        for P, Q in zip(depths, depths[1:], strict=False):
            name = f"{o} P{Q}-P{P}"
            growth[name] = (paired_difference(gap[f"P{Q}"], gap[f"P{P}"], level, **kw,
                                              detail=f"PipeDream gap at P{Q} minus at P{P}, per seed: "
                                                     f"{p.per_seed(gap[f'P{Q}'] - gap[f'P{P}'])}{p.dropped_note()}")
                            if p.n else not_measured(f"no seed has every run finished{p.dropped_note()}", **kw))
        for P in (P for P in depths if P > 2):
            name = f"{o} P{P}"
            excess[name] = (paired_difference(gap[f"P{P}"], gap["2bw"], level, **kw,
                                              detail=f"PipeDream gap at P{P} minus 2bw gap, per seed: "
                                                     f"{p.per_seed(gap[f'P{P}'] - gap['2bw'])}{p.dropped_note()}")
                            if p.n else not_measured(f"no seed has every run finished{p.dropped_note()}", **kw))
    parts = {"growth": weakest(growth) if growth else not_measured("the depth sweep has fewer than two depths",
                                                                   sources=src),
             "excess": weakest(excess) if excess else not_measured("the depth sweep has no depth P > 2",
                                                                   sources=src)}
    rec = with_parts(parts, sources=list(dict.fromkeys(sources)),
                     detail="every comparison must hold; each part is decided by its weakest comparison")
    if dropped:
        rec["diverged"] = len(dropped)
    return rec


def _b7(g: Gaps, src: list[str]) -> dict:
    lengths = sorted(int(s) for s in g.cfg["sweeps"]["length"]["steps"])
    short, long = lengths[0], lengths[-1]
    what = f"Muon gap at {long} steps / gap at {short} steps"
    if "muon" not in g.cfg["sweeps"]["length"]["optimizers"] or short == long:
        return not_measured(f"{what}: the length sweep lacks Muon or a second length", sources=src)
    p = g.paired({"s_sync": Spec("muon", steps=short), "s_2bw": Spec("muon", "2bw", steps=short),
                  "l_sync": Spec("muon", steps=long), "l_2bw": Spec("muon", "2bw", steps=long)})
    gs, gl = p["s_2bw"] - p["s_sync"], p["l_2bw"] - p["l_sync"]
    if p.n and not (gs > 0).all():
        return _undefined(p, what, src, f"the gap at {short} steps is <= 0 on some seed ({p.per_seed(gs)})")
    return _stat("B7", p, gl / gs if p.n else [], what, src)


def _b9(g: Gaps, mit: str, src: list[str]) -> dict:
    opts = list(g.cfg["sweeps"]["main"]["optimizers"])
    p = g.paired(_main_specs(opts, (("2bw", "none"), ("2bw", mit))))
    what = f"mean over optimizers of gap(2bw+{mit}) / gap(2bw)"
    if p.n == 0:
        return _stat(f"B9-{mit}", p, [], what, src)
    base = {o: p[f"{o}/2bw"] - p[f"{o}/sync"] for o in opts}
    kept = [o for o in opts if (base[o] > 0).all()]
    excluded = [f"{o} (2bw gap {p.per_seed(base[o])})" for o in opts if o not in kept]
    note = f"; left out, 2bw gap <= 0 on some seed: {', '.join(excluded)}" if excluded else ""
    if not kept:
        return _undefined(p, what, src, "no optimizer has a positive 2bw gap on every seed" + note)
    ratios = np.mean([(p[f"{o}/2bw+{mit}"] - p[f"{o}/sync"]) / base[o] for o in kept], axis=0)
    return _stat(f"B9-{mit}", p, ratios, f"{what} over {', '.join(kept)}{note}; ratio", src)


def claims(g: Gaps, scale: str, sources: list[str] | None = None) -> dict:
    """The evidence file: one record per claim B1..B9 (see claims/evidence.py for the record's fields).

    `sources` (runs.csv, the tables) are added to every record after the run directories behind it.
    """
    src = [str(s) for s in sources or []]
    out: dict[str, dict] = {}
    out.update(_b1(g, src))
    out["B2"] = _b2(g, src)
    out["B3"] = _b3(g, src)
    out["B4"] = _b4(g, src)
    out["B5-muon"] = _b5(g, "muon", "B5-muon", src)
    out["B5-adamw"] = _b5(g, "adamw", "B5-adamw", src)
    out["B6"] = _b6(g, src)
    out["B7"] = _b7(g, src)
    out["B8"] = not_measured("10B MoE at 200B tokens is paper-only and not built by this artifact (its shapes are "
                             "not public); it needs a GPU cluster", sources=src)
    for mit in ("sync_start", "sync_cooldown", "taylor"):
        out[f"B9-{mit}"] = _b9(g, mit, src)
    return {"study": "async_pp", "scale": scale, "values": {cid: out[cid] for cid in CLAIM_IDS}}


def read_runs(runs_csv: str, scale: str) -> pd.DataFrame:
    """runs.csv of this scale (refused when aggregated at another scale: stale results never mix in)."""
    runs = pd.read_csv(runs_csv)
    if "scale" in runs.columns:
        other = sorted({str(s) for s in runs["scale"].dropna()} - {scale})
        if other:
            raise UserError(f"{runs_csv} holds runs of scale(s) {other}, not {scale!r}: aggregate again")
    return runs


def write_claims(runs_csv: str, cfg: dict, scale: str, path: str, tables: list[str] | None = None) -> None:
    atomic_write_json(path, claims(Gaps(read_runs(runs_csv, scale), cfg), scale,
                                   [runs_csv, *(t for t in tables or [] if t)]))

