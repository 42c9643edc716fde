"""A run's committed records: the small files of its run directory that the cpu scale commits.

Why: a study's cpu run used to be a monolith. Its aggregates read run directories that were not committed, so one
more seed, budget rung or longer arm meant rerunning the whole study, and a run that did not fit in one session never
ran. With each run's records committed, a fresh checkout plans no training job, a new cell is planned alone, and a
study can be run in parts (CONTRIBUTING.md, "Committing a study's cpu results").

The records of a run are `RECORDS`: metrics.json (what it measured), provenance.json (what made it) and
benchmark.tsv (Snakemake's job benchmark). Checkpoints, models and logs are never committed.

- `restore`: a runs table -> its runs' records, for runs made before records were committed (round 4's studies A
  and B and the audit). metrics.json is the run's own record (the table's `metrics_json`), provenance.json carries
  every field the table carried and says it was restored, and benchmark.tsv has Snakemake's header and "-" (not
  measured: the original was not kept). The runs table rebuilt from them equals the committed one.
- `check`: an upstream run rerun to regenerate an artifact that is not committed (a base or SFT model) against its
  committed record, before any downstream job trains on it.

A study run in parts (parts.py) reads which planned runs have no record yet from Snakemake's own dry run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from gradfidelity.errors import UserError
from gradfidelity.harness.io import atomic_write_json, atomic_write_text
from gradfidelity.harness.provenance import IDENTITY_KEYS, describe_host, same_host_type
from gradfidelity.harness.record_compare import (
    NOT_COMPARABLE,
    RECORD,
    compare,
    cross_host_rules,
    read_drift,
    read_runs_table,
)
from gradfidelity.harness.results import VERSIONS

RECORDS = ("metrics.json", "provenance.json", "benchmark.tsv")
# Snakemake's benchmark columns (snakemake.benchmark.BenchmarkRecord.get_header), "-" where not measured
BENCHMARK_HEADER = ("s", "h:m:s", "max_rss", "max_vms", "max_uss", "max_pss", "io_in", "io_out", "mean_load",
                    "cpu_time")


def _value(v):
    """A runs-table cell as the provenance value it was written from (an empty cell was None)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    if hasattr(v, "item"):  # numpy scalars
        return v.item()
    return v


def _words(v) -> list[str]:
    v = _value(v)
    return str(v).split() if v is not None else []


def provenance_from_row(row: dict, table: str) -> dict:
    """The provenance.json a runs-table row was written from, as far as the row carried it (harness.results.
    runs_table's columns), marked `restored_from`: the config, start and end times are not in a runs table."""
    record = json.loads(row["metrics_json"])
    discarded = int(_value(row.get("checkpoints_discarded")) or 0)
    return {
        "study": record.get("study"), "scale": record.get("scale"), "seed": record.get("seed"),
        "status": record.get("status"), "cell": record.get("cell"),
        "git_sha": _value(row.get("git_sha")), "git_dirty": _value(row.get("git_dirty")),
        "git_dirty_files": _words(row.get("git_dirty_files")),
        "git_dirty_outputs": _words(row.get("git_dirty_outputs")),
        "machine": {"cpu_model": _value(row.get("cpu_model")), "cpu_count": _value(row.get("cpu_count")),
                    **{key: _value(row.get(key)) for key in IDENTITY_KEYS}},
        "threads": {"torch_num_threads": _value(row.get("torch_num_threads")),
                    "OMP_NUM_THREADS": _value(row.get("omp_num_threads"))},
        "resumed_from_step": _value(row.get("resumed_from_step")),
        "checkpoints_discarded": [{"restored": "the runs table kept only their number"}] * discarded,
        "packages": {k: _value(row.get(f"version_{k}")) for k in VERSIONS},
        "restored_from": table,
    }


def restore(table_path: str | Path, repo: str | Path = ".", overwrite: bool = False) -> list[Path]:
    """Write the records of every run of a committed runs table into its run directory (`run_id`, relative to
    `repo`). An existing record is kept unless `overwrite` (a run's own records are never replaced by restored
    ones by accident). Returns the metrics.json paths written."""
    table = read_runs_table(Path(table_path))
    if "metrics_json" not in table.columns or table["metrics_json"].isna().any():
        raise UserError(f"{table_path}: no metrics_json for every run: it was written before runs tables kept "
                        "each run's metrics.json, so its records cannot be restored (rerun the study)")
    written = []
    for row in table.to_dict("records"):
        run_dir = Path(repo) / row["run_id"]
        if (run_dir / "metrics.json").exists() and not overwrite:
            continue
        atomic_write_json(run_dir / "metrics.json", json.loads(row["metrics_json"]))
        atomic_write_json(run_dir / "provenance.json", provenance_from_row(row, str(table_path)))
        atomic_write_text(run_dir / "benchmark.tsv",
                          "\t".join(BENCHMARK_HEADER) + "\n" + "\t".join("-" for _ in BENCHMARK_HEADER) + "\n")
        written.append(run_dir / "metrics.json")
    return written


def check(committed: str | Path, fresh: str | Path, drift_repo: str | Path = ".") -> str:
    """A rerun of a committed cell (written to another run directory) against its committed record.

    On the same host type the two records must be equal bit for bit, wall-clock values aside
    (`harness.record_compare.record_digest`). On another host type an identical value (or an identical record) is
    equal, whatever its rule; every other scalar metric must be within its measured cross-host rule
    (results/cpu/reference/drift_*.csv); a metric that is not comparable across hosts and differs (study A's
    accuracies: its small models leave their trajectory at the first rounding difference) is a mismatch, since
    runs trained on this artifact would be another draw than the committed ones. Raises UserError naming both
    records and the way out; returns a one-line summary otherwise."""
    from gradfidelity.harness.results import runs_table

    a, b = runs_table([committed]), runs_table([fresh])
    a_row, b_row = a.iloc[0].to_dict(), b.iloc[0].to_dict()
    same = same_host_type(a_row, b_row)
    b = b.assign(run_id=a_row["run_id"])
    rules = {} if same else cross_host_rules(read_drift(Path(drift_repo)))
    table = compare(a, b, rules)
    if not same:  # a record that differs across host types drifts like its scalars: the scalars are judged instead
        table = table[~((table["metric"] == RECORD) & (table["verdict"] == NOT_COMPARABLE))]
    bad = table[table["verdict"] != "ok"]
    if same:
        hosts = f"same host type ({describe_host(a_row)})"
    else:
        hosts = f"committed on {describe_host(a_row)}, rerun on {describe_host(b_row)}"
    if bad.empty:
        return f"{fresh}: equals its committed record {committed} ({len(table)} values; {hosts})"
    lines = "; ".join(f"{r.metric}: {r.committed} -> {r.rerun} ({r.verdict}, rule {r.rule})"
                      for r in bad.head(6).itertuples())
    way_out = ("the code or the packages differ from the committed run's (its provenance.json names them): run at "
               "that commit, or rerun the study whole" if same else
               "this study's runs are another draw on this host type: rerun the study whole (in parts: "
               "CONTRIBUTING.md), not one cell on top of records from another host")
    raise UserError(f"the rerun record {fresh} differs from the committed record {committed} ({hosts}): {lines}"
                    f"{' ...' if len(bad) > 6 else ''}. No downstream job trains on it. Way out: {way_out}")
