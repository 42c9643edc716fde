"""Provenance of one run: what code, which packages, which machine, which settings.

Written next to metrics.json so a number can always be traced to the exact software and hardware that made it.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

PACKAGES = (
    "torch", "deepspeed", "trl", "transformers", "accelerate", "datasets", "numpy", "scipy", "statsmodels",
    "pandas", "matplotlib", "psutil", "pytorch-optimizer", "snakemake", "gradfidelity",
)


def config_hash(config: dict) -> str:
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def git_state(cwd: str | os.PathLike | None = None) -> dict:
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
                             check=True, timeout=10).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                                capture_output=True, text=True, check=True, timeout=10).stdout
        # Which tracked files differ from HEAD, so a reader can tell an edit of the run's own code from an
        # unrelated one (a dirty flag alone cannot).
        changed = sorted(line[3:] for line in status.splitlines() if line.strip())
        return {"git_sha": sha, "git_dirty": bool(changed), "git_dirty_files": changed}
    except (OSError, subprocess.SubprocessError):
        return {"git_sha": "unknown", "git_dirty": None, "git_dirty_files": None}


def package_versions() -> dict:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    # importlib.metadata searches sys.path in order, so the deepspeed 0.18.9 overlay (first on PYTHONPATH) is
    # what it reports; where deepspeed is already imported, its own __version__ is the final word.
    loaded = sys.modules.get("deepspeed")
    if loaded is not None:
        versions["deepspeed"] = loaded.__version__
        versions["deepspeed_path"] = str(Path(loaded.__file__).parent)
    return versions


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict:
    return {
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "hostname": platform.node(),
    }
