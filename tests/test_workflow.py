"""The Snakemake workflow: config validation before any job, lint, dry runs at every scale, and one end-to-end
smoke run in a temporary copy of the repository."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
_IGNORE = shutil.ignore_patterns(".venv", ".venv-ds0189", ".cache", ".snakemake", "results", ".git", "__pycache__",
                                 ".pytest_cache", ".ruff_cache")


def COPY_IGNORE(directory, names):
    """What a fresh clone would not have: environments, caches, results and built tables/figures."""
    ignored = set(_IGNORE(directory, names))
    if Path(directory).name in ("paper_tables", "figures"):
        ignored |= {n for n in names if n != "README.md"}
    return ignored


def _smk(*args, cwd=REPO, timeout=300):
    return subprocess.run([*SNAKEMAKE, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def test_unknown_scale_fails_before_any_job_naming_the_key():
    res = _smk("-n", "--config", "scale=bogus")
    assert res.returncode != 0
    out = res.stdout + res.stderr
    assert "'scale'" in out and "smoke, cpu, paper" in out
    assert "Job stats" not in out


def test_wrong_type_fails_naming_the_key():
    res = _smk("-n", "--config", "threads=many")
    assert res.returncode != 0
    assert "'threads'" in res.stdout + res.stderr


@pytest.mark.parametrize("scale", ["smoke", "cpu", "paper"])
def test_dry_run_lists_jobs(scale):
    res = _smk("-n", "--forceall", "--config", f"scale={scale}")  # every job, whatever is built already
    assert res.returncode == 0, res.stderr[-3000:]
    assert "verify" in res.stdout and "stats_check" in res.stdout


def test_lint_is_clean():
    res = _smk("--lint")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]


def test_cli_missing_input_exits_2_naming_the_path(tmp_path):
    res = subprocess.run([sys.executable, "-m", "gradfidelity", "verify", "--evidence", str(tmp_path / "no.json"),
                          "--csv", str(tmp_path / "c.csv"), "--md", str(tmp_path / "c.md"), "--scale", "smoke"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert str(tmp_path / "no.json") in res.stderr
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "c.csv").exists(), "nothing half-written"


@pytest.mark.e2e
@pytest.mark.slow
def test_smoke_dag_end_to_end(tmp_path):
    """The whole smoke DAG in a copy of the repository: claims report produced, no-op rerun is fast."""
    work = tmp_path / "repo"
    shutil.copytree(REPO, work, ignore=COPY_IGNORE)
    overlay = f"deepspeed_buggy_overlay={REPO / '.venv-ds0189'}"
    res = _smk("-c2", "--config", overlay, cwd=work, timeout=45 * 60)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-6000:]
    claims = pd.read_csv(work / "paper_tables" / "claims.csv")
    assert set(claims["verdict"]) <= {"reproduced", "not reproduced", "not measured at this scale"}
    assert (claims["scale"] == "smoke").all()
    assert "C5" in set(claims.loc[claims["verdict"] == "reproduced", "id"])
    start = time.monotonic()
    res = _smk("-c2", "--config", overlay, cwd=work, timeout=120)
    assert res.returncode == 0
    assert "Nothing to be done" in res.stdout + res.stderr
    print(f"no-op rerun: {time.monotonic() - start:.1f} s")
    assert os.path.exists(work / "paper_tables" / "claims.md")
