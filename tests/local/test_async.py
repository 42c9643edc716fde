"""The async runtime: same numbers as its serial twin, and clean shutdown when a stage raises or is killed
(the whole run stops, a clear error names the stage, no orphan process, no shared-memory segment left)."""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
import torch

from gradfidelity.studies.local.async_runtime import SHM_PREFIX, StageFailure, train_async
from gradfidelity.studies.local.data import batch_offsets, embedded_enwik8
from gradfidelity.studies.local.methods import flat, train_serial
from gradfidelity.studies.local.model import build_model
from tests.local._config import train

T = train(n_layer=4, n_head=2, block_size=16, batch_size=2, steps=6, warmup=2, n_stages=2, readout_lag=2,
          threads_per_stage=1, bp_threads=1, eval_batches=1, loss_every=1)
DATA = torch.frombuffer(bytearray(embedded_enwik8(20_000)), dtype=torch.uint8)


def _stage_children() -> list:
    """Live children of this process, except multiprocessing's resource tracker (a long-lived helper that
    unlinks leaked segments if this process dies) and its forkserver (the clean interpreter the stages fork from;
    it exits with this process): neither is a stage."""
    out = []
    for c in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(c.cmdline())
            if "resource_tracker" not in cmd and "forkserver" not in cmd and c.status() != psutil.STATUS_ZOMBIE:
                out.append(c)
        except psutil.NoSuchProcess:
            pass
    return out


def _segments() -> set[str]:
    return {p.name for p in Path("/dev/shm").iterdir() if p.name.startswith(SHM_PREFIX)}


class _NoRun:
    """The bits of harness.Run that train_serial uses, without a run directory."""

    def resume(self, state):
        return 0, {}

    def progress(self, it, **kw):
        return it

    def check_finite(self, value, step, what="loss"):
        assert torch.isfinite(torch.as_tensor(value))

    def maybe_checkpoint(self, *a, **k):
        pass


def _run_bounded(fn, limit_s: float = 60.0):
    """Run fn in a thread; a hang (a shutdown that never completes) fails the test instead of stalling it."""
    box = {}

    def target():
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: BLE001
            box["error"] = e

    th = threading.Thread(target=target, daemon=True)
    th.start()
    th.join(limit_s)
    assert not th.is_alive(), f"async run did not stop within {limit_s} s"
    return box


@pytest.mark.slow
@pytest.mark.parametrize("method,stages", [("broadcast_async", 2), ("rgc_async", 2), ("rgc_async", 3)])
def test_async_matches_serial_twin(method, stages):
    """Step-indexed snapshots make the pipeline deterministic: the same weights as the serial method (with 3
    stages the RGC gradient sum passes through a middle stage)."""
    torch.set_num_threads(1)
    t = replace(T, n_stages=stages, n_layer=2 * stages)
    offsets = batch_offsets(len(DATA), t.block_size, t.batch_size, t.steps, seed=0)
    serial = build_model(t.model(16), seed=0)
    s_res = train_serial(method.replace("_async", "_serial"), serial, t, DATA, offsets, _NoRun())
    asyn = build_model(t.model(16), seed=0)
    before = flat(asyn.parameters()).clone()
    a_res = train_async(method, asyn, t, DATA, offsets)
    assert not torch.equal(before, flat(asyn.parameters()))  # trained in place, visible to the parent
    torch.testing.assert_close(flat(asyn.parameters()), flat(serial.parameters()), rtol=1e-5, atol=1e-6)
    assert [s for s, _ in a_res["losses"]] == [s for s, _ in s_res["losses"]]
    assert a_res["stage_threads"] == [1] * stages
    assert not _stage_children()


def _assert_clean(before: set[str]) -> None:
    assert not _stage_children(), "orphan stage process"
    assert _segments() - before == set(), "leaked shared-memory segment"


def test_exception_in_a_stage_stops_the_run():
    before = _segments()
    offsets = batch_offsets(len(DATA), T.block_size, T.batch_size, 200, seed=0)
    t = replace(T, steps=200, n_layer=6, n_stages=3)
    box = _run_bounded(lambda: train_async("rgc_async", build_model(t.model(16), 0), t, DATA, offsets,
                                           fault={"stage": 1, "step": 3}))
    assert isinstance(box.get("error"), StageFailure)
    assert "stage 1" in str(box["error"]) and "injected fault" in str(box["error"])
    _assert_clean(before)


def test_killed_stage_stops_the_run():
    before = _segments()
    t = replace(T, steps=100_000)  # far longer than the test: only the kill ends it
    offsets = batch_offsets(len(DATA), t.block_size, t.batch_size, t.steps, seed=0)
    pids = []

    def kill_last_stage(procs):
        pids.extend(p.pid for p in procs)
        threading.Timer(0.5, os.kill, (procs[-1].pid, signal.SIGKILL)).start()

    box = _run_bounded(lambda: train_async("broadcast_async", build_model(t.model(16), 0), t, DATA, offsets,
                                           on_start=kill_last_stage))
    assert isinstance(box.get("error"), StageFailure)
    assert "stage 1" in str(box["error"]) and "SIGKILL" in str(box["error"])
    assert pids and not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                            for p in pids)
    _assert_clean(before)


def test_two_threads_per_stage_finish_and_match_the_serial_twin():
    """Round 1 hung here: stages forked after the parent had used its OpenMP pool (this test runs a 2-thread
    kernel in the parent first) deadlocked on their first parallel kernel. Fresh stages honour the thread count."""
    torch.set_num_threads(2)
    torch.randn(256, 256) @ torch.randn(256, 256)  # the parent's OpenMP pool is now live
    t = replace(T, threads_per_stage=2)
    offsets = batch_offsets(len(DATA), t.block_size, t.batch_size, t.steps, seed=0)
    serial = build_model(t.model(16), seed=0)
    train_serial("broadcast_serial", serial, t, DATA, offsets, _NoRun())
    before = _segments()
    asyn = build_model(t.model(16), seed=0)
    box = _run_bounded(lambda: train_async("broadcast_async", asyn, t, DATA, offsets), limit_s=120)
    assert "error" not in box, box.get("error")
    assert box["result"]["stage_threads"] == [2, 2]
    torch.testing.assert_close(flat(asyn.parameters()), flat(serial.parameters()), rtol=1e-4, atol=1e-5)
    _assert_clean(before)
    torch.set_num_threads(1)


@pytest.mark.slow
def test_stalled_stage_ends_with_a_clear_error():
    """A stage that hangs (and ignores the abort flag) is found by the supervisor's step counter, killed, and the
    run ends with an error naming it and the timeout key; nothing is left behind."""
    before = _segments()
    t = replace(T, steps=50, stall_timeout_s=2.0)
    offsets = batch_offsets(len(DATA), t.block_size, t.batch_size, t.steps, seed=0)
    pids = []
    box = _run_bounded(lambda: train_async("broadcast_async", build_model(t.model(16), 0), t, DATA, offsets,
                                           fault={"stage": 1, "step": 3, "stall": True},
                                           on_start=lambda procs: pids.extend(p.pid for p in procs)),
                       limit_s=90)
    err = box.get("error")
    assert isinstance(err, StageFailure), err
    assert "stalled" in str(err) and "stage 1" in str(err) and "stall_timeout_s" in str(err)
    assert pids and not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                            for p in pids)
    _assert_clean(before)
