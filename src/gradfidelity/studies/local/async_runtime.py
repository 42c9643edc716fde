"""The asynchronous local-training pipeline: one OS process per stage, shared-memory rings between them.

Why it looks like this:
- Processes, not threads: each stage runs its own forward/backward/optimizer with its own intra-op thread pool
  (`threads_per_stage`), as in the paper; Python threads would serialise on the GIL between kernels.
- Stages start from a clean process, never a fork of the parent: the parent has usually run OpenMP kernels
  already (model init, an earlier method), and a child forked after that inherits a thread pool whose threads do
  not exist in it; with `threads_per_stage` > 1 both stages then hung forever in `gomp_team_barrier_wait_end` on
  their first parallel kernel (round 1 of this study). Stages are forked by multiprocessing's *forkserver*, a
  fresh interpreter that imported this module (and torch) but never ran a kernel, so each stage builds its own
  OpenMP pool of `threads_per_stage` threads.
- Nothing model-sized is copied: the parent builds the model once (same seed = same initial weights as BP) and
  moves its parameters into named POSIX shared memory; each stage process maps those segments (the module is
  rebuilt on the meta device and its parameters assigned the mapped views) and trains *its own slice* in place
  (no other process writes it), keeping its optimizer state and gradients private. After the run the parent holds
  the trained model, copies it out of shared memory and evaluates it. Peak process-tree PSS therefore counts the
  weights once; the extra memory of the async run is per-process interpreter state (the forkserver's included),
  per-stage optimizer state and the rings.
- Activations move through one ring per stage boundary (`multiprocessing.shared_memory`, `ring_slots` slots of
  B*T*D floats + one readout-gradient accumulator) guarded by a free/full semaphore pair. For RGC the readout
  gradients ride with the activations: stage s adds dL_s/dR_snap to the sum it received from stage s-1, and the
  last stage averages the sum with its own live readout gradient (order of summation fixed -> deterministic).
- Readout snapshots: the last stage publishes its readout every `snapshot_every` updates into a versioned ring
  (seqlock: version -1 while writing); stage s at step t reads version v(t) (methods.snapshot_version), waiting
  if it is not there yet. A step-indexed version makes the run deterministic, whatever the timing.
- Clean shutdown: the parent supervises. A stage that raises reports its traceback and exits 1; a stage that is
  killed shows a negative exit code; a stage whose step counter (shared memory) has not moved for
  `stall_timeout_s` seconds is stalled (a deadlock, a livelock). In every case the parent sets the shared abort
  flag (every blocking wait polls it; each worker also dies with the forkserver, which dies with the parent, via
  PR_SET_PDEATHSIG, and polls that the parent lives), gives the others a short grace period, terminates/kills what
  is left, unlinks every shared-memory segment, and raises StageFailure naming the stage.
- Timers per stage (busy = compute, waits for input / free slot / snapshot, copies) give the speed-up
  decomposition: busy time, load imbalance (max vs mean busy) and orchestration overhead (wall - max busy).
- Checkpoints: an async run is not resumable mid-way (its timing would be meaningless); a killed run restarts.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import multiprocessing as mp
import os
import signal
import time
import traceback
import uuid
from dataclasses import dataclass, field
from multiprocessing import shared_memory

import numpy as np
import torch

from gradfidelity.errors import UserError
from gradfidelity.harness.run import Diverged
from gradfidelity.studies.local.config import TrainConfig
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
from gradfidelity.studies.local.model import ByteTransformer, ModelConfig, partition

SHM_PREFIX = "gf_local_"
POLL_S = 0.05
GRACE_S = 3.0
READY_TIMEOUT_S = 300.0  # stage start-up (fork from the forkserver, map segments, build optimizers)


class StageFailure(RuntimeError):
    """An async stage raised, died or stalled; the whole run was stopped."""


class _Aborted(Exception):
    pass


# ----------------------------------------------------------------------------------------------- shared memory
@dataclass(frozen=True)
class _Seg:
    """A named segment as the children see it: they map /dev/shm/<name> (no resource tracker involved)."""
    name: str
    numel: int
    dtype: torch.dtype

    def attach(self) -> torch.Tensor:
        with open(f"/dev/shm/{self.name}", "r+b") as f:
            mm = mmap.mmap(f.fileno(), 0)
        return torch.frombuffer(mm, dtype=self.dtype, count=self.numel)


class _Segments:
    """Owns every shared-memory segment of one run (created in the parent, unlinked by the parent)."""

    def __init__(self):
        self.tag = f"{SHM_PREFIX}{os.getpid()}_{uuid.uuid4().hex[:8]}_"
        self.segs: list[shared_memory.SharedMemory] = []

    def tensor(self, name: str, numel: int, dtype: torch.dtype) -> tuple[torch.Tensor, _Seg]:
        nbytes = max(1, numel * torch.empty((), dtype=dtype).element_size())
        seg = shared_memory.SharedMemory(name=self.tag + name, create=True, size=nbytes)
        self.segs.append(seg)
        return torch.frombuffer(seg.buf, dtype=dtype, count=numel), _Seg(seg.name, numel, dtype)

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
    parent: int  # the training process (the stages' grandparent: the forkserver sits between)

    def check(self) -> None:
        if self.abort.is_set():
            raise _Aborted
        try:
            os.kill(self.parent, 0)
        except ProcessLookupError:
            raise _Aborted from None

    def acquire(self, sem) -> None:
        while not sem.acquire(timeout=POLL_S):
            self.check()


@dataclass
class _RingSpec:
    seg: _Seg
    slots: int
    A: int
    R: int
    free: object
    full: object


class _Ring:
    """slots x [activation (B*T*D) | readout-gradient sum (R)] float32, with free/full semaphores."""

    def __init__(self, spec: _RingSpec):
        self.slots, self.A, self.R = spec.slots, spec.A, spec.R
        self.buf = spec.seg.attach().view(spec.slots, -1)
        self.free, self.full = spec.free, spec.full


class _Snapshots:
    """Versioned readout snapshots: seqlock per slot (version -1 while the last stage writes it)."""

    def __init__(self, data: torch.Tensor, version: torch.Tensor, slots: int, every: int):
        self.slots, self.every = slots, every
        self.data, self.version = data.view(slots, -1), version

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
    """Everything a stage needs, picklable (segments by name, semaphores and queues by multiprocessing)."""
    kind: str
    t: TrainConfig
    mcfg: ModelConfig
    params: dict  # parameter name -> (_Seg, shape)
    train: _Seg
    offsets: np.ndarray  # (steps, batch) int64
    rings: list[_RingSpec]
    snap_data: _Seg
    snap_version: _Seg
    snap_slots: int
    progress: _Seg  # int64 per stage: steps finished (the supervisor's stall detector reads it)
    ctl: _Control
    ready: object
    go: object
    results: object
    # test hooks: {"stage": s, "step": k} raises there; with "stall": True the stage hangs there instead
    fault: dict = field(default_factory=dict)


def _attach_model(job: _Job) -> ByteTransformer:
    """The parent's model, rebuilt on the meta device (no allocation, no kernel) with the shared views assigned."""
    with torch.device("meta"):
        model = ByteTransformer(job.mcfg)
    state = {name: seg.attach().view(shape) for name, (seg, shape) in job.params.items()}
    model.load_state_dict(state, assign=True, strict=True)
    return model


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
        torch.set_num_threads(job.t.threads_per_stage)  # a fresh process: its own pool of this many threads
        code = _stage_loop(s, job)
    except _Aborted:
        code = 3
    except BaseException:  # noqa: BLE001 - everything goes back to the parent
        job.results.put(("error", s, traceback.format_exc()))
        code = 1
    os._exit(code)  # no atexit handlers or inherited buffers of the parent


