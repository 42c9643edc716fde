"""Run records -> the study's tidy CSVs: runs.csv (one row per run: the cell, status, final loss, LR, tokens, epochs
of the training split, step and wall time, and the CPU identity of the host it ran on) and curves.csv (one row per
validation evaluation of a finished run).

The CPU identity columns (`harness.provenance.IDENTITY_KEYS`, read from each run's provenance.json as the runs table
reads them) let the claims name the host types behind every contrast (issue 57: runs of two host types fed one
contrast unseen); `wall_s` is the run's own wall time, what one more seed of its cell costs.

A run's cell is read from its records (`harness.results.cell_of`: the training rule's wildcards, written by the
harness), never rebuilt from its path; the files read are the ones given (the rule's {input}), through the harness
loader, which refuses a run made at another scale.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict

import pandas as pd

from gradfidelity.errors import UserError
from gradfidelity.harness.environment import SCALE_ENV
from gradfidelity.harness.io import atomic_write_csv
from gradfidelity.studies.async_pp.plan import KEYS, cell_from_run


def aggregate(metrics_paths: list[str], runs_csv: str, curves_csv: str, scale: str | None = None,
              tokens_per_step: int | None = None) -> None:
    """The metrics.json files given (the rule's {input}), read through the harness loader -> runs.csv + curves.csv.

    `scale` (default: $GRADFIDELITY_SCALE) must be the scale every run was made at: stale runs are refused.
    """
    from gradfidelity.harness.provenance import IDENTITY_KEYS, UNKNOWN_ISA
    from gradfidelity.harness.results import cell_of, load_run_records, read_provenance

    scale = scale or os.environ.get(SCALE_ENV)
    if not scale:
        raise UserError(f"async-pp-aggregate: no scale given (pass --scale or set {SCALE_ENV})")
    records = load_run_records(metrics_paths, scale=scale)
    cells = [cell_from_run(cell_of(rec)) for rec in records]  # every run names its cell before any row is made
    rows, curve_rows = [], []
    for c, rec in zip(cells, records, strict=True):
        if rec.get("seed") != c.seed:
            raise UserError(f"{rec['path']}: records seed {rec.get('seed')!r}, its cell says {c.seed}")
        ok = rec["status"] == "ok"
        m = rec["metrics"]
        key = asdict(c)
        machine = read_provenance(rec).get("machine") or {}  # refuses a run without its provenance, naming it
        rows.append({**key, "status": rec["status"], "final_val_loss": float(m["final_val_loss"]) if ok else math.nan,
                     "epochs": float(m.get("epochs", math.nan)) if ok else math.nan,
                     "n_params": int(m["n_params"]) if ok and "n_params" in m else math.nan,
                     "lr_value": m.get("lr", math.nan) if ok else math.nan,
                     "diverged_at_step": math.nan if ok else m.get("diverged_at_step", math.nan),
                     "tokens": c.steps * tokens_per_step if tokens_per_step else math.nan,
                     "step_s": (rec.get("timing") or {}).get("step_s", math.nan),
                     "wall_s": (rec.get("timing") or {}).get("wall_s", math.nan),
                     **{k: machine.get(k, UNKNOWN_ISA) for k in IDENTITY_KEYS},
                     "scale": rec["scale"], "run_dir": rec["run_dir"], "path": rec["path"]})
        for step, tokens, val in (m.get("curve") or []) if ok else []:
            curve_rows.append({**key, "step": step, "tokens": tokens, "val_loss": val})
    atomic_write_csv(pd.DataFrame(rows), runs_csv)
    columns = [*KEYS, "seed", "width", "step", "tokens", "val_loss"]
    atomic_write_csv(pd.DataFrame(curve_rows, columns=columns), curves_csv)


def read_runs(runs_csv: str, scale: str) -> pd.DataFrame:
    """runs.csv of this scale (refused when aggregated at another scale: stale results never mix in)."""
    runs = pd.read_csv(runs_csv)
    if "scale" in runs.columns:
        other = sorted({str(s) for s in runs["scale"].dropna()} - {scale})
        if other:
            raise UserError(f"{runs_csv} holds runs of scale(s) {other}, not {scale!r}: aggregate again")
    return runs
