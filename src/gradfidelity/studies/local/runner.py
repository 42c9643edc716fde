"""One paired cell: BP, thread-matched BP and each method on the same seed, corpus and width, back to back.

Why one job per (corpus, width, seed) instead of one per method: throughput ratios are the study's headline and
this machine is shared and noisy; measuring BP and a method minutes apart in unrelated jobs would put the load
drift into the ratio. Back-to-back runs in one process (method order reversed on odd seeds, so drift does not
always favour the same side) give a paired measurement, and the 4-s torch import is paid once.

Every method still gets its own harness Run directory results/local/<corpus>/w<width>/<method>/seed<k>/ with
metrics.json (deterministic numbers under `metrics`, wall-clock and memory under `timing`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from gradfidelity.harness import Run
from gradfidelity.harness.memory import PeakPSS
from gradfidelity.studies.local.async_runtime import train_async
from gradfidelity.studies.local.data import batch_offsets, load_split
from gradfidelity.studies.local.methods import evaluate_bpb, train_serial
from gradfidelity.studies.local.model import build_model, flops_per_token
from gradfidelity.studies.local.settings import ASYNC, LocalSettings


def run_dir(root: Path, corpus: str, width: int, method: str, seed: int) -> Path:
    return Path(root) / corpus / f"w{width}" / method / f"seed{seed}"


def run_method(method: str, settings: LocalSettings, cfg_dict: dict, corpus: str, width: int, seed: int,
               data_dir: Path, out: Path) -> None:
    t = settings.train
    train = load_split(data_dir, "train")
    val = load_split(data_dir, "val")
    source = json.loads((Path(data_dir) / "meta.json").read_text())["source"]
    offsets = batch_offsets(len(train), t.block_size, t.batch_size, t.steps, seed)
    threads = t.threads_for(method)
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
            "peak_pss_gib": mem.peak_bytes / 2**30, "compute_threads": compute_threads,
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


def run_cell(methods: list[str], settings: LocalSettings, cfg_dict: dict, corpus: str, width: int, seed: int,
             data_dir: Path, root: Path) -> None:
    order = list(methods) if seed % 2 == 0 else list(reversed(methods))
    for method in order:
        run_method(method, settings, cfg_dict, corpus, width, seed, data_dir,
                   run_dir(root, corpus, width, method, seed))
        torch.set_num_threads(settings.train.bp_threads)
