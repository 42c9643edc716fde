"""The asynchronous local-training pipeline: one OS process per stage, shared-memory rings between them.

Why it looks like this:
- Processes, not threads: each stage runs its own forward/backward/optimizer with its own intra-op thread pool
  (`threads_per_stage`), as in the paper; Python threads would serialise on the GIL between kernels.
- Nothing model-sized is copied: the parent builds the model once (same seed = same initial weights as BP),
  moves its parameters into shared memory and forks; each stage process trains *its own slice* of those shared
  tensors in place (no other process writes them) and keeps its optimizer state and gradients private. After the
  run the parent holds the trained model and evaluates it. Peak process-tree PSS therefore counts the weights
  once; the extra memory of the async run is per-process interpreter state, per-stage optimizer state and the rings.
- Activations move through one ring per stage boundary (`multiprocessing.shared_memory`, `ring_slots` slots of
  B*T*D floats + one readout-gradient accumulator) guarded by a free/full semaphore pair. For RGC the readout
  gradients ride with the activations: stage s adds dL_s/dR_snap to the sum it received from stage s-1, and the
  last stage averages the sum with its own live readout gradient (order of summation fixed -> deterministic).
- Readout snapshots: the last stage publishes its readout every `snapshot_every` updates into a versioned ring
  (seqlock: version -1 while writing); stage s at step t reads version v(t) (methods.snapshot_version), waiting
  if it is not there yet. A step-indexed version makes the run deterministic, whatever the timing.
- Clean shutdown: the parent supervises. A stage that raises reports its traceback and exits 1; a stage that is
  killed shows a negative exit code. Either way the parent sets the shared abort flag (every blocking wait polls
  it, and each worker also dies with its parent via PR_SET_PDEATHSIG), gives the others a short grace period,
  terminates/kills what is left, unlinks every shared-memory segment, and raises StageFailure naming the stage.
- Timers per stage (busy = compute, waits for input / free slot / snapshot, copies) give the speed-up
  decomposition: busy time, load imbalance (max vs mean busy) and orchestration overhead (wall - max busy).
- Checkpoints: an async run is not resumable mid-way (its timing would be meaningless); a killed run restarts.
"""

from __future__ import annotations

import ctypes
import gc
import math
import multiprocessing as mp
import os
import signal
import time
import traceback
import uuid
from dataclasses import dataclass, field
from multiprocessing import shared_memory

import torch

from gradfidelity.errors import UserError
from gradfidelity.harness.run import Diverged
from gradfidelity.studies.local.data import get_batch
from gradfidelity.studies.local.methods import (
    KIND,
    Optimizers,
    flat,
    flat_grad,
    load_flat,
    lr_at,
    make_head,
    set_flat_grad,
    snapshot_version,
    stage_forward_backward,
)
from gradfidelity.studies.local.model import ByteTransformer, partition
from gradfidelity.studies.local.settings import TrainConfig

SHM_PREFIX = "gf_local_"
POLL_S = 0.05
GRACE_S = 3.0


class StageFailure(RuntimeError):
    """An async stage raised or died; the whole run was stopped."""


class _Aborted(Exception):
    pass


