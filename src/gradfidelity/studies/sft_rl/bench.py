"""Throughput of study A's training paths, each against a reference measured in the same process and minutes.

What it measures, on the selection seed's fixed SFT model (the start every SFT-then-RL grid run trains from), with
the study's own trainers, DeepSpeed engine, thread count and deterministic algorithms:
1. The RL step, round 3's path against round 4's, switched step by step in one GFGRPOTrainer so that drift of the
   machine hits every path: `padded` (torch's uninitialised-memory fill on, TRL's padded log-prob forward: round
   3), `padded_no_fill` (the fill off alone) and `trimmed` (the fill off and rl.length_groups micro-batches cut to
   their longest row: round 4). Per path: the median ms per step and per rollout, and its generation part; the
   headline is the median over rounds of the per-round ratio trimmed / padded (a round = one step of each path, in
   rotating order), with an order-statistic 95% interval (stats.intervals.median_interval); its two factors beside.
2. The SFT step (micro-batch x GA of the study), the fill on against off, the same way.
3. The FLOP floor: FLOPs per rollout (flops.py's count, 6N per trained token + 2N per generated token, from the
   trainer's own token counts over the timed steps of the path) divided by an fp32 matmul rate measured in the same
   run at the model's MLP shape (rows = the tokens of one step's training forward), single-threaded as the runs
   are. overhead = measured ms per rollout / floor ms per rollout, a number anyone can recompute from the JSON.
The goal of the round-4 issue: the trimmed path within 3x of the floor. Tests never assert timings.
"""

from __future__ import annotations

import shutil
import statistics
import time
from pathlib import Path

import torch

from gradfidelity.harness.io import atomic_write_json
from gradfidelity.harness.provenance import cpu_model, package_versions
from gradfidelity.harness.seeding import seed_everything
from gradfidelity.harness.threads import configure_threads
from gradfidelity.stats.intervals import median_interval
from gradfidelity.studies.sft_rl import infra, models
from gradfidelity.studies.sft_rl.config import StudyConfig
from gradfidelity.studies.sft_rl.flops import flops

# round 3's RL path; the fill off alone; round 4's path (the fill off and the trim)
PATHS = ("padded", "padded_no_fill", "trimmed")
SFT_PATHS = ("fill", "no_fill")
GOAL_OVERHEAD = 3.0


def matmul_gflops(rows: int, inner: int, cols: int, reps: int = 20) -> float:
    """fp32 GFLOP/s of (rows x inner) @ (inner x cols) at the current thread count: median of `reps` timings."""
    a, b = torch.randn(rows, inner), torch.randn(inner, cols)
    a @ b  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2.0 * rows * inner * cols / statistics.median(times) / 1e9


def ratio_summary(num: list[float], den: list[float]) -> dict:
    """Per-round ratios num / den, their median and its interval."""
    ratios = [a / b for a, b in zip(num, den, strict=True)]
    iv = median_interval(ratios, 0.95)
    return {"median": iv.estimate, "ci95": [iv.low, iv.high], "per_round": ratios}


def set_fill(on: bool) -> None:
    torch.utils.deterministic.fill_uninitialized_memory = on


class _Alternate:
    """A TrainerCallback that switches the path before each step and times the step. A round is one step of each
    path; its order rotates from round to round (ABC, BCA, CAB, ...), so no path always runs first or after the same
    other. The first `warmup` steps are not recorded."""

    def __init__(self, apply, names: tuple[str, ...], warmup: int, counters=None):
        from transformers import TrainerCallback

        self.names, self.warmup, self.counters = names, warmup, counters
        self.times: dict[str, list[float]] = {n: [] for n in names}
        self.tokens: dict[str, list[tuple[int, int]]] = {n: [] for n in names}
        self.gen: dict[str, list[float]] = {n: [] for n in names}
        self.gen_s = 0.0
        outer, k = self, len(names)
        state = {"t0": 0.0, "name": names[0], "before": (0, 0)}

        class CB(TrainerCallback):
            def on_step_begin(self, args, st, control, **kw):
                rnd, pos = divmod(max(st.global_step - outer.warmup, 0), k)
                state["name"] = outer.names[(pos + rnd) % k]
                apply(state["name"])
                if outer.counters is not None:
                    state["before"] = (outer.counters.train, outer.counters.gen)
                outer.gen_s = 0.0
                state["t0"] = time.perf_counter()

            def on_step_end(self, args, st, control, **kw):
                dt = time.perf_counter() - state["t0"]
                if st.global_step <= outer.warmup:
                    return
                name = state["name"]
                outer.times[name].append(dt)
                outer.gen[name].append(outer.gen_s)
                if outer.counters is not None:
                    c, (train0, gen0) = outer.counters, state["before"]
                    outer.tokens[name].append((c.train - train0, c.gen - gen0))

        self.callback = CB()


