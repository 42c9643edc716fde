"""One method of a paired cell, in its own fresh process (started by cell.py): train, evaluate, write metrics.json.

Why one job per (corpus, width, seed) instead of one per method: throughput ratios are the study's headline and
this machine is shared and noisy; measuring BP and a method minutes apart in unrelated jobs would put the load
drift into the ratio. Back-to-back runs (method order reversed on odd seeds, so drift does not always favour the
same side) give a paired measurement.

Why each method in a fresh process of its own (multiprocessing spawn): peak PSS is a claim (C3). Round 1 ran the
methods one after another in one process, so each method's peak included the heap the previous ones left behind,
pulling the memory ratio toward 1. Now the job's process only supervises; each method's process measures the
peak PSS of its own tree (itself, the async forkserver and stages) over training, and records the PSS of the idle
interpreter (torch imported, nothing built) as `idle_pss_gib`, the floor every method pays.

Every method still gets its own harness Run directory results/local/<corpus>/w<width>/<method>/seed<k>/ with
metrics.json (deterministic numbers under `metrics`, wall-clock and memory under `timing`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from gradfidelity.harness import Run
from gradfidelity.harness.memory import PeakPSS, tree_pss_bytes
from gradfidelity.studies.local.async_runtime import prestart, train_async
from gradfidelity.studies.local.data import batch_offsets, load_split
from gradfidelity.studies.local.methods import evaluate_bpb, train_serial
from gradfidelity.studies.local.model import build_model, flops_per_token
from gradfidelity.studies.local.settings import ASYNC, LocalSettings


def run_method(method: str, settings: LocalSettings, cfg_dict: dict, corpus: str, width: int, seed: int,
               data_dir: Path, out: Path) -> None:
    t = settings.train
    if method in ASYNC:
        prestart()
    train = load_split(data_dir, "train")
    val = load_split(data_dir, "val")
    source = json.loads((Path(data_dir) / "meta.json").read_text())["source"]
    offsets = batch_offsets(len(train), t.block_size, t.batch_size, t.steps, seed)
    threads = t.threads_for(method)
    idle_pss = tree_pss_bytes()  # this fresh process before anything is built: the interpreter's floor
    with Run(out, study="local", config={**cfg_dict, "cell": {"corpus": corpus, "width": width,
                                                               "method": method}},
             seed=seed, threads=threads, checkpoint_every=t.checkpoint_every or None,
             sample_memory=False) as run:  # one PSS sampler (ours, over the training window) is enough
        model = build_model(t.model(width), seed)
        n_params = sum(p.numel() for p in model.parameters())
        with PeakPSS() as mem:
            if method in ASYNC:
                res = train_async(method, model, t, train, offsets)
            else:
                res = train_serial(method, model, t, train, offsets, run)
        bpb = evaluate_bpb(model, val, t)
        run.check_finite(bpb, t.steps, what="held-out bits per byte")
        tokens = res["steps_timed"] * t.batch_size * t.block_size
        tps = tokens / res["train_s"]
        compute_threads = t.async_threads if method in ASYNC else threads
        timing = {
            "tokens_per_s": tps, "train_s": res["train_s"], "peak_pss_bytes": mem.peak_bytes,
            "peak_pss_gib": mem.peak_bytes / 2**30, "idle_pss_gib": idle_pss / 2**30,
            "compute_threads": compute_threads,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""),
            "model_tflops_per_s": tps * flops_per_token(t.model(width), n_params) / 1e12,
        }
        for key in ("stage_busy_s", "stage_wait_input_s", "stage_wait_slot_s", "stage_wait_snapshot_s",
                    "stage_copy_s", "stage_threads"):
            if key in res:
                timing[key] = res[key]
        run.finish({
            "val_bpb": bpb, "final_train_loss": res["losses"][-1][1], "losses": res["losses"],
            "n_params": n_params, "corpus": corpus, "corpus_source": source, "width": width,
            "method": method, "n_stages": t.n_stages, "n_layer": t.n_layer, "steps": t.steps,
            "tokens_trained": t.steps * t.batch_size * t.block_size, "threads": compute_threads,
        }, timing=timing)
