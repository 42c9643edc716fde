"""A real asynchronous pipeline: one process per stage, torch.distributed gloo on CPU, 1F1B without a flush.

Why our own loop: torch.distributed.pipelining and DeepSpeed's PipelineEngine flush after every batch (they are
synchronous by design), so the bubble-free asynchronous schedule has to be written out. Each stage owns a
contiguous run of model units (model.stage_bounds), receives activations from stage k-1 and gradients from stage
k+1 with tagged point-to-point messages, and keeps *weight versions*: immutable snapshots that micro-batches run
forward and backward on, while the live parameters are updated by the stage's own optimizer. Sends are isend; each
receive is posted early (irecv, `Receives`): the next forward's activation and the next backward's gradient are
always posted before the stage computes, so a message that arrives while the stage works is already in its buffer,
and the time a stage waits in `wait()` is the bubble alone (issue 37: round 3's blocking receives could not tell
transfer from waiting).

Schedules (micro-batch i belongs to batch t = i // m; d_k = P-1-k):
- `2bw`:       1F1B over all batches with no flush; batch t runs on version W(t-1) at every stage (two versions per
               stage: W(t-1) for the batch in flight, W(t) for the next). Runs without stalls iff m >= P-1-k.
- `pipedream`: m = 1 (update after every minibatch), weight stashing: a micro-batch runs on the latest version of
               each stage at its forward, stashed until its backward, i.e. W_k(t-d_k): no vertical sync.
- `sync`:      1F1B with a flush after every batch: every micro-batch of batch t runs on W(t). The reference with a
               bubble of (P-1)/(m+P-1) of each stage's time.
The update of batch t happens on each stage right after that stage's backward of the batch's last micro-batch,
through delay.UpdateRule, the same code the single-process simulator uses. `simulate` is that simulator run on the
same data; the equivalence test compares both in float64.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.multiprocessing.spawn import ProcessException

from gradfidelity.errors import UserError
from gradfidelity.harness.integrity import load_checkpoint, save_checkpoint
from gradfidelity.studies.async_pp.config import ModelConfig
from gradfidelity.studies.async_pp.data import embedded_stream
from gradfidelity.studies.async_pp.delay import DelaySimulator, DelaySpec, UpdateRule, model_loss_fn
from gradfidelity.studies.async_pp.model import DTYPES, build_model, lm_loss, stage_bounds, stage_of_params
from gradfidelity.studies.async_pp.optimizers import build_optimizer, lr_factor, set_lr_factor

PIPE_SCHEDULES = ("sync", "2bw", "pipedream")


@dataclass(frozen=True)
class PipeSetup:
    model: ModelConfig  # untied: a tied weight would live in two stages; vocab_size 0 = the corpus's
    n_stages: int
    seq_len: int
    batch_size: int
    seed: int = 0
    dtype: str = "float64"
    train_chars: int = 20000
    val_chars: int = 2000


@dataclass(frozen=True)
class PipeJob:
    name: str
    schedule: str
    optimizer: str
    steps: int
    n_micro: int = 2  # micro-batches per batch (pipedream uses 1)
    mitigation: str = "none"  # per-stage mitigations only: none, error_feedback, taylor
    lr: float | None = None
    momentum: float | None = None
    warmup: int = 0
    decay: int = 0
    fail_at: int = -1  # test hook: stage n_stages-1 raises at this micro-batch (clean-shutdown test)

    def micro(self) -> int:
        return 1 if self.schedule == "pipedream" else self.n_micro


def _check(setup: PipeSetup, job: PipeJob) -> None:
    if job.schedule not in PIPE_SCHEDULES:
        raise UserError(f"pipeline schedule {job.schedule!r} not in {list(PIPE_SCHEDULES)}")
    if job.mitigation not in ("none", "error_feedback", "taylor"):
        raise UserError(f"pipeline mitigation {job.mitigation!r}: sync_start/sync_cooldown need a flush")
    if setup.model.tie_embeddings:
        raise UserError("pipeline: set model.tie_embeddings false (a tied weight would span two stages)")
    if setup.batch_size % job.micro():
        raise UserError(f"pipeline: batch_size {setup.batch_size} not divisible by n_micro {job.micro()}")
    if job.schedule == "2bw" and job.micro() < setup.n_stages - 1:
        raise UserError(f"pipeline 2bw: n_micro {job.micro()} < P-1 = {setup.n_stages - 1} would stall")


def _spec(setup: PipeSetup, job: PipeJob) -> DelaySpec:
    return DelaySpec(schedule=job.schedule, mitigation=job.mitigation, depth=setup.n_stages, total_steps=job.steps)


def _ops(schedule: str, k: int, P: int, n_batches: int, m: int) -> list[tuple[str, int]]:
    """The op order of stage k: ('F'|'B', micro-batch). 1F1B: P-1-k warm-up forwards, then F/B pairs."""

    def one_f_one_b(first: int, count: int) -> list[tuple[str, int]]:
        w = min(P - 1 - k, count)
        ops = [("F", first + i) for i in range(w)]
        for i in range(count - w):
            ops += [("F", first + w + i), ("B", first + i)]
        return ops + [("B", first + i) for i in range(count - w, count)]

    if schedule == "sync":  # flush after every batch
        return [op for t in range(n_batches) for op in one_f_one_b(t * m, m)]
    return one_f_one_b(0, n_batches * m)


class Receives:
    """Early receives of one stage: for each direction (activations from k-1 for forwards, gradients from k+1 for
    backwards) the next one its op list needs is always posted (dist.irecv into its own buffer), one ahead per
    direction; `take` waits for the one an op needs and posts the next. One ahead per direction: it is the message
    the stage needs next, and it can land while the stage computes the current op; a later message that arrives
    before its receive is posted waits in gloo's transport, as every message did behind round 3's blocking recv."""

    def __init__(self, ops: list[tuple[str, int]], k: int, P: int, shape: tuple[int, ...], dtype):
        self.queue = {"F": [i for op, i in ops if op == "F"] if k > 0 else [],
                      "B": [i for op, i in ops if op == "B"] if k < P - 1 else []}
        self.src = {"F": k - 1, "B": k + 1}
        self.shape, self.dtype = shape, dtype
        self.posted: dict[str, tuple[int, torch.Tensor, object]] = {}
        self.taken = 0  # messages received (the bench's latency share: messages x one-way latency)
        for d in ("F", "B"):
            self._post(d)

    def _post(self, d: str) -> None:
        if self.queue[d]:
            i = self.queue[d].pop(0)
            buf = torch.empty(self.shape, dtype=self.dtype)
            self.posted[d] = (i, buf, dist.irecv(buf, src=self.src[d], tag=i))

    def take(self, d: str, i: int) -> torch.Tensor:
        """The message of op (d, i): waits for it (the caller times the wait) and posts the next of direction d."""
        got, buf, handle = self.posted.pop(d)
        if got != i:
            raise RuntimeError(f"pipeline: op {d}{i} found the receive of {d}{got} posted (op order broken)")
        handle.wait()
        self.taken += 1
        self._post(d)
        return buf


def _snapshot(named) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone().requires_grad_(True) for n, p in named}


def run_stage(k: int, setup: PipeSetup, job: PipeJob, stream) -> dict:
    """Run `job` as stage k; returns the stage's final parameters and timing."""
    P, dtype = setup.n_stages, DTYPES[setup.dtype]
    cfg = setup.model.with_vocab(stream.vocab_size)
    model = build_model(cfg, setup.seed, dtype)
    lo, hi = stage_bounds(cfg.n_units, P)[k]
    owner = stage_of_params(model, P)
    named = [(n, p) for n, p in model.named_parameters() if owner[n] == k]
    names = [n for n, _ in named]
    opt = build_optimizer(job.optimizer, named, lr=job.lr, momentum=job.momentum)
    rule = UpdateRule(named, opt, _spec(setup, job))
    m, T, mb = job.micro(), job.steps, setup.batch_size // job.micro()
    S, d = setup.seq_len, cfg.d_model
    versions = {0: _snapshot(named)}  # update count -> immutable weights
    peak = 1  # the most versions the stage held at once (2bw: two, the double buffer; sync: one)
    updates = 0
    in_flight: dict[int, tuple] = {}
    acc: dict[int, list[torch.Tensor]] = {}
    sends: list = []
    busy = wait = send = 0.0  # compute; blocking receives (transfer + waiting: the bubble); posting sends
    losses = []
    ops = _ops(job.schedule, k, P, T, m)
    t_start = time.perf_counter()
    recvs = Receives(ops, k, P, (mb, S, d), dtype)
    for op, i in ops:
        t = i // m
        if i == job.fail_at and k == P - 1:
            raise RuntimeError(f"injected failure at micro-batch {i} on stage {k}")
        if op == "F":
            v = {"sync": t, "2bw": max(t - 1, 0), "pipedream": updates}[job.schedule]
            if v not in versions:
                raise RuntimeError(f"stage {k}: weight version {v} for micro-batch {i} not available (stall)")
            x, y = stream.batch(t)
            j = i % m
            if k == 0:
                x_in = x[j * mb:(j + 1) * mb]
            else:
                t0 = time.perf_counter()
                x_in = recvs.take("F", i)
                wait += time.perf_counter() - t0
                x_in.requires_grad_(True)
            t0 = time.perf_counter()
            out = torch.func.functional_call(model, versions[v], (x_in,), {"lo": lo, "hi": hi})
            if k == P - 1:
                out = lm_loss(out, y[j * mb:(j + 1) * mb])
                losses.append(float(out.detach()))
            else:
                busy += time.perf_counter() - t0
                t0 = time.perf_counter()
                sends.append(dist.isend(out.detach(), dst=k + 1, tag=i))
                send += time.perf_counter() - t0
                t0 = time.perf_counter()
            in_flight[i] = (v, x_in, out)
            busy += time.perf_counter() - t0
        else:
            v, x_in, out = in_flight.pop(i)
            if k == P - 1:
                outputs, grad_out = out / m, None
            else:
                t0 = time.perf_counter()
                grad_out = recvs.take("B", i)
                wait += time.perf_counter() - t0
                outputs = out
            t0 = time.perf_counter()
            inputs = [versions[v][n] for n in names] + ([x_in] if k > 0 else [])
            gs = torch.autograd.grad(outputs, inputs, grad_outputs=grad_out)
            if k > 0:
                busy += time.perf_counter() - t0
                t0 = time.perf_counter()
                sends.append(dist.isend(gs[-1].detach(), dst=k - 1, tag=i))
                send += time.perf_counter() - t0
                t0 = time.perf_counter()
            pg = list(gs[:len(names)])
            acc[t] = pg if t not in acc else [a + b for a, b in zip(acc[t], pg, strict=True)]
            if (i + 1) % m == 0:  # last micro-batch of batch t on this stage: update
                if updates != t:
                    raise RuntimeError(f"stage {k}: update {updates} out of order (batch {t})")
                set_lr_factor(opt, lr_factor(t, T, job.warmup, job.decay))
                rule.apply(dict(zip(names, acc.pop(t), strict=True)),
                           {n: w.detach() for n, w in versions[v].items()})
                updates += 1
                versions[updates] = _snapshot(named)
                # 2bw's next batch runs on W(t-1) (the double buffer); sync and pipedream forward on the newest
                # version, so an older one stays only while a micro-batch in flight (pipedream's stash) needs it.
                keep = {updates} | {e[0] for e in in_flight.values()}
                if job.schedule == "2bw":
                    keep.add(updates - 1)
                for old in [u for u in versions if u not in keep]:
                    del versions[old]
                peak = max(peak, len(versions))
            busy += time.perf_counter() - t0
        t0 = time.perf_counter()
        sends = [h for h in sends if not h.is_completed()]
        send += time.perf_counter() - t0
    t0 = time.perf_counter()
    for h in sends:
        h.wait()
    send += time.perf_counter() - t0
    wall = time.perf_counter() - t_start
    return {"params": {n: p.detach().clone() for n, p in named},
            "timing": {"stage": k, "wall_s": wall, "busy_s": busy, "recv_wait_s": wait, "send_s": send,
                       "recv_n": recvs.taken, "max_versions": peak},
            "losses": losses}


