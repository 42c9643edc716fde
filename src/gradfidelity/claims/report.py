"""The claims report: for every registry row, the estimate, its interval, n against min_n, the gates and the verdict
computed from them (claims/verify.py), and whether the verdict survives hardware drift where that was measured.

Hardware drift: `gradfidelity check-reference --measure-drift` reruns a fixed sample at two ISA levels and, where
the runs tables can rebuild their run records, recomputes the claims with each level's values in place of the
committed ones (results/<scale>/reference/verdicts_*.csv). A claim whose recomputed verdict differs is "fragile:
flips within hardware drift", shown with both verdicts and values; that is information for the reader, not a
failure. Nothing here judges drift itself: the flag is read from the measurement, never written by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from gradfidelity.claims.power_table import read_power_csv
from gradfidelity.claims.registry import load_registry
from gradfidelity.claims.verdict import ARITHMETIC_BAD, ARITHMETIC_OK, MEASURED_VERDICTS
from gradfidelity.claims.verify import load_evidence, verify
from gradfidelity.errors import UserError
from gradfidelity.harness.io import atomic_write_csv, atomic_write_text
from gradfidelity.harness.record_compare import RECORD, record_digest
from gradfidelity.tables import markdown


def _num(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def interval_text(row) -> str:
    """'[low, high] 95%', 'exact', or '' when there is no interval."""
    if row["exact"]:
        return "exact"
    if row["low"] is None or pd.isna(row["low"]):
        return ""
    return f"[{_num(row['low'])}, {_num(row['high'])}] {round(100 * row['level']):d}%"


def value_text(row) -> str:
    """'1.342 [0.98, 1.7] 95%', '0.0995 exact', or 'no value': a claim's number as one cell."""
    text = f"{_num(row['estimate'])} {interval_text(row)}".strip()
    return text or "no value"


def counts_line(df: pd.DataFrame) -> str:
    counts = df["verdict"].value_counts()
    measured = df[df["evidence"] == "measured"]
    parts = [f"{counts.get(v, 0)} {v}" for v in MEASURED_VERDICTS]
    arith = [f"{counts.get(v, 0)} {v}" for v in (ARITHMETIC_OK, ARITHMETIC_BAD) if counts.get(v, 0)]
    return (f"{', '.join(parts)} (of {len(measured)} measured claims)"
            + (f"; {', '.join(arith)} (recomputations of the papers' own numbers, not reproductions)" if arith else ""))


FRAGILE = "fragile: flips within hardware drift"
VALUE_MOVED = "value moved"  # an unchanged verdict whose value moved under the drift
NOT_SAMPLED = "not in the drift sample"  # a recomputed claim none of whose runs was rerun
STALE = "stale: recomputed from evidence that has changed since"  # a drift row whose committed side is not today's
DRIFT_COLUMNS = {"id", "committed", "rerun", "unchanged", "committed_value", "rerun_value", "values", "source"}


def read_drift_verdicts(paths) -> pd.DataFrame:
    """The verdict recomputes of every drift measurement given (verdicts_*.csv), in one table; `source_path` is the
    comparison each row was recomputed from (its `source`, beside the verdicts file)."""
    frames = []
    for path in paths:
        df = pd.read_csv(path)
        missing = DRIFT_COLUMNS - set(df.columns)
        if missing:
            raise UserError(f"{path}: no column(s) {sorted(missing)}: not a verdicts file of check-reference "
                            "--measure-drift")
        frames.append(df.assign(source_path=[str(Path(path).parent / s) for s in df["source"]]))
    return (pd.concat(frames, ignore_index=True) if frames
            else pd.DataFrame(columns=sorted(DRIFT_COLUMNS | {"source_path"})))


def _same_number(now, then) -> bool:
    try:
        return math.isclose(float(now), float(then), rel_tol=1e-12)
    except (TypeError, ValueError):
        return False


def changed_runs(source_path: str) -> set[str]:
    """The runs of the comparison `source_path` whose record in this checkout is not the one it compared:
    - a check-reference comparison (its `(record)` rows): the committed record's digest then against now;
    - a drift measurement of two reruns (`value_a`, `value_b`): today's value of a metric it compared is neither.
    A run with no record now counts as changed. Empty for a comparison not in this checkout, or one that kept
    neither (nothing to tell). Each run's metrics.json (the record as committed: a runs table's `metrics_json`
    is the same data) is read once."""
    path = Path(source_path)
    if not path.is_file():
        return set()
    df = pd.read_csv(path)
    texts: dict[str, str | None] = {}

    def text_now(run: str) -> str | None:
        if run not in texts:
            file = Path(run) / "metrics.json"
            texts[run] = file.read_text() if file.is_file() else None
        return texts[run]

    out = set()
    if {"run", "metric", "committed"} <= set(df.columns):
        rows = df[(df["metric"] == RECORD) & df["committed"].notna()]
        for run, then in zip(rows["run"].astype(str), rows["committed"].astype(str), strict=True):
            if text_now(run) is None or record_digest(text_now(run)) != then:
                out.add(run)
    elif {"run", "metric", "value_a", "value_b"} <= set(df.columns):
        for r in df.itertuples():
            run = str(r.run)
            if text_now(run) is None:
                out.add(run)
                continue
            metrics = json.loads(text_now(run)).get("metrics")
            now = metrics.get(r.metric) if isinstance(metrics, dict) else None
            if isinstance(now, (int, float)) and not isinstance(now, bool) and not (
                    _same_number(now, r.value_a) or _same_number(now, r.value_b)):
                out.add(run)
    return out


