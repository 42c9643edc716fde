"""One training run of study B (one cell, one seed) through the harness Run.

The delay is simulated in one process (delay.DelaySimulator); the pipeline equivalence test shows that this is
what the real multi-process pipeline computes. Everything in metrics.json is a pure function of (config, cell,
seed, threads): batches are drawn by (seed, step), checkpoints hold the model, the optimizer and the weight
history, so a killed and resumed run ends with the same numbers.

The LR: `lr~x<m>` cells (the selection grid) train at m x the default LR (config.DEFAULTS); `lr~tuned` cells read the
LR chosen on sync from the selection file (lr_select.py), `lr~own` cells the LR chosen on their own schedule (2bw,
or PipeDream at their depth). The head: `head~untied` unties the LM head from the embedding.
`epochs` = the share of the training split its batches draw (data.check_epochs refuses more than
`data.max_epochs`). The cell's wildcards go into the run's records (`Run(cell=...)`): the
aggregations read a run's identity there, never from its path.

Settings (config `train`, `delay`; chosen before any result was seen): warmup-stable-decay LR with 10% warmup and a
20% linear decay to 0.1x; sync_start K = 10% of the steps (the warmup), sync_cooldown K = 20% (the decay phase);
Taylor DC-ASGD-a with lambda0 2.0 and EMA 0.95 (the adaptive variant: a fixed lambda of 0.04 times g*g is
negligible at these gradient scales); no gradient clipping (a global-norm clip couples the pipeline stages).
"""

from __future__ import annotations

import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from gradfidelity.errors import UserError
from gradfidelity.harness import Run
from gradfidelity.studies.async_pp.config import DEFAULTS, DELAY_READERS, STUDY, StudyConfig
from gradfidelity.studies.async_pp.data import build_stream, check_epochs
from gradfidelity.studies.async_pp.delay import DelaySimulator, DelaySpec, model_loss_fn
from gradfidelity.studies.async_pp.lr_select import tuned_lr
from gradfidelity.studies.async_pp.model import DTYPES, build_model, lm_loss, n_params, stage_of_params
from gradfidelity.studies.async_pp.optimizers import build_optimizer, lr_factor, set_lr_factor
from gradfidelity.studies.async_pp.plan import OWN, TUNED, Cell, lr_multiplier


def delay_spec(cfg: StudyConfig, cell: Cell) -> DelaySpec:
    """Where the cell evaluates its gradient. The rule passes `delay` only to the cells whose mitigation reads it
    (rules.JOB_KEYS); the others take no setting from it: sync_start/sync_cooldown steps 0 and a Taylor lambda of 0,
    none of which a schedule without that mitigation reads."""
    d = cfg.delay
    if d is None:
        if cell.mitigation in DELAY_READERS:
            raise UserError(f"async_pp: mitigation {cell.mitigation} needs the config's `delay` section")
        return DelaySpec(schedule=cell.schedule, mitigation=cell.mitigation, depth=cell.depth, total_steps=cell.steps,
                         sync_start_steps=0, sync_cooldown_steps=0, taylor_lambda=0.0, taylor_adaptive=False,
                         taylor_ema=0.5)
    return DelaySpec(schedule=cell.schedule, mitigation=cell.mitigation, depth=cell.depth, total_steps=cell.steps,
                     sync_start_steps=round(d.sync_start_frac * cell.steps),
                     sync_cooldown_steps=round(d.sync_cooldown_frac * cell.steps),
                     taylor_lambda=d.taylor_lambda, taylor_adaptive=d.taylor_adaptive, taylor_ema=d.taylor_ema)


@torch.inference_mode()  # no autograd bookkeeping at all (no_grad still tracks versions); same kernels, same numbers
def evaluate(model, val_batches) -> float:
    return sum(float(lm_loss(model(x), y)) for x, y in val_batches) / len(val_batches)


def cell_lr(cell: Cell, lr_selection: str | None) -> float:
    if cell.lr in (TUNED, OWN):
        if not lr_selection:
            raise UserError(f"async_pp cell {cell.dir()}: lr~{cell.lr} needs the LR selection file (--lr-selection)")
        if cell.lr == TUNED:
            return tuned_lr(lr_selection, cell.optimizer, cell.momentum, width=cell.width)
        return tuned_lr(lr_selection, cell.optimizer, cell.momentum, cell.schedule, cell.depth, cell.width)
    return DEFAULTS[cell.optimizer]["lr"] * lr_multiplier(cell.lr)


