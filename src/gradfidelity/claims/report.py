"""The claims report: paper value, measured value and computed verdict for every registry row."""

from __future__ import annotations

from gradfidelity.claims.verify import NOT_MEASURED, NOT_REPRODUCED, REPRODUCED, load_evidence, load_registry, verify
from gradfidelity.harness.io import atomic_write_csv, atomic_write_text
from gradfidelity.tables import markdown


def _fmt(value) -> str:
    if value is None or (isinstance(value, float) and value != value):  # None, or NaN from pandas' float column
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def write_claims_report(evidence_paths, csv_path, md_path, scale: str) -> None:
    registry = load_registry()
    df = verify(registry, load_evidence(evidence_paths, scale), scale)
    counts = df["verdict"].value_counts()
    shown = df.assign(measured=df["measured"].map(_fmt))[
        ["id", "statement", "paper_value", "check", "measured", "n", "verdict", "detail", "scale"]]
    notes = [
        f"Scale: {scale}. {counts.get(REPRODUCED, 0)} reproduced, {counts.get(NOT_REPRODUCED, 0)} not reproduced, "
        f"{counts.get(NOT_MEASURED, 0)} not measured at this scale (of {len(df)}).",
        "Verdicts are computed by `gradfidelity verify` from results/claims/<study>.json and the thresholds in "
        "src/gradfidelity/claims/registry.yaml (fixed before any result was seen); none is written by hand.",
        "A claim that does not reproduce at a small scale is a result, not a failure of the artifact.",
        "n = the seeds (or paired seeds) behind the measured value; at the smoke scale most values rest on one or "
        "two seeds and test the pipeline, not the paper.",
    ]
    atomic_write_csv(df, csv_path)  # every column; the Markdown view leaves out the long metric text
    body = ["# Claims: paper value, measured value, verdict", "", *[f"- {n}" for n in notes], "",
            markdown(shown)]
    atomic_write_text(md_path, "\n".join(body) + "\n")
