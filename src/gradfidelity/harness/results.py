"""The one loader of run directories: every study's aggregation reads finished runs through here.

One record per metrics.json, with its run directory, status, seed and scale; diverged runs are kept and labelled,
so a table or a statistic has to decide explicitly what to do with them instead of silently averaging survivors.
A run made at another scale than the one being aggregated is refused: stale results must never mix in.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from gradfidelity.errors import UserError
from gradfidelity.harness.io import read_json
from gradfidelity.harness.provenance import IDENTITY_KEYS, UNKNOWN_ISA, split_dirty

STATUSES = ("ok", "diverged")


def identity_hash(run_dir: str | Path) -> str | None:
    """The hash of the identity (harness/identity.py) a run's provenance.json records, or None (no provenance, or
    a record made before identities)."""
    return _identity(run_dir).get("hash")


def _identity(run_dir: str | Path) -> dict:
    path = Path(run_dir) / "provenance.json"
    return (read_json(path).get("identity") or {}) if path.is_file() else {}


def check_one_identity_per_cell(records: list[dict]) -> None:
    """Refuse runs of one cell (the same wildcards but the seed) made with two identities, naming both: a cell's
    seeds are repeats of one config on one data, never a mix (a 100-step run beside 2,000-step ones)."""
    seen: dict[str, tuple[str, str]] = {}
    for record in records:
        identity = _identity(record["run_dir"])  # provenance.json read once per record
        digest = identity.get("hash")
        if digest is None:
            continue
        cell = {k: v for k, v in (record.get("cell") or {}).items() if k != "seed"}
        # a design that starts seeds from different committed bases (study A, round 6: base k mod 2) makes each base
        # a stratum of the cell: its seeds repeat one config on one base, and the strata differ by design
        base = (identity.get("data") or {}).get("base_seed")
        if base is not None:
            cell["base_seed"] = base
        key = json.dumps(cell, sort_keys=True)
        if key in seen and seen[key][0] != digest:
            other_hash, other_run = seen[key]
            raise UserError(f"runs of one cell {cell} were made with two configs or data: {other_run} (identity "
                            f"{other_hash}) and {record['run_dir']} (identity {digest}); their provenance.json "
                            "files say what differs (`identity`). Rerun the stale ones; an aggregate never mixes them")
        seen.setdefault(key, (digest, record["run_dir"]))


def load_run_records(paths: Iterable[str | Path], scale: str | None = None) -> list[dict]:
    """Each metrics.json as a dict: status, seed, scale, metrics, timing, plus `path` and `run_dir`.

    With `scale`, every run must have been made at that scale (the harness records it in metrics.json). Runs of one
    cell made with two identities are refused (`check_one_identity_per_cell`).
    """
    records = []
    for path in paths:
        record = read_json(path)
        if not isinstance(record, dict) or "status" not in record or "metrics" not in record:
            raise UserError(f"{path} is not a run's metrics.json (no status/metrics)")
        if record["status"] not in STATUSES:
            raise UserError(f"{path}: unknown run status {record['status']!r} (expected one of {STATUSES})")
        if scale is not None and record.get("scale") != scale:
            raise UserError(f"{path} was made at scale {record.get('scale')!r}, not {scale!r}: rerun it")
        records.append({**record, "path": str(path), "run_dir": str(Path(path).parent)})
    check_one_identity_per_cell(records)
    return records


def load_runs(paths: Iterable[str | Path], keys: Iterable[str] | None = None,
              scale: str | None = None) -> pd.DataFrame:
    """One row per metrics.json: path, run_dir, status, seed, scale and the scalar metrics (or only `keys`).

    A diverged run keeps its row with status "diverged" and empty metric cells.
    """
    rows = []
    for record in load_run_records(paths, scale):
        metrics = record["metrics"] if record["status"] == "ok" else {}
        wanted = keys if keys is not None else [
            k for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
        row = {"path": record["path"], "run_dir": record["run_dir"], "status": record["status"],
               "seed": record.get("seed"), "scale": record.get("scale")}
        row.update({k: metrics.get(k) for k in wanted})
        rows.append(row)
    return pd.DataFrame(rows)


def cell_of(record: dict) -> dict:
    """The plan's cell a run belongs to (its study and wildcards), as the harness wrote it into metrics.json.

    A run made before runs carried their identity has none: it is refused, naming the file, rather than guessed
    from its path.
    """
    cell = record.get("cell")
    if not isinstance(cell, dict) or "study" not in cell:
        raise UserError(f"{record.get('path')}: no 'cell' (the run's study and wildcards) in its metrics.json: it was "
                        "made by an older version; rerun it (delete its metrics.json)")
    return cell


def read_provenance(record: dict) -> dict:
    """The provenance.json beside a run's metrics.json, checked to belong to that run.

    A run without its provenance has lost the record of what code, packages and machine made it: every reader
    refuses it, naming the file, rather than writing a row with an empty git sha. A provenance whose seed or status
    differs from the metrics.json is a stale record of another run.
    """
    path = Path(record["run_dir"]) / "provenance.json"
    if not path.is_file():
        raise UserError(f"{path} is missing: the run {record['run_dir']} has no record of the code, packages and "
                        "machine that made it; rerun it (delete its metrics.json)")
    prov = read_json(path)
    for key in ("seed", "status"):
        if prov.get(key) != record.get(key):
            raise UserError(f"{path}: {key} {prov.get(key)!r} differs from {record['path']} ({record.get(key)!r}):"
                            " a stale record of another run; rerun it (delete its metrics.json)")
    return prov


def _git_dirty(prov: dict) -> tuple[bool | None, list[str], list[str]]:
    """(git_dirty, the changed tracked files outside the output folders, those under them). A record written before
    provenance split them (no `git_dirty_outputs`) is split here from its `git_dirty_files`, so that every row of a
    runs table reads alike: dirty means changed code, not the DAG's own outputs; a record without the file list
    keeps its flag."""
    files = prov.get("git_dirty_files")
    if "git_dirty_outputs" in prov or files is None:
        return prov.get("git_dirty"), list(files or []), list(prov.get("git_dirty_outputs") or [])
    code, outputs = split_dirty(files)
    return bool(code), code, outputs


VERSIONS = ("torch", "deepspeed", "trl", "transformers", "pytorch-optimizer", "numpy", "scipy")


def runs_table(paths: Iterable[str | Path], scale: str | None = None) -> pd.DataFrame:
    """One row per run: run id, seed, status, scalar metrics, and where and how it ran (from provenance.json).

    This is the per-study `runs.csv` committed with the cpu scale's reference results: every number in a paper
    table can be traced to a run, the git sha that produced it, its package versions, CPU and thread settings.
    `git_dirty` says that a tracked file outside the output folders differed from that sha (`git_dirty_files`);
    `git_dirty_outputs` lists the changed tracked files under them (results/, paper_tables/, figures/).
    The CPU identity columns (`harness.provenance.IDENTITY_KEYS`) decide which reruns check-reference compares bit
    for bit; a run recorded before provenance had them reads "unknown ISA" there. `metrics_json` is the run's
    metrics.json itself (cell, histories and timing included), so that the table alone can rebuild the run
    records an aggregation reads (check-reference recomputes claims from it; `records_from_runs_table`).
    `tokens_per_s` (and `shares_machine`, for a job that ran beside another) where the study's runs time it.
    `config_hash`: the hash of the identity the run was made with (its config section and data: harness/identity.py).
    """
    rows = []
    for record in load_run_records(paths, scale):
        prov = read_provenance(record)
        machine = prov.get("machine") or {}
        metrics = record["metrics"] if record["status"] == "ok" else {}
        dirty, files, outputs = _git_dirty(prov)
        row = {"run_id": record["run_dir"], "study": record.get("study"), "scale": record.get("scale"),
               "seed": record.get("seed"), "status": record["status"],
               "git_sha": prov.get("git_sha"), "git_dirty": dirty, "git_dirty_files": " ".join(files),
               "git_dirty_outputs": " ".join(outputs),
               # what made the run: its identity's hash (harness/identity.py), one value a cell
               "config_hash": (prov.get("identity") or {}).get("hash"),
               "cpu_model": machine.get("cpu_model"),
               **{key: machine.get(key, UNKNOWN_ISA) for key in IDENTITY_KEYS},
               "cpu_count": machine.get("cpu_count"),
               "torch_num_threads": (prov.get("threads") or {}).get("torch_num_threads"),
               "omp_num_threads": (prov.get("threads") or {}).get("OMP_NUM_THREADS"),
               "wall_s": (record.get("timing") or {}).get("wall_s"),
               "resumed_from_step": prov.get("resumed_from_step"),
               "checkpoints_discarded": len(prov.get("checkpoints_discarded") or [])}
        timing = record.get("timing") or {}
        # throughput, per run, where the study times it (a job that ran beside another says so: its rate is not read)
        row.update({k: timing[k] for k in ("tokens_per_s", "shares_machine") if k in timing})
        row.update({f"version_{k}": (prov.get("packages") or {}).get(k) for k in VERSIONS})
        row.update({f"metric_{k}": v for k, v in metrics.items()
                    if isinstance(v, (int, float)) and not isinstance(v, bool)})
        if record["status"] == "diverged":
            row["metric_diverged_at_step"] = record["metrics"].get("diverged_at_step")
        row["metrics_json"] = json.dumps({k: v for k, v in record.items() if k not in ("path", "run_dir")},
                                         sort_keys=True, separators=(",", ":"))
        rows.append(row)
    return pd.DataFrame(rows)


def records_from_runs_table(table: pd.DataFrame, root: str | Path) -> list[Path]:
    """Rebuild each row's run directory under `root` (`<root>/<run_id>/metrics.json` and a provenance.json with the
    row's seed, status and machine), from its `metrics_json`: the run records an aggregation reads, for a checkout
    that has the committed runs tables but not the run directories. A table written before runs tables carried
    `metrics_json` cannot: refused, naming the rows' study, rather than rebuilt from its scalar columns (a
    history, a curve or a timing would be missing and an aggregation would compute something else)."""
    if "metrics_json" not in table.columns or table["metrics_json"].isna().any():
        studies = sorted({str(s) for s in table.get("study", pd.Series(["?"])).dropna()})
        raise UserError(f"the runs table of {', '.join(studies) or '?'} has no metrics_json for every run: it was "
                        "written before runs tables kept each run's metrics.json, so its run records cannot be "
                        "rebuilt (the study's next run of this scale writes it)")
    written = []
    for row in table.itertuples(index=False):
        record = json.loads(row.metrics_json)
        run_dir = Path(root) / row.run_id
        run_dir.mkdir(parents=True, exist_ok=True)
        machine = {key: getattr(row, key, UNKNOWN_ISA) for key in ("cpu_model", *IDENTITY_KEYS)}
        (run_dir / "metrics.json").write_text(json.dumps(record))
        (run_dir / "provenance.json").write_text(json.dumps(
            {"seed": record.get("seed"), "status": record.get("status"), "scale": record.get("scale"),
             "machine": machine, "rebuilt_from": "runs table metrics_json"}, default=str))
        written.append(run_dir / "metrics.json")
    return written