LATENCY_TAG = 1 << 30  # above every micro-batch tag: the ping-pong never matches a pipeline message
LATENCY_WARMUP = 5


def _ping_pong(rank: int, shape: tuple[int, ...], dtype, rounds: int) -> list[float]:
    """Round trips of one pipeline-sized message between stages 0 and 1 (blocking send, then receive the echo), in
    the process group the jobs use, before any job runs: rank 0's seconds per round trip after LATENCY_WARMUP
    unrecorded ones (the other ranks return [] at once). Half a round trip is the one-way latency of a message, the
    cost each receive pays even when its sender is ready."""
    if rank > 1:
        return []
    buf, times = torch.zeros(shape, dtype=dtype), []
    for r in range(LATENCY_WARMUP + rounds):
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(buf, dst=1, tag=LATENCY_TAG + r)
            dist.recv(buf, src=1, tag=LATENCY_TAG + r)
        else:
            dist.recv(buf, src=0, tag=LATENCY_TAG + r)
            dist.send(buf, dst=0, tag=LATENCY_TAG + r)
        if r >= LATENCY_WARMUP:
            times.append(time.perf_counter() - t0)
    return times if rank == 0 else []


def message_shape(setup: PipeSetup, job: PipeJob) -> tuple[int, int, int]:
    """The shape of every pipeline message of `job` (an activation forward, its gradient backward)."""
    return setup.batch_size // job.micro(), setup.seq_len, setup.model.d_model


