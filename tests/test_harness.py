"""The run harness: kill-and-resume gives identical metrics, NaN -> diverged, atomic writes, provenance."""

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
import torch
from matplotlib.figure import Figure

from gradfidelity.harness import Run, load_runs
from gradfidelity.harness import io as harness_io
from gradfidelity.harness.integrity import load_checkpoint, save_checkpoint
from gradfidelity.harness.io import atomic_write_json
from gradfidelity.harness.memory import PeakPSS, tree_pss_bytes
from gradfidelity.harness.run import SCALE_ENV

FIXTURE = Path(__file__).with_name("_train_fixture.py")
MiB = 2**20


def _run(out, steps, *extra, wait=True):
    cmd = [sys.executable, str(FIXTURE), str(out), str(steps), *extra]
    if wait:
        subprocess.run(cmd, check=True, timeout=300)
        return None
    return subprocess.Popen(cmd)


def _metrics(out):
    return json.loads((Path(out) / "metrics.json").read_text())


STEPS = 40


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """metrics.json of an uninterrupted fixture run of STEPS steps, the reference for every resume test."""
    out = tmp_path_factory.mktemp("straight")
    _run(out, STEPS)
    return _metrics(out)


@pytest.mark.slow
def test_sigkill_then_rerun_gives_identical_metrics(tmp_path, straight):
    steps = STEPS
    proc = _run(tmp_path / "killed", steps, "--sleep", "0.05", wait=False)
    ckpt = tmp_path / "killed" / "checkpoint.pt"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # wait until at least one checkpoint past step 8 exists
        if ckpt.exists() and load_checkpoint(ckpt)["step"] >= 8:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "killed" / "metrics.json").exists(), "a killed run must not leave a result"
    killed_at = load_checkpoint(ckpt)["step"]
    assert 8 <= killed_at < steps
    _run(tmp_path / "killed", steps)  # the rerun resumes from the checkpoint
    a, b = straight, _metrics(tmp_path / "killed")
    assert a["status"] == b["status"] == "ok"
    assert a["metrics"] == b["metrics"]  # bit-identical, timing fields aside
    prov = json.loads((tmp_path / "killed" / "provenance.json").read_text())
    assert prov["resumed_from_step"] == killed_at
    assert not ckpt.exists(), "a finished run drops its checkpoint"


def _die_midway(out, die_at):
    """A fixture run that SIGKILLs itself after step `die_at`; returns the step of the checkpoint it left."""
    proc = subprocess.run([sys.executable, str(FIXTURE), str(out), str(STEPS), "--die-at", str(die_at)], timeout=300)
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "metrics.json").exists()
    return load_checkpoint(out / "checkpoint.pt")["step"]


@pytest.mark.slow
def test_resume_restores_rng_and_a_resume_without_it_differs(tmp_path, straight):
    """The guard that keeps the resume test from being vacuous: both reruns really resume from a mid-run checkpoint;
    the one that restores the RNG states matches the uninterrupted run, the one that skips them does not."""
    killed_at = _die_midway(tmp_path / "good", die_at=14)
    assert killed_at == 12  # checkpoints every 4 steps; steps 13 and 14 were lost and must be redone
    shutil.copytree(tmp_path / "good", tmp_path / "broken")

    _run(tmp_path / "good", STEPS)
    _run(tmp_path / "broken", STEPS, "--no-rng-restore")
    for name in ("good", "broken"):
        prov = json.loads((tmp_path / name / "provenance.json").read_text())
        assert prov["resumed_from_step"] == killed_at, name
        assert len(_metrics(tmp_path / name)["metrics"]["history"]) == STEPS, name
    assert _metrics(tmp_path / "good")["metrics"] == straight["metrics"]
    broken = _metrics(tmp_path / "broken")["metrics"]
    assert broken["history"][:killed_at] == straight["metrics"]["history"][:killed_at]  # from the checkpoint
    assert broken["history"][killed_at:] != straight["metrics"]["history"][killed_at:]
    assert broken["weight_sum"] != straight["metrics"]["weight_sum"]


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
    assert prov["packages"]["torch"] == torch.__version__
    assert prov["threads"]["torch_num_threads"] == 1
    assert prov["memory"]["peak_tree_pss_bytes"] > 0


def _records(out):
    return _metrics(out), json.loads((Path(out) / "provenance.json").read_text())


