"""A copy of the repository as a fresh clone would have it (no environments, caches, results or built outputs), for
tests that run Snakemake end to end (the smoke DAG, the SLURM slice)."""

import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_IGNORE = shutil.ignore_patterns(".venv", ".venv-ds0189", ".cache", ".snakemake", "results", ".git", "__pycache__",
                                 ".pytest_cache", ".ruff_cache")


def COPY_IGNORE(directory, names):
    """What a fresh clone would not have: environments, caches, results and built tables/figures."""
    ignored = set(_IGNORE(directory, names))
    if Path(directory).name in ("paper_tables", "figures"):
        ignored |= {n for n in names if n != "README.md"}
    return ignored
