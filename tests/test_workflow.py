"""The Snakemake workflow: config validation before any job, lint, dry runs at every scale, and one end-to-end
smoke run in a temporary copy of the repository."""

import json
import shutil
import subprocess
import sys
import time

import pandas as pd
import pytest

from gradfidelity.claims.verify import (
    ARITHMETIC_OK,
    INCONCLUSIVE,
    NOT_MEASURED,
    NOT_REPRODUCED,
    REPRODUCED,
    VERDICTS,
)
from tests._repo_copy import COPY_IGNORE
from tests._snakemake import REPO, home_only_env
from tests._snakemake import smk as _smk


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


@pytest.mark.slow
@pytest.mark.parametrize("scale", ["smoke", "cpu", "paper"])
def test_dry_run_lists_jobs(scale):
    res = _smk("-n", "--forceall", "--config", f"scale={scale}")  # every job, whatever is built already
    assert res.returncode == 0, res.stderr[-3000:]
    assert "verify" in res.stdout and "stats_check" in res.stdout


def test_lint_is_clean():
    res = _smk("--lint")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]


@pytest.mark.slow
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
    """The whole smoke DAG in a copy of the repository, as a fresh clone would run it: claims report with measured
    verdicts, outputs per scale and world-readable, the HTML report opening on the claims figure, no-op rerun."""
    work = tmp_path / "repo"
    shutil.copytree(REPO, work, ignore=COPY_IGNORE)
    overlay = f"deepspeed_buggy_overlay={REPO / '.venv-ds0189'}"
    home = tmp_path / "home"  # every job of the DAG runs with an empty home, which must stay empty
    home.mkdir()
    res = _smk("-c2", "--config", overlay, cwd=work, timeout=45 * 60, env=home_only_env(home))
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-6000:]
    claims = pd.read_csv(work / "paper_tables" / "smoke" / "claims.csv").set_index("id")
    assert set(claims["verdict"]) <= set(VERDICTS)
    assert (claims["scale"] == "smoke").all()
    # the exact probes of study A are measured at smoke and agree with the paper's description of the bug
    assert claims.loc[["A1", "A2", "A1-7981"], "verdict"].eq(REPRODUCED).all(), claims.loc[["A1", "A2"]].T
    assert claims.loc["C5", "verdict"] == ARITHMETIC_OK
    decided = claims[claims["verdict"].isin([REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE])]
    assert (decided["n"] >= decided["min_n"]).all(), "a claim with n < min_n got a verdict"
    small = claims[(claims["n"] < claims["min_n"]) & (claims["evidence"] == "measured")]
    assert len(small) and small["verdict"].eq(NOT_MEASURED).all()
    for path in (work / "results" / "smoke").rglob("metrics.json"):
        assert json.loads(path.read_text()).get("scale") == "smoke", path
    for path in [*(work / "paper_tables" / "smoke").iterdir(), *(work / "figures" / "smoke").iterdir()]:
        assert path.stat().st_mode & 0o044 == 0o044, f"{path} is not group/world-readable"
    runs = pd.read_csv(work / "results" / "smoke" / "runs" / "local.csv")
    assert {"run_id", "seed", "status", "git_sha", "cpu_model", "torch_num_threads", "wall_s"} <= set(runs.columns)
    assert not (work / "paper_tables" / "cpu").exists(), "a smoke run must not write another scale's outputs"
    assert (work / "figures" / "smoke" / "claims.png").stat().st_size > 10_000
    res = _smk("-c2", "--config", overlay, "--report", "results/smoke/report.html", cwd=work, timeout=600,
               env=home_only_env(home))
    assert res.returncode == 0, res.stderr[-3000:]
    html = (work / "results" / "smoke" / "report.html").read_text()
    landing = html.index("every paper claim at scale smoke")
    first_image = html.index("data:image/png;base64")
    assert landing < first_image < landing + 5000, "the report opens on the summary with the claims figure"
    start = time.monotonic()
    res = _smk("-c2", "--config", overlay, cwd=work, timeout=120, env=home_only_env(home))
    assert res.returncode == 0
    assert "Nothing to be done" in res.stdout + res.stderr
    print(f"no-op rerun: {time.monotonic() - start:.1f} s")
    assert not list(home.rglob("*")), f"written to the home directory: {list(home.rglob('*'))[:5]}"
