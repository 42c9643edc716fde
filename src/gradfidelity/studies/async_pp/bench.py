"""Benchmarks of study B, written to results/bench/async_pp.json with their references measured in the same run.

1. Simulated step cost: a `2bw` step (weight snapshot + gradient at the stashed version) against a `sync` step, same
   model shape and init, same optimizer, same batches, alternating single steps in one process (median per-step
   time); the issue asks for <= 1.15x.
2. Real pipeline: tokens/s of the asynchronous 1F1B (2bw, no flush) against a flushing synchronous 1F1B on the same
   stages, alternating repeat by repeat. Reported: every repeat's ratio, their median, range and IQR (on a shared
   2-core machine the repeats scatter: round 2's were 1.02-1.40), the exact bound for the batches used
   (`batch_bound`: 24 batches of 4 micro-batches on 2 stages allow at most 120/97 = 1.237, not the asymptotic 1.25),
   and each repeat's reconciliation of the ratio with the bubbles (`summarize`): sends are timed apart from compute,
   so the bubble is idle time only, and whatever the bubbles do not explain is shown as a compute-time difference.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, replace

import torch

from gradfidelity.harness.io import atomic_write_json
from gradfidelity.studies.async_pp.config import BenchPipeline, StudyConfig
from gradfidelity.studies.async_pp.data import build_stream
from gradfidelity.studies.async_pp.delay import DelaySimulator, DelaySpec, model_loss_fn
from gradfidelity.studies.async_pp.model import build_model, lm_loss
from gradfidelity.studies.async_pp.optimizers import build_optimizer
from gradfidelity.studies.async_pp.pipeline import PipeJob, PipeSetup, run_pipeline, theoretical_bubble

STEP_COST_LIMIT = 1.15
PIPELINE_TARGET = 1.15  # the bar for real 2bw / flushing sync throughput (theory: (m+P-1)/m)


def sim_step_cost(cfg: StudyConfig, steps: int, repeats: int, data_dir: str | None = None) -> dict:
    tc = cfg.train
    stream = build_stream(cfg.data, tc.seq_len, tc.batch_size, seed=0, data_dir=data_dir)
    mcfg = cfg.model.with_vocab(stream.vocab_size)
    sims = {}
    for schedule in ("sync", "2bw"):
        model = build_model(mcfg, seed=0)
        opt = build_optimizer("adamw", list(model.named_parameters()))
        sims[schedule] = (model, DelaySimulator(model, opt, DelaySpec(schedule=schedule)))
    # Alternate single steps (sync, 2bw, sync, ...) so that both see the same machine load; the first
    # `steps` steps of each warm up allocator and caches and are dropped.
    times: dict[str, list[float]] = {"sync": [], "2bw": []}
    for t in range(steps * (repeats + 1)):
        x, y = stream.batch(t)
        for schedule, (model, sim) in sims.items():
            t0 = time.perf_counter()
            sim.step(t, model_loss_fn(model, [(x, y)], lm_loss))
            times[schedule].append(time.perf_counter() - t0)
    med = {k: statistics.median(v[steps:]) for k, v in times.items()}
    ratio = med["2bw"] / med["sync"]
    return {"sync_step_s": med["sync"], "2bw_step_s": med["2bw"], "ratio_2bw_over_sync": ratio,
            "limit": STEP_COST_LIMIT, "within_limit": ratio <= STEP_COST_LIMIT,
            "mean_step_s": {k: statistics.fmean(v[steps:]) for k, v in times.items()},
            "timed_steps": steps * repeats, "optimizer": "adamw", "threads": torch.get_num_threads()}


def batch_bound(n_stages: int, n_micro: int, steps: int) -> float:
    """The most 2bw can gain over the flushing schedule for `steps` batches on balanced stages, in micro-batch
    slots: sync runs each batch alone, m + P - 1 slots; 2bw fills the pipe once, steps m + P - 1 slots in all."""
    P, m = n_stages, n_micro
    return steps * (m + P - 1) / (steps * m + P - 1)


def _repeat(timing: list[dict], tokens: int) -> dict:
    """One repeat of one schedule: the stages' seconds and the bubble (idle share of the stage-seconds)."""
    wall = max(t["wall_s"] for t in timing)
    busy = sum(t["busy_s"] for t in timing)
    comm = sum(t.get("send_s", 0.0) for t in timing)
    return {"wall_s": wall, "tokens_per_s": tokens / wall, "busy_s": busy, "send_s": comm,
            "recv_wait_s": sum(t["recv_wait_s"] for t in timing),
            "bubble_fraction": 1.0 - busy / (len(timing) * wall)}


