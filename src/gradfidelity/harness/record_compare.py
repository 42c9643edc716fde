"""A committed run record against a rerun of it: the comparison primitives that check-record (harness/records.py),
check-reference (reference/check.py) and the claims report (claims/report.py) share.

Why here: these are facts about a run record (its digest, its runs-table row read back exactly, the measured
cross-host rules its metrics obey), not about the reference check's sample. Kept in harness/, the rooms above it
(claims/, reference/) import them and nothing here imports a room above (tests/test_layout.py checks the arrows).

- `record_digest`: a run's whole metrics.json, wall-clock values aside, in 16 hex digits (`RECORD` names it in a
  comparison table).
- `read_drift`, `cross_host_rules`: the committed drift measurements (results/cpu/reference/drift_*.csv) and the
  per-metric tolerance across host types they give.
- `compare`: one row per (run, metric), judged bit for bit on the same host type, by its cross-host rule elsewhere.
  Equal is equal: an identical value (a selected LR, a record digest) is ok on any host type, whatever its rule.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pandas as pd

from gradfidelity.errors import UserError
from gradfidelity.harness.provenance import same_host_type

DRIFT_DIR = Path("results") / "cpu" / "reference"  # drift_*.csv: (study, run, metric, ..., rel_difference)
MIN_REL = 0.005   # the smallest cross-host tolerance of a metric that drifted at all
MAX_REL = 0.25    # a metric whose tolerance would exceed this is not comparable across hosts
COLUMNS = ["run", "metric", "committed", "rerun", "difference", "rel_difference", "rule", "verdict", "hosts"]
RECORD = "(record)"  # the metric name of a run's whole record in the comparison
WALL_CLOCK_KEYS = frozenset({"timing", "seconds"})  # wall-clock values inside a record: they never repeat
EQUAL = "equal"  # the rule of a value identical to the committed one on another host type: ok whatever its rule
NOT_COMPARABLE = "not comparable"


def missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def read_runs_table(path: Path) -> pd.DataFrame:
    """A committed runs table, its floats read back exactly (pandas' default parser may differ in the last bit)."""
    return pd.read_csv(path, float_precision="round_trip")


def record_digest(metrics_json) -> str | None:
    """The first 16 hex digits of the SHA-256 of a run's metrics.json (a runs table's `metrics_json`) without its
    wall-clock values (`WALL_CLOCK_KEYS` at any depth); None for a row without one (written before round 4).

    Why: a runs table's scalar `metric_*` columns are not all a run records. Study A's audit runs keep their
    evidence (contribution vectors, loss-aggregation rows) nested, with no scalar metric at all, and the training
    runs keep curves and histories. One digest compares all of it."""
    if missing(metrics_json):
        return None

    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in WALL_CLOCK_KEYS}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    canonical = json.dumps(strip(json.loads(metrics_json)), sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def read_drift(repo: Path) -> pd.DataFrame:
    """Every committed drift measurement (results/cpu/reference/drift_*.csv) in one table, each row with its file."""
    paths = sorted((Path(repo) / DRIFT_DIR).glob("drift_*.csv"))
    if not paths:
        raise UserError(f"{Path(repo) / DRIFT_DIR} has no drift_*.csv: the committed drift measurements behind the "
                        "cross-host rules are missing")
    frames = []
    for path in paths:
        df = pd.read_csv(path)
        absent = {"study", "metric", "rel_difference"} - set(df.columns)
        if absent:
            raise UserError(f"{path}: no column(s) {sorted(absent)}")
        frames.append(df.assign(source=path.name))
    return pd.concat(frames, ignore_index=True)


def cross_host_rules(drift: pd.DataFrame) -> dict[tuple[str, str], float | None]:
    """(study, metric) -> relative tolerance across hosts (0: exact), or None: not comparable across hosts.

    From the drift measurements: twice the largest relative drift of the metric in its study over every
    measurement, at least MIN_REL; above MAX_REL the metric is not comparable. A metric of a study no measurement
    saw stays exact.
    """
    rules = {}
    worst = drift.assign(rel=pd.to_numeric(drift["rel_difference"], errors="coerce")).groupby(
        ["study", "metric"])["rel"].max()
    for (study, metric), rel in worst.items():
        if pd.isna(rel):
            raise UserError(f"{DRIFT_DIR}: no relative difference for {study}/{metric}")
        tol = 0.0 if rel == 0 else max(2 * float(rel), MIN_REL)
        rules[(study, metric)] = None if tol > MAX_REL else tol
    return rules


def _row(run, metric, committed, rerun, difference, rel, rule, verdict, hosts) -> dict:
    return dict(zip(COLUMNS, (run, metric, committed, rerun, difference, rel, rule, verdict, hosts), strict=True))


def compare(committed: pd.DataFrame, rerun: pd.DataFrame, rules: dict[tuple[str, str], float | None] | None = None,
            force_cross_host: bool = False) -> pd.DataFrame:
    """One row per (run, metric) of `committed` (runs-table rows) against `rerun` (rows with the same `run_id`):
    committed, rerun, difference (absolute and relative), the rule applied, the verdict (ok, MISMATCH, or "not
    comparable" across hosts) and whether the two ran on one host type ("same" or "cross").

    Bit for bit when both rows carry the same CPU identity (`harness.provenance.same_host_type`); a row without one
    ("unknown ISA") is another host. Across hosts each metric follows its measured rule (`cross_host_rules`; a metric
    without one is compared exactly), and an identical value is ok whatever the rule (rule `EQUAL`): a selected LR
    or a count that did not move is not a mismatch because it could have. `force_cross_host` applies the cross-host
    rules on one host type too (to measure drift). A run's whole record (`RECORD`, from `metrics_json`) is exact on
    one host type; across hosts it is ok when equal, else not comparable (its curves drift like its scalars)."""
    rules = rules or {}
    rows = []
    rerun = rerun.set_index("run_id")
    for rec in committed.itertuples(index=False):
        rec = rec._asdict()
        run = rec["run_id"]
        if run not in rerun.index:
            rows.append(_row(run, "(the run)", "ok", "missing", "", "", "", "MISMATCH", ""))
            continue
        new = rerun.loc[run].to_dict()
        same = same_host_type(rec, new)
        hosts = "same" if same else "cross"
        exact = same and not force_cross_host
        if new["status"] != rec["status"]:
            rows.append(_row(run, "status", rec["status"], new["status"], "", "", "exact", "MISMATCH", hosts))
        for key in sorted(k for k in rec if k.startswith("metric_") and not missing(rec[k])):
            rows.append(_metric_row(run, key[len("metric_"):], rec[key], new.get(key),
                                    0.0 if exact else rules.get((rec["study"], key[len("metric_"):]), 0.0), hosts))
        digest_a, digest_b = record_digest(rec.get("metrics_json")), record_digest(new.get("metrics_json"))
        if digest_a is not None:
            equal = digest_a == digest_b
            rule, verdict = (("exact", "ok" if equal else "MISMATCH") if exact else
                             (EQUAL, "ok") if equal else (NOT_COMPARABLE, NOT_COMPARABLE))
            rows.append(_row(run, RECORD, digest_a, digest_b, 0.0 if equal else "", "", rule, verdict, hosts))
    return pd.DataFrame(rows, columns=COLUMNS)


def _metric_row(run: str, metric: str, a, b, tol: float | None, hosts: str) -> dict:
    """One scalar metric: `tol` 0 exact, None not comparable, else the relative tolerance."""
    rule = "exact" if tol == 0 else (NOT_COMPARABLE if tol is None else f"rel<={tol:.3g}")
    if missing(b):
        return _row(run, metric, a, b, "", "", rule, "MISMATCH", hosts)
    diff = float(b) - float(a)
    rel = abs(diff) / max(abs(float(a)), 1e-12)
    if diff == 0:
        return _row(run, metric, a, b, diff, rel, rule if tol is not None else EQUAL, "ok", hosts)
    if tol is None:
        return _row(run, metric, a, b, diff, rel, rule, NOT_COMPARABLE, hosts)
    return _row(run, metric, a, b, diff, rel, rule, "ok" if tol and rel <= tol else "MISMATCH", hosts)