def _rl_bench(cfg: StudyConfig, init: Path, work: Path, rounds: int, warmup: int) -> dict:
    from datasets import Dataset
    from trl import GRPOConfig

    from gradfidelity.studies.sft_rl.evaluate import checker
    from gradfidelity.studies.sft_rl.train import make_reward, rl_args, rl_problems
    from gradfidelity.studies.sft_rl.trainers import GFGRPOTrainer

    groups = cfg.rl.length_groups
    if groups < 1:
        raise ValueError("sft_rl bench: rl.length_groups is 0 (the trimmed path is off): nothing to compare")
    model, tok = models.load_checkpoint(init / "model")
    data = Dataset.from_list([{"prompt": p.prompt, "solution": p.solution, "answer": p.answer}
                              for p in rl_problems(cfg)])
    args = rl_args(cfg, "sft_then_rl", cfg.rl.lr, cfg.rl.loss_type, 1, work, seed=0)
    steps = warmup + len(PATHS) * rounds
    args.update(max_steps=steps, save_strategy="no", logging_steps=1)
    trainer = GFGRPOTrainer(model=model, args=GRPOConfig(**args), reward_funcs=make_reward(checker(cfg)),
                            train_dataset=data, processing_class=tok, length_groups=groups)

    def apply(name: str) -> None:
        set_fill(name == "padded")
        trainer.length_groups = groups if name == "trimmed" else 0

    alt = _Alternate(apply, PATHS, warmup, trainer.tokens)
    generate = trainer._generate_and_score_completions

    def timed_generate(inputs):  # the generation part of a step (sampling, rewards, advantages)
        t0 = time.perf_counter()
        out = generate(inputs)
        alt.gen_s += time.perf_counter() - t0
        return out

    trainer._generate_and_score_completions = timed_generate
    trainer.add_callback(alt.callback)
    trainer.train()
    rollouts = cfg.rl.prompts_per_step * cfg.rl.num_generations
    n = models.n_params(trainer.model)
    out = {"rollouts_per_step": rollouts, "length_groups": groups, "n_params": n, "steps_timed": len(PATHS) * rounds}
    for name in PATHS:
        t, g = alt.times[name], alt.gen[name]
        train_tok = sum(a for a, _ in alt.tokens[name])
        gen_tok = sum(b for _, b in alt.tokens[name])
        out[name] = {"ms_per_step": 1e3 * statistics.median(t), "ms_per_rollout": 1e3 * statistics.median(t) / rollouts,
                     "generation_ms_per_step": 1e3 * statistics.median(g),
                     "training_ms_per_step": 1e3 * statistics.median([a - b for a, b in zip(t, g, strict=True)]),
                     "train_tokens_per_rollout": train_tok / (len(t) * rollouts),
                     "gen_tokens_per_rollout": gen_tok / (len(t) * rollouts),
                     "flops_per_rollout": flops(n, train_tok, gen_tok) / (len(t) * rollouts),
                     "steps_s": t}
    out["ratio_trimmed_over_padded"] = ratio_summary(alt.times["trimmed"], alt.times["padded"])
    out["ratio_padded_no_fill_over_padded"] = ratio_summary(alt.times["padded_no_fill"], alt.times["padded"])
    out["ratio_trimmed_over_padded_no_fill"] = ratio_summary(alt.times["trimmed"], alt.times["padded_no_fill"])
    training = {n: [a - b for a, b in zip(alt.times[n], alt.gen[n], strict=True)] for n in PATHS}
    out["ratio_trimmed_over_padded_training_part"] = ratio_summary(training["trimmed"], training["padded"])
    return out


