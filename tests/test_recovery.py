"""Recovery after `kill -9` of the snakemake process group mid-DAG, on a two-job slice (two study-B training runs):
`make run` again (what `make reproduce` runs) removes the stale lock, reruns the incomplete jobs, resumes training
from the checkpoints, and every metrics block equals the one of an uninterrupted run."""

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests._repo_copy import COPY_IGNORE, REPO

# Two of study B's learning-rate grid runs: they need nothing upstream and checkpoint every 5 steps here.
_GRID = "results/smoke/async_pp/optimizer~muon/lr~x{m}/head~untied/schedule~sync/mitigation~none/depth~1/" \
        "momentum~0.95/steps~60/seed100/metrics.json"
SLICE = " ".join(_GRID.format(m=m) for m in ("0.5", "1"))
CKPT_CONFIG = "async_pp:\n  train:\n    checkpoint_every: 5\n"


def _copy(tmp_path: Path, name: str) -> Path:
    work = tmp_path / name
    shutil.copytree(REPO, work, ignore=COPY_IGNORE)
    (work / "ckpt.yaml").write_text(CKPT_CONFIG)
    return work


def _make_run(work: Path, **popen) -> list[str]:
    venv = REPO / ".venv"
    return ["make", "--no-print-directory", f"VENV={venv}", "run", f"TARGETS={SLICE}",
            "CONFIG=--configfile ckpt.yaml", "CORES=2"]


def _metrics(work: Path) -> dict[str, dict]:
    root = work / "results" / "smoke" / "async_pp"
    return {str(p.relative_to(root)): json.loads(p.read_text())["metrics"] for p in root.rglob("metrics.json")}


@pytest.mark.slow
def test_kill_9_mid_dag_then_make_run_resumes_to_the_same_metrics(tmp_path):
    ref = _copy(tmp_path, "ref")
    res = subprocess.run(_make_run(ref), cwd=ref, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    expected = _metrics(ref)
    assert len(expected) >= 2

    work = _copy(tmp_path, "killed")
    proc = subprocess.Popen(_make_run(work), cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    results = work / "results" / "smoke" / "async_pp"
    deadline = time.monotonic() + 600
    while not list(results.rglob("checkpoint.pt")):  # training has started and written a checkpoint
        assert proc.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert list((work / ".snakemake" / "locks").glob("*")), "a kill -9 leaves snakemake's lock behind"
    assert len(_metrics(work)) < len(expected), "killed before the slice finished"

    res = subprocess.run(_make_run(work), cwd=work, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "removed a stale lock" in res.stdout
    assert _metrics(work) == expected
    resumed = [json.loads(p.read_text()).get("resumed_from_step") for p in results.rglob("provenance.json")]
    assert any(step for step in resumed), "at least one run resumed from its checkpoint"
