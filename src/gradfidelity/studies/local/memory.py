"""C3's memory probe: the memory a method's *model* costs, with its interpreters cancelled out.

Why a probe of its own, apart from the training cells:
- At the training width (64 at the cpu scale: 241,024 parameters, about 4 MB with gradients and AdamW state) the
  peak process-tree PSS is almost all interpreter. Async RGC runs four interpreters (the training process, the
  forkserver, two stages), BP one, so the round-2 ratio (2.27x, near the paper's 2.2x) counted processes.
- So the probe trains a few steps at a size where parameters, gradients, optimizer state and activations reach at
  least the interpreters' size (the `memory` section: width and depth), and gives each method a baseline of its
  own: the same process tree started with the model not built. For BP that is the spawned process with torch
  imported; for an async method it is that process, the forkserver and `n_stages` stage processes forked from it
  (`async_runtime.idle_tree`). PSS splits a page shared by k processes into k parts, so one interpreter's floor
  times the process count would be wrong: each tree's baseline is measured, not computed.
- C3 is then decided on (method - its baseline) / (BP - its baseline); the raw ratio is reported beside it.

Each measurement runs in a fresh spawned process and is sampled over that process's tree only (`PeakPSS(pid=...)`,
every 20 ms), so the job's own process, which builds nothing, is not counted. Every measurement loads the same
training split, so the data cancel out of each difference too.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import time
from pathlib import Path

from gradfidelity.errors import UserError
from gradfidelity.studies.local.config import StudyConfig, TrainConfig

METHODS = ("bp", "rgc_async")  # C3: async RGC against BP
PSS_INTERVAL_S = 0.02
IDLE_HOLD_S = 1.0  # how long a baseline tree stays up (50 samples)
BYTES_PER_PARAM_STATE = 16  # fp32 weight + gradient + AdamW exp_avg + exp_avg_sq


def probe_train(s: StudyConfig) -> TrainConfig:
    """The training settings of the probe: the study's, at the probe's depth and number of steps."""
    m = s.memory
    return dataclasses.replace(s.train, n_layer=m.n_layer, steps=m.steps, warmup=0)


def _child(method: str, with_model: bool, t: TrainConfig, width: int, seed: int, data_dir: str) -> None:
    """One measurement, in a fresh spawned process: load the split; then either hold the bare process tree
    (`with_model` False) or build the model and train `t.steps` steps."""
    import torch

    from gradfidelity.studies.local.async_runtime import idle_tree, prestart, train_async
    from gradfidelity.studies.local.data import batch_offsets, load_split
    from gradfidelity.studies.local.model import build_model

    train = load_split(Path(data_dir), "train")
    if method != "bp":
        prestart()
    torch.set_num_threads(t.bp_threads if method == "bp" else t.threads_per_stage)
    if not with_model:
        if method == "bp":
            time.sleep(IDLE_HOLD_S)
        else:
            idle_tree(t, IDLE_HOLD_S)
        return
    model = build_model(t.model(width), seed)
    offsets = batch_offsets(len(train), t.block_size, t.batch_size, t.steps, seed)
    if method == "bp":
        bp_steps(model, t, train, offsets)
    else:
        train_async(method, model, t, train, offsets)


def bp_steps(model, t: TrainConfig, train, offsets) -> None:
    """`len(offsets)` plain BP steps (AdamW, clip), as `methods.train_serial` takes them, without a harness run: what
    a memory probe needs (the bench's PSS probe uses it too)."""
    from gradfidelity.studies.local.data import get_batch
    from gradfidelity.studies.local.methods import Optimizers, bp_backward

    opts = Optimizers([list(model.parameters())], t)
    for i in range(len(offsets)):
        x, y = get_batch(train, offsets[i], t.block_size)
        opts.zero_grad()
        bp_backward(model, x, y)
        opts.clip_and_step(t.lr)


def peak_pss_gib(method: str, with_model: bool, t: TrainConfig, width: int, seed: int, data_dir: Path) -> float:
    """Peak PSS of one measurement's process tree (the spawned child and its descendants), in GiB."""
    from gradfidelity.harness.memory import PeakPSS

    p = mp.get_context("spawn").Process(target=_child, name=f"gf-local-memory-{method}",
                                        args=(method, with_model, t, width, seed, str(data_dir)))
    p.start()
    try:
        with PeakPSS(pid=p.pid, interval=PSS_INTERVAL_S) as mem:
            p.join()
    finally:
        if p.is_alive():
            p.kill()
            p.join()
    if p.exitcode != 0:
        raise UserError(f"study C memory probe: {method} ({'model' if with_model else 'baseline'}) exited with "
                        f"code {p.exitcode}; its traceback is in this job's log")
    return mem.peak_bytes / 2**30


def run_probe(s: StudyConfig, cfg: dict, cell: dict, data_dir: Path, out: Path) -> None:
    """The `local-memory` job: each method of `METHODS` with its model and as its bare tree, in fresh processes,
    written as one harness run (deterministic sizes under `metrics`, PSS under `timing`)."""
    import torch

    from gradfidelity.harness import Run
    from gradfidelity.studies.local.model import ByteTransformer

    width, seed = int(cell["width"]), int(cell["seed"])
    if width != s.memory.width:
        raise UserError(f"--cell width {width} is not local.memory.width={s.memory.width}")
    t = probe_train(s)
    with torch.device("meta"):  # the count without allocating the model in this (unmeasured) process
        n_params = sum(p.numel() for p in ByteTransformer(t.model(width)).parameters())
    with Run(out, study="local", config=cfg, cell=cell, seed=seed, threads=t.bp_threads,
             sample_memory=False) as run:
        timing = {}
        for method in METHODS:
            for with_model in (False, True):
                key = f"pss_{method}_gib" if with_model else f"pss_{method}_baseline_gib"
                timing[key] = peak_pss_gib(method, with_model, t, width, seed, data_dir)
                print(f"{key} {timing[key]:.4f}", flush=True)
        run.finish({"width": width, "n_layer": t.n_layer, "steps": t.steps, "batch_size": t.batch_size,
                    "block_size": t.block_size, "n_stages": t.n_stages, "n_params": n_params,
                    "state_gib": BYTES_PER_PARAM_STATE * n_params / 2**30},
                   timing={**timing, "pss_interval_s": PSS_INTERVAL_S, "pid": os.getpid()})
