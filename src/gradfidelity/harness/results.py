"""Reading finished runs back for aggregation: one row per run, diverged runs kept and labelled."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from gradfidelity.errors import UserError
from gradfidelity.harness.io import read_json


def load_runs(paths: Iterable[str | Path], keys: Iterable[str] | None = None) -> pd.DataFrame:
    """One row per metrics.json: status, seed, and the scalar metrics (or only `keys`).

    A diverged run keeps its row with status "diverged" and empty metric cells, so a table or a statistic has to
    decide explicitly what to do with it instead of silently averaging over survivors.
    """
    rows = []
    for path in paths:
        record = read_json(path)
        if "status" not in record or "metrics" not in record:
            raise UserError(f"{path} is not a run's metrics.json (no status/metrics)")
        metrics = record["metrics"] if record["status"] == "ok" else {}
        wanted = keys if keys is not None else [k for k, v in metrics.items() if isinstance(v, (int, float))]
        row = {"path": str(path), "status": record["status"], "seed": record.get("seed")}
        row.update({k: metrics.get(k) for k in wanted})
        rows.append(row)
    return pd.DataFrame(rows)
