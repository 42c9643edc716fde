"""Run many DeepSpeed probe cases in one set of rank processes, surviving cases that crash or hang.

Why: importing DeepSpeed costs seconds and a probe step a fraction of one, so the fault matrix runs every case of
one (DeepSpeed version, rank count) group in the same `world` processes (gloo over localhost). A case that raises
on every rank is recorded and the ranks go on; a case that kills a rank, raises on one rank only or hangs a
collective leaves the process group unusable, so the driver kills the ranks, records that case as an error with
the text it found, and restarts the group after it. Every case therefore ends up as a row, never silently missing.

Protocol: each rank appends JSON events to `<events>.rank<r>.jsonl`: {"i", "event": "start"|"done"|"error", ...}.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path

from gradfidelity.harness.extensions import use_deepspeed_extensions_dir
from gradfidelity.studies.ds_audit.case import SECONDS_PER_BACKWARD, DSCase, case_from_json
from gradfidelity.studies.ds_audit.versions import (
    env_for,
    installed_version_noimport,
    shm_op_cached,
)

GLOO_TIMEOUT_S = 60


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _emit(fh, **event) -> None:
    fh.write(json.dumps(event) + "\n")
    fh.flush()


def _short(exc: BaseException) -> str:
    """One line: exception type and message, plus the innermost DeepSpeed/torch frame."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if "site-packages" in f.filename or "venv" in f.filename]
    where = f" [{Path(frames[-1].filename).name}:{frames[-1].lineno} in {frames[-1].name}]" if frames else ""
    msg = " ".join(str(exc).split())[:300]
    return f"{type(exc).__name__}: {msg}{where}"


def rank_main(jobs_path: str, events_prefix: str, start: int) -> int:
    """Entry point of one rank process (RANK/WORLD_SIZE/MASTER_* come from the environment)."""
    use_deepspeed_extensions_dir()
    import deepspeed
    import torch.distributed as dist

    from gradfidelity.studies.ds_audit.ds_step import run_case

    raw = json.loads(Path(jobs_path).read_text())
    cases = [case_from_json(c, f"cases[{i}]") for i, c in enumerate(raw)]
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, timeout=timedelta(seconds=GLOO_TIMEOUT_S))
    with open(f"{events_prefix}.rank{rank}.jsonl", "a") as fh:
        for i in range(start, len(cases)):
            _emit(fh, i=i, event="start")
            t0 = time.perf_counter()
            try:
                res = run_case(cases[i])
                ok = True
                _emit(fh, i=i, event="done", result=res.to_dict(), seconds=time.perf_counter() - t0)
            except Exception as exc:  # the error text becomes the row's content
                ok = False
                _emit(fh, i=i, event="error", error=_short(exc), seconds=time.perf_counter() - t0)
            if world > 1:
                states = [None] * world
                dist.all_gather_object(states, (i, ok))
                if any(s != (i, ok) for s in states):
                    return 3  # ranks disagree: the group is no longer trustworthy; the driver restarts it
    return 0


def read_events(prefix: Path, world: int) -> list[list[dict]]:
    out = []
    for r in range(world):
        p = Path(f"{prefix}.rank{r}.jsonl")
        # A rank may be in the middle of writing a long line (a large result is written in several chunks):
        # only lines that end with a newline are complete events; the rest is read on the next poll.
        text = p.read_text() if p.is_file() else ""
        complete = text.split("\n")[:-1]
        out.append([json.loads(x) for x in complete if x.strip()])
    return out


def case_state(events: list[list[dict]], i: int) -> dict:
    """Merge the ranks' events for case i: rank 0's result; an error on any rank makes the case an error."""
    errors = [e["error"] for evs in events for e in evs if e["i"] == i and e["event"] == "error"]
    done = [e for e in events[0] if e["i"] == i and e["event"] == "done"]
    if errors:
        return {"status": "error", "error": errors[0]}
    if done and all(any(e["i"] == i and e["event"] == "done" for e in evs) for evs in events):
        return {"status": "ok", "result": done[-1]["result"], "seconds": done[-1]["seconds"]}
    return {}


