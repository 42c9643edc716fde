"""Benchmarks of study B, written to results/<scale>/bench/async_pp.json with their references measured in the same
run (issue 37). No number here is asserted by a test; the arithmetic is (tests/async_pp/test_bench.py).

1. Step cost (`step_cost`): per optimizer, milliseconds per training step of three arms on the study's model shape,
   same init, same batches, one thread: `plain` (an nn.Module forward, loss.backward(), optimizer.step(): the
   reference), and the delay simulator's `sync` and `2bw` steps (what a training cell runs). The arms and the
   optimizers alternate block by block inside each round, so every arm sees the same machine load; round 0 warms
   caches up and is dropped. Reported per arm: the median over rounds of each block's median step, and the ratios
   to `plain` per round with their median (the method's own cost is 2bw over sync: one weight snapshot a step).
   Also one validation pass (`eval_ms`) and its share of a main-budget run's step (`train.evals` + 1 passes).
2. Real pipeline (`pipeline_throughput`): tokens/s of the asynchronous 1F1B (2bw, no flush) against a flushing
   synchronous 1F1B on the same stages, alternating repeat by repeat. Receives are posted early (pipeline.Receives),
   so each stage's time splits into busy (compute), send (posting isends) and wait (the bubble). Per repeat, the
   throughput ratio is exactly compute_factor x idle_factor (`summarize`); the idle factor's ideal is the exact
   bound of the schedule for the batches used (`batch_bound`), and the target is the median idle factor within 3% of
   it. Medians come with their distribution-free interval (stats.intervals.median_interval), per-stage busy time is
   kept, so a slow stage (imbalance) is told apart from message latency.
3. The receive wait, attributed (`wait_attribution`, issue 47): each stage's wait split into messages x one-way
   latency (a ping-pong of a pipeline-sized message in the same process group, before the jobs) and the rest, the
   schedule (fill, drain, flush, a slower neighbour).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, replace

import torch

from gradfidelity.harness.io import atomic_write_json
from gradfidelity.stats.intervals import median_interval
from gradfidelity.studies.async_pp.config import DEFAULTS, BenchPipeline, StudyConfig
from gradfidelity.studies.async_pp.data import build_stream
from gradfidelity.studies.async_pp.delay import DelaySimulator, DelaySpec, model_loss_fn
from gradfidelity.studies.async_pp.model import build_model, lm_loss
from gradfidelity.studies.async_pp.optimizers import build_optimizer
from gradfidelity.studies.async_pp.pipeline import PipeJob, PipeSetup, run_pipeline, theoretical_bubble

STEP_COST_LIMIT = 1.15  # the most a 2bw step may cost over a sync step (issue 13)
IDLE_TARGET = 0.03  # issue 37: the median idle factor within 3% of the schedule's bound
LEVEL = 0.95  # the median intervals' level
LATENCY_ROUNDS = 200  # ping-pong round trips of a pipeline message before the jobs (wait_attribution)
ARMS = ("plain", "sync", "2bw")


def _med_iv(values: list[float]) -> dict:
    iv = median_interval(values, LEVEL)
    return {"median": iv.estimate, "low": iv.low, "high": iv.high, "level": LEVEL, "n": iv.n}


class _Arm:
    """One optimizer's model and optimizer on one arm; `step(t, x, y)` is one timed training step."""

    def __init__(self, arm: str, optimizer: str, mcfg):
        self.model = build_model(mcfg, seed=0)
        opt = build_optimizer(optimizer, list(self.model.named_parameters()), lr=DEFAULTS[optimizer]["lr"])
        self.opt, self.arm = opt, arm
        self.sim = None if arm == "plain" else DelaySimulator(self.model, opt, DelaySpec(schedule=arm))

    def step(self, t: int, x, y) -> None:
        if self.sim is not None:
            self.sim.step(t, model_loss_fn(self.model, [(x, y)], lm_loss))
            return
        lm_loss(self.model(x), y).backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


