"""The claims report: for every registry row, the estimate, its interval, n against min_n, the gates and the verdict
computed from them (claims/verify.py)."""

from __future__ import annotations

import math

import pandas as pd

from gradfidelity.claims.registry import load_registry
from gradfidelity.claims.verdict import ARITHMETIC_BAD, ARITHMETIC_OK, MEASURED_VERDICTS
from gradfidelity.claims.verify import load_evidence, verify
from gradfidelity.harness.io import atomic_write_csv, atomic_write_text
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


def counts_line(df: pd.DataFrame) -> str:
    counts = df["verdict"].value_counts()
    measured = df[df["evidence"] == "measured"]
    parts = [f"{counts.get(v, 0)} {v}" for v in MEASURED_VERDICTS]
    arith = [f"{counts.get(v, 0)} {v}" for v in (ARITHMETIC_OK, ARITHMETIC_BAD) if counts.get(v, 0)]
    return (f"{', '.join(parts)} (of {len(measured)} measured claims)"
            + (f"; {', '.join(arith)} (recomputations of the papers' own numbers, not reproductions)" if arith else ""))


def write_claims_report(evidence_paths, csv_path, md_path, scale: str) -> pd.DataFrame:
    df = verify(load_registry(), load_evidence(evidence_paths, scale), scale)
    shown = pd.DataFrame({
        "id": df["id"], "claim": df["statement"], "paper": df["paper_value"], "check": df["check"],
        "estimate": df["estimate"].map(_num), "interval": df.apply(interval_text, axis=1),
        "n / min_n": [f"{'' if pd.isna(n) else int(n)} / {m}" for n, m in zip(df["n"], df["min_n"], strict=True)],
        "gates": df["gates"], "verdict": df["verdict"], "why this verdict": df["reason"], "detail": df["detail"],
    })
    diverged = df[df["diverged"] > 0]
    notes = [
        f"Scale: {scale}. {counts_line(df)}.",
        "Verdicts are computed by `gradfidelity verify` from the studies' evidence files (estimate, interval, n, "
        "gates) and the checks in src/gradfidelity/claims/registry.yaml, fixed before any result was seen; none is "
        "written by hand. `gradfidelity claim ID` shows one claim with everything behind it.",
        "reproduced: the whole interval satisfies the check; not reproduced: the whole interval contradicts it; "
        "inconclusive: the interval spans the threshold; not measured: outside the claim's scales, n < min_n, a "
        "failed gate or no value (the reason is shown). A claim that does not reproduce is a result.",
        "n = the independent units behind the estimate (paired seeds; rows of a deterministic probe for exact "
        "values). Intervals are two-sided t intervals over paired seeds at the registry's level.",
    ]
    if len(diverged):
        notes.append("Diverged runs left out of a pairing: " + ", ".join(
            f"{r.id} ({int(r.diverged)})" for r in diverged.itertuples()) + ".")
    else:
        notes.append("No claim lost a seed to a diverged run.")
    atomic_write_csv(df, csv_path)  # every column, the long metric text and sources included
    body = ["# Claims: estimate, interval, n and verdict", "", *[f"- {n}" for n in notes], "", markdown(shown)]
    atomic_write_text(md_path, "\n".join(body) + "\n")
    return df
