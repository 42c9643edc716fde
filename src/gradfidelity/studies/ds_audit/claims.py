"""Claim evidence for ds_audit (A1, A1-z1-r1, A1-z1-r2, A1-7981, A2, A3, A4), each exactly per its registry metric.

Why computed here from the tables' rows and not inside the probe: data flows one way (runs -> table -> evidence),
so the number in the claims report is the number a reader finds in paper_tables/.

Every value is a record of the evidence contract (gradfidelity.claims.evidence). The probe is deterministic (one
optimizer step, fixed inputs, a least-squares read-out within a stated tolerance), so a matrix claim is `exact`, with
n = the number of matrix rows behind the value; a claim with no row to measure is `not_measured` with the reason.
A4 is the Spearman correlation over the loss-aggregation summary (means over seeds per spread level): that statistic
is itself the registry's decision rule, so it is recorded exactly too, with n = the spread levels behind it.

`sources`: the run directories of the rows a claim read (the matrix table's `run_dir` column, filled by the
ds-audit-tables step) followed by the table paths it summarises.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

import pandas as pd
from scipy.stats import spearmanr

from gradfidelity.claims.evidence import exact, not_measured
from gradfidelity.studies.ds_audit.matrix import compare


def _vec(row) -> list[float]:
    return [float(x) for x in row.contributions_raw.split()]


def _ran(df: pd.DataFrame) -> pd.DataFrame:
    return df[df.status == "ok"]


def _pred(row) -> list[int] | None:
    return None if row.predicted == "open" else json.loads(row.predicted)


def _tol(r) -> float:
    from gradfidelity.studies.ds_audit.probe import TOLERANCE

    return TOLERANCE[r.dtype]


def _sources(rows: pd.DataFrame, tables: Sequence[str]) -> list[str]:
    """Run directories of `rows` (in table order, each once), then the tables."""
    dirs = list(dict.fromkeys(rows.run_dir)) if "run_dir" in rows.columns else []
    return [str(d) for d in dirs] + [str(t) for t in tables]


def a1(df: pd.DataFrame, tables: Sequence[str] = ()) -> dict:
    """Rows with ZeRO 0/2/3 (one backward per micro-step) that ran and whose vector differs from the prediction."""
    scope = df[df.zero_stage.isin([0, 2, 3]) & (df.backward_calls == 1)]
    sel = _ran(scope)
    src = _sources(scope, tables)
    n_err = len(scope) - len(sel)
    if sel.empty:
        return not_measured(f"no ZeRO 0/2/3 row ran ({n_err} could not run)", sources=src)
    bad = []
    for r in sel.itertuples(index=False):
        res = {"contributions": _vec(r), "tolerance": _tol(r), "residual": r.residual}
        if compare(res, _pred(r)) != "yes":
            bad.append(f"{r.deepspeed} r{r.ranks} z{r.zero_stage} {r.offload} ga{r.ga} {r.dtype}: {r.contributions}")
    detail = (f"{len(sel)} rows ran ({n_err} could not run and are not counted); disagreeing: "
              + ("; ".join(bad[:8]) if bad else "none"))
    return exact(len(bad), n=len(sel), detail=detail, sources=src)


def a1_z1(df: pd.DataFrame, ranks: int, tables: Sequence[str] = ()) -> dict:
    """Whether any 0.18.9 ZeRO-1 + offload, GA >= 3 row with `ranks` ranks drops a micro-batch (exact boolean)."""
    sel = df[(df.deepspeed == "0.18.9") & (df.zero_stage == 1) & (df.offload != "none") & (df.ga >= 3)
             & (df.backward_calls == 1) & (df.ranks == ranks)]
    ran = _ran(sel)
    src = _sources(sel, tables)
    if ran.empty:
        errs = "; ".join(sorted(set(sel.error)))[:400] or "no such row in the matrix"
        return not_measured(f"no 0.18.9 ZeRO-1 + offload GA>=3 {ranks}-rank row ran: {errs}", sources=src)
    drops = [r for r in ran.itertuples(index=False) if any(abs(c) <= _tol(r) for c in _vec(r))]
    ex = "; ".join(f"ga{r.ga} {r.dtype}: {r.contributions}" for r in list(ran.itertuples(index=False))[:6])
    return exact(bool(drops), n=len(ran), detail=f"{len(drops)} of {len(ran)} rows drop a micro-batch ({ex})",
                 sources=src)


def a1_7981(df: pd.DataFrame, tables: Sequence[str] = ()) -> dict:
    sel = df[(df.deepspeed == "0.18.9") & (df.zero_stage == 2) & (df.offload != "none") & (df.ga == 1)
             & (df.backward_calls == 4)]
    ran = _ran(sel)
    src = _sources(sel, tables)
    if ran.empty:
        return not_measured("no 0.18.9 ZeRO-2 + offload GA 1 x 4-backward row ran", sources=src)
    devs, ex = [], []
    for r in ran.itertuples(index=False):
        target = [0, 0, 0, 1] * r.ranks
        devs.append(max(abs(a - b) for a, b in zip(_vec(r), target, strict=True)))
        ex.append(f"r{r.ranks} {r.dtype}: {r.contributions}")
    return exact(max(devs), n=len(ran), detail=f"max over {len(ran)} rows of max|c - [0,0,0,1] per rank|: "
                 + "; ".join(ex), sources=src)


def a2(df: pd.DataFrame, tables: Sequence[str] = ()) -> dict:
    sel = df[(df.deepspeed == "0.18.9") & (df.zero_stage == 2) & (df.offload != "none") & (df.ga == 2)
             & (df.backward_calls == 1)]
    ran = _ran(sel)
    src = _sources(sel, tables)
    if ran.empty:
        return not_measured("no 0.18.9 ZeRO-2 + offload GA 2 row ran", sources=src)
    dev = max(max(abs(c - 1) for c in _vec(r)) for r in ran.itertuples(index=False))
    ex = "; ".join(f"r{r.ranks} {r.dtype}: {r.contributions}" for r in ran.itertuples(index=False))
    return exact(dev, n=len(ran), detail=f"max |c_i - 1| over {len(ran)} rows: {ex}", sources=src)


def a3(df: pd.DataFrame, tables: Sequence[str] = (), ga: int = 8) -> dict:
    """(reported norm / reference norm) / (2/N) on the one-rank fp32 row (the cleanest one); others in detail.

    The value is that one row's, so n = 1; the other rows' ratios are listed in the detail.
    """
    scope = df[(df.deepspeed == "0.18.9") & (df.zero_stage == 2) & (df.offload != "none") & (df.ga == ga)
               & (df.backward_calls == 1)]
    sel = _ran(scope)
    sel = sel[sel.grad_norm_ratio.notna()]
    if sel.empty:
        return not_measured(f"no 0.18.9 ZeRO-2 + offload GA {ga} row reported a gradient norm",
                            sources=_sources(scope, tables))
    vals = {f"r{r.ranks} {r.dtype}": float(r.grad_norm_ratio) / (2 / ga) for r in sel.itertuples(index=False)}
    keys = [f"r{r.ranks} {r.dtype}" for r in sel.itertuples(index=False)]
    primary = "r1 fp32" if "r1 fp32" in vals else keys[0]
    row = sel.iloc[[keys.index(primary)]]
    applied = {f"r{r.ranks} {r.dtype}": float(r.applied_norm_ratio) / (2 / ga) for r in sel.itertuples(index=False)}
    detail = (f"row {primary}; all rows (reported/true)/(2/N): " + ", ".join(f"{k} {v:.3f}" for k, v in vals.items())
              + "; norm of the update actually applied /(2/N): "
              + ", ".join(f"{k} {v:.3f}" for k, v in applied.items())
              + f"; sqrt(2/N)/(2/N) would be {(ga / 2) ** 0.5:.3f}")
    return exact(vals[primary], n=1, detail=detail, sources=_sources(row, tables))


def a4(summ: pd.DataFrame, run_dirs: Sequence[str] = (), tables: Sequence[str] = ()) -> dict:
    """Spearman(spread, mean relative error of the per-micro-batch mean) over the spread levels of the summary."""
    sub = summ[summ.method == "per_microbatch_mean"].sort_values("spread")
    src = [str(d) for d in run_dirs] + [str(t) for t in tables]
    levels = ", ".join(f"{s:g}: {e:.3f}" for s, e in zip(sub.spread, sub.rel_error, strict=True))
    if sub.spread.nunique() < 2 or not sub.rel_error.notna().all():
        return not_measured(f"need >= 2 spread levels with a finite error, got: {levels or 'none'}", sources=src)
    if sub.rel_error.nunique() < 2:
        return not_measured(f"Spearman correlation undefined: the error is the same at every spread ({levels})",
                            sources=src)
    rho = float(spearmanr(sub.spread, sub.rel_error).statistic)
    if not math.isfinite(rho):
        return not_measured(f"Spearman correlation undefined: {levels}", sources=src)
    seeds = ", ".join(str(int(s)) for s in sub.seeds)
    return exact(rho, n=len(sub), sources=src,
                 detail=f"Spearman(spread, mean relative error of the per-micro-batch mean) over {len(sub)} spread "
                 f"levels (seeds per level: {seeds}): {levels}")


def evidence(matrix: pd.DataFrame, loss_summary: pd.DataFrame, scale: str, *, matrix_tables: Sequence[str] = (),
             loss_run_dirs: Sequence[str] = (), loss_tables: Sequence[str] = ()) -> dict:
    """The study's evidence file: one record per claim; `matrix` rows carry their `run_dir` (see `_sources`)."""
    t = list(matrix_tables)
    return {"study": "ds_audit", "scale": scale, "values": {
        "A1": a1(matrix, t), "A1-z1-r1": a1_z1(matrix, 1, t), "A1-z1-r2": a1_z1(matrix, 2, t),
        "A1-7981": a1_7981(matrix, t), "A2": a2(matrix, t), "A3": a3(matrix, t),
        "A4": a4(loss_summary, loss_run_dirs, list(loss_tables)),
    }}