def step_cost(cfg: StudyConfig, optimizers: list[str], steps: int, repeats: int, data_dir: str | None = None) -> dict:
    """Per optimizer, ms per step of plain / sync / 2bw (module docstring, 1)."""
    from gradfidelity.studies.async_pp.train import evaluate

    tc = cfg.train
    stream = build_stream(cfg.data, tc.seq_len, tc.batch_size, seed=0, data_dir=data_dir)
    mcfg = cfg.model.with_vocab(stream.vocab_size)
    arms = {(o, a): _Arm(a, o, mcfg) for o in optimizers for a in ARMS}
    blocks: dict[tuple[str, str], list[float]] = {k: [] for k in arms}  # per round: the block's median step (s)
    t_next = dict.fromkeys(arms, 0)
    for _ in range(repeats + 1):
        for key, arm in arms.items():
            times = []
            for _ in range(steps):
                x, y = stream.batch(t_next[key])
                t0 = time.perf_counter()
                arm.step(t_next[key], x, y)
                times.append(time.perf_counter() - t0)
                t_next[key] += 1
            blocks[key].append(statistics.median(times))
    val = stream.val_batches(tc.val_batches)
    model = arms[(optimizers[0], "plain")].model
    evals = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        evaluate(model, val)
        evals.append(time.perf_counter() - t0)
    eval_s = statistics.median(evals[1:])
    out = {}
    for o in optimizers:
        ms = {a: [1000 * b for b in blocks[(o, a)][1:]] for a in ARMS}  # round 0 is the warm-up
        ratios = {a: [x / p for x, p in zip(ms[a], ms["plain"], strict=True)] for a in ("sync", "2bw")}
        ratios["2bw_over_sync"] = [b / s for b, s in zip(ms["2bw"], ms["sync"], strict=True)]
        out[o] = {**{f"{a}_ms": statistics.median(ms[a]) for a in ARMS},
                  **{f"ratio_{k}": statistics.median(v) for k, v in ratios.items()},
                  "per_round_ms": ms, "per_round_ratio": ratios}
    adamw = out.get("adamw") or out[optimizers[0]]
    return {"optimizers": out, "rounds": repeats, "steps_per_block": steps, "threads": torch.get_num_threads(),
            "eval_ms": 1000 * eval_s, "eval_share_of_a_main_step_ms": 1000 * eval_s * (tc.evals + 1) / tc.steps,
            "limit_2bw_over_sync": STEP_COST_LIMIT,
            "within_limit": adamw["ratio_2bw_over_sync"] <= STEP_COST_LIMIT,
            "shape": {"d_model": mcfg.d_model, "n_layers": mcfg.n_layers, "vocab_size": mcfg.vocab_size,
                      "batch_size": tc.batch_size, "seq_len": tc.seq_len},
            "note": "plain = nn.Module forward + loss.backward() + optimizer.step() (the reference); sync/2bw = the "
                    "delay simulator's step, as a training cell runs it; ms = median over rounds of each block's "
                    "median step; ratios per round, then their median; eval_ms = one validation pass"}


def batch_bound(n_stages: int, n_micro: int, steps: int) -> float:
    """The most 2bw can gain over the flushing schedule for `steps` batches on balanced stages, in micro-batch
    slots: sync runs each batch alone, m + P - 1 slots; 2bw fills the pipe once, steps m + P - 1 slots in all. It is
    also the ideal idle factor: (1 - bubble_2bw) / (1 - bubble_sync) with both bubbles at their fill/drain minimum."""
    P, m = n_stages, n_micro
    return steps * (m + P - 1) / (steps * m + P - 1)


