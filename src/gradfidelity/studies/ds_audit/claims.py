"""Claim evidence for ds_audit (A1, A1-z1-r1, A1-z1-r2, A1-7981, A2, A3, A4), each exactly per its registry metric.

Why computed here from the tables' rows and not inside the probe: data flows one way (runs -> table -> evidence),
so the number in the claims report is the number a reader finds in paper_tables/.

Every value is a record of the evidence contract (gradfidelity.claims.evidence). The probe is deterministic (fixed
inputs, a least-squares read-out within a stated tolerance), so a matrix claim is `exact`, with n = the number of
matrix rows behind the value; a claim with no row to measure (none in scope, or every one errored) is `not_measured`
with the reason. Claims read each row's raw probe result (`result`: per-step contributions, norms, clip
coefficients), never the formatted table strings. A4 is the Spearman correlation over the loss-aggregation summary
(means over seeds per spread level): that statistic is itself the registry's decision rule, so it is recorded
exactly too, with n = the spread levels behind it.

`sources`: the run directories of the rows a claim read (the matrix frame's `run_dir` column, filled by
`aggregate.matrix_frame`) followed by the table paths it summarises. The claims job (`write`) rebuilds the frames from
the runs with the functions the table job uses, and takes the tables as inputs: it runs after them, and a figure
edit never reruns it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

import pandas as pd
from scipy.stats import spearmanr

from gradfidelity.claims.evidence import exact, gate, not_measured, with_parts
from gradfidelity.studies.ds_audit.prediction import compare
from gradfidelity.studies.ds_audit.probe import clip_coefficient


def _steps(row) -> list[dict]:
    return row.result["per_step"]


def _ran(df: pd.DataFrame) -> pd.DataFrame:
    return df[df.status == "ok"]


def _accum(df: pd.DataFrame) -> pd.DataFrame:
    """Accumulation rows: one backward per micro-step, clipping off."""
    return df[(df.backward_calls == 1) & (df.clip_mode == "off")]


def _pred(row) -> list[int] | None:
    return None if row.predicted == "open" else json.loads(row.predicted)


def _tol(row) -> float:
    return row.result["tolerance"]


def _sources(rows: pd.DataFrame, tables: Sequence[str]) -> list[str]:
    """Run directories of `rows` (in table order, each once), then the tables."""
    dirs = list(dict.fromkeys(rows.run_dir)) if "run_dir" in rows.columns else []
    return [str(d) for d in dirs] + [str(t) for t in tables]


def a1(df: pd.DataFrame, tables: Sequence[str] = ()) -> dict:
    """Accumulation rows with ZeRO 0/2/3 that ran and whose per-step vectors differ from the prediction."""
    scope = _accum(df[df.zero_stage.isin([0, 2, 3])])
    sel = _ran(scope)
    src = _sources(scope, tables)
    n_err = len(scope) - len(sel)
    if sel.empty:
        return not_measured(f"no ZeRO 0/2/3 row ran ({n_err} of {len(scope)} could not run)", sources=src)
    bad = [f"{r.deepspeed} r{r.ranks} z{r.zero_stage} {r.offload} ga{r.ga} {r.dtype}: {r.contributions}"
           for r in sel.itertuples(index=False) if compare(r.result, _pred(r), r.predicted_clip) != "yes"]
    detail = (f"{len(sel)} rows ran ({n_err} could not run and are not counted); disagreeing: "
              + ("; ".join(bad[:8]) if bad else "none"))
    return exact(len(bad), n=len(sel), detail=detail, sources=src)


def a1_z1(df: pd.DataFrame, ranks: int, tables: Sequence[str] = ()) -> dict:
    """Whether any 0.18.9 ZeRO-1 + offload, GA >= 3 row with `ranks` ranks drops a micro-batch in any step."""
    sel = _accum(df[(df.deepspeed == "0.18.9") & (df.zero_stage == 1) & (df.offload != "none") & (df.ga >= 3)
                    & (df.ranks == ranks)])
    ran = _ran(sel)
    src = _sources(sel, tables)
    if ran.empty:
        errs = "; ".join(sorted(set(sel.error)))[:400] or "no such row in the matrix"
        return not_measured(f"no 0.18.9 ZeRO-1 + offload GA>=3 {ranks}-rank row ran: {errs}", sources=src)
    drops = [r for r in ran.itertuples(index=False)
             if any(abs(c) <= _tol(r) for s in _steps(r) for c in s["contributions"])]
    ex = "; ".join(f"ga{r.ga} {r.dtype}: {r.contributions}" for r in list(ran.itertuples(index=False))[:6])
    return exact(bool(drops), n=len(ran), detail=f"{len(drops)} of {len(ran)} rows drop a micro-batch ({ex})",
                 sources=src)


def a1_7981(df: pd.DataFrame, tables: Sequence[str] = ()) -> dict:
    sel = df[(df.deepspeed == "0.18.9") & (df.zero_stage == 2) & (df.offload != "none") & (df.ga == 1)
             & (df.backward_calls == 4) & (df.boundary == "manual") & (df.clip_mode == "off")]
    ran = _ran(sel)
    src = _sources(sel, tables)
    if ran.empty:
        return not_measured("no 0.18.9 ZeRO-2 + offload GA 1 x 4-backward (boundary marked) row ran", sources=src)
    devs, ex = [], []
    for r in ran.itertuples(index=False):
        target = [0, 0, 0, 1] * r.ranks
        devs += [max(abs(a - b) for a, b in zip(s["contributions"], target, strict=True)) for s in _steps(r)]
        ex.append(f"r{r.ranks} {r.dtype}: {r.contributions}")
    return exact(max(devs), n=len(ran), detail=f"max over {len(ran)} rows and their steps of max|c - [0,0,0,1] per "
                 "rank|: " + "; ".join(ex), sources=src)


def a2(df: pd.DataFrame, tables: Sequence[str] = ()) -> dict:
    sel = _accum(df[(df.deepspeed == "0.18.9") & (df.zero_stage == 2) & (df.offload != "none") & (df.ga == 2)])
    ran = _ran(sel)
    src = _sources(sel, tables)
    if ran.empty:
        return not_measured("no 0.18.9 ZeRO-2 + offload GA 2 row ran", sources=src)
    dev = max(abs(c - 1) for r in ran.itertuples(index=False) for s in _steps(r) for c in s["contributions"])
    ex = "; ".join(f"r{r.ranks} {r.dtype}: {r.contributions}" for r in ran.itertuples(index=False))
    return exact(dev, n=len(ran), detail=f"max |c_i - 1| over {len(ran)} rows and their steps: {ex}", sources=src)


def _bug_pattern(row, ga: int) -> bool:
    want = ([1] + [0] * (ga - 2) + [1]) * row.ranks
    for s in _steps(row):
        c = s["contributions"]
        top = max(c)
        if top <= _tol(row) or any(abs(x / top - w) > _tol(row) for x, w in zip(c, want, strict=True)):
            return False
    return True


def _alignment_detail(align: dict | None) -> str:
    if not align:
        return "real SFT micro-batches: not measured"
    return (f"on real SFT micro-batches (sft_rl task, {align['model']}, micro-batch {align['micro_batch_size']}, "
            f"N = {align['n_micro']}, {align['windows']} windows) ||g0 + g(N-1)|| / ||sum g_i|| = "
            f"{align['mean']:.3f} [{align['low']:.3f}, {align['high']:.3f}] = {align['over_two_over_n']:.2f} x 2/N "
            f"(2/N = {align['two_over_n']:.3f} if all gradients were equal, sqrt(2/N) = {align['orthogonal']:.3f} "
            f"if orthogonal; mean pairwise cosine {align['mean_cosine']:.3f})")


def a3(df: pd.DataFrame, tables: Sequence[str] = (), ga: int = 8, alignment: dict | None = None) -> dict:
    """The mechanism: on 0.18.9 ZeRO-2 + offload GA `ga` rows the reported norm is the norm of the kept micro-batches
    g0 + g(N-1) (part `norm`: max |reported / ||g0 + g(N-1)|| - 1| over rows and steps), and clipping scales by the
    coefficient of that norm (part `clip`: max |clip applied - min(1, threshold / ||g0 + g(N-1)||)| on the active
    clipping rows, where the full gradient's norm is twice the threshold). Gated on the rows actually showing the
    bug (else the kept and the full gradient coincide and nothing is tested) and on the clipping rows discriminating
    (the full gradient's coefficient differs from the partial one's). The "about 2/N" of the paper is a property of
    how aligned the micro-batch gradients are, not of DeepSpeed: `alignment` (the summary of ds_audit.alignment on
    the sft_rl study's real SFT micro-batches) and the probe's reported/true ratio over 2/N are in the detail for
    what they are, never in the verdict."""
    base = df[(df.deepspeed == "0.18.9") & (df.zero_stage == 2) & (df.offload != "none") & (df.ga == ga)
              & (df.backward_calls == 1)]
    norm_rows, clip_rows = _ran(base[base.clip_mode == "off"]), _ran(base[base.clip_mode == "active"])
    src = _sources(base, tables) + list((alignment or {}).get("sources", []))
    about = _alignment_detail(alignment)

    def none(why: str) -> dict:  # a parts claim keeps its parts when nothing is measured
        return with_parts({k: not_measured(why, sources=src) for k in ("norm", "clip")}, detail=f"{why}; {about}",
                          sources=src)

    if norm_rows.empty or clip_rows.empty:
        return none(f"needs 0.18.9 ZeRO-2 + offload GA {ga} rows with clipping off and active; ran: "
                    f"{len(norm_rows)} and {len(clip_rows)}")
    if any(s["reported_over_kept"] is None for r in norm_rows.itertuples(index=False) for s in _steps(r)):
        return none("DeepSpeed reported no gradient norm")
    bug = all(_bug_pattern(r, ga) for r in pd.concat([norm_rows, clip_rows]).itertuples(index=False))
    ratios = [s["reported_over_kept"] for r in norm_rows.itertuples(index=False) for s in _steps(r)]
    coefs = [(s["clip_applied"], clip_coefficient(s["kept_norm"], r.result["clip"]), s["clip_full"])
             for r in clip_rows.itertuples(index=False) for s in _steps(r)]
    discriminates = all(abs(p - f) > 0.1 for _, p, f in coefs)
    two_over_n = ", ".join(f"r{r.ranks} {r.dtype} {s['grad_norm_ratio'] / (2 / ga):.3f}"
                           for r in norm_rows.itertuples(index=False) for s in _steps(r)[:1])
    gates = [gate("bug_present", bug, f"every GA {ga} row keeps exactly micro-batches 0 and N-1 of each rank"
                  if bug else "some row does not show the [1, 0, ..., 0, 1] pattern: reported and full norm coincide"),
             gate("clip_discriminates", discriminates, "clip coefficients of the kept vs the full gradient: "
                  + ", ".join(f"{p:.3f} vs {f:.3f}" for _, p, f in coefs))]
    norm = exact(max(abs(x - 1) for x in ratios), n=len(norm_rows), sources=src,
                 detail=f"reported / ||g0 + g(N-1)|| per row and step: {', '.join(f'{x:.5f}' for x in ratios)}")
    clip = exact(max(abs(a - p) for a, p, _ in coefs), n=len(clip_rows), sources=src,
                 detail="clip applied vs min(1, threshold / ||g0 + g(N-1)||) vs the full gradient's: "
                 + ", ".join(f"{a:.4f} / {p:.4f} / {f:.4f}" for a, p, f in coefs))
    return with_parts({"norm": norm, "clip": clip}, gates=gates, sources=src,
                      detail=f"GA {ga}. 'About 2/N' is gradient alignment, not DeepSpeed: {about}; reported/true "
                      f"over 2/N on the probe's synthetic data: {two_over_n}")


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
             loss_run_dirs: Sequence[str] = (), loss_tables: Sequence[str] = (), alignment: dict | None = None) -> dict:
    """The study's evidence file: one record per claim; `matrix` rows carry their `run_dir` (see `_sources`)."""
    t = list(matrix_tables)
    return {"study": "ds_audit", "scale": scale, "values": {
        "A1": a1(matrix, t), "A1-z1-r1": a1_z1(matrix, 1, t), "A1-z1-r2": a1_z1(matrix, 2, t),
        "A1-7981": a1_7981(matrix, t), "A2": a2(matrix, t), "A3": a3(matrix, t, alignment=alignment),
        "A4": a4(loss_summary, loss_run_dirs, list(loss_tables)),
    }}


def write(groups: Sequence[str], loss: str, alignment_run: str, tables: dict[str, str], out: str, scale: str) -> None:
    """The claims job: the runs (and the paths of the tables they made, `tables` by plan.TABLES' names, cited as
    sources) -> the study's evidence file at `out`."""
    from gradfidelity.claims.evidence import level_for
    from gradfidelity.harness.io import atomic_write_json
    from gradfidelity.studies.ds_audit import aggregate
    from gradfidelity.studies.ds_audit import alignment as align_mod

    df = aggregate.matrix_frame(aggregate.ok_runs(groups, scale))
    (loss_run,) = aggregate.ok_runs([loss], scale)
    summ = aggregate.loss_summary(aggregate.loss_frame(loss_run))
    (align_run,) = aggregate.ok_runs([alignment_run], scale)
    align = align_mod.summary(align_run["metrics"], level=level_for("A3"))
    align["sources"] = [align_run["run_dir"], tables["alignment_csv"], tables["alignment_md"]]
    atomic_write_json(out, evidence(
        df, summ, scale, matrix_tables=[tables["matrix_csv"], tables["matrix_md"]],
        loss_run_dirs=[loss_run["run_dir"]], loss_tables=[tables["loss_csv"], tables["loss_md"]], alignment=align))