def _worker(rank: int, setup: PipeSetup, jobs: list[PipeJob], out_dir: str, store: str,
            latency_rounds: int = 0) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=setup.n_stages,
                            timeout=timedelta(seconds=120))
    try:
        if latency_rounds:
            dist.barrier()
            rtt = _ping_pong(rank, message_shape(setup, jobs[0]), DTYPES[setup.dtype], latency_rounds)
            if rank == 0:
                save_checkpoint(Path(out_dir) / "latency.pt", {"round_trip_s": rtt,
                                                                "shape": list(message_shape(setup, jobs[0]))})
        stream = embedded_stream(setup.train_chars, setup.val_chars, setup.seq_len, setup.batch_size, setup.seed)
        for job in jobs:
            dist.barrier()  # every stage starts a job together: wall times are comparable
            result = run_stage(rank, setup, job, stream)
            dist.barrier()
            result["timing"]["job_wall_s"] = result["timing"]["wall_s"]
            save_checkpoint(Path(out_dir) / job.name / f"stage{rank}.pt", result)
    finally:
        dist.destroy_process_group()


def run_pipeline(setup: PipeSetup, jobs: list[PipeJob], out_dir: str | os.PathLike | None = None,
                 pids: list[int] | None = None, latency: dict | None = None,
                 latency_rounds: int = 0) -> dict[str, dict]:
    """Spawn one process per stage, run `jobs` one after the other in the same process group, and return per job
    {"params": merged final weights, "timing": [per-stage timing], "losses": last stage's micro-batch losses}.
    A failing stage ends the whole group (torch.multiprocessing terminates the others) and raises here.
    `latency_rounds` > 0: first `_ping_pong` that many round trips of the first job's message between stages 0
    and 1, into `latency` ({"round_trip_s": [...], "shape": [...]})."""
    for job in jobs:
        _check(setup, job)
    if latency_rounds and (latency is None or setup.n_stages < 2):
        raise UserError("run_pipeline: latency_rounds needs a `latency` dict to fill and at least two stages")
    if latency_rounds and len({message_shape(setup, j) for j in jobs}) > 1:
        raise UserError("run_pipeline: latency_rounds needs every job to send messages of one shape")
    with tempfile.TemporaryDirectory(prefix="gf_pipe_") as tmp:
        out = Path(out_dir) if out_dir else Path(tmp)
        store = str(Path(tmp) / "store")
        ctx = mp.start_processes(_worker, args=(setup, jobs, str(out), store, latency_rounds),
                                 nprocs=setup.n_stages, join=False, start_method="spawn")
        if pids is not None:
            pids.extend(p.pid for p in ctx.processes)
        try:
            while not ctx.join():
                pass
        except ProcessException as exc:
            raise RuntimeError(f"pipeline stage failed: {exc}") from None
        if latency_rounds:
            latency.update(load_checkpoint(out / "latency.pt"))
        results = {}
        for job in jobs:
            parts = [load_checkpoint(out / job.name / f"stage{k}.pt") for k in range(setup.n_stages)]
            params = {n: v for part in parts for n, v in part["params"].items()}
            results[job.name] = {"params": params, "timing": [p["timing"] for p in parts],
                                 "losses": parts[-1]["losses"]}
    return results