def stale_drift_rows(verdicts: pd.DataFrame, current: pd.DataFrame) -> pd.DataFrame:
    """The rows of a drift measurement whose committed side is no longer the current evidence. Such a row says
    nothing about today's verdict. Stale when:
    - its verdict or value differs from verify's row today (the claim's metric or runs changed since, e.g. a raised
      evidence version); or
    - a run the claim reads today (its evidence's `sources`) had another record when the comparison was made
      (`changed_runs`). Why: a claim with parts and no single value reads 'no value' on both sides, and a claim
      behind a failed gate keeps its verdict, so a rerun study (study A's round 5) left their old drift rows looking
      current ("value identical") although every run behind them had changed."""
    now = current.set_index("id")
    changed = {p: changed_runs(p) for p in verdicts.get("source_path", pd.Series(dtype=str)).dropna().unique()}

    def reads_changed_run(r) -> bool:
        sources = str(now.loc[r["id"], "sources"] or "").split() if "sources" in now.columns else []
        return bool(changed.get(r.get("source_path"), set()) & set(sources))

    stale = [i for i, r in verdicts.iterrows() if r["id"] in now.index and (
        str(r["committed"]) != str(now.loc[r["id"], "verdict"])
        or str(r["committed_value"]) != value_text(now.loc[r["id"]])
        or reads_changed_run(r))]
    return verdicts.loc[stale]


def drift_flags(verdicts: pd.DataFrame) -> dict[str, str]:
    """claim id -> 'fragile: flips within hardware drift: A -> B (values ...)' or 'unchanged under ...', for every
    claim some measurement recomputed; a claim none recomputed is absent (not measured, never "stable")."""
    out = {}
    for cid, rows in verdicts.groupby("id", sort=False):
        if "sampled_runs" in rows and pd.to_numeric(rows["sampled_runs"], errors="coerce").fillna(0).eq(0).all():
            out[cid] = (f"{NOT_SAMPLED}: none of the runs it reads was rerun ("
                        + ", ".join(sorted({str(r.source) for r in rows.itertuples()})) + ")")
            continue
        flips = rows[~rows["unchanged"].astype(bool)]
        if len(flips):
            out[cid] = FRAGILE + ": " + "; ".join(
                f"{r.committed} -> {r.rerun} ({r.committed_value} -> {r.rerun_value}, {r.values}, {r.source})"
                for r in flips.itertuples())
        else:
            moved = rows[rows["committed_value"].astype(str) != rows["rerun_value"].astype(str)]
            # an unchanged verdict whose value did not move says little: the claim may read no sampled run
            identical = ("value identical (no sampled run feeds it, or the rerun was bit for bit)"
                         if "sampled_runs" not in rows else
                         f"value identical ({int(pd.to_numeric(rows['sampled_runs']).max())} of its runs rerun)")
            how = (f"{VALUE_MOVED}: " + "; ".join(f"{r.committed_value} -> {r.rerun_value} ({r.values})"
                                               for r in moved.itertuples())) if len(moved) else identical
            out[cid] = ("unchanged under " + ", ".join(sorted({f"{r.values} ({r.source})" for r in rows.itertuples()}))
                        + "; " + how)
    return out


def drift_note(df: pd.DataFrame, flags: dict[str, str], scale: str) -> str:
    if not flags:
        return (f"Hardware drift: no verdict has been recomputed under measured hardware drift yet (results/{scale}/"
                "reference/verdicts_*.csv, written by `gradfidelity check-reference --measure-drift` where the runs "
                "tables can rebuild their run records), so this report cannot say which verdicts survive another "
                "CPU's rounding; the metrics' own drift is in results/" + scale + "/reference/drift_*.csv.")
    fragile = [cid for cid in df["id"] if flags.get(cid, "").startswith(FRAGILE)]
    unsampled = [cid for cid in df["id"] if flags.get(cid, "").startswith(NOT_SAMPLED)]
    stale = [cid for cid in df["id"] if flags.get(cid, "").startswith(STALE)]
    moved = [cid for cid in df["id"] if f"; {VALUE_MOVED}: " in flags.get(cid, "")]
    return (f"Hardware drift: {len(flags)} claims recomputed with the sampled runs' values rerun at another ISA "
            f"level; {len(fragile)} {FRAGILE}" + (f" ({', '.join(fragile)})" if fragile else "")
            + f"; {len(moved)} unchanged with a value that moved" + (f" ({', '.join(moved)})" if moved else "")
            + f"; {len(unsampled)} {NOT_SAMPLED}" + (f" ({', '.join(unsampled)})" if unsampled else "")
            + (f"; {len(stale)} {STALE} ({', '.join(stale)}: rerun check-reference)" if stale else "")
            + f"; the other {len(flags) - len(fragile) - len(moved) - len(unsampled) - len(stale)} read a sampled "
            "run that "
            f"repeated bit for bit or did not move their value; "
            f"{len(df) - len(flags)} not recomputed (column 'under hardware drift': empty).")


