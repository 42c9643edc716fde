"""From run directories to the study's tables and claim evidence.

Pairing: seed k of every cell has the same initialisation and batch order, so every statistic is computed per seed
first (gap = variant - sync on that seed, a difference or ratio of gaps, an EF recovery %, a Spearman correlation)
and only then summarised over seeds, with an interval (`gradfidelity.claims.evidence`) at the registry's level.
Only `lr~tuned` cells enter (the LR grid is lr_select.py's).

A seed on which any run a statistic needs diverged (or is missing) is dropped from that statistic, counted in the
record's `diverged` and named in its detail, and the tables name it in their `diverged` column: never averaged
away silently. A per-seed ratio whose denominator is <= 0 on some seed is undefined: that record is then not
measured, with the reason, rather than a number made of the other seeds.

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
import os
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from gradfidelity.claims.evidence import (
    gate,
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
from gradfidelity.studies.async_pp.plan import KEYS, TUNED, cell_from_path, default_momentum, main_head

CLAIM_IDS = ("B1", "B1-abs", "B2", "B3", "B4", "B5-muon", "B5-adamw", "B6", "B7", "B8", "B9-sync_start",
             "B9-sync_cooldown", "B9-taylor")
B3_MIDDLE = ("soap", "adan", "lion")  # the registry's statement: these fall between Muon (smallest) and AdamW
PLATEAU_SHARE = 0.25  # the sync change over the last 10% must be below this share of the gap
PLATEAU_FLOOR = 0.01  # ... or of this fraction of the sync loss when the gap is smaller (B2's threshold)
SCALE_ENV = "GRADFIDELITY_SCALE"  # the harness records a run's scale from this variable (harness/run.py)


# ----------------------------------------------------------------------------------------------- aggregation
def aggregate(metrics_paths: list[str], runs_csv: str, curves_csv: str, scale: str | None = None,
              tokens_per_step: int | None = None) -> None:
    """The metrics.json files given (the rule's {input}), read through the harness loader -> runs.csv + curves.csv.

    `scale` (default: $GRADFIDELITY_SCALE) must be the scale every run was made at: stale runs are refused.
    """
    from gradfidelity.harness.results import load_run_records

    cells = [cell_from_path(p) for p in metrics_paths]  # every path names its cell before anything is read
    scale = scale or os.environ.get(SCALE_ENV)
    if not scale:
        raise UserError(f"async-pp-aggregate: no scale given (pass --scale or set {SCALE_ENV})")
    rows, curve_rows = [], []
    for c, rec in zip(cells, load_run_records(metrics_paths, scale=scale), strict=True):
        if rec.get("seed") != c.seed:
            raise UserError(f"{rec['path']}: records seed {rec.get('seed')!r}, its directory says {c.seed}")
        ok = rec["status"] == "ok"
        m = rec["metrics"]
        key = asdict(c)
        rows.append({**key, "status": rec["status"], "final_val_loss": float(m["final_val_loss"]) if ok else math.nan,
                     "plateau_delta": float(m.get("plateau_delta", math.nan)) if ok else math.nan,
                     "lr_value": m.get("lr", math.nan) if ok else math.nan,
                     "diverged_at_step": math.nan if ok else m.get("diverged_at_step", math.nan),
                     "tokens": c.steps * tokens_per_step if tokens_per_step else math.nan,
                     "step_s": (rec.get("timing") or {}).get("step_s", math.nan),
                     "scale": rec["scale"], "run_dir": rec["run_dir"], "path": rec["path"]})
        for step, tokens, val in (m.get("curve") or []) if ok else []:
            curve_rows.append({**key, "step": step, "tokens": tokens, "val_loss": val})
    atomic_write_csv(pd.DataFrame(rows), runs_csv)
    atomic_write_csv(pd.DataFrame(curve_rows, columns=[*KEYS, "seed", "step", "tokens", "val_loss"]), curves_csv)


# ----------------------------------------------------------------------------------------------- pairing
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

    def __init__(self, runs: pd.DataFrame, cfg: dict):
        self.runs, self.cfg = runs, cfg
        self.steps = int(cfg["train"]["steps"])
        self.seeds = list(range(int(cfg["seeds"])))
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


# ----------------------------------------------------------------------------------------------- tables
def _mean(x) -> float:
    x = np.asarray(x, dtype=float)
    return float(x.mean()) if len(x) and np.isfinite(x).all() else math.nan


def _diverged_cell(p: Paired) -> str:
    return "; ".join(f"seed {s}: {', '.join(why)}" for s, why in sorted(p.dropped.items())) or "none"


def _curve(curves: pd.DataFrame | None, g: Gaps, spec: Spec, seed: int):
    if curves is None or curves.empty:
        return [], []
    c = curves[(curves.optimizer == spec.optimizer) & (curves.schedule == spec.schedule)
               & (curves.mitigation == spec.mitigation) & (curves.depth == 1) & (curves.steps == g.steps)
               & (curves.seed == seed) & np.isclose(curves.momentum, default_momentum(spec.optimizer))]
    if "lr" in c.columns:
        c = c[c["lr"] == TUNED]
    if "head" in c.columns:
        c = c[c["head"] == g.head]  # not c.head: DataFrame.head is a method
    c = c.sort_values("step")
    return c.step.to_numpy(), c.val_loss.to_numpy()


def _gap_row(p: Paired, sync: str, asyn: str, level: float) -> dict:
    """sync, async, the gap with its t interval, and the sync plateau gate of one optimizer's paired cells."""
    gap = p[asyn] - p[sync]
    ci = mean_ci(gap, level) if p.n else {"low": None, "high": None}
    gates = plateau_gate(p, [("", sync, gap)])
    return {"sync": _mean(p[sync]), "async_2bw": _mean(p[asyn]), "gap": _mean(gap),
            "gap_low": math.nan if ci["low"] is None else ci["low"],
            "gap_high": math.nan if ci["high"] is None else ci["high"],
            "gap_pct_of_sync": _mean(100 * gap / p[sync]), "sync_plateau_delta": _mean(p.plateau[sync]),
            "plateau_limit": plateau_limit(_mean(gap), _mean(p[sync])) if p.n else math.nan,
            "plateau_gate": ("pass" if gates[0]["passed"] else "FAIL") if gates else "n/a"}


def main_table(g: Gaps, curves: pd.DataFrame | None = None) -> pd.DataFrame:
    rows = []
    level = level_for("B1-abs")
    for opt in g.cfg["sweeps"]["main"]["optimizers"]:
        p = g.paired({"sync": Spec(opt), "2bw": Spec(opt, "2bw")})
        row = _gap_row(p, "sync", "2bw", level)
        extra = [extra_steps(*_curve(curves, g, Spec(opt), s), p["2bw"][i]) for i, s in enumerate(p.seeds)]
        gate_cols = {k: row.pop(k) for k in ("sync_plateau_delta", "plateau_limit", "plateau_gate")}
        rows.append({"optimizer": opt, **row, "extra_steps": _mean(extra),
                     "extra_steps_pct": _mean(100 * np.asarray(extra, dtype=float) / g.steps), **gate_cols,
                     "seeds": p.n, "diverged": _diverged_cell(p)})
    return pd.DataFrame(rows)


def length_table(g: Gaps) -> pd.DataFrame:
    """The length sweep: per optimizer and budget (separate runs, each with its full LR schedule), the gap and
    the sync plateau gate. It shows how the gap and the sync loss's end-of-run change scale with the budget."""
    rows = []
    sw = g.cfg["sweeps"]["length"]
    tok = int(g.cfg["train"]["batch_size"]) * int(g.cfg["train"]["seq_len"])
    for opt in sw["optimizers"]:
        for steps in sorted(int(s) for s in sw["steps"]):
            p = g.paired({"sync": Spec(opt, steps=steps), "2bw": Spec(opt, "2bw", steps=steps)})
            rows.append({"optimizer": opt, "steps": steps, "tokens": steps * tok,
                         **_gap_row(p, "sync", "2bw", level_for("B7")), "seeds": p.n, "diverged": _diverged_cell(p)})
    return pd.DataFrame(rows)


def mitigations_table(g: Gaps) -> pd.DataFrame:
    rows = []
    sw = g.cfg["sweeps"]["mitigation"]
    for opt in sw["optimizers"]:
        specs = {"sync": Spec(opt), "2bw": Spec(opt, "2bw")} | {m: Spec(opt, "2bw", m) for m in sw["mitigations"]}
        p = g.paired(specs)
        base = p["2bw"] - p["sync"]
        row = {"optimizer": opt, "gap_2bw": _mean(base)}
        for mit in sw["mitigations"]:
            gm = p[mit] - p["sync"]
            row[f"gap_{mit}"] = _mean(gm)
            row[f"ratio_{mit}"] = _mean(gm / base) if p.n and (base > 0).all() else math.nan
        if "error_feedback" in sw["mitigations"]:
            row["ef_recovery_pct"] = _mean(ef_recovery(p["sync"], p["2bw"], p["error_feedback"]))
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


def _undefined(p: Paired, what: str, sources: list[str], why: str, gates=None) -> dict:
    return not_measured(f"{what} undefined: {why}{p.dropped_note()}", n=p.n, sources=p.sources + sources,
                        diverged=p.diverged, gates=gates)


def _gaps(p: Paired, opts) -> dict[str, np.ndarray]:
    return {o: p[f"{o}/2bw"] - p[f"{o}/sync"] for o in opts}


def _main_specs(opts, variants=(("2bw", "none"),)) -> dict[str, Spec]:
    out = {}
    for o in opts:
        out[f"{o}/sync"] = Spec(o)
        for s, m in variants:
            out[f"{o}/{s}" + ("" if m == "none" else f"+{m}")] = Spec(o, s, m)
    return out


def _gate_items(p: Paired, gaps: dict[str, np.ndarray]) -> list[tuple[str, str, np.ndarray]]:
    return [(o, f"{o}/sync", gaps[o]) for o in gaps]


def _b1(g: Gaps, src: list[str]) -> dict[str, dict]:
    p = g.paired(_main_specs(("adamw", "muon")))
    gaps = _gaps(p, ("adamw", "muon"))
    ga, gm = gaps["adamw"], gaps["muon"]
    gates = plateau_gate(p, _gate_items(p, gaps))
    out = {"B1-abs": _stat("B1-abs", p, ga, "AdamW gap (2bw - sync), nats", src, gates=gates)}
    seeds = f"; per seed adamw {p.per_seed(ga)}; muon {p.per_seed(gm)}{p.dropped_note()}" if p.n else ""
    kw = {"sources": p.sources + src, "diverged": p.diverged}
    if p.n == 0:
        rec = _stat("B1", p, [], "AdamW gap - Muon gap", src)
        return {**out, "B1": with_parts({"difference": rec, "ratio": rec}, detail=rec["detail"], sources=src)}
    diff = paired_difference(ga, gm, level_for("B1"), detail=f"AdamW gap - Muon gap, nats{seeds}", **kw)
    what = "AdamW gap / Muon gap (geometric mean over seeds, interval on the log ratios)"
    if not ((ga > 0).all() and (gm > 0).all()):
        ratio = _undefined(p, what, src, f"a gap is <= 0 on some seed (adamw {p.per_seed(ga)}; muon "
                                         f"{p.per_seed(gm)}); the difference part still stands")
    else:
        ratio = paired_ratio(ga, gm, level_for("B1"), detail=f"{what}{seeds}", **kw)
    rec = with_parts({"difference": diff, "ratio": ratio}, gates=gates, sources=p.sources + src,
                     detail="AdamW's gap larger than Muon's (difference > 0) and far larger (ratio > 5)")
    if p.diverged:
        rec["diverged"] = p.diverged
    out["B1"] = rec
    return out


def _b2(g: Gaps, src: list[str]) -> dict:
    p = g.paired(_main_specs(("muon",)))
    gap = p["muon/2bw"] - p["muon/sync"]
    rel = gap / p["muon/sync"]
    gates = plateau_gate(p, [("muon", "muon/sync", gap)])
    rec = _stat("B2", p, rel, "Muon signed gap / Muon sync loss", src, gates=gates)
    if rec["estimate"] is not None and rec["high"] is not None and rec["high"] < 0:
        rec["detail"] += "; the whole interval is negative: async ends below sync, i.e. no gap (not a small one)"
    elif rec["estimate"] is not None and rec["estimate"] < 0:
        rec["detail"] += "; the estimate is negative: no measurable gap"
    return rec


def _b3(g: Gaps, src: list[str]) -> dict:
    opts = ("adamw", "muon", *B3_MIDDLE)
    p = g.paired(_main_specs(opts))
    gaps = _gaps(p, opts)
    gates = plateau_gate(p, _gate_items(p, gaps))
    level, kw = level_for("B3"), {"sources": p.sources + src, "diverged": p.diverged}
    parts = {}
    for o in B3_MIDDLE:
        if p.n == 0:
            parts[o] = not_measured(f"no seed has every run finished{p.dropped_note()}", **kw)
            continue
        cmp = {f"{o} - muon": paired_difference(gaps[o], gaps["muon"], level, **kw,
                                               detail=f"{o} gap - Muon gap, per seed "
                                                      f"{p.per_seed(gaps[o] - gaps['muon'])}{p.dropped_note()}"),
               f"adamw - {o}": paired_difference(gaps["adamw"], gaps[o], level, **kw,
                                                 detail=f"AdamW gap - {o} gap, per seed "
                                                        f"{p.per_seed(gaps['adamw'] - gaps[o])}{p.dropped_note()}")}
        parts[o] = weakest(cmp)
    rec = with_parts(parts, gates=gates, sources=p.sources + src,
                     detail="Muon gap < gap < AdamW gap for each of SOAP, Adan, Lion (both paired differences > 0)")
    if p.diverged:
        rec["diverged"] = p.diverged
    return rec


def _b4(g: Gaps, src: list[str]) -> dict:
    sw = g.cfg["sweeps"]["momentum"]
    opts, moms = list(sw["optimizers"]), [float(m) for m in sw["momenta"]]
    specs = {f"{o}/{s}/{m}": Spec(o, s, momentum=m) for o in opts for m in moms for s in ("sync", "2bw")}
    p = g.paired(specs)
    what = f"mean over {', '.join(opts)} of Spearman(momentum, gap) over momenta {moms} at the tuned LR"
    gates = plateau_gate(p, [(f"{o} mom {m:g}", f"{o}/sync/{m}", p[f"{o}/2bw/{m}"] - p[f"{o}/sync/{m}"])
                             for o in opts for m in moms])
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
                          else f"gap constant over momentum for {', '.join(constant)}", gates=gates)
    return _stat("B4", p, rhos, what, src, gates=gates)