def simulate(setup: PipeSetup, job: PipeJob, schedule: str | None = None) -> dict[str, torch.Tensor]:
    """The single-process delay simulator on the pipeline's data, micro-batching and LR schedule."""
    stream = embedded_stream(setup.train_chars, setup.val_chars, setup.seq_len, setup.batch_size, setup.seed)
    cfg = setup.model.with_vocab(stream.vocab_size)
    model = build_model(cfg, setup.seed, DTYPES[setup.dtype])
    opt = build_optimizer(job.optimizer, list(model.named_parameters()), lr=job.lr, momentum=job.momentum)
    schedule = schedule or job.schedule
    spec = DelaySpec(schedule=schedule, mitigation="none" if schedule == "sync" else job.mitigation,
                     depth=setup.n_stages, total_steps=job.steps)
    sim = DelaySimulator(model, opt, spec, stage_of_params(model, setup.n_stages))
    m = job.micro()
    mb = setup.batch_size // m
    for t in range(job.steps):
        x, y = stream.batch(t)
        micro = [(x[j * mb:(j + 1) * mb], y[j * mb:(j + 1) * mb]) for j in range(m)]
        set_lr_factor(opt, lr_factor(t, job.steps, job.warmup, job.decay))
        sim.step(t, model_loss_fn(model, micro, lm_loss), n_micro=m)
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def theoretical_bubble(schedule: str, P: int, m: int) -> float:
    """Idle share of a stage in steady state: (P-1)/(m+P-1) with a flush per batch, 0 without."""
    return (P - 1) / (m + P - 1) if schedule == "sync" else 0.0


__all__ = ["PipeJob", "PipeSetup", "run_pipeline", "simulate", "theoretical_bubble"]
