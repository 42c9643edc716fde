"""One cell inside the harness: pretrain the base model, SFT, or an RL-stage method, each a harness Run.

How the harness and TRL share the work (why):
- Run owns the run directory, seeding, thread count, provenance (which records the imported deepspeed version),
  the diverged status and the run's identity (its plan cell, with the stage it ran, which the aggregate reads).
- The Trainer's own checkpoints carry resume, with our extra state beside them (callbacks.py); a killed job rerun
  by Snakemake finds the last good checkpoint and continues; metrics repeat because every random draw is restored.
- Evaluation (evaluate.py) is greedy and FLOPs (flops.py) are counted from the trainers' token counts.
- Several ranks (torchrun, `sft_rl.ranks`): every rank trains (the Trainer shards the data, DeepSpeed reduces the
  gradients); token counts are summed over ranks before FLOPs are computed; rank 0 alone evaluates and writes the
  model and the run's records, while the others wait at a barrier (harness.run: only rank 0 owns the directory).
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import torch

from gradfidelity.errors import UserError
from gradfidelity.harness import Run
from gradfidelity.harness.io import read_json
from gradfidelity.studies.sft_rl import infra, models, paper
from gradfidelity.studies.sft_rl.callbacks import EvalAtSteps, HarnessCallback, StartCheckpoint, barrier, resume
from gradfidelity.studies.sft_rl.config import StudyConfig
from gradfidelity.studies.sft_rl.evaluate import checker, evaluate_all, evaluate_val, fact_accuracy
from gradfidelity.studies.sft_rl.flops import flops, summed_over_ranks
from gradfidelity.studies.sft_rl.plan import stage_variant
from gradfidelity.studies.sft_rl.task import Problem, make_split, pretrain_corpus

STUDY = "sft_rl"


def train_problems(cfg: StudyConfig) -> list[Problem]:
    """The train split: generated arithmetic, or (paper scale) the LUFFY-style training set."""
    return make_split(cfg.task, "train") if cfg.data.source == "arithmetic" else paper.train_problems(cfg.data)


def rl_problems(cfg: StudyConfig) -> list[Problem]:
    """The RL stage's prompts: a split of their own (`task.n_rl` > 0: disjoint from SFT's demonstrations and every
    held-out set), else the train split as in round 2 (SFT had memorised those: RL found little to reward)."""
    if cfg.data.source == "arithmetic" and cfg.task.n_rl > 0:
        return make_split(cfg.task, "rl")
    return train_problems(cfg)


def rl_lr(cfg: StudyConfig, model_name: str, method: str, lr: float | None, lr_selection: Path | None) -> float:
    """The RL stage's learning rate: a grid point (`lr`, the LR selection's runs), the arm's chosen LR (the
    selection file, lr_select.py), or `rl.lr` when the config selects none. Resolved before the run starts, so a
    missing or foreign selection file fails before any work."""
    if lr is not None and lr_selection is not None:
        raise UserError("sft_rl rl: give --lr (a grid run) or --lr-selection (a tuned run), not both")
    if lr is not None:
        return float(lr)
    if lr_selection is not None:
        from gradfidelity.studies.sft_rl.lr_select import tuned_lr

        return tuned_lr(str(lr_selection), model_name, method)
    if cfg.lr_selection is not None and cfg.lr_selection.enabled:
        raise UserError(f"sft_rl.lr_selection.lrs is set: the {method} run needs its chosen LR (--lr-selection)")
    return cfg.rl.lr


def common_args(cfg: StudyConfig, out: Path, seed: int) -> dict:
    save = cfg.checkpoint_every > 0
    # CPU where DeepSpeed is told to use its CPU accelerator (the smoke and cpu scales) or no GPU exists
    use_cpu = os.environ.get("DS_ACCELERATOR") == "cpu" or not torch.cuda.is_available()
    # gradient_checkpointing off: TRL's SFTConfig and GRPOConfig default it on (a memory saving for 7B models), which
    # recomputes every forward in the backward; the tiny models need no memory saving, and the gradient is the same
    return dict(output_dir=str(out / "trainer"), bf16=False, use_cpu=use_cpu, report_to=[], logging_steps=1,
                gradient_checkpointing=False,
                seed=seed, data_seed=seed, dataloader_num_workers=0, save_strategy="steps" if save else "no",
                save_steps=cfg.checkpoint_every if save else 500, save_only_model=False,
                disable_tqdm=not sys.stderr.isatty())


def sft_args(cfg: StudyConfig, out: Path, seed: int) -> dict:
    """SFTConfig fields of an SFT run (the bench builds the same trainer)."""
    s = cfg.sft
    return dict(per_device_train_batch_size=s.micro_batch_size, gradient_accumulation_steps=s.grad_accum,
                max_steps=s.steps, learning_rate=s.lr, lr_scheduler_type="cosine", warmup_steps=s.warmup_ratio,
                max_grad_norm=s.max_grad_norm, weight_decay=s.weight_decay, max_length=256,
                deepspeed=infra.ds_config(cfg.deepspeed, s.lr, s.weight_decay), **common_args(cfg, out, seed))


def rl_args(cfg: StudyConfig, method: str, lr: float, loss_type: str, world: int, out: Path, seed: int) -> dict:
    """GRPOConfig fields of an RL-stage run: prompts_per_step x num_generations rollouts per optimizer step in all,
    split evenly over the `world` ranks, one policy update per generation (GA 1), no KL term, constant LR."""
    r = cfg.rl
    rollouts = r.prompts_per_step * r.num_generations
    if rollouts % world:
        raise UserError(f"sft_rl.rl: prompts_per_step x num_generations = {rollouts} rollouts per step do not "
                        f"split over {world} ranks (sft_rl.ranks)")
    return dict(
        per_device_train_batch_size=rollouts // world, gradient_accumulation_steps=1,
        num_generations=r.num_generations, steps_per_generation=1, num_iterations=1,
        max_completion_length=r.max_completion_length, max_steps=r.steps, learning_rate=lr,
        lr_scheduler_type="constant", warmup_steps=0, beta=0.0, loss_type=loss_type,
        scale_rewards="none" if method == "luffy" else r.scale_rewards, temperature=r.temperature,
        max_grad_norm=r.max_grad_norm, use_vllm=False, log_completions=False,
        deepspeed=infra.ds_config(cfg.deepspeed, lr, 0.0), **common_args(cfg, out, seed))


def no_memory_fill() -> None:
    """Keep deterministic algorithms (seeded by the harness) but stop torch filling every new tensor with NaN.

    `torch.use_deterministic_algorithms(True)` also turns on `torch.utils.deterministic.fill_uninitialized_memory`,
    which writes NaN into every `torch.empty` so that a read of uninitialised memory cannot differ between runs. In
    the transformers forward and backward of these tiny models that fill was 35-40% of an RL step (profiled in
    round 4; it is not DeepSpeed's buffers, the cost stays without DeepSpeed). Every tensor the step reads is
    written first, so no number depends on it: the loss, reward and accuracy histories repeated bit for bit with
    it off (the study's HISTORY.md, "Round 4 (issue 36)")."""
    torch.utils.deterministic.fill_uninitialized_memory = False


def _history(trainer, key: str) -> list[float]:
    return [float(h[key]) for h in trainer.state.log_history if key in h]


def _finish(run: Run, model, tok, out: Path, metrics: dict, timing: dict) -> None:
    """Rank 0 saves the model and writes metrics.json; every rank then meets at a barrier, so no rank tears the
    process group down while rank 0 still evaluates or writes."""
    if run.primary:
        models.save_checkpoint(model, tok, out / "model")
        metrics["model_sha256"] = models.weights_digest(out / "model")
    run.finish(metrics, timing=timing)
    barrier()


# ----------------------------------------------------------------------------- pretraining (base model)
def run_pretrain(cfg: StudyConfig, model_name: str, out: Path, seed: int = 0, cell: dict | None = None) -> None:
    """Short causal-LM pretraining on unlabeled task text (plain Trainer, no DeepSpeed: not under study)."""
    from datasets import Dataset
    from trl import SFTConfig

    from gradfidelity.studies.sft_rl.trainers import GFSFTTrainer

    mcfg = cfg.model(model_name)
    if mcfg.hub_id:  # paper scale: the pretrained model is the base; save it as the shared checkpoint
        with Run(out, study=STUDY, config={"stage": "base", "model": model_name, **cfg.record()}, seed=seed,
                 threads=cfg.threads, cell={**(cell or {}), "stage": "base"}) as run:
            no_memory_fill()
            model, tok = models.load_pretrained(mcfg)
            _finish(run, model, tok, out, {"stage": "base", "model": model_name, "hub_id": mcfg.hub_id,
                                           "n_params": models.n_params(model), "flops": 0.0}, {})
        return
    with Run(out, study=STUDY, config={"stage": "pretrain", "model": model_name, **cfg.record()}, seed=seed,
             threads=cfg.threads, cell={**(cell or {}), "stage": "pretrain"}) as run:
        no_memory_fill()
        tok = models.build_tokenizer()
        model = models.build_tiny_model(mcfg, tok, seed)
        data = Dataset.from_list(pretrain_corpus(cfg.task))  # prompt/completion: loss on completions only
        args = SFTConfig(per_device_train_batch_size=cfg.pretrain.batch_size, max_steps=cfg.pretrain.steps,
                         learning_rate=cfg.pretrain.lr, lr_scheduler_type="cosine", warmup_steps=0.05,
                         max_length=mcfg.max_position, **common_args(cfg, out, seed))
        ref: list = []
        trainer = GFSFTTrainer(model=model, args=args, train_dataset=data, processing_class=tok,
                               callbacks=[HarnessCallback(run, ref)])
        ref.append(trainer)
        trainer.train(resume_from_checkpoint=resume(trainer, out / "trainer", run)[0])
        acc = {**evaluate_all(trainer.model, tok, cfg), **fact_accuracy(trainer.model, tok, cfg)}
        p = models.n_params(trainer.model)
        metrics = {**acc, "stage": "pretrain", "model": model_name, "n_params": p,
                   "train_tokens": trainer.tokens.train, "flops": flops(p, trainer.tokens.train, 0),
                   "loss_history": _history(trainer, "loss")}
        _finish(run, trainer.model, tok, out, metrics, {"train_runtime_s": trainer.state.log_history[-1].get(
            "train_runtime", math.nan)})


# ----------------------------------------------------------------------------- SFT
def run_sft(cfg: StudyConfig, model_name: str, variant: str, seed: int, base: Path, out: Path,
            overrides: dict | None = None, record: list | None = None, cell: dict | None = None) -> dict:
    """SFT with TRL's SFTTrainer on the demonstrations, on the infrastructure of `variant`.

    `overrides` replaces TrainingArguments fields and `record` collects the micro-batches in the order the
    Trainer fed them (the gradient probe uses both for one SGD step)."""
    from datasets import Dataset
    from trl import SFTConfig

    from gradfidelity.studies.sft_rl.trainers import GFSFTTrainer

    inf = infra.Infra.of(stage_variant(cfg, variant, "sft"))
    version = infra.check_deepspeed_version(inf, cfg.deepspeed)
    infra.process_env(version)
    run_cfg = {"stage": "sft", "model": model_name, "variant": variant, "infra": inf.variant, **cfg.record()}
    if (base / "metrics.json").is_file():  # a base made by the workflow: its weights are the ones its record names
        base_record = read_json(base / "metrics.json")
        models.check_weights(base / "model", base_record.get("metrics", {}).get("model_sha256"),
                             base / "metrics.json")
    with Run(out, study=STUDY, config=run_cfg, seed=seed, threads=cfg.threads,
             cell={**(cell or {}), "stage": "sft"}) as run:
        no_memory_fill()
        model, tok = models.load_checkpoint(base / "model")
        data = Dataset.from_list([{"prompt": p.prompt, "completion": p.solution} for p in train_problems(cfg)])
        kwargs = {**sft_args(cfg, out, seed), **(overrides or {})}
        ref: list = []
        probe = bool(overrides and overrides.get("max_steps") == 1)
        start = None if probe or not cfg.sft.start_every else _start_callback(cfg, run, ref, tok, out)
        callbacks = ([HarnessCallback(run, ref, lambda: {"start": start.state()}), start] if start is not None
                     else [HarnessCallback(run, ref)])
        trainer = GFSFTTrainer(model=model, args=SFTConfig(**kwargs), train_dataset=data, processing_class=tok,
                               callbacks=callbacks, per_micro_mean=inf.per_micro_mean)
        ref.append(trainer)
        trainer.recorded_inputs = record
        before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
        ckpt, saved = resume(trainer, out / "trainer", run)
        if start is not None:
            start.restore(saved.get("start"))
        trainer.train(resume_from_checkpoint=ckpt)
        p = models.n_params(trainer.model)
        (train_tokens,) = summed_over_ranks(trainer.tokens.train)
        metrics = {"stage": "sft", "method": "sft", "model": model_name, "variant": variant,
                   "infra": inf.variant, "deepspeed_version": version, "per_micro_mean": inf.per_micro_mean,
                   "grad_accum": kwargs["gradient_accumulation_steps"], "ranks": run.world_size,
                   "global_batch": kwargs["per_device_train_batch_size"] * kwargs["gradient_accumulation_steps"]
                   * run.world_size, "n_params": p, "train_tokens": train_tokens, "gen_tokens": 0,
                   "demo_tokens": summed_over_ranks(trainer.tokens.demo)[0],
                   "flops": flops(p, train_tokens, 0), "loss_history": _history(trainer, "loss"),
                   "grad_norm_history": _history(trainer, "grad_norm")}
        if probe:  # the probe: the exact update, no evaluation
            delta = {k: (v.detach() - before[k]).tolist() for k, v in trainer.model.named_parameters()}
            metrics["delta"] = delta
        elif run.primary:
            metrics.update(evaluate_all(trainer.model, tok, cfg))
            if start is not None:
                metrics.update(_start_metrics(cfg, start, out, p))
        _finish(run, trainer.model, tok, out, metrics, {})
        return metrics


START = "start"  # <sft run>/start/: the SFT-then-RL start's weights (sft.start_every)


def _start_callback(cfg: StudyConfig, run: Run, ref: list, tok, out: Path) -> StartCheckpoint:
    """The SFT-then-RL start rule inside an SFT run (callbacks.StartCheckpoint; `ref[0]` the trainer, for its token
    counts): rank 0 scores val and saves; with several ranks the score is sent to every rank so that all take the
    same decision."""
    def score(model, step):
        train_k, demo_k = summed_over_ranks(ref[0].tokens.train, ref[0].tokens.demo)
        acc = evaluate_val(model, tok, cfg)["acc_val"] if run.primary else None
        if run.world_size > 1:
            box = [acc]
            torch.distributed.broadcast_object_list(box, src=0)
            acc = box[0]
        return {"acc_val": acc, "train_tokens": train_k, "demo_tokens": demo_k}

    def save(model, step):
        if not run.primary:
            return None
        models.save_checkpoint(model, tok, out / START)
        return models.weights_digest(out / START)

    return StartCheckpoint(cfg.sft.start_every, cfg.sft.start_max_val, score, save)


def _start_metrics(cfg: StudyConfig, start: StartCheckpoint, out: Path, n_params: int) -> dict:
    """The start block of an SFT record: its step, its val score and what it cost (tokens, FLOPs), every score made
    on the way, and the start model evaluated on every set (the SFT-then-RL row's start, a paired reading); the
    weights on disk checked against the digest taken when they were saved."""
    step = start.check()
    at = start.results[str(step)]
    models.check_weights(out / START, at["model_sha256"], out / "metrics.json")
    model, tok = models.load_checkpoint(out / START)
    block = {**evaluate_all(model, tok, cfg), "step": step, "acc_val": at["acc_val"],
             "train_tokens": at["train_tokens"], "demo_tokens": at["demo_tokens"], "gen_tokens": 0,
             "flops": flops(n_params, at["train_tokens"], 0), "model_sha256": at["model_sha256"],
             "every": cfg.sft.start_every, "max_val": cfg.sft.start_max_val,
             "val_history": {k: v["acc_val"] for k, v in start.results.items()}}
    # scalars for the runs table beside the block
    return {"start": block, "start_step": step, "start_acc_val": at["acc_val"], "start_acc_id": block["acc_id"]}


# ----------------------------------------------------------------------------- RL stage
def make_reward(check):
    def reward_exact(completions, answer, **kwargs) -> list[float]:
        """The verifiable reward: 1.0 iff the completion's final answer matches exactly."""
        return [float(check(c, a)) for c, a in zip(completions, answer, strict=True)]
    return reward_exact


def run_rl(cfg: StudyConfig, model_name: str, variant: str, method: str, seed: int, init: Path,
           out: Path, cell: dict | None = None, lr: float | None = None, lr_selection: Path | None = None) -> dict:
    """GRPO (rl, sft_then_rl) or a mixed-policy method from `init` (the base model or an SFT run), at the learning
    rate `rl_lr` resolves (a grid point, the arm's chosen LR, or rl.lr).

    The whole generation batch is one micro-batch (GA 1), so on the RL stage TRL's `bnpo` (the per-micro-batch
    mean, used when `agg_bug` reaches this stage through bug_stages) equals `dapo`; the aggregation bug bites
    where GA > 1, i.e. in SFT. The DeepSpeed bug needs GA >= 3 as well (docs/sources.md, Study A)."""
    from datasets import Dataset
    from trl import GRPOConfig

    from gradfidelity.studies.sft_rl.trainers import MIXED_TRAINERS, GFGRPOTrainer

    inf = infra.Infra.of(stage_variant(cfg, variant, "rl"))
    version = infra.check_deepspeed_version(inf, cfg.deepspeed)
    infra.process_env(version)
    init_metrics = read_json(init / "metrics.json")
    if init_metrics.get("status") != "ok":
        raise UserError(f"{init}/metrics.json: the init run did not finish ok ({init_metrics.get('status')})")
    upstream = init_metrics["metrics"] if method == "sft_then_rl" else {}
    if upstream and "demo_tokens" not in upstream:
        raise UserError(f"{init}/metrics.json: the SFT run records no demo_tokens (made by older code; rerun it)")
    # SFT-then-RL starts from its SFT run's start where the run made one (sft.start_every), else from its end; the
    # upstream cost is the SFT run's up to that point. Either way the weights are checked against the record.
    start_block = upstream.get("start") if upstream else None
    init_model = init / (START if start_block else "model")
    models.check_weights(init_model, (start_block or init_metrics.get("metrics", {})).get("model_sha256"),
                         init / "metrics.json")
    if start_block:
        upstream = start_block
    upstream_flops = upstream["flops"] if upstream else 0.0
    upstream_demo = upstream["demo_tokens"] if upstream else 0
    selection_run = lr is not None  # an LR-grid run: scored on val alone, never on the eval sets
    lr = rl_lr(cfg, model_name, method, lr, lr_selection)
    run_cfg = {"stage": "rl", "method": method, "model": model_name, "variant": variant, "infra": inf.variant,
               "init": str(init), "lr": lr, **cfg.record()}
    with Run(out, study=STUDY, config=run_cfg, seed=seed, threads=cfg.threads,
             cell={**(cell or {}), "stage": "rl"}) as run:
        no_memory_fill()
        model, tok = models.load_checkpoint(init_model)
        data = Dataset.from_list([{"prompt": p.prompt, "solution": p.solution, "answer": p.answer}
                                  for p in rl_problems(cfg)])
        loss_type = "bnpo" if inf.per_micro_mean else cfg.rl.loss_type
        args = GRPOConfig(**rl_args(cfg, method, lr, loss_type, run.world_size, out, seed))
        cls = MIXED_TRAINERS.get(method, GFGRPOTrainer)
        extra = {"mixed": cfg.mixed} if method in MIXED_TRAINERS else {}
        extra["length_groups"] = cfg.rl.length_groups
        ref: list = []
        p = models.n_params(model)
        # evaluations inside the run: each smaller budget (rl.eval_steps) and, for SFT-then-RL, each budget's
        # truncation step; an LR-grid run is scored on val at its end alone
        at = None
        if not selection_run and cfg.eval_steps_of(method):
            def at_step(m, step):  # every rank reaches the step: the token sum is collective, the evaluation rank 0's
                train_k, gen_k, demo_k = summed_over_ranks(ref[0].tokens.train, ref[0].tokens.gen,
                                                           ref[0].tokens.demo)
                return {**(evaluate_all(m, tok, cfg) if run.primary else {}),
                        "flops": upstream_flops + flops(p, train_k, gen_k), "rl_steps": step,
                        "demo_tokens": upstream_demo + demo_k, "gen_tokens": gen_k}
            at = EvalAtSteps(cfg.eval_steps_of(method), at_step)
        extras = (lambda: {"at_step": at.results}) if at is not None else None
        callbacks = [HarnessCallback(run, ref, extras)] + ([at] if at is not None else [])
        trainer = cls(model=model, args=args, reward_funcs=make_reward(checker(cfg)), train_dataset=data,
                      processing_class=tok, callbacks=callbacks, **extra)
        trainer.check = checker(cfg)
        ref.append(trainer)
        ckpt, saved = resume(trainer, out / "trainer", run)
        if at is not None:  # the evaluations made before the kill
            at.restore(saved.get("at_step"))
        trainer.train(resume_from_checkpoint=ckpt)
        train_tokens, gen_tokens, demo_tokens = summed_over_ranks(trainer.tokens.train, trainer.tokens.gen,
                                                                  trainer.tokens.demo)
        metrics = {"stage": "rl", "method": method, "model": model_name, "variant": variant, "rl_steps": cfg.rl.steps,
                   "infra": inf.variant, "deepspeed_version": version, "loss_type": loss_type, "n_params": p,
                   "ranks": run.world_size, "init": str(init), "lr": lr, "train_tokens": train_tokens,
                   "gen_tokens": gen_tokens, "demo_tokens": upstream_demo + demo_tokens,
                   "flops": upstream_flops + flops(p, train_tokens, gen_tokens),
                   "upstream_flops": upstream_flops,
                   "reward_history": _history(trainer, "reward"), "loss_history": _history(trainer, "loss"),
                   # per step, the fraction of GRPO groups whose rollouts all got one reward (zero advantage), and
                   # its mean over the run (the runs table's zero_adv_share: how much of the stage had no signal)
                   "zero_adv_history": _history(trainer, "frac_reward_zero_std")}
        metrics["zero_adv_share"] = (sum(metrics["zero_adv_history"]) / len(metrics["zero_adv_history"])
                                     if metrics["zero_adv_history"] else None)
        if method == "sft_then_rl":  # the SFT step it started from (None: the SFT run's end)
            metrics["start_step"] = start_block["step"] if start_block else None
        if run.primary:
            metrics.update(evaluate_val(trainer.model, tok, cfg) if selection_run else
                           evaluate_all(trainer.model, tok, cfg))
        if at is not None:
            metrics["at_step"] = at.check()
        if method == "sft_then_rl" and not selection_run:  # the truncated arm at the full budget, as before
            metrics["truncated"] = metrics["at_step"][str(cfg.truncated_steps)]
        _finish(run, trainer.model, tok, out, metrics, {})
        return metrics