def _repeat(timing: list[dict], tokens: int) -> dict:
    """One repeat of one schedule: per stage busy, send and wait seconds, and the bubble (the share of the
    stage-seconds not spent computing)."""
    wall = max(t["wall_s"] for t in timing)
    busy = [t["busy_s"] for t in timing]
    return {"wall_s": wall, "tokens_per_s": tokens / wall, "busy_s": sum(busy), "busy_s_per_stage": busy,
            "send_s_per_stage": [t.get("send_s", 0.0) for t in timing],
            "recv_wait_s_per_stage": [t["recv_wait_s"] for t in timing],
            "send_s": sum(t.get("send_s", 0.0) for t in timing), "recv_wait_s": sum(t["recv_wait_s"] for t in timing),
            "imbalance": max(busy) / (sum(busy) / len(busy)),
            "bubble_fraction": 1.0 - sum(busy) / (len(timing) * wall)}


def _iqr(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4)
    return q3 - q1


def summarize(res: dict, n_stages: int, n_micro: int, steps: int, repeats: int, tokens: int) -> dict:
    """Per-repeat ratios (2bw and sync alternate, so repeat r of each saw the same machine load), their median with
    its interval, the exact bound for the batches used, and the decomposition: per repeat the ratio is exactly
    compute_factor x idle_factor, compute_factor = busy_sync / busy_2bw (the same work: 1 but for noise),
    idle_factor = (1 - bubble_2bw) / (1 - bubble_sync) (what the schedule buys; ideal = the bound)."""
    runs = {s: [_repeat(res[f"{s}_{r}"]["timing"], tokens) for r in range(repeats)] for s in ("sync", "2bw")}
    pairs = list(zip(runs["sync"], runs["2bw"], strict=True))
    ratios = [b["tokens_per_s"] / a["tokens_per_s"] for a, b in pairs]
    compute = [a["busy_s"] / b["busy_s"] for a, b in pairs]
    idle = [(1 - b["bubble_fraction"]) / (1 - a["bubble_fraction"]) for a, b in pairs]
    bound = batch_bound(n_stages, n_micro, steps)
    idle_iv = _med_iv(idle)
    out = {"runs": {s: {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in rs),
                        "bubble_fraction": statistics.median(r["bubble_fraction"] for r in rs),
                        "bubble_theoretical": theoretical_bubble(s, n_stages, n_micro),
                        "busy_s_per_stage_median": [statistics.median(r["busy_s_per_stage"][k] for r in rs)
                                                    for k in range(n_stages)],
                        "recv_wait_s_per_stage_median": [statistics.median(r["recv_wait_s_per_stage"][k] for r in rs)
                                                         for k in range(n_stages)],
                        "repeats": rs}
                    for s, rs in runs.items()},
           "ratio_per_repeat": ratios, "ratio_median": statistics.median(ratios), "ratio_interval": _med_iv(ratios),
           "ratio_min": min(ratios), "ratio_max": max(ratios), "ratio_iqr": _iqr(ratios),
           "decomposition": {"compute_factor_per_repeat": compute, "idle_factor_per_repeat": idle,
                             "compute_factor": _med_iv(compute), "idle_factor": idle_iv,
                             "explained": ("ratio = compute_factor x idle_factor per repeat: compute_factor = busy "
                                           "seconds of sync / of 2bw, summed over stages (the same work: > 1 means "
                                           "2bw computed faster, noise only), idle_factor = (1 - bubble_2bw) / (1 - "
                                           "bubble_sync), bubble = 1 - busy / (stages x wall); receives are posted "
                                           "early, so wait is idle time and sends are counted apart (send_s)")},
           "bound_for_these_batches": bound,
           "bound_asymptotic": 1.0 / (1.0 - theoretical_bubble("sync", n_stages, n_micro)),
           "idle_target": f"median idle factor within {IDLE_TARGET:.0%} of bound_for_these_batches",
           "idle_factor_over_bound": idle_iv["median"] / bound}
    out["meets_idle_target"] = abs(out["idle_factor_over_bound"] - 1.0) <= IDLE_TARGET
    out["median_within_bound"] = out["ratio_median"] <= bound
    return out


