"""The landing page of the HTML report (Snakemake's global `report:` description, reStructuredText): scale, machine,
git sha, counts per verdict, the claims figure, and a link per study to its tables and figures."""

from __future__ import annotations

import base64
import textwrap
from pathlib import Path

import pandas as pd

from gradfidelity.claims.report import counts_line
from gradfidelity.harness.io import atomic_write_text
from gradfidelity.harness.provenance import UNKNOWN_ISA
from gradfidelity.studies import STUDIES


def _distinct(frames: list[pd.DataFrame], column: str, unknown: str = "unknown") -> str:
    """Every value of `column` over the tables; `unknown` for a table (or rows) without it."""
    values = {str(v) for df in frames if column in df for v in df[column].dropna().unique()}
    if any(column not in df or df[column].isna().any() for df in frames):
        values.add(unknown)
    return ", ".join(sorted(values)) if values else unknown


def write_summary(claims_csv, figure_png, runs_csvs, out_rst, scale: str) -> None:
    claims = pd.read_csv(claims_csv)
    runs = [pd.read_csv(p) for p in runs_csvs]
    dirty = any(bool(v) for df in runs if "git_dirty" in df for v in df["git_dirty"].dropna())
    png = base64.b64encode(Path(figure_png).read_bytes()).decode("ascii")
    title = f"gradfidelity: every paper claim at scale {scale}"
    lines = [
        title, "=" * len(title), "",
        f"**Scale** {scale}. **Runs** {sum(len(df) for df in runs)} "
        f"({sum(int((df['status'] == 'diverged').sum()) for df in runs if 'status' in df)} diverged). "
        f"**Git sha** {_distinct(runs, 'git_sha')}{' (with uncommitted changes)' if dirty else ''}. "
        f"**Machine** {_distinct(runs, 'cpu_model')} (torch kernels: "
        f"{_distinct(runs, 'cpu_capability', UNKNOWN_ISA)}), {_distinct(runs, 'cpu_count')} cores.",
        "",
        f"**Verdicts** {counts_line(claims)}.",
        "",
        "Each claim's estimate and interval against its threshold (right of the line = the claim's side), coloured "
        "by verdict, with n / min_n. The table with every reason: Claims_.",
        "",
        # docutils joins a URI split over lines and drops the whitespace; one line would exceed its length limit
        ".. image:: data:image/png;base64,", *textwrap.wrap(png, 100, initial_indent="   ", subsequent_indent="   "),
        "   :alt: claims figure",
        "",
        "Tables and figures per study: " + ", ".join(f"{s}_" for s in STUDIES) + ", stats_ (C5). "
        "One claim with everything behind it: ``.venv/bin/gradfidelity claim ID --scale " + scale + "``.",
        "",
    ]
    atomic_write_text(out_rst, "\n".join(lines))