def _sft_bench(cfg: StudyConfig, init: Path, work: Path, rounds: int, warmup: int) -> dict:
    from datasets import Dataset
    from trl import SFTConfig

    from gradfidelity.studies.sft_rl.train import sft_args, train_problems
    from gradfidelity.studies.sft_rl.trainers import GFSFTTrainer

    model, tok = models.load_checkpoint(init / "model")
    data = Dataset.from_list([{"prompt": p.prompt, "completion": p.solution} for p in train_problems(cfg)])
    args = sft_args(cfg, work, seed=0)
    args.update(max_steps=warmup + len(SFT_PATHS) * rounds, save_strategy="no")
    trainer = GFSFTTrainer(model=model, args=SFTConfig(**args), train_dataset=data, processing_class=tok)
    alt = _Alternate(lambda name: set_fill(name == "fill"), SFT_PATHS, warmup, trainer.tokens)
    trainer.add_callback(alt.callback)
    trainer.train()
    n = models.n_params(trainer.model)
    out = {"sequences_per_step": cfg.sft.micro_batch_size * cfg.sft.grad_accum}
    for name in SFT_PATHS:
        t = alt.times[name]
        tok_step = sum(a for a, _ in alt.tokens[name]) / len(t)
        out[name] = {"ms_per_step": 1e3 * statistics.median(t), "train_tokens_per_step": tok_step,
                     "flops_per_step": flops(n, int(tok_step), 0), "steps_s": t}
    out["ratio_no_fill_over_fill"] = ratio_summary(alt.times["no_fill"], alt.times["fill"])
    return out


def run_bench(cfg: StudyConfig, init: Path, out: Path, rounds: int = 15, warmup: int = 2) -> dict:
    """The RL and SFT benches from `init` (an SFT run directory), the matmul rate between them, one JSON."""
    configure_threads(cfg.threads)
    seed_everything(0)  # deterministic algorithms on, as in every run (the fill is what the bench switches)
    version = infra.check_deepspeed_version(infra.Infra.of("fixed"), cfg.deepspeed)
    infra.process_env(version)
    hidden, inter = cfg.models[0].hidden_size, cfg.models[0].intermediate_size
    work = out.parent / f".{out.stem}_work"
    rl = _rl_bench(cfg, init, work, rounds, warmup)
    rows = int(rl["trimmed"]["train_tokens_per_rollout"] * rl["rollouts_per_step"])
    shapes = [(rows, hidden, inter), (rows, inter, hidden)]
    rates = [statistics.mean(matmul_gflops(*s) for s in shapes) for _ in range(5)]
    sft = _sft_bench(cfg, init, work, rounds, warmup)
    rates += [statistics.mean(matmul_gflops(*s) for s in shapes) for _ in range(5)]
    set_fill(False)
    rate = statistics.median(rates)
    floor = {}
    for name in PATHS:
        floor_ms = rl[name]["flops_per_rollout"] / (rate * 1e9) * 1e3
        floor[name] = {"floor_ms_per_rollout": floor_ms, "overhead": rl[name]["ms_per_rollout"] / floor_ms}
    for name in SFT_PATHS:
        floor_ms = sft[name]["flops_per_step"] / (rate * 1e9) * 1e3
        floor[f"sft_{name}"] = {"floor_ms_per_step": floor_ms, "overhead": sft[name]["ms_per_step"] / floor_ms}
    res = {
        "what": "study A RL and SFT steps: round 3's path against round 4's in one process (sft_rl/bench.py)",
        "init": str(init), "threads": cfg.threads, "model": cfg.models[0].name, "deepspeed_version": version,
        "rl": rl, "sft": sft,
        "matmul": {"gflops": rate, "gflops_rounds": rates, "shapes": shapes,
                   "note": "fp32 (rows x hidden) @ (hidden x intermediate) and back, the MLP of one step's "
                           "training forward; mean of the two per probe, median of 10 probes around the benches"},
        "floor": floor,
        "flop_count": "flops.py: 6 N per trained token + 2 N per generated token (N = all parameters)",
        "goal": {"trimmed_overhead_at_most": GOAL_OVERHEAD},
        "meets": {"trimmed_within_goal": floor["trimmed"]["overhead"] <= GOAL_OVERHEAD},
        "cpu": cpu_model(), "packages": package_versions(),
    }
    atomic_write_json(out, res)
    shutil.rmtree(work, ignore_errors=True)  # the trainers' output_dir: nothing is saved there (save_strategy no)
    return res