def run_group(
    cases: list[DSCase],
    world: int,
    version: str | None,
    workdir: Path,
    case_timeout_s: float = 120.0,
    log=sys.stderr,
    on_case: Callable[[int, dict], None] | None = None,
) -> list[dict]:
    """Run every case under DeepSpeed `version` (None: installed) with `world` ranks; one dict per case, in order.

    `on_case(i, state)` is called once per case as soon as its result (or error) is known: the audit's progress
    line. Whatever ends this call (an error, SIGTERM turned into an exception by the caller), no rank process
    outlives it. Each rank's stderr goes to a file in `workdir`, not a pipe: a pipe nobody reads fills up and
    blocks a chatty rank."""
    workdir.mkdir(parents=True, exist_ok=True)
    jobs = workdir / "jobs.json"
    jobs.write_text(json.dumps([asdict(c) for c in cases]))
    prefix = workdir / "events"
    for r in range(world):
        Path(f"{prefix}.rank{r}.jsonl").unlink(missing_ok=True)
    env_base = env_for(version)
    child_version = version or installed_version_noimport()
    if not shm_op_cached(child_version):
        warmup(version)
    states: dict[int, dict] = {}
    reported: set[int] = set()

    def report(i: int, st: dict) -> None:
        if i not in reported:
            reported.add(i)
            if on_case is not None:
                on_case(i, st)

    start = 0
    procs: list[subprocess.Popen] = []
    try:
        while start < len(cases):
            port = _free_port()
            procs = []
            for r in range(world):
                env = dict(env_base, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world),
                           MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
                cmd = [sys.executable, "-W", "ignore", "-m", "gradfidelity.studies.ds_audit.worker", str(jobs),
                       str(prefix), str(start)]
                with open(workdir / f"rank{r}.stderr", "w") as err:
                    procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err))
            last_progress, seen = time.monotonic(), -1
            while True:
                time.sleep(0.2)
                events = read_events(prefix, world)
                for i in range(start, len(cases)):
                    st = case_state(events, i)
                    if not st:
                        break
                    report(i, st)
                n_events = sum(len(e) for e in events)
                if n_events != seen:
                    seen, last_progress = n_events, time.monotonic()
                codes = [p.poll() for p in procs]
                if all(c is not None for c in codes):
                    break
                # before the first event the ranks are importing DeepSpeed (slow on a loaded machine): allow more;
                # a case reports only at its start and end, so a long one (a large GA) is given 10x its estimate
                running = next((i for i in range(start, len(cases)) if i not in reported), len(cases) - 1)
                limit = case_timeout_s + 10 * SECONDS_PER_BACKWARD * cases[running].backward_total
                limit = limit if n_events > 0 else max(limit, 300.0)
                if any(c not in (None, 0) for c in codes) or time.monotonic() - last_progress > limit:
                    time.sleep(1.0)  # let the other ranks write their error event
                    break
            _stop(procs)
            stderr_tails = [_stderr_tail(workdir / f"rank{r}.stderr") for r in range(world)]
            events = read_events(prefix, world)
            nxt = start
            while nxt < len(cases):
                st = case_state(events, nxt)
                if not st:
                    break
                states[nxt] = st
                nxt += 1
            if nxt < len(cases):
                if nxt in states:
                    nxt += 1
                else:
                    started = any(e["i"] == nxt and e["event"] == "start" for evs in events for e in evs)
                    codes = [p.returncode for p in procs]
                    hung = all(c in (None, -9) for c in codes)
                    why = f"hung (no progress in {case_timeout_s:.0f} s)" if hung else f"rank exit codes {codes}"
                    tail = next((t for t in stderr_tails if t), "")
                    msg = f"{why}; {tail}" if started else f"ranks failed before this case ({why}; {tail})"
                    states[nxt] = {"status": "error", "error": msg}
                    nxt += 1
            for i in range(start, nxt):
                report(i, states[i])
            print(f"[ds_audit] {version or 'installed'} world={world}: {len(states)}/{len(cases)} cases", file=log)
            start = nxt
    finally:
        _stop(procs)
    return [states[i] for i in range(len(cases))]


def _stop(procs: list[subprocess.Popen]) -> None:
    """Kill the rank processes still running and reap them all (no zombie, no orphan)."""
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def _stderr_tail(path: Path) -> str:
    text = path.read_text(errors="replace") if path.is_file() else ""
    lines = [ln for ln in text.splitlines() if ln.strip() and "WARNING" not in ln and "INFO" not in ln]
    return lines[-1][:300] if lines else ""


def warmup_main(all_ops: bool = False) -> int:
    """Build (or load from the cache) DeepSpeed's CPU shared-memory comm op in ONE process, with no time limit;
    with `all_ops` also DeepSpeedCPUAdam (what a Trainer with optimizer offload builds: `make setup` prebuilds both
    for each pinned version, so neither the first audit nor the guard pays minutes of compilation).

    Why: `init_distributed` JIT-builds the comm op on first use; two ranks building at once, or a rank killed
    mid-build by the driver's hang detector, would leave a stale lock that blocks every later process."""
    path = use_deepspeed_extensions_dir()
    import deepspeed
    from deepspeed.comm.torch import build_shm_op

    build_shm_op()
    built = ["shm comm op"]
    if all_ops:
        from deepspeed.accelerator import get_accelerator

        get_accelerator().create_op_builder("CPUAdamBuilder").load()
        built.append("cpu_adam")
    print(f"DeepSpeed {deepspeed.__version__}: {', '.join(built)} ready under {path}")
    return 0


def warmup(version: str | None) -> None:
    """Run `warmup_main` in a child with DeepSpeed `version`; raise with its stderr tail if it fails."""
    proc = subprocess.run([sys.executable, "-W", "ignore", "-m", "gradfidelity.studies.ds_audit.worker", "--warmup"],
                          env=env_for(version), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"DeepSpeed {version or 'installed'} warm-up failed: {proc.stderr.strip()[-500:]}")


if __name__ == "__main__":
    if sys.argv[1:] in (["--warmup"], ["--prebuild"]):
        sys.exit(warmup_main(all_ops=sys.argv[1] == "--prebuild"))
    sys.exit(rank_main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
