"""Paper tables: every table is written twice, as CSV (for machines) and Markdown (for readers), atomically."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from gradfidelity.harness.io import atomic_write_csv, atomic_write_text


def markdown(df: pd.DataFrame, floatfmt: str = ".4g") -> str:
    return df.to_markdown(index=False, floatfmt=floatfmt)


def write_table(df: pd.DataFrame, csv_path: str | os.PathLike, md_path: str | os.PathLike | None = None, *,
                title: str, notes: list[str] | None = None, floatfmt: str = ".4g") -> None:
    """Write `df` to csv_path and, with a title and notes, to md_path (default: same stem, .md)."""
    csv_path = Path(csv_path)
    md_path = Path(md_path) if md_path else csv_path.with_suffix(".md")
    atomic_write_csv(df, csv_path)
    parts = [f"# {title}", "", markdown(df, floatfmt=floatfmt)]
    if notes:
        parts += [""] + [f"- {n}" for n in notes]
    atomic_write_text(md_path, "\n".join(parts) + "\n")
