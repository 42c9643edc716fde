"""One paired cell (corpus, width, seed): each method in a fresh process of its own, back to back, inside the harness.

Why one job per (corpus, width, seed) instead of one per method: throughput ratios are the study's headline and
this machine is shared and noisy; measuring BP and a method minutes apart in unrelated jobs would put the load
drift into the ratio. Back-to-back runs (method order reversed on odd seeds, so drift does not always favour the
same side) give a paired measurement.

Why each method in a fresh process of its own (multiprocessing spawn): peak PSS is a claim (C3). Round 1 ran the
methods one after another in one process, so each method's peak included the heap the previous ones left behind,
pulling the memory ratio toward 1. Now the job's process only supervises and stays torch-free (`run_cell`); each
method's process (`run_method`) imports torch, measures the peak PSS of its own tree (itself, the async forkserver
and stages) over training, and records the PSS of the idle interpreter (torch imported, nothing built) as
`idle_pss_gib`, the floor every method pays.

Every method gets its own harness Run directory (the rule's `--run-dir` with the method in place of `{method}`)
with metrics.json (deterministic numbers under `metrics`, wall-clock and memory under `timing`) and the plan's
cell (the rule's wildcards and the method) in its records.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
from pathlib import Path

from gradfidelity.errors import UserError
from gradfidelity.studies.local.config import ASYNC, CORPORA, METHODS, TrainConfig

CELL_KEYS = ("corpus", "width", "seed")  # the training rules' wildcards
# How often a training run samples its tree's PSS. Reading /proc/<pid>/smaps_rollup walks the process's page
# tables: every 50 ms (round 2) it took about a quarter of a core per process, which on 2 cores slowed exactly the
# runs that use both cores (measured 2026-12-03, BP at width 64: 2 threads 50.1 ms a step with the 50 ms sampler
# against 34.7 without; 1 thread 45.0 vs 43.1), so 2-thread BP looked slower than 1-thread BP and the async
# methods paid for a sampler BP ran beside. Once a second it costs about 1%; the peak of a steady training loop is
# still caught, and C3's memory probe (memory.py) samples every 20 ms in runs where nothing is timed.
TRAINING_PSS_INTERVAL_S = 1.0


def run_job(t: TrainConfig, cfg: dict, methods: list[str], cell: dict, data_dir: Path, run_dir: str,
            shares_machine: bool = False) -> None:
    """The `local-cell` job: check its arguments before any work, then `run_cell`.

    `run_dir`: the run directory with `{method}` in place of the method (the rule's `--run-dir`); `cell`: the
    rule's wildcards (`--cell`); `shares_machine`: the job runs beside another (a quality job), recorded in each
    run's timing so that no throughput is read from it.
    """
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise UserError(f"--methods: unknown {bad} (allowed: {list(METHODS)})")
    missing = [k for k in CELL_KEYS if k not in cell]
    if missing or cell["corpus"] not in CORPORA or not all(str(cell[k]).isdigit() for k in ("width", "seed")):
        raise UserError(f"--cell {cell}: needs corpus (one of {list(CORPORA)}), width and seed (integers)")
    if run_dir.count("{method}") != 1:
        raise UserError(f"--run-dir {run_dir}: must hold '{{method}}' once (one run directory per method)")
    for name in ("train.bin", "val.bin", "meta.json"):
        if not (Path(data_dir) / name).exists():
            raise UserError(f"{data_dir}/{name} does not exist (prepare the corpus with the local_data rule)")
    run_cell(methods, t, cfg, cell, data_dir, {m: Path(run_dir.replace("{method}", m)) for m in methods},
             shares_machine)


def run_cell(methods: list[str], t: TrainConfig, cfg: dict, cell: dict, data_dir: Path, run_dirs: dict[str, Path],
             shares_machine: bool = False) -> None:
    """Run `methods` of one cell back to back (reversed on odd seeds), each in a fresh spawned process.

    `cfg`: the job's config as given (recorded in provenance); `cell`: the plan's cell (corpus, width, seed);
    `run_dirs`: method -> its run directory.
    """
    seed = int(cell["seed"])
    order = list(methods) if seed % 2 == 0 else list(reversed(methods))
    ctx = mp.get_context("spawn")
    for method in order:
        out = Path(run_dirs[method])
        p = ctx.Process(target=run_method, name=f"gf-local-{method}",
                        args=(method, t, cfg, {**cell, "method": method}, Path(data_dir), out, shares_machine))
        p.start()
        p.join()
        if p.exitcode != 0:
            raise UserError(f"study C: {method} on {cell['corpus']} w{cell['width']} seed {seed} failed (exit code "
                            f"{p.exitcode}); its traceback is in this job's log, its run directory is {out}")


def run_method(method: str, t: TrainConfig, cfg: dict, cell: dict, data_dir: Path, out: Path,
               shares_machine: bool = False) -> None:
    """One method of the cell, in its own fresh process: train, evaluate, write metrics.json."""
    from gradfidelity.harness import Run
    from gradfidelity.harness.memory import PeakPSS, tree_pss_bytes
    from gradfidelity.studies.local.async_runtime import prestart, train_async
    from gradfidelity.studies.local.data import batch_offsets, load_split
    from gradfidelity.studies.local.methods import evaluate_bpb, train_serial
    from gradfidelity.studies.local.model import build_model, flops_per_token

    corpus, width, seed = str(cell["corpus"]), int(cell["width"]), int(cell["seed"])
    if method in ASYNC:
        prestart()
    train = load_split(data_dir, "train")
    val = load_split(data_dir, "val")
    source = json.loads((Path(data_dir) / "meta.json").read_text())["source"]
    offsets = batch_offsets(len(train), t.block_size, t.batch_size, t.steps, seed)
    threads = t.threads_for(method)
    idle_pss = tree_pss_bytes()  # this fresh process before anything is built: the interpreter's floor
    with Run(out, study="local", config=cfg, cell=cell, seed=seed, threads=threads,
             checkpoint_every=t.checkpoint_every or None,
             sample_memory=False) as run:  # one PSS sampler (ours, over the training window) is enough
        model = build_model(t.model(width), seed)
        n_params = sum(p.numel() for p in model.parameters())
        with PeakPSS(interval=TRAINING_PSS_INTERVAL_S) as mem:
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
            "compute_threads": compute_threads, "shares_machine": shares_machine,
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