def _b5(g: Gaps, opt: str, cid: str, src: list[str]) -> dict:
    p = g.paired({"sync": Spec(opt), "2bw": Spec(opt, "2bw"), "ef": Spec(opt, "2bw", "error_feedback")})
    what = f"{opt} EF recovery % = 100 (async - async_EF) / (async - sync)"
    gap = p["2bw"] - p["sync"]
    gates = plateau_gate(p, [(opt, "sync", gap)])
    if p.n and not (gap > 0).all():
        return _undefined(p, what, src, f"async <= sync on some seed (gap per seed {p.per_seed(gap)})", gates=gates)
    return _stat(cid, p, ef_recovery(p["sync"], p["2bw"], p["ef"]), what, src, gates=gates)


def _b6(g: Gaps, src: list[str]) -> dict:
    sw = g.cfg["sweeps"]["depth"]
    depths, level = sorted(int(P) for P in sw["depths"]), level_for("B6")
    if "pipedream" not in sw["schedules"] or not sw["optimizers"]:
        rec = not_measured("the depth sweep has no 'pipedream' schedule or no optimizer", sources=src)
        return with_parts({"growth": rec, "excess": rec}, detail=rec["detail"], sources=src)
    growth, excess, sources, dropped, gate_parts = {}, {}, list(src), set(), []
    for o in sw["optimizers"]:
        pd_specs = {f"P{P}": Spec(o, "pipedream", depth=P, head="untied") for P in depths}
        p = g.paired({"sync": Spec(o, head="untied"), "2bw": Spec(o, "2bw", head="untied"), **pd_specs})
        sources += p.sources
        dropped |= set(p.dropped)
        kw = {"sources": p.sources + src, "diverged": p.diverged}
        gap = {k: p[k] - p["sync"] for k in ("2bw", *pd_specs)}
        if p.n:
            biggest = max(gap.values(), key=lambda a: abs(float(np.mean(a))))
            gate_parts += plateau_gate(p, [(f"{o} (untied head)", "sync", biggest)])
        for P, Q in zip(depths, depths[1:], strict=False):
            growth[f"{o} P{Q}-P{P}"] = (
                paired_difference(gap[f"P{Q}"], gap[f"P{P}"], level, **kw,
                                  detail=f"PipeDream gap at P{Q} minus at P{P}, per seed: "
                                         f"{p.per_seed(gap[f'P{Q}'] - gap[f'P{P}'])}{p.dropped_note()}")
                if p.n else not_measured(f"no seed has every run finished{p.dropped_note()}", **kw))
        for P in (P for P in depths if P > 2):
            excess[f"{o} P{P}"] = (
                paired_difference(gap[f"P{P}"], gap["2bw"], level, **kw,
                                  detail=f"PipeDream gap at P{P} minus 2bw gap, per seed: "
                                         f"{p.per_seed(gap[f'P{P}'] - gap['2bw'])}{p.dropped_note()}")
                if p.n else not_measured(f"no seed has every run finished{p.dropped_note()}", **kw))
    parts = {"growth": weakest(growth) if growth else not_measured("the depth sweep has fewer than two depths",
                                                                   sources=src),
             "excess": weakest(excess) if excess else not_measured("the depth sweep has no depth P > 2",
                                                                   sources=src)}
    gates = [gate("sync_plateau", all(x["passed"] for x in gate_parts), "; ".join(x["reason"] for x in gate_parts))
             ] if gate_parts else []
    rec = with_parts(parts, sources=list(dict.fromkeys(sources)), gates=gates,
                     detail="untied LM head (the last stage is fresh); every comparison must hold; each part is "
                            "decided by its weakest comparison")
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
    gates = plateau_gate(p, [(f"muon {long} steps", "l_sync", gl)])
    if p.n and not (gs > 0).all():
        return _undefined(p, what, src, f"the gap at {short} steps is <= 0 on some seed ({p.per_seed(gs)})",
                          gates=gates)
    return _stat("B7", p, gl / gs if p.n else [], what, src, gates=gates)