def write_claims_report(evidence_paths, csv_path, md_path, scale: str, drift_verdicts=(),
                        power_csv=None) -> pd.DataFrame:
    """claims.csv and claims.md. `power_csv`: the power table (paper_tables/<scale>/power.csv), whose N a claim
    below it names in its reason or detail; None: no power reading."""
    power = read_power_csv(power_csv) if power_csv else None
    df = verify(load_registry(), load_evidence(evidence_paths, scale), scale, power=power)
    measured = read_drift_verdicts([Path(p) for p in drift_verdicts])
    unknown = sorted(set(measured["id"]) - set(df["id"]))
    if unknown:
        raise UserError(f"drift verdicts name claims the registry does not have: {unknown}")
    stale = stale_drift_rows(measured, df)
    flags = drift_flags(measured.drop(stale.index))
    for cid, rows in stale.groupby("id", sort=False):
        if cid not in flags:  # every measurement of it predates today's evidence
            flags[cid] = (f"{STALE}: " + "; ".join(f"{r.committed}, {r.committed_value} ({r.source})"
                                                   for r in rows.itertuples()) + " then")
    df["hardware_drift"] = [flags.get(cid, "") for cid in df["id"]]
    shown = pd.DataFrame({
        "id": df["id"], "claim": df["statement"], "paper": df["paper_value"], "check": df["check"],
        # a parts claim's numbers are its parts' (verify.parts_text), shown whatever its gates say
        "estimate": [p if isinstance(p, str) and p else _num(e) for e, p in zip(df["estimate"], df["parts"],
                                                                                   strict=True)],
        "interval": df.apply(interval_text, axis=1),
        "n / min_n": [f"{'' if pd.isna(n) else int(n)} / {m}" for n, m in zip(df["n"], df["min_n"], strict=True)],
        "gates": df["gates"], "hosts": df["hosts"], "verdict": df["verdict"], "why this verdict": df["reason"],
        "detail": df["detail"],
    })
    if flags:
        shown.insert(shown.columns.get_loc("why this verdict"), "under hardware drift", df["hardware_drift"])
    diverged = df[df["diverged"] > 0]
    notes = [
        f"Scale: {scale}. {counts_line(df)}.",
        "Verdicts are computed by `gradfidelity verify` from the studies' evidence files (estimate, interval, n, "
        "gates) and the checks in src/gradfidelity/claims/registry.yaml, fixed before any result was seen; none is "
        "written by hand. `gradfidelity claim ID` shows one claim with everything behind it.",
        "reproduced: the whole interval satisfies the check; not reproduced: the whole interval contradicts it; "
        "inconclusive: the interval spans the threshold (or an end of a band); not measured: outside the claim's "
        "scales, n < min_n, a failed gate or no value (the reason is shown). A claim that does not reproduce is a "
        "result.",
        "n = the independent units behind the estimate (paired seeds; rows of a deterministic probe for exact "
        "values). Intervals are two-sided t intervals over paired seeds at the registry's level.",
        "hosts: the host types (CPU vendor/family/model/stepping, torch kernels, flags) of the runs a claim reads, as "
        "its study recorded them (empty where it recorded none); a claim whose runs come from more than one says so "
        "in its detail.",
    ]
    if power is not None:
        notes.append(f"'n = k of the N its power needs': N from the power table (paper_tables/{scale}/power.md), the "
                     "n at which the verdict is decided with 80% probability at the measured effect; in the reason "
                     "while the verdict is open, in the detail once decided.")
    notes.append(drift_note(df, flags, scale))
    if len(diverged):
        notes.append("Diverged runs left out of a pairing: " + ", ".join(
            f"{r.id} ({int(r.diverged)})" for r in diverged.itertuples()) + ".")
    else:
        notes.append("No claim lost a seed to a diverged run.")
    atomic_write_csv(df, csv_path)  # every column, the long metric text and sources included
    body = ["# Claims: estimate, interval, n and verdict", "", *[f"- {n}" for n in notes], "", markdown(shown)]
    atomic_write_text(md_path, "\n".join(body) + "\n")
    return df