def wait_attribution(res: dict, repeats: int, round_trip_s: list[float]) -> dict:
    """The receive wait split into message latency and schedule (issue 47, item 4), per schedule and stage.

    latency part = messages received x one-way latency (half the median round trip of a pipeline-sized message,
    measured in the same process group before the jobs: `pipeline._ping_pong`); schedule part = the median wait
    minus it: time the sender had not yet produced the message (the pipeline's fill and drain, the flush, a slower
    neighbour). The latency part is an upper bound of what latency adds to the wait: a receive posted early overlaps
    its transfer with compute. A shared-memory transport can only shrink the latency part."""
    one_way = [t / 2 for t in round_trip_s]
    lat = _med_iv(one_way)
    out: dict = {"one_way_latency_s": lat, "round_trips": len(round_trip_s)}
    for s in ("sync", "2bw"):
        timings = [res[f"{s}_{r}"]["timing"] for r in range(repeats)]
        stages = []
        for k in range(len(timings[0])):
            waits = [t[k]["recv_wait_s"] for t in timings]
            n_msgs = {t[k]["recv_n"] for t in timings}
            if len(n_msgs) != 1:
                raise RuntimeError(f"bench: stage {k} of {s} received {sorted(n_msgs)} messages across repeats")
            wait, n = statistics.median(waits), n_msgs.pop()
            latency = n * lat["median"]
            stages.append({"stage": k, "recv_wait_s_median": wait, "messages": n, "latency_part_s": latency,
                           "schedule_part_s": wait - latency,
                           "latency_share": latency / wait if wait > 0 else math.nan})
        total_wait = sum(x["recv_wait_s_median"] for x in stages)
        total_latency = sum(x["latency_part_s"] for x in stages)
        out[s] = {"stages": stages, "latency_share": total_latency / total_wait if total_wait > 0 else math.nan}
    share = out["2bw"]["latency_share"]
    out["larger_part_2bw"] = "latency" if share > 0.5 else "schedule"
    out["note"] = ("latency part = messages x one-way latency (an upper bound: early receives overlap transfer "
                   "with compute), schedule part = median wait - latency part; a same-host shared-memory transport "
                   "is the lever only where the latency part is the larger")
    return out


def pipeline_throughput(cfg: StudyConfig, pc: BenchPipeline) -> dict:
    # A stage big enough that compute dominates the gloo messages (bench.pipeline.model overrides the study model).
    model = replace(cfg.model, **asdict(pc.model), tie_embeddings=False)
    setup = PipeSetup(model=model, n_stages=pc.n_stages, seq_len=pc.seq_len, batch_size=pc.batch_size,
                      dtype="float32", train_chars=cfg.data.train_chars, val_chars=cfg.data.val_chars)
    m = pc.n_micro
    jobs = [PipeJob(f"{s}_{r}", s, pc.optimizer, pc.steps, n_micro=m)
            for r in range(pc.repeats) for s in ("sync", "2bw")]
    latency: dict = {}
    res = run_pipeline(setup, jobs, latency=latency, latency_rounds=LATENCY_ROUNDS)
    tokens = pc.steps * setup.batch_size * setup.seq_len
    out: dict = {"n_stages": setup.n_stages, "n_micro": m, "steps": pc.steps, "repeats": pc.repeats,
                 "tokens_per_run": tokens, "model": asdict(model),
                 "corpus": "embedded (throughput does not depend on the text)", "receives": "posted early (irecv)",
                 **summarize(res, setup.n_stages, m, pc.steps, pc.repeats, tokens)}
    out["throughput_ratio_2bw_over_sync"] = out["ratio_median"]
    out["receive_wait"] = {"message_shape": latency["shape"],
                           **wait_attribution(res, pc.repeats, latency["round_trip_s"])}
    return out


def run_bench(cfg: StudyConfig, out_path: str, data_dir: str | None = None) -> dict:
    cfg.need("model", "data", "train", "bench")
    torch.set_num_threads(1)
    b = cfg.bench
    result = {"study": "async_pp",
              "step_cost": step_cost(cfg, list(b.optimizers), b.steps, b.repeats, data_dir),
              "pipeline": pipeline_throughput(cfg, b.pipeline)}
    atomic_write_json(out_path, result)
    return result