def _stage_loop(s: int, job: _Job) -> int:
    t, ctl, kind = job.t, job.ctl, job.kind
    S, B, T, D = t.n_stages, t.batch_size, t.block_size, job.mcfg.d_model
    last = s == S - 1
    model = _attach_model(job)
    stage, readout = partition(model, S)[s], model.readout
    train, offsets = job.train.attach(), torch.from_numpy(job.offsets)
    rings = [_Ring(r) for r in job.rings]
    snaps = _Snapshots(job.snap_data.attach(), job.snap_version.attach(), job.snap_slots, t.snapshot_every)
    progress = job.progress.attach()
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
            if job.fault.get("stall"):
                while True:  # a hang that ignores the abort flag, like a stuck OpenMP barrier
                    time.sleep(1.0)
            raise RuntimeError(f"injected fault in stage {s} at step {step}")
        x, y = get_batch(train, offsets[step], T)
        if s == 0:
            inp = x
        else:
            ring = rings[s - 1]
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
            snaps.read(snapshot_version(step, t.readout_lag, t.snapshot_every), head_vec, ctl)
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
            ring = rings[s]
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
                snaps.publish(step + 1, flat(readout.parameters()))
            if step % t.loss_every == 0 or step == t.steps - 1:
                losses.append([step, float(loss)])
        progress[s] = step + 1
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


def _supervise(procs: list, job: _Job, progress: torch.Tensor, on_start=None) -> tuple[float, dict]:
    """Wait for all stages; on the first failure or stall stop everything and raise. Returns (t_go, results)."""
    S, stall_s = len(procs), float(job.t.stall_timeout_s)
    results: dict[int, dict] = {}
    ready = 0
    t_go = None
    t0 = time.monotonic()
    seen = [-1] * S
    moved = [t0] * S

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
        now = time.monotonic()
        if t_go is None:
            while ready < S and job.ready.acquire(timeout=0.0):
                ready += 1
            if ready == S:
                t_go = time.perf_counter()
                moved = [now] * S
                if on_start:
                    on_start(procs)
                job.go.set()
            elif now - t0 > max(READY_TIMEOUT_S, stall_s):
                raise StageFailure(f"only {ready} of {S} async stages started within "
                                   f"{max(READY_TIMEOUT_S, stall_s):.0f} s; whole run stopped")
        else:
            steps = [int(v) for v in progress.tolist()]
            for s in range(S):
                if steps[s] != seen[s]:
                    seen[s], moved[s] = steps[s], now
            stalled = [s for s in range(S) if steps[s] < job.t.steps and s not in results
                       and now - moved[s] > stall_s]
            if stalled:
                where = ", ".join(f"stage {s} (pid {procs[s].pid}) at step {steps[s]}" for s in stalled)
                raise StageFailure(f"async run stalled: no progress for {stall_s:g} s "
                                   f"(local.train.stall_timeout_s) in {where}; whole run stopped")
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