def _b9(g: Gaps, mit: str, src: list[str]) -> dict:
    sw = g.cfg["sweeps"]["mitigation"]
    opts = list(sw["optimizers"])
    what = f"mean over optimizers of gap(2bw+{mit}) / gap(2bw)"
    if mit not in sw["mitigations"] or not opts:
        return not_measured(f"{what}: the mitigation sweep does not run {mit}", sources=src)
    p = g.paired(_main_specs(opts, (("2bw", "none"), ("2bw", mit))))
    if p.n == 0:
        return _stat(f"B9-{mit}", p, [], what, src)
    base = {o: p[f"{o}/2bw"] - p[f"{o}/sync"] for o in opts}
    gates = plateau_gate(p, _gate_items(p, base))
    kept = [o for o in opts if (base[o] > 0).all()]
    excluded = [f"{o} (2bw gap {p.per_seed(base[o])})" for o in opts if o not in kept]
    note = f"; left out, 2bw gap <= 0 on some seed: {', '.join(excluded)}" if excluded else ""
    if not kept:
        return _undefined(p, what, src, "no optimizer has a positive 2bw gap on every seed" + note, gates=gates)
    ratios = np.mean([(p[f"{o}/2bw+{mit}"] - p[f"{o}/sync"]) / base[o] for o in kept], axis=0)
    return _stat(f"B9-{mit}", p, ratios, f"{what} over {', '.join(kept)}{note}; ratio", src, gates=gates)


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