def eval_steps(steps: int, evals: int) -> list[int]:
    """Steps (1-based, after the update) at which the run evaluates: evenly spaced and the last."""
    every = max(1, steps // evals)
    return sorted({t for t in range(every, steps + 1, every)} | {steps})


def run_cell(cfg: StudyConfig, cell: Cell, run_dir: str | Path, threads: int,
             lr_selection: str | None = None, data_dir: str | Path | None = None) -> Path:
    """Train `cell` in `run_dir` (metrics.json written last); `cfg` holds the sections rules.JOB_KEYS gives it;
    `data_dir` is the prepared corpus of a `file` corpus (the async_pp_data rule's output)."""
    cfg.need("model", "data", "train")
    tc = cfg.train
    out = Path(run_dir)
    spec = delay_spec(cfg, cell)  # validates schedule/mitigation before any work
    if cell.schedule.startswith("pipedream") and cell.head == "tied":
        raise UserError("async_pp: pipedream needs head~untied (a tied head cannot be fresh at the last stage)")
    lr = cell_lr(cell, lr_selection)
    record = {"cell": {k: getattr(cell, k) for k in cell.__dataclass_fields__}, "model": asdict(cfg.model),
              "data": asdict(cfg.data), "train": asdict(tc), "delay": asdict(cfg.delay) if cfg.delay else None,
              "lr": lr}
    # No memory sampler: study B reads no memory number, and the sampler's thread (a /proc read every 50 ms, holding
    # the GIL) competes with the one training thread for its core (issue 37's profile).
    with Run(out, study=STUDY, config=record, seed=cell.seed, threads=threads,
             checkpoint_every=tc.checkpoint_every, cell=cell.wildcards(), sample_memory=False) as run:
        stream = build_stream(cfg.data, tc.seq_len, tc.batch_size, cell.seed, data_dir)
        epochs = check_epochs(stream, cell.steps, cfg.data.max_epochs)
        base = cfg.model.at_width(cell.width) if cell.width else cfg.model  # the width ladder's model
        mcfg = replace(base, tie_embeddings=cell.head == "tied").with_vocab(stream.vocab_size)
        model = build_model(mcfg, seed=cell.seed, dtype=DTYPES[tc.dtype])
        opt = build_optimizer(cell.optimizer, list(model.named_parameters()), lr=lr,
                              momentum=cell.momentum)
        stages = stage_of_params(model, cell.depth) if cell.schedule.startswith("pipedream") else None
        sim = DelaySimulator(model, opt, spec, stages)
        state = {"model": model, "sim": sim}
        start, extra = run.resume(state)
        curve = extra.get("curve", [])  # [step, tokens, val_loss]
        train_loss = extra.get("train_loss", [])
        val_batches = stream.val_batches(tc.val_batches)
        tokens_per_step = tc.tokens_per_step
        warmup = round(tc.warmup_frac * cell.steps)
        decay = round(tc.decay_frac * cell.steps)
        at = set(eval_steps(cell.steps, tc.evals))
        t0 = time.perf_counter()
        for t in run.progress(range(start, cell.steps), desc=out.parent.name):
            x, y = stream.batch(t)
            set_lr_factor(opt, lr_factor(t, cell.steps, warmup, decay))
            loss = sim.step(t, model_loss_fn(model, [(x, y)], lm_loss))
            run.check_finite(loss, t)
            train_loss.append(loss)
            if t + 1 in at:
                val = evaluate(model, val_batches)
                run.check_finite(val, t, what="val_loss")
                curve.append([t + 1, (t + 1) * tokens_per_step, val])
            run.maybe_checkpoint(t + 1, state, extra={"curve": curve, "train_loss": train_loss})
        elapsed = time.perf_counter() - t0
        steps_done = cell.steps - start
        last = train_loss[-10:]
        run.finish({"final_val_loss": curve[-1][2], "curve": curve, "n_params": n_params(model), "lr": lr,
                    "tokens": cell.steps * tokens_per_step, "epochs": epochs,
                    "final_train_loss": sum(last) / len(last),
                    "max_delay": spec.max_delay},
                   timing={"step_s": elapsed / max(steps_done, 1),
                           "tokens_per_s": steps_done * tokens_per_step / max(elapsed, 1e-9)})
    return out