def test_scale_recorded_from_argument_or_environment(tmp_path, monkeypatch):
    monkeypatch.delenv(SCALE_ENV, raising=False)
    with Run(tmp_path / "arg", study="t", config={}, seed=0, threads=1, scale="smoke") as run:
        run.finish({"x": 1.0})
    monkeypatch.setenv(SCALE_ENV, "full")
    with Run(tmp_path / "env", study="t", config={}, seed=0, threads=1) as run:
        run.finish({"x": 1.0})
    with Run(tmp_path / "both", study="t", config={}, seed=0, threads=1, scale="smoke") as run:
        run.finish({"x": 1.0})
    with Run(tmp_path / "diverged", study="t", config={}, seed=0, threads=1) as run:
        run.finish({"x": float("nan")})
    for name, want in {"arg": "smoke", "env": "full", "both": "smoke", "diverged": "full"}.items():
        metrics, prov = _records(tmp_path / name)
        assert metrics["scale"] == want, name
        assert prov["scale"] == want, name
    assert _metrics(tmp_path / "diverged")["status"] == "diverged"


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o027, 0o640)])
def test_atomic_writers_give_the_mode_a_plain_open_would(tmp_path, umask, mode):
    fig = Figure()
    fig.add_subplot().plot([0, 1])
    writers = {
        "a.txt": lambda p: harness_io.atomic_write_text(p, "x"),
        "a.json": lambda p: harness_io.atomic_write_json(p, {"v": 1}),
        "a.pt": lambda p: save_checkpoint(p, {"w": torch.zeros(2)}),
        "a.png": lambda p: harness_io.atomic_savefig(fig, p),
        "a.csv": lambda p: harness_io.atomic_write_csv(pd.DataFrame({"a": [1]}), p),
    }
    old = os.umask(umask)
    try:
        assert harness_io.current_umask() == umask
        with open(tmp_path / "plain", "w"):
            pass
        for name, write in writers.items():
            write(tmp_path / name)
            write(tmp_path / name)  # overwriting an existing output gives the same mode
        assert os.umask(umask) == umask, "reading the umask must not change it"
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "plain").stat().st_mode) == mode  # the reference: what open() does
    for name in writers:
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == mode, name


def test_umask_fallback_without_proc(monkeypatch):
    def no_proc(*args, **kwargs):
        raise FileNotFoundError("/proc/self/status")

    monkeypatch.setattr(harness_io, "open", no_proc, raising=False)
    old = os.umask(0o027)
    try:
        assert harness_io.current_umask() == 0o027
        assert os.umask(0o027) == 0o027, "the fallback restores the umask it read"
    finally:
        os.umask(old)


