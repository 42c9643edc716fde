"""The run harness: kill-and-resume gives identical metrics, NaN -> diverged, atomic writes, provenance."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from gradfidelity.harness import Run, load_runs
from gradfidelity.harness.io import atomic_write_json
from gradfidelity.harness.memory import PeakPSS, tree_pss_bytes

FIXTURE = Path(__file__).with_name("_train_fixture.py")


def _run(out, steps, *extra, wait=True):
    cmd = [sys.executable, str(FIXTURE), str(out), str(steps), *extra]
    if wait:
        subprocess.run(cmd, check=True, timeout=300)
        return None
    return subprocess.Popen(cmd)


def _metrics(out):
    return json.loads((Path(out) / "metrics.json").read_text())


def test_sigkill_then_rerun_gives_identical_metrics(tmp_path):
    steps = 40
    _run(tmp_path / "straight", steps)
    proc = _run(tmp_path / "killed", steps, "--sleep", "0.05", wait=False)
    ckpt = tmp_path / "killed" / "checkpoint.pt"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # wait until at least one checkpoint past step 8 exists
        if ckpt.exists() and torch.load(ckpt, weights_only=True)["step"] >= 8:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "killed" / "metrics.json").exists(), "a killed run must not leave a result"
    killed_at = torch.load(ckpt, weights_only=True)["step"]
    assert 8 <= killed_at < steps
    _run(tmp_path / "killed", steps)  # the rerun resumes from the checkpoint
    a, b = _metrics(tmp_path / "straight"), _metrics(tmp_path / "killed")
    assert a["status"] == b["status"] == "ok"
    assert a["metrics"] == b["metrics"]  # bit-identical, timing fields aside
    prov = json.loads((tmp_path / "killed" / "provenance.json").read_text())
    assert prov["resumed_from_step"] == killed_at
    assert not ckpt.exists(), "a finished run drops its checkpoint"


def test_resume_without_rng_restore_would_differ(tmp_path):
    """Guard against a vacuous resume test: a fresh run with a different seed gives different metrics."""
    _run(tmp_path / "a", 12)
    out = tmp_path / "b"
    with Run(out, study="fixture", config={}, seed=4, threads=1) as run:
        run.finish({"x": float(torch.randn(()))})
    with Run(tmp_path / "c", study="fixture", config={}, seed=3, threads=1) as run:
        run.finish({"x": float(torch.randn(()))})
    assert _metrics(out)["metrics"] != _metrics(tmp_path / "c")["metrics"]


def test_nan_loss_marks_run_diverged(tmp_path):
    _run(tmp_path / "nan", 20, "--nan-at", "7")
    m = _metrics(tmp_path / "nan")
    assert m["status"] == "diverged"
    assert m["metrics"]["diverged_at_step"] == 7
    assert "final_loss" not in m["metrics"]
    df = load_runs([tmp_path / "nan" / "metrics.json"])
    assert df.loc[0, "status"] == "diverged"


def test_nan_metric_at_finish_is_not_written_as_a_number(tmp_path):
    with Run(tmp_path, study="t", config={}, seed=0, threads=1) as run:
        run.finish({"val_loss": float("inf")})
    assert _metrics(tmp_path)["status"] == "diverged"


def test_other_exceptions_propagate_and_leave_no_metrics(tmp_path):
    with pytest.raises(RuntimeError):
        with Run(tmp_path, study="t", config={}, seed=0, threads=1):
            raise RuntimeError("boom")
    assert not (tmp_path / "metrics.json").exists()
    assert (tmp_path / "provenance.json").exists()


def test_provenance_records_what_the_issue_lists(tmp_path):
    with Run(tmp_path, study="t", config={"a": 1}, seed=5, threads=1) as run:
        run.finish({"x": 1.0})
    prov = json.loads((tmp_path / "provenance.json").read_text())
    for key in ("git_sha", "git_dirty", "packages", "machine", "threads", "config_hash", "seed", "started",
                "ended", "wall_s", "memory"):
        assert key in prov, key
    assert prov["packages"]["torch"].startswith("2.13")
    assert prov["threads"]["torch_num_threads"] == 1
    assert prov["memory"]["peak_tree_pss_bytes"] > 0


def test_atomic_write_leaves_old_file_when_writer_fails(tmp_path):
    path = tmp_path / "x.json"
    atomic_write_json(path, {"v": 1})
    with pytest.raises(TypeError):
        atomic_write_json(path, {"v": object()})
    assert json.loads(path.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"], "no temp file left behind"


def test_tree_pss_counts_children(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; x = bytearray(200 * 2**20); time.sleep(30)"])
    try:
        time.sleep(1.5)
        with PeakPSS(interval=0.02) as mem:
            time.sleep(0.1)
        own = tree_pss_bytes(child.pid)
        assert own > 150 * 2**20
        assert mem.peak_bytes >= own
    finally:
        child.kill()
        child.wait()
    assert os.getpid()
