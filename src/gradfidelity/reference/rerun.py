"""How check-reference reruns its sample: in a scratch copy of the checkout, in several Snakemake calls, each of which
can end by a failure, by the budget or by Ctrl-C without losing what finished.

Why several calls: round 5 ran the whole sample in one Snakemake call under a fixed one-hour limit. On a slow host
the limit hit while study A's runs were still training, study C's had not started, and the 17 runs that had finished
were never compared (issue 58). One call per study (drift-only studies first) keeps every finished run: a call that
is stopped leaves the records of its finished runs in the scratch copy, and the check compares those.

Why the speed probe: a run's committed wall time says how long it took on the committed host, not here. The first
call of each study reruns one short run of it alone, and its own wall time (measured inside the training process,
`timing.wall_s`) over the committed one is this host's speed ratio for the study. The expected time of the rest is
the committed time of every job left, scaled by its study's ratio, over the cores, plus Snakemake's own start-up per
call (measured on the probes).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from gradfidelity.harness.results import runs_table

SCALE = "cpu"
STOP_GRACE_S = 60.0  # after SIGTERM, how long Snakemake gets to stop its jobs before the group is killed
DEFAULT_OVERHEAD_S = 10.0  # Snakemake's start-up per call until a probe has measured it
OK, FAILED, BUDGET, INTERRUPTED = "ok", "failed", "budget", "interrupted"


def metrics_path(run_id: str) -> str:
    return f"{run_id}/metrics.json"


def _is_run_record(rel: str) -> bool:
    """A committed run's record (results/cpu/<study>/.../{metrics,provenance}.json, benchmark*.tsv): left out of the
    scratch copy, so that the sample reruns instead of standing as committed. The LR selections and rounds stay."""
    parts = rel.split("/")
    return (len(parts) > 3 and parts[:2] == ["results", SCALE] and parts[2] not in ("runs", "claims", "bench",
                                                                                       "reference")
            and parts[-1] != "lr_selection.json" and "lr_rounds" not in parts)


def scratch_copy(repo: Path, work: Path) -> None:
    """The checkout's tracked files (as they are in the working tree), without results and run records, into
    `work`."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=repo, capture_output=True, check=True).stdout
    for rel in filter(None, files.decode().split("\0")):
        if _is_run_record(rel):
            continue
        src = repo / rel
        if src.is_file():
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, work / rel)
    for sub in ("results/cpu/runs", "results/cpu/claims", "results/cpu/bench"):
        shutil.rmtree(work / sub, ignore_errors=True)  # the committed outputs are what we compare against


@dataclass
class Call:
    """One Snakemake call of the rerun: its runs, how it ended, how long it took and where its log is."""
    label: str
    runs: list[str]
    status: str = OK
    elapsed_s: float = 0.0
    log: Path | None = None
    finished: list[str] = field(default_factory=list)


def _stop(proc: subprocess.Popen) -> None:
    """Stop Snakemake and its jobs (one process group): SIGTERM lets it end its jobs and unlock; SIGKILL after the
    grace or at a second Ctrl-C."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=STOP_GRACE_S)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    except ProcessLookupError:
        proc.wait()


def snakemake_call(work: Path, call: Call, cores: int, extra_config: tuple[str, ...], deadline: float | None = None,
                   env: dict | None = None) -> Call:
    """Rerun `call.runs` (and the jobs they need) in `work`, up to `deadline` (time.monotonic(); None: no limit).
    Never raises for the call's own end: `call.status` says ok, failed (Snakemake's exit code is not 0: a job
    failed), budget (the deadline came) or interrupted (Ctrl-C); `call.finished` lists the runs with a record written
    by this call. --keep-going: one failed job does not stop the others; --rerun-incomplete: a job a stopped call
    left half-written reruns."""
    logs = work / ".check-reference"
    logs.mkdir(parents=True, exist_ok=True)
    call.log = logs / f"{call.label}.log"
    cmd = [sys.executable, "-m", "snakemake", f"-c{cores}", "--keep-going", "--rerun-incomplete",
           *[metrics_path(r) for r in call.runs], "--config", f"scale={SCALE}", *extra_config]
    start, started = time.monotonic(), time.time() - 1.0  # file times come from a coarser clock
    with open(call.log, "w") as log:
        proc = subprocess.Popen(cmd, cwd=work, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env=dict(os.environ) if env is None else env)
        try:
            timeout = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            rc = proc.wait(timeout=timeout)
            call.status = OK if rc == 0 else FAILED
        except subprocess.TimeoutExpired:
            call.status = BUDGET
            _stop(proc)
        except KeyboardInterrupt:
            call.status = INTERRUPTED
            _stop(proc)
    call.elapsed_s = time.monotonic() - start
    call.finished = finished_runs(work, call.runs, started)
    return call


@contextlib.contextmanager
def sigterm_as_ctrl_c():
    """Inside: SIGTERM (a `timeout` or a scheduler ending the check) stops it like Ctrl-C, so that what finished is
    still compared and summarised. Outside a main thread (a test runner's worker) it changes nothing."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt
    try:
        before = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def finished_runs(work: Path, runs: list[str], since: float) -> list[str]:
    """The runs of `runs` whose record in `work` was written after `since` (time.time()): a record that stood would
    compare the committed run with itself."""
    out = []
    for run in runs:
        path = work / metrics_path(run)
        if path.is_file() and path.stat().st_mtime >= since:
            out.append(run)
    return out


def log_tail(call: Call, lines: int = 25) -> str:
    if call.log is None or not call.log.is_file():
        return ""
    return "\n".join(call.log.read_text(errors="replace").splitlines()[-lines:])


def rerun_rows(work: Path, runs: list[str]) -> pd.DataFrame:
    """The runs table of reruns in `work`, each row made by the same `runs_table` that made the committed rows (the
    CPU identity read in the training process), named as in the committed tables."""
    if not runs:
        return pd.DataFrame(columns=["run_id", "study", "status", "wall_s"])
    rerun = runs_table([work / metrics_path(r) for r in runs], SCALE)
    rerun["run_id"] = list(runs)  # the committed tables name runs relative to the checkout
    return rerun


# ----------------------------------------------------------------------------------------------- speed
def speed_ratio(committed_wall_s: float, rerun_wall_s: float) -> float:
    """How much slower this host ran a run than the committed host (> 1: slower)."""
    if not committed_wall_s or committed_wall_s <= 0 or not rerun_wall_s or rerun_wall_s <= 0:
        return float("nan")
    return float(rerun_wall_s) / float(committed_wall_s)


def expected_s(costs: dict[str, float], ratios: dict[str, float], cores: int, calls: int,
               overhead_s: float) -> float:
    """Expected wall time: `costs` (study -> committed seconds of the jobs left) each scaled by its study's speed
    ratio, run `cores` at a time, plus Snakemake's start-up for each of `calls` calls."""
    work = sum(cost * ratios[study] for study, cost in costs.items())
    return work / max(cores, 1) + calls * overhead_s


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"
