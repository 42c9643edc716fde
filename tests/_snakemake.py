"""Running Snakemake from a test (shared by the workflow and config tests; a helper module, not a test module)."""

import os
import subprocess
import sys
from pathlib import Path

from gradfidelity.checkout_env import CACHES

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
CACHE_VARIABLES = (*CACHES, "HF_HUB_OFFLINE")


def smk(*args, cwd=REPO, timeout=300, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([*SNAKEMAKE, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def home_only_env(home: Path) -> dict:
    """This process's environment with HOME at `home` and none of the cache variables that the Makefile, common.smk
    and conftest set: whatever keeps the caches in the checkout must then come from the venv itself."""
    env = {k: v for k, v in os.environ.items() if k not in CACHE_VARIABLES}
    env["HOME"] = str(home)
    return env
