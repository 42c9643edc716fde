"""Claim evidence for ds_audit (A1, A1-z1-r1, A1-z1-r2, A1-7981, A2, A3, A4), each exactly per its registry metric.

Why computed here from the tables' rows and not inside the probe: data flows one way (runs -> table -> evidence),
so the number in the claims report is the number a reader finds in paper_tables/.
"""

from __future__ import annotations

import json

import pandas as pd
from scipy.stats import spearmanr

from gradfidelity.studies.ds_audit.matrix import compare


def _vec(row) -> list[float]:
    return [float(x) for x in row.contributions_raw.split()]


def _ran(df: pd.DataFrame) -> pd.DataFrame:
    return df[df.status == "ok"]


def _pred(row) -> list[int] | None:
    return None if row.facts_md_prediction == "open" else json.loads(row.facts_md_prediction)


def a1(df: pd.DataFrame) -> dict:
    """Rows with ZeRO 0/2/3 (one backward per micro-step) that ran and whose vector differs from the prediction."""
    sel = _ran(df[df.zero_stage.isin([0, 2, 3]) & (df.backward_calls == 1)])
    bad = []
    for r in sel.itertuples(index=False):
        res = {"contributions": _vec(r), "tolerance": _tol(r), "residual": r.residual}
        if compare(res, _pred(r)) != "yes":
            bad.append(f"{r.deepspeed} r{r.ranks} z{r.zero_stage} {r.offload} ga{r.ga} {r.dtype}: {r.contributions}")
    n_err = int((df.zero_stage.isin([0, 2, 3]) & (df.backward_calls == 1) & (df.status != "ok")).sum())
    detail = (f"{len(sel)} rows ran ({n_err} could not run and are not counted); disagreeing: "
              + ("; ".join(bad[:8]) if bad else "none"))
    return {"measured": len(bad), "detail": detail, "n": len(sel)}


def _tol(r) -> float:
    from gradfidelity.studies.ds_audit.probe import TOLERANCE

    return TOLERANCE[r.dtype]


def a1_z1(df: pd.DataFrame, ranks: int) -> dict:
    sel = df[(df.deepspeed == "0.18.9") & (df.zero_stage == 1) & (df.offload != "none") & (df.ga >= 3)
             & (df.backward_calls == 1) & (df.ranks == ranks)]
    ran = _ran(sel)
    if ran.empty:
        errs = "; ".join(sorted(set(sel.error)))[:400]
        return {"measured": None, "detail": f"no 0.18.9 ZeRO-1 + offload GA>=3 {ranks}-rank row ran: {errs}", "n": 0}
    drops = [r for r in ran.itertuples(index=False) if any(abs(c) <= _tol(r) for c in _vec(r))]
    ex = "; ".join(f"ga{r.ga} {r.dtype}: {r.contributions}" for r in list(ran.itertuples(index=False))[:6])
    return {"measured": bool(drops), "detail": f"{len(drops)} of {len(ran)} rows drop a micro-batch ({ex})",
            "n": len(ran)}


def a1_7981(df: pd.DataFrame) -> dict:
    sel = _ran(df[(df.deepspeed == "0.18.9") & (df.zero_stage == 2) & (df.offload != "none") & (df.ga == 1)
                  & (df.backward_calls == 4)])
    if sel.empty:
        return {"measured": None, "detail": "no 0.18.9 ZeRO-2 + offload GA 1 x 4-backward row ran", "n": 0}
    devs, ex = [], []
    for r in sel.itertuples(index=False):
        target = [0, 0, 0, 1] * r.ranks
        devs.append(max(abs(a - b) for a, b in zip(_vec(r), target, strict=True)))
        ex.append(f"r{r.ranks} {r.dtype}: {r.contributions}")
    return {"measured": max(devs), "detail": f"max over {len(sel)} rows of max|c - [0,0,0,1] per rank|: "
            + "; ".join(ex), "n": len(sel)}


def a2(df: pd.DataFrame) -> dict:
    sel = _ran(df[(df.deepspeed == "0.18.9") & (df.zero_stage == 2) & (df.offload != "none") & (df.ga == 2)
                  & (df.backward_calls == 1)])
    if sel.empty:
        return {"measured": None, "detail": "no 0.18.9 ZeRO-2 + offload GA 2 row ran", "n": 0}
    dev = max(max(abs(c - 1) for c in _vec(r)) for r in sel.itertuples(index=False))
    ex = "; ".join(f"r{r.ranks} {r.dtype}: {r.contributions}" for r in sel.itertuples(index=False))
    return {"measured": dev, "detail": f"max |c_i - 1| over {len(sel)} rows: {ex}", "n": len(sel)}


def a3(df: pd.DataFrame, ga: int = 8) -> dict:
    """(reported norm / reference norm) / (2/N) on the one-rank fp32 row (the cleanest one); others in detail."""
    sel = _ran(df[(df.deepspeed == "0.18.9") & (df.zero_stage == 2) & (df.offload != "none") & (df.ga == ga)
                  & (df.backward_calls == 1)])
    sel = sel[sel.grad_norm_ratio.notna()]
    if sel.empty:
        return {"measured": None, "detail": f"no 0.18.9 ZeRO-2 + offload GA {ga} row reported a gradient norm", "n": 0}
    vals = {f"r{r.ranks} {r.dtype}": float(r.grad_norm_ratio) / (2 / ga) for r in sel.itertuples(index=False)}
    primary = "r1 fp32" if "r1 fp32" in vals else next(iter(vals))
    applied = {f"r{r.ranks} {r.dtype}": float(r.applied_norm_ratio) / (2 / ga) for r in sel.itertuples(index=False)}
    return {"measured": vals[primary],
            "detail": f"row {primary}; all rows (reported/true)/(2/N): "
            + ", ".join(f"{k} {v:.3f}" for k, v in vals.items())
            + "; norm of the update actually applied /(2/N): " + ", ".join(f"{k} {v:.3f}" for k, v in applied.items())
            + f"; sqrt(2/N)/(2/N) would be {(ga / 2) ** 0.5:.3f}",
            "n": len(sel)}


def a4(summ: pd.DataFrame) -> dict:
    sub = summ[summ.method == "per_microbatch_mean"].sort_values("spread")
    rho = float(spearmanr(sub.spread, sub.rel_error).statistic)
    levels = ", ".join(f"{s:g}: {e:.3f}" for s, e in zip(sub.spread, sub.rel_error, strict=True))
    return {"measured": rho, "detail": "Spearman(spread, mean relative error of the per-micro-batch mean) over "
            f"{len(sub)} spread levels: {levels}",
            "n": int(sub.seeds.sum())}


def evidence(matrix: pd.DataFrame, loss_summary: pd.DataFrame, scale: str) -> dict:
    return {"study": "ds_audit", "scale": scale, "values": {
        "A1": a1(matrix), "A1-z1-r1": a1_z1(matrix, 1), "A1-z1-r2": a1_z1(matrix, 2), "A1-7981": a1_7981(matrix),
        "A2": a2(matrix), "A3": a3(matrix), "A4": a4(loss_summary),
    }}
