"""One run per stage: pretrain the base model, SFT, or an RL-stage method, each inside the harness Run.

How the harness and TRL share the work (why):
- Run owns the run directory, seeding, thread count, provenance (which records the imported deepspeed version)
  and the diverged status. A TrainerCallback turns a non-finite logged loss into `Diverged`.
- Checkpoint/resume uses the Trainer's own checkpoints (`save_steps`, `resume_from_checkpoint`), not Run's
  state-dict checkpoint: with DeepSpeed the optimizer state lives in the engine's partitioned (and offloaded)
  buffers, which only the engine can save and restore; the Trainer's checkpoint also carries the RNG states, the
  LR scheduler, the data position and the log history. Our own extra state (token counters, ReLIFT's buffer) is
  written next to it by the same callback. A killed job rerun by Snakemake finds the last checkpoint and
  continues; metrics repeat because every random draw is restored.
- Several ranks (torchrun, `sft_rl.ranks`): every rank trains (the Trainer shards the data, DeepSpeed reduces the
  gradients); token counts are summed over ranks before FLOPs are computed; rank 0 alone evaluates and writes the
  model and the run's records, while the others wait at a barrier (harness.run: only rank 0 owns the directory).
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import torch
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from gradfidelity.errors import UserError
from gradfidelity.harness import Run
from gradfidelity.harness.integrity import CorruptState, verify_manifest, write_manifest
from gradfidelity.harness.io import read_json
from gradfidelity.harness.run import launch_rank
from gradfidelity.studies.sft_rl import infra, models, paper
from gradfidelity.studies.sft_rl.config import StudyConfig, stage_variant
from gradfidelity.studies.sft_rl.task import (
    EVAL_SETS,
    Problem,
    accuracy_table,
    fact_table,
    is_correct,
    make_split,
    pretrain_corpus,
)

STUDY = "sft_rl"
GF_STATE = "gf_state.json"


def _gf_state_name() -> str:
    """Each rank saves its own counters (they count that rank's tokens) next to the Trainer checkpoint."""
    rank, world = launch_rank()
    return GF_STATE if world == 1 else f"gf_state_rank{rank}.json"


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized() and launch_rank()[1] > 1


def summed_over_ranks(*counts: int) -> list[int]:
    """Token counts of every rank added up (a collective: every rank must call it at the same point)."""
    if not _distributed():
        return [int(c) for c in counts]
    t = torch.tensor(counts, dtype=torch.int64)
    torch.distributed.all_reduce(t)
    return t.tolist()


def _barrier() -> None:
    if _distributed():
        torch.distributed.barrier()


# ----------------------------------------------------------------------------- evaluation and FLOPs
@torch.no_grad()
def evaluate(model, tok, problems: list[Problem], batch_size: int, check=is_correct) -> list[bool]:
    """Greedy decoding (deterministic, draws no random numbers), exact-match answers."""
    was_training = model.training
    model.eval()
    max_new = max(len(p.solution) for p in problems) + 4
    out: list[bool] = []
    tok.padding_side = "left"
    for i in range(0, len(problems), batch_size):
        chunk = problems[i:i + batch_size]
        enc = tok([p.prompt for p in chunk], add_special_tokens=False, padding=True, return_tensors="pt")
        gen = model.generate(**enc, max_new_tokens=max_new, do_sample=False, pad_token_id=tok.pad_token_id,
                             eos_token_id=tok.eos_token_id)
        texts = tok.batch_decode(gen[:, enc["input_ids"].size(1):], skip_special_tokens=True)
        out += [check(t, p.answer) for t, p in zip(texts, chunk, strict=True)]
    model.train(was_training)
    return out


def train_problems(cfg: StudyConfig) -> list[Problem]:
    """The train split: generated arithmetic, or (paper scale) the LUFFY-style training set."""
    return make_split(cfg.task, "train") if cfg.data.source == "arithmetic" else paper.train_problems(cfg.data)


def eval_problems(cfg: StudyConfig) -> dict[str, list[Problem]]:
    if cfg.data.source == "arithmetic":
        return {s: make_split(cfg.task, s) for s in EVAL_SETS}
    return paper.eval_problems(cfg.data)


def checker(cfg: StudyConfig):
    """Exact match of the final answer: after '#' (arithmetic) or in the last \\boxed{} (paper data)."""
    return is_correct if cfg.data.source == "arithmetic" else paper.is_correct_boxed


@torch.no_grad()
def demo_nll(model, tok, problems: list[Problem], batch_size: int) -> float:
    """Held-out teacher-forced NLL (nats per token) of the demonstrations (solution + EOS) given their prompts:
    the low-noise secondary endpoint (no sampling, no exact-match threshold), a token mean over the whole set."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    eos, pad = tok.eos_token_id, tok.pad_token_id
    for i in range(0, len(problems), batch_size):
        chunk = problems[i:i + batch_size]
        prompts = tok([p.prompt for p in chunk], add_special_tokens=False)["input_ids"]
        demos = tok([p.solution for p in chunk], add_special_tokens=False)["input_ids"]
        seqs = [a + b + [eos] for a, b in zip(prompts, demos, strict=True)]
        length = max(len(x) for x in seqs)
        ids = torch.full((len(seqs), length), pad, dtype=torch.long)
        attn = torch.zeros_like(ids)
        target = torch.zeros_like(ids, dtype=torch.bool)  # tokens of the demonstration (+ EOS)
        for j, (x, a) in enumerate(zip(seqs, prompts, strict=True)):
            ids[j, :len(x)] = torch.tensor(x)
            attn[j, :len(x)] = 1
            target[j, len(a):len(x)] = True
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
        logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
        mask = target[:, 1:]
        total += float(-(logp * mask).sum())
        count += int(mask.sum())
    model.train(was_training)
    return total / max(count, 1)


def evaluate_all(model, tok, cfg: StudyConfig) -> dict[str, float]:
    """Exact-match accuracy per eval set (points) and the demonstrations' NLL per set (nats/token)."""
    check = checker(cfg)
    sets = eval_problems(cfg)
    out = accuracy_table({s: evaluate(model, tok, probs, cfg.eval_batch_size, check) for s, probs in sets.items()})
    nll = {f"nll_{s}": demo_nll(model, tok, probs, cfg.eval_batch_size) for s, probs in sets.items()}
    nll["nll_macro"] = sum(nll.values()) / len(nll)
    return {**out, **nll}


def fact_accuracy(model, tok, cfg: StudyConfig) -> dict[str, float]:
    """Greedy accuracy (points) on the whole operator-fact table, per operator: did pretraining teach the facts?
    (A diagnostic of the base model; every fact prompt has the same length, so one unpadded forward suffices.)"""
    import torch

    facts = fact_table(cfg.task)
    ids = torch.tensor([tok(p, add_special_tokens=False)["input_ids"] for p, _ in facts])
    model.eval()
    with torch.no_grad():
        guess = model(input_ids=ids).logits[:, -1].argmax(-1).tolist()
    right: dict[str, list[bool]] = {}
    for (prompt, answer), g in zip(facts, guess, strict=True):
        right.setdefault(prompt[1], []).append(tok.decode([g]) == answer)
    return {f"fact_acc_{op}": 100.0 * sum(r) / len(r) for op, r in right.items()}


def flops(n_params: int, train_tokens: int, gen_tokens: int) -> float:
    """Training ~6 x params x tokens (forward + backward), generation ~2 x params x tokens."""
    return 6.0 * n_params * train_tokens + 2.0 * n_params * gen_tokens


# ----------------------------------------------------------------------------- harness glue
class HarnessCallback(TrainerCallback):
    """NaN -> Diverged; our extra state (trainer.gf_state() plus `extras`) saved with every Trainer checkpoint."""

    def __init__(self, run: Run, trainer_ref: list, extras=None):
        self.run, self.trainer_ref, self.extras = run, trainer_ref, extras or (lambda: {})

    def on_log(self, args, state, control, logs=None, **kwargs):
        for key in ("loss", "reward"):
            if logs and key in logs:
                self.run.check_finite(logs[key], state.global_step, what=key)

    def on_save(self, args, state, control, **kwargs):
        trainer = self.trainer_ref[0]
        ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        (ckpt / _gf_state_name()).write_text(json.dumps({**trainer.gf_state(), "extras": self.extras()}))
        # Every rank has written its part (the Trainer's and ours) before rank 0 lists them in the manifest, which
        # _resume checks before trusting the checkpoint.
        _barrier()
        if self.run.primary:
            write_manifest(ckpt)
        _barrier()


class EvalAtStep(TrainerCallback):
    """Evaluate once at a given optimizer step (the truncated SFT-then-RL, read off the same run)."""

    def __init__(self, step: int, fn):
        self.step, self.fn, self.result = step, fn, None

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step == self.step:
            self.result = self.fn(model)


def _resume(trainer, trainer_dir: Path, run: Run) -> tuple[str | None, dict]:
    """(last Trainer checkpoint that passes its manifest check, or None; the extras saved with it).

    Newer checkpoints that fail the check (damaged, truncated, or cut off before their manifest was written) are
    moved aside by rank 0 with a log line and a note in provenance.json; the run resumes from the newest good one,
    or starts over. Every rank checks the same files, so every rank picks the same checkpoint.
    """
    ckpt = None
    found = sorted((p for p in trainer_dir.glob(f"{PREFIX_CHECKPOINT_DIR}-*") if p.is_dir()
                    and p.name.split("-")[-1].isdigit()), key=lambda p: int(p.name.split("-")[-1]), reverse=True)
    bad = []
    for candidate in found:
        try:
            verify_manifest(candidate)
        except CorruptState as exc:
            bad.append((candidate, exc.reason))
            continue
        ckpt = str(candidate)
        break
    _barrier()  # every rank has checked before any directory moves
    for candidate, reason in bad:
        run.discard_checkpoint(candidate, reason, move=run.primary)
    _barrier()
    if not ckpt:
        return None, {}
    state_file = Path(ckpt) / _gf_state_name()
    if not state_file.exists():
        raise UserError(f"{ckpt}: checkpoint without {state_file.name}; delete {trainer_dir} to start over")
    state = json.loads(state_file.read_text())
    trainer.gf_load_state(state)
    run.resumed_from = int(Path(ckpt).name.split("-")[-1])
    return ckpt, state.get("extras", {})


def common_args(cfg: StudyConfig, out: Path, seed: int) -> dict:
    save = cfg.checkpoint_every > 0
    # CPU where DeepSpeed is told to use its CPU accelerator (the smoke and cpu scales) or no GPU exists
    use_cpu = os.environ.get("DS_ACCELERATOR") == "cpu" or not torch.cuda.is_available()
    return dict(output_dir=str(out / "trainer"), bf16=False, use_cpu=use_cpu, report_to=[], logging_steps=1,
                seed=seed, data_seed=seed, dataloader_num_workers=0, save_strategy="steps" if save else "no",
                save_steps=cfg.checkpoint_every if save else 500, save_only_model=False,
                disable_tqdm=not sys.stderr.isatty())


def _history(trainer, key: str) -> list[float]:
    return [float(h[key]) for h in trainer.state.log_history if key in h]


def _finish(run: Run, model, tok, out: Path, metrics: dict, timing: dict) -> None:
    """Rank 0 saves the model and writes metrics.json; every rank then meets at a barrier, so no rank tears the
    process group down while rank 0 still evaluates or writes."""
    if run.primary:
        models.save_checkpoint(model, tok, out / "model")
    run.finish(metrics, timing=timing)
    _barrier()


def _ds_version() -> str | None:
    return infra.deepspeed_version()


# ----------------------------------------------------------------------------- pretraining (base model)
def run_pretrain(cfg: StudyConfig, model_name: str, out: Path, seed: int = 0) -> None:
    """Short causal-LM pretraining on unlabeled task text (plain Trainer, no DeepSpeed: not under study)."""
    from datasets import Dataset
    from trl import SFTConfig

    from gradfidelity.studies.sft_rl.trainers import GFSFTTrainer

    mcfg = cfg.model(model_name)
    if mcfg.hub_id:  # paper scale: the pretrained model is the base; save it as the shared checkpoint
        with Run(out, study=STUDY, config={"stage": "base", "model": model_name, **cfg.raw}, seed=seed,
                 threads=cfg.threads) as run:
            model, tok = models.load_pretrained(mcfg)
            _finish(run, model, tok, out, {"stage": "base", "model": model_name, "hub_id": mcfg.hub_id,
                                           "n_params": models.n_params(model), "flops": 0.0}, {})
        return
    with Run(out, study=STUDY, config={"stage": "pretrain", "model": model_name, **cfg.raw}, seed=seed,
             threads=cfg.threads) as run:
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
        trainer.train(resume_from_checkpoint=_resume(trainer, out / "trainer", run)[0])
        acc = {**evaluate_all(trainer.model, tok, cfg), **fact_accuracy(trainer.model, tok, cfg)}
        p = models.n_params(trainer.model)
        metrics = {**acc, "stage": "pretrain", "model": model_name, "n_params": p,
                   "train_tokens": trainer.tokens.train, "flops": flops(p, trainer.tokens.train, 0),
                   "loss_history": _history(trainer, "loss")}
        _finish(run, trainer.model, tok, out, metrics, {"train_runtime_s": trainer.state.log_history[-1].get(
            "train_runtime", math.nan)})


# ----------------------------------------------------------------------------- SFT
def run_sft(cfg: StudyConfig, model_name: str, variant: str, seed: int, base: Path, out: Path,
            overrides: dict | None = None, record: list | None = None) -> dict:
    """SFT with TRL's SFTTrainer on the demonstrations, on the infrastructure of `variant`.

    `overrides` replaces TrainingArguments fields and `record` collects the micro-batches in the order the
    Trainer fed them (the gradient probe uses both for one SGD step)."""
    from datasets import Dataset
    from trl import SFTConfig

    from gradfidelity.studies.sft_rl.trainers import GFSFTTrainer

    inf = infra.Infra.of(stage_variant(cfg, variant, "sft"))
    version = infra.check_deepspeed_version(inf, cfg.deepspeed)
    infra.process_env(version)
    run_cfg = {"stage": "sft", "model": model_name, "variant": variant, "infra": inf.variant, **cfg.raw}
    with Run(out, study=STUDY, config=run_cfg, seed=seed, threads=cfg.threads) as run:
        model, tok = models.load_checkpoint(base / "model")
        data = Dataset.from_list([{"prompt": p.prompt, "completion": p.solution} for p in train_problems(cfg)])
        s = cfg.sft
        kwargs = dict(per_device_train_batch_size=s.micro_batch_size, gradient_accumulation_steps=s.grad_accum,
                      max_steps=s.steps, learning_rate=s.lr, lr_scheduler_type="cosine", warmup_steps=s.warmup_ratio,
                      max_grad_norm=s.max_grad_norm, weight_decay=s.weight_decay, max_length=256,
                      deepspeed=infra.ds_config(cfg.deepspeed, s.lr, s.weight_decay), **common_args(cfg, out, seed))
        kwargs.update(overrides or {})
        ref: list = []
        trainer = GFSFTTrainer(model=model, args=SFTConfig(**kwargs), train_dataset=data, processing_class=tok,
                               callbacks=[HarnessCallback(run, ref)], per_micro_mean=inf.per_micro_mean)
        ref.append(trainer)
        trainer.recorded_inputs = record
        before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
        trainer.train(resume_from_checkpoint=_resume(trainer, out / "trainer", run)[0])
        p = models.n_params(trainer.model)
        (train_tokens,) = summed_over_ranks(trainer.tokens.train)
        metrics = {"stage": "sft", "method": "sft", "model": model_name, "variant": variant,
                   "infra": inf.variant, "deepspeed_version": version, "per_micro_mean": inf.per_micro_mean,
                   "grad_accum": kwargs["gradient_accumulation_steps"], "ranks": run.world_size,
                   "global_batch": kwargs["per_device_train_batch_size"] * kwargs["gradient_accumulation_steps"]
                   * run.world_size, "n_params": p, "train_tokens": train_tokens, "gen_tokens": 0,
                   "flops": flops(p, train_tokens, 0), "loss_history": _history(trainer, "loss"),
                   "grad_norm_history": _history(trainer, "grad_norm")}
        if overrides and overrides.get("max_steps") == 1:  # the probe: the exact update, no evaluation
            delta = {k: (v.detach() - before[k]).tolist() for k, v in trainer.model.named_parameters()}
            metrics["delta"] = delta
        elif run.primary:
            metrics.update(evaluate_all(trainer.model, tok, cfg))
        _finish(run, trainer.model, tok, out, metrics, {})
        return metrics


# ----------------------------------------------------------------------------- RL stage
def make_reward(check):
    def reward_exact(completions, answer, **kwargs) -> list[float]:
        """The verifiable reward: 1.0 iff the completion's final answer matches exactly."""
        return [float(check(c, a)) for c, a in zip(completions, answer, strict=True)]
    return reward_exact


def run_rl(cfg: StudyConfig, model_name: str, variant: str, method: str, seed: int, init: Path,
           out: Path) -> dict:
    """GRPO (rl, sft_then_rl) or a mixed-policy method from `init` (the base model or an SFT run).

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
    upstream_flops = init_metrics["metrics"]["flops"] if method == "sft_then_rl" else 0.0
    run_cfg = {"stage": "rl", "method": method, "model": model_name, "variant": variant, "infra": inf.variant,
               "init": str(init), **cfg.raw}
    with Run(out, study=STUDY, config=run_cfg, seed=seed, threads=cfg.threads) as run:
        model, tok = models.load_checkpoint(init / "model")
        data = Dataset.from_list([{"prompt": p.prompt, "solution": p.solution, "answer": p.answer}
                                  for p in train_problems(cfg)])
        r = cfg.rl
        loss_type = "bnpo" if inf.per_micro_mean else r.loss_type
        # prompts_per_step x num_generations rollouts per optimizer step in all, split evenly over the ranks
        rollouts, world = r.prompts_per_step * r.num_generations, run.world_size
        if rollouts % world:
            raise UserError(f"sft_rl.rl: prompts_per_step x num_generations = {rollouts} rollouts per step do not "
                            f"split over {world} ranks (sft_rl.ranks)")
        args = GRPOConfig(
            per_device_train_batch_size=rollouts // world, gradient_accumulation_steps=1,
            num_generations=r.num_generations, steps_per_generation=1, num_iterations=1,
            max_completion_length=r.max_completion_length, max_steps=r.steps, learning_rate=r.lr,
            lr_scheduler_type="constant", warmup_steps=0, beta=0.0, loss_type=loss_type,
            scale_rewards="none" if method == "luffy" else r.scale_rewards, temperature=r.temperature,
            max_grad_norm=r.max_grad_norm, use_vllm=False, log_completions=False,
            deepspeed=infra.ds_config(cfg.deepspeed, r.lr, 0.0), **common_args(cfg, out, seed))
        cls = MIXED_TRAINERS.get(method, GFGRPOTrainer)
        extra = {"mixed": cfg.mixed} if method in MIXED_TRAINERS else {}
        ref: list = []
        p = models.n_params(model)
        k = cfg.truncated_steps
        trunc = None
        if method == "sft_then_rl":
            def at_k(m):  # every rank reaches step k: the token sum is collective, the evaluation rank 0's
                train_k, gen_k = summed_over_ranks(ref[0].tokens.train, ref[0].tokens.gen)
                return {**(evaluate_all(m, tok, cfg) if run.primary else {}),
                        "flops": upstream_flops + flops(p, train_k, gen_k), "rl_steps": k}
            trunc = EvalAtStep(k, at_k)
        extras = (lambda: {"truncated": trunc.result}) if trunc is not None else None
        callbacks = [HarnessCallback(run, ref, extras)] + ([trunc] if trunc is not None else [])
        trainer = cls(model=model, args=args, reward_funcs=make_reward(checker(cfg)), train_dataset=data,
                      processing_class=tok, callbacks=callbacks, **extra)
        trainer.check = checker(cfg)
        ref.append(trainer)
        ckpt, saved = _resume(trainer, out / "trainer", run)
        if trunc is not None and saved.get("truncated") is not None:  # step k was before the kill
            trunc.result = saved["truncated"]
        trainer.train(resume_from_checkpoint=ckpt)
        train_tokens, gen_tokens = summed_over_ranks(trainer.tokens.train, trainer.tokens.gen)
        metrics = {"stage": "rl", "method": method, "model": model_name, "variant": variant,
                   "infra": inf.variant, "deepspeed_version": version, "loss_type": loss_type, "n_params": p,
                   "ranks": world, "init": str(init), "train_tokens": train_tokens, "gen_tokens": gen_tokens,
                   "flops": upstream_flops + flops(p, train_tokens, gen_tokens),
                   "upstream_flops": upstream_flops,
                   "reward_history": _history(trainer, "reward"), "loss_history": _history(trainer, "loss"),
                   **(evaluate_all(trainer.model, tok, cfg) if run.primary else {})}
        if trunc is not None:
            if trunc.result is None:
                raise RuntimeError(f"truncated evaluation at RL step {k} did not run")
            metrics["truncated"] = trunc.result
        _finish(run, trainer.model, tok, out, metrics, {})
        return metrics
