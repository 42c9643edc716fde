"""The sizing pilot of the RL stage: one RL-stage arm on the selection seed, evaluated at several step counts.

Why: the cpu plan needs the number of rollouts at which RL improves on its start (the `rl_learns` gate: SFT-then-RL's
`id` accuracy above its SFT's, its training reward rising), before the run, on a seed that is not an evaluation
seed. One long run evaluated at steps k1 < k2 < ... gives what separate k-step runs would (constant LR, one RNG
stream: tests/sft_rl/test_reuse.py shows a run read at step k equals a run that stops there). It writes one JSON
(the start's accuracy, then per evaluation step the accuracies, the mean reward and zero-advantage fraction of the
steps since the previous one); the study's HISTORY.md, "Round 4 (issue 36)", has the pilot table made from it.
"""

from __future__ import annotations

import dataclasses
import shutil
import statistics
import time
from pathlib import Path

from gradfidelity.harness.io import atomic_write_json, read_json
from gradfidelity.harness.seeding import seed_everything
from gradfidelity.harness.threads import configure_threads
from gradfidelity.studies.sft_rl import infra, models
from gradfidelity.studies.sft_rl.config import StudyConfig
from gradfidelity.studies.sft_rl.evaluate import checker, evaluate_all


def run_pilot(cfg: StudyConfig, method: str, init: Path, lr: float, eval_steps: list[int], seed: int,
              out: Path) -> dict:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig

    from gradfidelity.studies.sft_rl.train import make_reward, no_memory_fill, rl_args, rl_problems
    from gradfidelity.studies.sft_rl.trainers import MIXED_TRAINERS, GFGRPOTrainer

    steps = sorted(set(eval_steps))
    if not steps or steps[0] < 1:
        raise ValueError(f"sft_rl pilot: evaluation steps must be >= 1, got {eval_steps}")
    configure_threads(cfg.threads)
    seed_everything(seed)
    no_memory_fill()
    version = infra.check_deepspeed_version(infra.Infra.of("fixed"), cfg.deepspeed)
    infra.process_env(version)
    start = read_json(init / "metrics.json")["metrics"]
    model, tok = models.load_checkpoint(init / "model")
    data = Dataset.from_list([{"prompt": p.prompt, "solution": p.solution, "answer": p.answer}
                              for p in rl_problems(cfg)])
    cfg = dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, steps=steps[-1]))
    args = rl_args(cfg, method, lr, cfg.rl.loss_type, 1, out.parent / f".{out.stem}_work", seed)
    args.update(save_strategy="no")
    extra = {"mixed": cfg.mixed} if method in MIXED_TRAINERS else {}
    trainer = MIXED_TRAINERS.get(method, GFGRPOTrainer)(
        model=model, args=GRPOConfig(**args), reward_funcs=make_reward(checker(cfg)), train_dataset=data,
        processing_class=tok, length_groups=cfg.rl.length_groups, **extra)
    trainer.check = checker(cfg)
    points: list[dict] = []
    t0 = time.perf_counter()

    class AtSteps(TrainerCallback):
        def on_step_end(self, a, state, control, model=None, **kw):
            if state.global_step not in steps:
                return
            hist = trainer.state.log_history
            prev = points[-1]["step"] if points else 0
            rewards = [h["reward"] for h in hist if "reward" in h][prev:state.global_step]
            zero = [h["frac_reward_zero_std"] for h in hist if "frac_reward_zero_std" in h][prev:state.global_step]
            points.append({"step": state.global_step,
                           "rollouts": state.global_step * cfg.rl.prompts_per_step * cfg.rl.num_generations,
                           "wall_s": time.perf_counter() - t0, "reward_since_last": statistics.fmean(rewards),
                           "zero_adv_since_last": statistics.fmean(zero) if zero else None,
                           **evaluate_all(model, tok, cfg)})

    trainer.add_callback(AtSteps())
    trainer.train()
    res = {"method": method, "init": str(init), "lr": lr, "seed": seed, "length_groups": cfg.rl.length_groups,
           "rollouts_per_step": cfg.rl.prompts_per_step * cfg.rl.num_generations,
           "start": {k: v for k, v in start.items() if k.startswith(("acc_", "nll_"))},
           "points": points, "deepspeed_version": version, "threads": cfg.threads}
    atomic_write_json(out, res)
    shutil.rmtree(out.parent / f".{out.stem}_work", ignore_errors=True)  # the Trainer's output_dir (nothing saved)
    return res