def _context():
    """The forkserver, preloading this module (torch included) so that each stage forks in milliseconds from an
    interpreter that never ran an OpenMP kernel."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    return ctx


def prestart() -> None:
    """Start the forkserver now (its interpreter imports torch while the caller builds the model and loads data)."""
    from multiprocessing import forkserver

    _context()
    forkserver.ensure_running()


def _idle_stage(threads: int, go) -> None:
    """A stage process with nothing built: the start-up of `_stage_worker` up to the model (`idle_tree`)."""
    _die_with_parent()
    torch.set_num_threads(threads)
    go.wait(60.0)
    os._exit(0)


def idle_tree(t: TrainConfig, hold_s: float = 1.0) -> list[int]:
    """Start the async run's process tree without a model: the forkserver and `n_stages` stage processes forked
    from it exactly as `train_async` forks them, each held for `hold_s` seconds and then stopped. The memory
    baseline of an async method (study C's C3): its tree's PSS with every interpreter present and nothing
    model-sized allocated. Returns the stages' pids."""
    ctx = _context()
    go = ctx.Event()
    procs = [ctx.Process(target=_idle_stage, args=(t.threads_per_stage, go), name=f"gf-local-idle{s}",
                         daemon=True) for s in range(t.n_stages)]
    try:
        for p in procs:
            p.start()
        time.sleep(hold_s)
    finally:
        go.set()
        for p in procs:
            p.join(5.0)
            if p.is_alive():
                p.kill()
                p.join(1.0)
    bad = [p.exitcode for p in procs if p.exitcode != 0]
    if bad:
        raise StageFailure(f"idle async stages exited with codes {bad}")
    return [p.pid for p in procs]


def train_async(method: str, model: ByteTransformer, t: TrainConfig, train: torch.Tensor,
                offsets: torch.Tensor, fault: dict | None = None, on_start=None) -> dict:
    """Run async Broadcast or RGC; the model's parameters are trained in place. Returns metrics + timing."""
    kind = KIND[method]
    if kind not in ("broadcast", "rgc"):
        raise UserError(f"method {method!r} has no async variant")
    S = t.n_stages
    if S < 2 or t.readout_lag < 1:
        raise UserError("async local training needs local.train.n_stages >= 2 and local.train.readout_lag >= 1")
    ctx = _context()
    segs = _Segments()
    procs: list = []
    abort = ctx.Event()
    named = dict(model.named_parameters())
    res: dict = {}
    try:
        params = {}
        with torch.no_grad():
            for i, (name, p) in enumerate(named.items()):
                view, seg = segs.tensor(f"p{i}", p.numel(), p.dtype)
                view.copy_(p.detach().reshape(-1))
                p.data = view.view(p.shape)
                params[name] = (seg, tuple(p.shape))
        data_view, data_seg = segs.tensor("data", len(train), train.dtype)
        data_view.copy_(train)
        R = sum(p.numel() for p in model.readout.parameters())
        act = t.batch_size * t.block_size * model.cfg.d_model
        rings = []
        for b in range(S - 1):
            grad = R if kind == "rgc" else 0
            _, seg = segs.tensor(f"ring{b}", t.ring_slots * (act + grad), torch.float32)
            rings.append(_RingSpec(seg, t.ring_slots, act, grad, ctx.Semaphore(t.ring_slots), ctx.Semaphore(0)))
        slots = t.readout_lag // t.snapshot_every + 3
        snap_data, snap_seg = segs.tensor("snap", slots * R, torch.float32)
        snap_ver, ver_seg = segs.tensor("snapver", slots, torch.int64)
        snap_ver.fill_(-1)
        _Snapshots(snap_data, snap_ver, slots, t.snapshot_every).publish(0, flat(model.readout.parameters()))
        progress, prog_seg = segs.tensor("progress", S, torch.int64)
        progress.zero_()
        job = _Job(kind, t, model.cfg, params, data_seg, offsets.numpy().astype(np.int64), rings, snap_seg,
                   ver_seg, slots, prog_seg, _Control(abort, os.getpid()), ctx.Semaphore(0), ctx.Event(),
                   ctx.SimpleQueue(), fault or {})
        procs = [ctx.Process(target=_stage_worker, args=(s, job), name=f"gf-local-stage{s}", daemon=True)
                 for s in range(S)]
        for p in procs:
            p.start()
        t_go, res = _supervise(procs, job, progress, on_start)
    finally:
        _shutdown(procs, abort)
        with torch.no_grad():
            for p in named.values():  # out of shared memory before the segments go
                p.data = p.data.clone()
        job = rings = progress = snap_data = snap_ver = data_view = None  # drop the views before closing
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