# ----------------------------------------------------------------------------------------------- shared memory
class _Segments:
    """Owns every shared-memory segment of one run (created in the parent, unlinked by the parent)."""

    def __init__(self):
        self.tag = f"{SHM_PREFIX}{os.getpid()}_{uuid.uuid4().hex[:8]}_"
        self.segs: list[shared_memory.SharedMemory] = []

    def tensor(self, name: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        nbytes = max(1, numel * torch.empty((), dtype=dtype).element_size())
        seg = shared_memory.SharedMemory(name=self.tag + name, create=True, size=nbytes)
        self.segs.append(seg)
        return torch.frombuffer(seg.buf, dtype=dtype, count=numel)

    def release(self) -> None:
        for seg in self.segs:
            try:
                seg.close()
            except BufferError:  # a tensor view is still alive; unlinking is what frees /dev/shm
                pass
            try:
                seg.unlink()
            except FileNotFoundError:
                pass
        self.segs.clear()


@dataclass
class _Control:
    abort: object  # mp.Event
    parent: int

    def check(self) -> None:
        if self.abort.is_set() or os.getppid() != self.parent:
            raise _Aborted

    def acquire(self, sem) -> None:
        while not sem.acquire(timeout=POLL_S):
            self.check()


class _Ring:
    """slots x [activation (B*T*D) | readout-gradient sum (R)] float32, with free/full semaphores."""

    def __init__(self, ctx, segs: _Segments, name: str, slots: int, act_numel: int, grad_numel: int):
        self.slots, self.A, self.R = slots, act_numel, grad_numel
        self.buf = segs.tensor(name, slots * (act_numel + grad_numel), torch.float32).view(slots, -1)
        self.free, self.full = ctx.Semaphore(slots), ctx.Semaphore(0)


class _Snapshots:
    """Versioned readout snapshots: seqlock per slot (version -1 while the last stage writes it)."""

    def __init__(self, segs: _Segments, slots: int, numel: int, every: int):
        self.slots, self.every = slots, every
        self.data = segs.tensor("snap", slots * numel, torch.float32).view(slots, numel)
        self.version = segs.tensor("snapver", slots, torch.int64)
        self.version.fill_(-1)

    def _slot(self, version: int) -> int:
        return (version // self.every) % self.slots

    def publish(self, version: int, vec: torch.Tensor) -> None:
        i = self._slot(version)
        self.version[i] = -1
        self.data[i].copy_(vec)
        self.version[i] = version

    def read(self, version: int, out: torch.Tensor, ctl: _Control) -> None:
        i = self._slot(version)
        while int(self.version[i]) != version:
            ctl.check()
            time.sleep(0.0005)
        out.copy_(self.data[i])
        if int(self.version[i]) != version:  # overwritten while copying: the slot count is too small (a bug)
            raise RuntimeError(f"readout snapshot {version} was overwritten while being read")


@dataclass
class _Job:
    kind: str
    t: TrainConfig
    model: ByteTransformer
    stages: list
    train: torch.Tensor
    offsets: torch.Tensor
    rings: list[_Ring]
    snaps: _Snapshots
    ctl: _Control
    ready: object
    go: object
    results: object
    fault: dict = field(default_factory=dict)  # test hook: {"stage": s, "step": k} raises there


def _lean_before_fork() -> None:
    """Keep the children from duplicating the parent's memory. Freed-but-resident heap pages of earlier work
    would be reused by a child's malloc and copied on write (measured: +0.19 GiB PSS with 2 stages after one BP
    run in the same process), so return them to the OS first (malloc_trim); gc.freeze() keeps the children's
    garbage collector from writing to every inherited object (Python's fork advice)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    gc.freeze()


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


# ----------------------------------------------------------------------------------------------- stage process
def _stage_worker(s: int, job: _Job) -> None:
    code = 0
    try:
        _die_with_parent()
        job.ctl.check()
        torch.set_num_threads(job.t.threads_per_stage)
        code = _stage_loop(s, job)
    except _Aborted:
        code = 3
    except BaseException:  # noqa: BLE001 - everything goes back to the parent
        job.results.put(("error", s, traceback.format_exc()))
        code = 1
    os._exit(code)  # no atexit handlers or inherited buffers of the parent


def _stage_loop(s: int, job: _Job) -> int:
    t, ctl, kind = job.t, job.ctl, job.kind
    S, B, T, D = t.n_stages, t.batch_size, t.block_size, job.model.cfg.d_model
    last = s == S - 1
    stage, readout = job.stages[s], job.model.readout
    params = list(stage.parameters()) + (list(readout.parameters()) if last else [])
    opt = Optimizers([params], t)
    head = None if last else make_head(readout, kind)
    R = sum(p.numel() for p in readout.parameters())
    head_vec = torch.empty(R)
    inp_buf = torch.empty(B, T, D) if s > 0 else None
    recv_grad = torch.zeros(R)
    timers = {"busy_s": 0.0, "wait_input_s": 0.0, "wait_slot_s": 0.0, "wait_snapshot_s": 0.0, "copy_s": 0.0}
    losses: list[list[float]] = []
    job.ready.release()
    while not job.go.wait(POLL_S):
        ctl.check()
    t_start = time.perf_counter()
    for step in range(t.steps):
        if job.fault.get("stage") == s and job.fault.get("step") == step:
            raise RuntimeError(f"injected fault in stage {s} at step {step}")
        x, y = get_batch(job.train, job.offsets[step], T)
        if s == 0:
            inp = x
        else:
            ring = job.rings[s - 1]
            w0 = time.perf_counter()
            ctl.acquire(ring.full)
            w1 = time.perf_counter()
            slot = ring.buf[step % ring.slots]
            inp_buf.view(-1).copy_(slot[: ring.A])
            if kind == "rgc":
                recv_grad.copy_(slot[ring.A:])
            ring.free.release()
            w2 = time.perf_counter()
            timers["wait_input_s"] += w1 - w0
            timers["copy_s"] += w2 - w1
            inp = inp_buf
        if not last:
            w0 = time.perf_counter()
            job.snaps.read(snapshot_version(step, t.readout_lag, t.snapshot_every), head_vec, ctl)
            load_flat(head, head_vec)
            timers["wait_snapshot_s"] += time.perf_counter() - w0
        b0 = time.perf_counter()
        opt.zero_grad()
        if head is not None:
            head.zero_grad(set_to_none=True)
        h, loss = stage_forward_backward(stage, readout if last else head, inp, y)
        if not math.isfinite(float(loss)):
            job.results.put(("diverged", s, (step, float(loss))))
            return 0
        if kind == "rgc":
            if last:  # same summation order as methods.local_backward
                set_flat_grad(readout, (recv_grad + flat_grad(readout)) / S if S > 1 else flat_grad(readout))
            else:
                acc = flat_grad(head).clone() if s == 0 else recv_grad + flat_grad(head)
        opt.clip_and_step(lr_at(step, t))
        timers["busy_s"] += time.perf_counter() - b0
        if not last:
            ring = job.rings[s]
            w0 = time.perf_counter()
            ctl.acquire(ring.free)
            w1 = time.perf_counter()
            slot = ring.buf[step % ring.slots]
            slot[: ring.A].copy_(h.reshape(-1))
            if kind == "rgc":
                slot[ring.A:].copy_(acc)
            ring.full.release()
            timers["wait_slot_s"] += w1 - w0
            timers["copy_s"] += time.perf_counter() - w1
        else:
            if (step + 1) % t.snapshot_every == 0:
                job.snaps.publish(step + 1, flat(readout.parameters()))
            if step % t.loss_every == 0 or step == t.steps - 1:
                losses.append([step, float(loss)])
    t_end = time.perf_counter()
    job.results.put(("ok", s, {**timers, "t_start": t_start, "t_end": t_end, "losses": losses,
                               "threads": torch.get_num_threads()}))
    return 0


# ----------------------------------------------------------------------------------------------- parent
def _shutdown(procs: list, abort) -> None:
    abort.set()
    deadline = time.monotonic() + GRACE_S
    for p in procs:
        if p.pid is not None:
            p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.pid is not None and p.is_alive():
            p.terminate()
            p.join(1.0)
        if p.pid is not None and p.is_alive():
            p.kill()
            p.join(1.0)


def _describe(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        return f"was killed by signal {signal.Signals(-code).name}"
    return f"exited with code {code}"


def _supervise(procs: list, job: _Job, on_start=None) -> tuple[float, dict]:
    """Wait for all stages; on the first failure stop everything and raise. Returns (t_go, per-stage results)."""
    S = len(procs)
    results: dict[int, dict] = {}
    ready = 0
    t_go = None

    def drain() -> None:
        while not job.results.empty():
            status, s, payload = job.results.get()
            if status == "ok":
                results[s] = payload
            elif status == "diverged":
                raise Diverged(payload[0], payload[1], what=f"stage {s} local loss")
            else:
                raise StageFailure(f"async stage {s} (pid {procs[s].pid}) raised; whole run stopped:\n{payload}")

    while True:
        drain()
        if t_go is None:
            while ready < S and job.ready.acquire(timeout=0.0):
                ready += 1
            if ready == S:
                t_go = time.perf_counter()
                if on_start:
                    on_start(procs)
                job.go.set()
        codes = [p.exitcode for p in procs]
        bad = [(s, c) for s, c in enumerate(codes) if c not in (None, 0)]
        if bad:
            time.sleep(POLL_S)  # a raising stage writes its traceback before exiting: collect it
            drain()
            s, c = bad[0]
            raise StageFailure(f"async stage {s} (pid {procs[s].pid}) {_describe(c)}; whole run stopped")
        if all(c == 0 for c in codes):
            drain()
            missing = sorted(set(range(S)) - set(results))
            if missing:
                raise StageFailure(f"async stages {missing} exited without reporting results")
            return t_go, results
        time.sleep(POLL_S)


def train_async(method: str, model: ByteTransformer, t: TrainConfig, train: torch.Tensor,
                offsets: torch.Tensor, fault: dict | None = None, on_start=None) -> dict:
    """Run async Broadcast or RGC; the model's parameters are trained in place. Returns metrics + timing."""
    kind = KIND[method]
    if kind not in ("broadcast", "rgc"):
        raise UserError(f"method {method!r} has no async variant")
    S = t.n_stages
    if S < 2 or t.readout_lag < 1:
        raise UserError("async local training needs local.train.n_stages >= 2 and local.train.readout_lag >= 1")
    stages = partition(model, S)
    model.share_memory()
    ctx = mp.get_context("fork")
    segs = _Segments()
    procs: list = []
    abort = ctx.Event()
    try:
        R = sum(p.numel() for p in model.readout.parameters())
        act = t.batch_size * t.block_size * model.cfg.d_model
        rings = [_Ring(ctx, segs, f"ring{b}", t.ring_slots, act, R if kind == "rgc" else 0) for b in range(S - 1)]
        snaps = _Snapshots(segs, t.readout_lag // t.snapshot_every + 3, R, t.snapshot_every)
        snaps.publish(0, flat(model.readout.parameters()))
        job = _Job(kind, t, model, stages, train, offsets, rings, snaps, _Control(abort, os.getpid()),
                   ctx.Semaphore(0), ctx.Event(), ctx.SimpleQueue(), fault or {})
        procs = [ctx.Process(target=_stage_worker, args=(s, job), name=f"gf-local-stage{s}", daemon=True)
                 for s in range(S)]
        _lean_before_fork()
        for p in procs:
            p.start()
        t_go, res = _supervise(procs, job, on_start)
    finally:
        gc.unfreeze()
        _shutdown(procs, abort)
        job = rings = snaps = None  # drop the tensor views before closing the segments
        segs.release()
    wall = max(r["t_end"] for r in res.values()) - t_go
    busy = [res[s]["busy_s"] for s in range(S)]
    return {
        "losses": res[S - 1]["losses"], "train_s": wall, "steps_timed": t.steps,
        "stage_busy_s": busy,
        "stage_wait_input_s": [res[s]["wait_input_s"] for s in range(S)],
        "stage_wait_slot_s": [res[s]["wait_slot_s"] for s in range(S)],
        "stage_wait_snapshot_s": [res[s]["wait_snapshot_s"] for s in range(S)],
        "stage_copy_s": [res[s]["copy_s"] for s in range(S)],
        "stage_threads": [res[s]["threads"] for s in range(S)],
        "worker_pids": [p.pid for p in procs],
    }