def _iqr(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4)
    return q3 - q1


def summarize(res: dict, n_stages: int, n_micro: int, steps: int, repeats: int, tokens: int) -> dict:
    """Per-repeat ratios (2bw and sync alternate, so repeat r of each saw the same machine load), their median and
    spread, the exact bound for the batches used, and the reconciliation: per repeat the ratio is exactly
    (busy_sync / busy_2bw) x ((1 - bubble_2bw) / (1 - bubble_sync)), so a ratio the bubbles alone do not explain
    shows up as a difference in compute time between the schedules, not as a mystery."""
    runs = {s: [_repeat(res[f"{s}_{r}"]["timing"], tokens) for r in range(repeats)] for s in ("sync", "2bw")}
    ratios = [b["tokens_per_s"] / a["tokens_per_s"] for a, b in zip(runs["sync"], runs["2bw"], strict=True)]
    compute = [a["busy_s"] / b["busy_s"] for a, b in zip(runs["sync"], runs["2bw"], strict=True)]
    idle = [(1 - b["bubble_fraction"]) / (1 - a["bubble_fraction"]) for a, b in zip(runs["sync"], runs["2bw"],
                                                                                    strict=True)]
    out = {"runs": {s: {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in rs),
                        "bubble_fraction": statistics.median(r["bubble_fraction"] for r in rs),
                        "bubble_theoretical": theoretical_bubble(s, n_stages, n_micro), "repeats": rs}
                    for s, rs in runs.items()},
           "ratio_per_repeat": ratios, "ratio_median": statistics.median(ratios),
           "ratio_min": min(ratios), "ratio_max": max(ratios),
           "ratio_iqr": _iqr(ratios),
           "reconciliation": {"compute_factor_per_repeat": compute, "idle_factor_per_repeat": idle,
                              "explained": ("ratio = compute_factor x idle_factor per repeat: compute_factor = "
                                            "busy seconds of sync / of 2bw (the same work; > 1 means 2bw computed "
                                            "faster), idle_factor = (1 - bubble_2bw) / (1 - bubble_sync); sends are "
                                            "counted apart from busy (send_s), blocking receives are idle")},
           "bound_for_these_batches": batch_bound(n_stages, n_micro, steps),
           "bound_asymptotic": 1.0 / (1.0 - theoretical_bubble("sync", n_stages, n_micro))}
    out["median_within_bound"] = out["ratio_median"] <= out["bound_for_these_batches"]
    return out


def pipeline_throughput(cfg: StudyConfig, pc: BenchPipeline) -> dict:
    # A stage big enough that compute dominates the gloo messages (bench.pipeline.model overrides the study model).
    model = replace(cfg.model, **asdict(pc.model), tie_embeddings=False)
    setup = PipeSetup(model=model, n_stages=pc.n_stages, seq_len=pc.seq_len, batch_size=pc.batch_size,
                      dtype="float32", train_chars=cfg.data.train_chars, val_chars=cfg.data.val_chars)
    m = pc.n_micro
    jobs = [PipeJob(f"{s}_{r}", s, pc.optimizer, pc.steps, n_micro=m)
            for r in range(pc.repeats) for s in ("sync", "2bw")]
    res = run_pipeline(setup, jobs)
    tokens = pc.steps * setup.batch_size * setup.seq_len
    out: dict = {"n_stages": setup.n_stages, "n_micro": m, "steps": pc.steps, "tokens_per_run": tokens,
                 "model": asdict(model), "corpus": "embedded (throughput does not depend on the text)",
                 **summarize(res, setup.n_stages, m, pc.steps, pc.repeats, tokens)}
    out["throughput_ratio_2bw_over_sync"] = out["ratio_median"]
    out["target"], out["meets_target"] = PIPELINE_TARGET, out["ratio_median"] >= PIPELINE_TARGET
    return out


def run_bench(cfg: StudyConfig, out_path: str, data_dir: str | None = None) -> dict:
    cfg.need("model", "data", "train", "bench")
    torch.set_num_threads(1)
    b = cfg.bench
    result = {"study": "async_pp",
              "sim_step_cost": sim_step_cost(cfg, b.steps, b.repeats, data_dir),
              "pipeline": pipeline_throughput(cfg, b.pipeline)}
    atomic_write_json(out_path, result)
    return result
