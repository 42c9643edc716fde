"""Run records -> the study's tidy frames: the fault matrix (one row per case, with the bug description's prediction
and the agreement), the loss-aggregation rows and their summary over seeds.

The table, figure and claims jobs each build these frames from the same run files with these functions, so the
three agree row for row. Each matrix row keeps the raw probe result under `result` (claims read it; the table
writer leaves it out of the CSV) and flat columns for the reader: per-step vectors joined by " | ", the clipping
threshold used, the comparison. A row's version and rank count are its group run's own record (`deepspeed`,
`ranks` in its metrics), its `run_dir` the folder of the metrics.json it was read from: never parsed from a path.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from gradfidelity.errors import UserError
from gradfidelity.studies.ds_audit.audit import fmt_vector
from gradfidelity.studies.ds_audit.case import DSCase, case_from_json
from gradfidelity.studies.ds_audit.prediction import compare, prediction

MATRIX_ORDER = ["deepspeed", "ranks", "clip_mode", "backward_calls", "boundary", "zero_stage", "offload", "ga", "dtype"]


def ok_runs(paths: Iterable[str | Path], scale: str) -> list[dict]:
    """The runs' metrics.json records (the shared loader refuses another scale); every one must have finished ok."""
    from gradfidelity.harness.results import load_run_records

    records = load_run_records(paths, scale=scale)
    for rec in records:
        if rec["status"] != "ok":
            raise UserError(f"{rec['path']}: status {rec['status']!r}, expected ok")
    return records


def _steps(r: dict, key: str, fmt=str) -> str:
    return " | ".join(fmt(s[key]) if s[key] is not None else "" for s in r["per_step"])


def rows_for_group(version: str, ranks: int, cases: list[DSCase], states: list[dict]) -> list[dict]:
    """One row per case of a (version, ranks) group, from `worker.run_group` states."""
    rows = []
    for case, st in zip(cases, states, strict=True):
        pred, threshold, basis = prediction(version, case, ranks)
        clip_mode = "silent" if case.clip is None else ("active" if case.target_norm > case.clip > 0 else "off")
        row = {
            "deepspeed": version, "zero_stage": case.zero_stage, "offload": case.offload, "ga": case.ga,
            "backward_calls": case.backward_calls, "boundary": case.boundary if case.backward_calls > 1 else "",
            "clip_mode": clip_mode, "dtype": case.dtype, "ranks": ranks, "steps": case.steps, "status": st["status"],
            "contributions": "", "contributions_raw": "", "faithful": None, "clip_used": None,
            "grad_norm_ratio": "", "reported_over_kept": "", "clip_applied": "", "clip_full": "", "residual": "",
            "predicted": "open" if pred is None else str(pred).replace(" ", ""), "predicted_clip": threshold,
            "prediction_basis": basis, "agrees_with_prediction": "error", "error": st.get("error", ""),
            "result": None,
        }
        if st["status"] == "ok":
            r = st["result"]
            if r.get("extra", {}).get("deepspeed") not in (None, version):
                raise RuntimeError(f"group labelled {version} ran deepspeed {r['extra']['deepspeed']}")
            vecs = [fmt_vector(s["contributions"], r["tolerance"]) for s in r["per_step"]]
            g = "{:.4f}".format
            row.update(
                contributions=" | ".join(vecs),
                contributions_raw=" | ".join(" ".join(f"{x:.5f}" for x in s["contributions"]) for s in r["per_step"]),
                faithful=r["faithful"], clip_used=r["clip"], grad_norm_ratio=_steps(r, "grad_norm_ratio", g),
                reported_over_kept=_steps(r, "reported_over_kept", g), clip_applied=_steps(r, "clip_applied", g),
                clip_full=_steps(r, "clip_full", g), residual=_steps(r, "residual", "{:.1e}".format),
                agrees_with_prediction=compare(r, pred, threshold), result=r,
            )
        rows.append(row)
    return rows


def matrix_frame(groups: Iterable[dict]) -> pd.DataFrame:
    """The fault matrix from the group runs' records (`ok_runs`), in table order, each row with its `run_dir`."""
    rows = []
    for rec in groups:
        g = rec["metrics"]
        cases = [case_from_json(c, f"{rec['path']}: cases[{i}]") for i, c in enumerate(g["cases"])]
        rows += [{**row, "run_dir": rec["run_dir"]} for row in rows_for_group(g["deepspeed"], g["ranks"], cases,
                                                                            g["states"])]
    return pd.DataFrame(rows).sort_values(MATRIX_ORDER, kind="stable").reset_index(drop=True)


def loss_frame(record: dict) -> pd.DataFrame:
    """The loss-aggregation run's rows: one per (spread, seed, method)."""
    return pd.DataFrame(record["metrics"]["rows"])


def loss_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Means (and the error's sd) over seeds per (spread, method): what the table, the figure and A4 show."""
    return (df.groupby(["spread", "method"], sort=True)
              .agg(length_cv=("length_cv", "mean"), weight_min=("weight_min", "mean"),
                   weight_max=("weight_max", "mean"), rel_error=("rel_error", "mean"),
                   rel_error_sd=("rel_error", "std"), cosine=("cosine", "mean"), seeds=("seed", "nunique"))
              .reset_index())
