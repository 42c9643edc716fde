"""From run directories to the study's tables, figures and claim evidence.

gap = final validation loss of the delayed variant minus sync, paired by seed (same init, same batches), averaged
over seeds. A diverged run is never averaged away: a cell with a diverged seed has no gap (NaN in tables, null with
a reason in claims). EF recovery % = 100 (async - async_EF) / (async - sync), undefined when async <= sync.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from gradfidelity.errors import UserError
from gradfidelity.harness.io import atomic_write_csv, atomic_write_json, read_json
from gradfidelity.studies.async_pp.plan import KEYS, cells, default_momentum

MAIN_VARIANTS = [("2bw", "error_feedback"), ("2bw", "taylor"), ("2bw", "sync_start"), ("2bw", "sync_cooldown")]


# ----------------------------------------------------------------------------------------------- aggregation
def aggregate(cfg: dict, root: str, runs_csv: str, curves_csv: str) -> None:
    rows, curve_rows = [], []
    for c in cells(cfg):
        path = Path(c.metrics(root))
        if not path.exists():
            raise UserError(f"{path}: missing run (train it first)")
        rec = read_json(path)
        if rec.get("status") not in ("ok", "diverged"):
            raise UserError(f"{path}: status {rec.get('status')!r} is neither ok nor diverged")
        m = rec["metrics"]
        key = {k: getattr(c, k) for k in (*KEYS, "seed")}
        ok = rec["status"] == "ok"
        rows.append({**key, "status": rec["status"], "final_val_loss": m["final_val_loss"] if ok else math.nan,
                     "tokens": c.steps * int(cfg["train"]["batch_size"]) * int(cfg["train"]["seq_len"]),
                     "step_s": rec["timing"].get("step_s", math.nan), "path": str(path)})
        for step, tokens, val in (m.get("curve") or []) if ok else []:
            curve_rows.append({**key, "step": step, "tokens": tokens, "val_loss": val})
    atomic_write_csv(pd.DataFrame(rows), runs_csv)
    atomic_write_csv(pd.DataFrame(curve_rows, columns=[*KEYS, "seed", "step", "tokens", "val_loss"]), curves_csv)


# ----------------------------------------------------------------------------------------------- gaps
class Gaps:
    """Paired-by-seed loss look-ups on runs.csv."""

    def __init__(self, runs: pd.DataFrame, cfg: dict):
        self.runs, self.cfg = runs, cfg
        self.steps = int(cfg["train"]["steps"])

    def losses(self, optimizer, schedule="sync", mitigation="none", depth=1, momentum=None, steps=None) -> pd.Series:
        mom = default_momentum(self.cfg, optimizer) if momentum is None else momentum
        r = self.runs
        sel = r[(r.optimizer == optimizer) & (r.schedule == schedule) & (r.mitigation == mitigation)
                & (r.depth == depth) & np.isclose(r.momentum, mom) & (r.steps == (steps or self.steps))]
        return sel.set_index("seed")["final_val_loss"].sort_index()

    def loss(self, *a, **k) -> float:
        s = self.losses(*a, **k)
        return float(s.mean()) if len(s) and s.notna().all() else math.nan

    def gap(self, optimizer, schedule="2bw", mitigation="none", depth=1, momentum=None, steps=None) -> float:
        """Mean over seeds of (variant - sync); NaN if a seed is missing or diverged."""
        a = self.losses(optimizer, schedule, mitigation, depth, momentum, steps)
        s = self.losses(optimizer, "sync", "none", 1, momentum, steps)
        if not len(a) or len(a) != len(s) or a.isna().any() or s.isna().any():
            return math.nan
        return float((a - s).mean())

    def n(self, optimizer) -> int:
        return len(self.losses(optimizer))


def ef_recovery(sync: float, asyn: float, ef: float) -> float:
    if any(map(math.isnan, (sync, asyn, ef))) or asyn - sync <= 0:
        return math.nan
    return 100.0 * (asyn - ef) / (asyn - sync)


def main_table(g: Gaps) -> pd.DataFrame:
    rows = []
    for opt in g.cfg["sweeps"]["main"]["optimizers"]:
        sync, asyn, ef = g.loss(opt), g.loss(opt, "2bw"), g.loss(opt, "2bw", "error_feedback")
        rows.append({"optimizer": opt, "sync": sync, "async_2bw": asyn, "async_ef": ef, "gap": g.gap(opt),
                     "gap_ef": g.gap(opt, "2bw", "error_feedback"), "ef_recovery_pct": ef_recovery(sync, asyn, ef),
                     "seeds": g.n(opt)})
    return pd.DataFrame(rows)


def mitigations_table(g: Gaps) -> pd.DataFrame:
    rows = []
    for opt in g.cfg["sweeps"]["main"]["optimizers"]:
        base = g.gap(opt)
        row = {"optimizer": opt, "gap_2bw": base}
        for sched, mit in MAIN_VARIANTS:
            gm = g.gap(opt, sched, mit)
            row[f"gap_{mit}"] = gm
            row[f"ratio_{mit}"] = gm / base if base > 0 else math.nan
        rows.append(row)
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------------- claims
def _num(x: float):
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else float(x)


def claims(g: Gaps, scale: str) -> dict:
    cfg, sw = g.cfg, g.cfg["sweeps"]
    n = int(cfg["seeds"])
    out: dict[str, dict] = {}
    ga, gm = g.gap("adamw"), g.gap("muon")
    detail = f"gap adamw {ga:.4f}, muon {gm:.4f} nats (2bw - sync, mean of {n} paired seeds)"
    out["B1"] = {"measured": _num(ga / gm) if gm > 0 else None,
                 "detail": detail if gm > 0 else detail + "; Muon gap <= 0 or undefined: ratio undefined", "n": n}
    out["B1-abs"] = {"measured": _num(ga), "detail": detail + f" at scale {scale}", "n": n}
    sm = g.loss("muon")
    out["B2"] = {"measured": _num(gm / sm), "detail": f"Muon sync {sm:.4f}, gap {gm:.4f}", "n": n}
    lo, hi = min(gm, ga), max(gm, ga)
    between = {o: g.gap(o) for o in ("soap", "adan", "lion")}
    ok = not any(map(math.isnan, [ga, gm, *between.values()]))
    out["B3"] = {"measured": sum(lo <= v <= hi for v in between.values()) if ok else None,
                 "detail": f"gaps: muon {gm:.4f}, adamw {ga:.4f}, "
                           + ", ".join(f"{k} {v:.4f}" for k, v in between.items()), "n": n}
    rhos, parts = [], []
    for opt in sw["momentum"]["optimizers"]:
        moms = sw["momentum"]["momenta"]
        gaps = [g.gap(opt, momentum=m) for m in moms]
        if any(map(math.isnan, gaps)):
            parts.append(f"{opt}: a momentum point diverged or is missing")
            continue
        if len(set(gaps)) == 1:  # Spearman's rho is undefined for a constant input
            parts.append(f"{opt}: gap constant over momentum ({gaps[0]:.4f}), rho undefined")
            continue
        rho = float(spearmanr(moms, gaps).statistic)
        rhos.append(rho)
        parts.append(f"{opt}: rho {rho:.2f}, gaps " + ", ".join(f"{m}:{v:.4f}" for m, v in zip(moms, gaps,
                                                                                             strict=True)))
    full = len(rhos) == len(sw["momentum"]["optimizers"])
    out["B4"] = {"measured": _num(float(np.mean(rhos))) if full else None, "detail": "; ".join(parts), "n": n}
    for opt, cid in (("muon", "B5-muon"), ("adamw", "B5-adamw")):
        s, a, e = g.loss(opt), g.loss(opt, "2bw"), g.loss(opt, "2bw", "error_feedback")
        rec = ef_recovery(s, a, e)
        out[cid] = {"measured": _num(rec), "detail": f"{opt}: sync {s:.4f}, async {a:.4f}, async+EF {e:.4f}"
                    + ("" if math.isfinite(rec) else "; recovery undefined (async <= sync or diverged)"), "n": n}
    depths = sorted(sw["depth"]["depths"])
    verdicts, parts = [], []
    for opt in sw["depth"]["optimizers"]:
        pd_gaps = [g.gap(opt, "pipedream", depth=P) for P in depths]
        g2 = g.gap(opt)
        if any(map(math.isnan, [*pd_gaps, g2])):
            parts.append(f"{opt}: a depth point diverged or is missing (pipedream gaps {pd_gaps}, 2bw {g2})")
            verdicts.append(None)
            continue
        increasing = all(b > a for a, b in zip(pd_gaps, pd_gaps[1:], strict=False))
        below = all(g2 < v for P, v in zip(depths, pd_gaps, strict=True) if P > 2)
        verdicts.append(increasing and below)
        parts.append(f"{opt}: pipedream gaps " + ", ".join(f"P{P}:{v:.4f}" for P, v in zip(depths, pd_gaps,
                                                                                          strict=True))
                     + f", 2bw {g2:.4f}")
    if any(v is False for v in verdicts):
        b6 = False  # one optimizer that contradicts the claim settles it
    elif any(v is None for v in verdicts):
        b6 = None  # a diverged or missing point: not measurable
    else:
        b6 = True
    out["B6"] = {"measured": b6, "detail": "all optimizers of the depth sweep must hold; " + "; ".join(parts),
                 "n": n}
    lengths = sorted(sw["length"]["steps"])
    g_short, g_long = g.gap("muon", steps=lengths[0]), g.gap("muon", steps=lengths[-1])
    out["B7"] = {"measured": _num(g_long / g_short) if g_short > 0 else None,
                 "detail": f"Muon gap at {lengths[0]} steps {g_short:.4f}, at {lengths[-1]} steps {g_long:.4f}"
                 + ("" if g_short > 0 else "; shortest gap <= 0: ratio undefined"), "n": n}
    out["B8"] = {"measured": None, "detail": "10B MoE at 200B tokens is paper-only and not built by this artifact "
                 "(its shapes are not public); needs a GPU cluster", "n": 0}
    for mit in ("sync_start", "sync_cooldown", "taylor"):
        ratios, parts = [], []
        for opt in sw["main"]["optimizers"]:
            base, gmit = g.gap(opt), g.gap(opt, "2bw", mit)
            if math.isnan(base) or math.isnan(gmit) or base <= 0:
                parts.append(f"{opt}: excluded (2bw gap {base:.4f}, {mit} gap {gmit:.4f})")
                continue
            ratios.append(gmit / base)
            parts.append(f"{opt}: {gmit:.4f}/{base:.4f}")
        out[f"B9-{mit}"] = {"measured": _num(float(np.mean(ratios))) if ratios else None,
                            "detail": "; ".join(parts), "n": n}
    return {"study": "async_pp", "scale": scale, "values": out}


def write_claims(runs_csv: str, cfg: dict, scale: str, path: str) -> None:
    atomic_write_json(path, claims(Gaps(pd.read_csv(runs_csv), cfg), scale))