def test_atomic_write_leaves_old_file_when_writer_fails(tmp_path):
    path = tmp_path / "x.json"
    atomic_write_json(path, {"v": 1})
    with pytest.raises(TypeError):
        atomic_write_json(path, {"v": object()})
    assert json.loads(path.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"], "no temp file left behind"


CHILD = """
import sys, time
print("ready", flush=True)
n = int(sys.stdin.readline())
buf = bytearray(n)
for i in range(0, n, 4096):
    buf[i] = 1
print("touched", flush=True)
time.sleep(120)
"""


def _smaps_pss(pid):
    """Reference reader, independent of psutil: Pss from /proc/PID/smaps_rollup, kB -> bytes."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no Pss line")


def test_tree_pss_rises_by_what_a_child_touches():
    n = 200 * MiB
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        child_before, tree_before = tree_pss_bytes(child.pid), tree_pss_bytes()
        assert child_before > 0
        assert tree_before > _smaps_pss(os.getpid()) + child_before - 8 * MiB  # the tree counts the child
        with PeakPSS(interval=0.02) as mem:
            child.stdin.write(f"{n}\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == "touched"
            time.sleep(0.1)
        child_after, tree_after = tree_pss_bytes(child.pid), tree_pss_bytes()
        assert abs(child_after - _smaps_pss(child.pid)) < 2 * MiB  # psutil agrees with the kernel's own file
        assert 0.9 * n < child_after - child_before < 1.1 * n
        assert 0.8 * n < tree_after - tree_before < 1.25 * n  # generous: pytest itself may allocate meanwhile
        assert mem.peak_bytes >= tree_before + 0.9 * n
        assert mem.record()["peak_tree_pss_bytes"] == mem.peak_bytes
    finally:
        child.kill()
        child.wait()


def test_exited_child_counts_zero():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    proc = psutil.Process(child.pid)
    deadline = time.monotonic() + 60
    while proc.status() != psutil.STATUS_ZOMBIE:  # exited, not yet reaped
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert tree_pss_bytes(child.pid) == 0
    child.wait()  # reaped: the pid is gone
    assert tree_pss_bytes(child.pid) == 0


def test_thread_limits_reach_every_native_pool():
    import subprocess
    import sys

    code = ("import json, numpy, torch; from gradfidelity.harness.threads import configure_threads; "
            "from threadpoolctl import threadpool_info; rec = configure_threads(1); "
            "print(json.dumps([rec['torch_num_threads'], [p['num_threads'] for p in threadpool_info()], "
            "[p['num_threads'] for p in rec['pools']]]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    torch_threads, seen, recorded = json.loads(out)
    assert torch_threads == 1 and seen and set(seen) == {1} and recorded == seen


def test_git_state_names_the_modified_tracked_files(tmp_path):
    import subprocess

    from gradfidelity.harness.provenance import git_state

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "b.py").write_text("y = 1\n")
    git("add", "a.py", "b.py")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init")
    assert git_state(tmp_path)["git_dirty"] is False and git_state(tmp_path)["git_dirty_files"] == []
    (tmp_path / "b.py").write_text("y = 2\n")
    (tmp_path / "new.py").write_text("untracked\n")  # untracked files are not the run's code
    state = git_state(tmp_path)
    assert state["git_dirty"] is True and state["git_dirty_files"] == ["b.py"]
    assert state["git_dirty_outputs"] == []


def test_git_state_keeps_the_runs_own_outputs_apart_from_the_code(tmp_path):
    """A DAG rewrites tracked outputs (results/, paper_tables/, figures/) while its later runs train: they are
    listed in git_dirty_outputs and do not make git_dirty true; a changed source file does, wherever the run's
    working directory is inside the checkout."""
    import subprocess

    from gradfidelity.harness.provenance import git_state

    def git(*args):
        subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    files = {"src/pkg/train.py": "x = 1\n", "results/cpu/bench/b.json": "{}\n", "paper_tables/cpu/t.csv": "a\n",
             "figures/cpu/f.svg": "<svg/>\n", "docs/results/notes.md": "n\n", "results.md": "r\n"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "init")
    clean = git_state(tmp_path)
    assert (clean["git_dirty"], clean["git_dirty_files"], clean["git_dirty_outputs"]) == (False, [], [])

    for name in ("results/cpu/bench/b.json", "paper_tables/cpu/t.csv", "figures/cpu/f.svg"):
        (tmp_path / name).write_text("rewritten by the DAG\n")
    (tmp_path / "results/cpu/new_untracked.json").write_text("{}\n")
    outputs_only = git_state(tmp_path)
    assert outputs_only["git_dirty"] is False and outputs_only["git_dirty_files"] == []
    assert outputs_only["git_dirty_outputs"] == ["figures/cpu/f.svg", "paper_tables/cpu/t.csv",
                                                 "results/cpu/bench/b.json"]

    for name in ("src/pkg/train.py", "docs/results/notes.md", "results.md"):  # only top-level folders are outputs
        (tmp_path / name).write_text("edited\n")
    git("mv", "paper_tables/cpu/t.csv", "paper_tables/cpu/u.csv")  # a rename names its new path once
    state = git_state(tmp_path / "src" / "pkg")  # paths stay relative to the repository root
    assert state["git_dirty"] is True
    assert state["git_dirty_files"] == ["docs/results/notes.md", "results.md", "src/pkg/train.py"]
    assert state["git_dirty_outputs"] == ["figures/cpu/f.svg", "paper_tables/cpu/u.csv", "results/cpu/bench/b.json"]


def test_git_state_outside_a_repository_is_unknown(tmp_path):
    from gradfidelity.harness.provenance import git_state

    state = git_state(tmp_path)
    assert state == {"git_sha": "unknown", "git_dirty": None, "git_dirty_files": None, "git_dirty_outputs": None}


def test_run_args_parse_the_cell_and_refuse_a_bad_one(capsys):
    import argparse

    from gradfidelity.harness.cli_args import add_run_args

    parser = argparse.ArgumentParser(prog="x")
    add_run_args(parser)
    args = parser.parse_args(["--run-dir", "d", "--cell", '{"seed": "3", "width": "64"}'])
    assert (args.run_dir, args.cell) == ("d", {"seed": "3", "width": "64"})
    for bad, why in (('[1]', "must be a JSON object"), ("{seed", "not valid JSON")):
        with pytest.raises(SystemExit) as exc:
            parser.parse_args(["--run-dir", "d", "--cell", bad])
        assert exc.value.code == 2 and why in capsys.readouterr().err
