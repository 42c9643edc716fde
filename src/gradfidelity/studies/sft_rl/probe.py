"""The gradient probe: one optimizer step of the real SFT path (TRL SFTTrainer -> Accelerate -> DeepSpeed ZeRO-2
with CPU optimizer offload), with SGD at lr 1 and no clipping, so the parameter change is exactly minus the
gradient DeepSpeed handed to the optimizer.

Why a probe and not only the training runs: a test can then compare that applied gradient with a plain-torch
reference computed from the very micro-batches the Trainer drew (recorded in order): `fixed` must equal the
global token mean over all GA micro-batches; under deepspeed 0.18.9 it must not (the accumulation bug:
docs/sources.md, Study A).

Under torchrun with W ranks (the launch path of the paper scale, `sft_rl.ranks`) the same probe takes GA x W
demonstrations, one optimizer step over all ranks: rank 0 writes probe.pt (the parameter change and its own
micro-batches), every other rank r its micro-batches to batches_rank<r>.pt.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from gradfidelity.errors import UserError
from gradfidelity.harness.integrity import save_checkpoint
from gradfidelity.harness.run import launch_rank
from gradfidelity.studies.sft_rl import models
from gradfidelity.studies.sft_rl.config import load
from gradfidelity.studies.sft_rl.train import run_sft

GA = 8
PROBE_CFG = {
    "models": [{"name": "probe", "arch": "qwen2", "hidden_size": 32, "num_layers": 1, "num_heads": 2,
                "num_kv_heads": 1, "intermediate_size": 64}],
    "seeds": [0], "methods": ["sft"], "variants": ["fixed", "ds_bug", "agg_bug", "both"], "bug_stages": ["sft"],
    "task": {"n_train": GA, "n_eval": 4, "train_ops": [1, 6]},
    "sft": {"steps": 1, "micro_batch_size": 1, "grad_accum": GA, "lr": 1.0, "max_grad_norm": 0.0},
    "deepspeed": {"enabled": True, "zero_stage": 2, "offload_optimizer": "cpu", "optimizer": "torch_adamw",
                  "bucket_size": 2_000_000},
}
# One plain SGD step: lr 1, constant schedule, no warmup, no weight decay, no clipping.
OVERRIDES = {"optim": "sgd", "learning_rate": 1.0, "lr_scheduler_type": "constant", "warmup_steps": 0,
             "max_steps": 1, "max_grad_norm": 0.0, "weight_decay": 0.0}


def _wait_for(path: Path, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise UserError(f"{path} did not appear within {timeout_s:g} s (rank 0 writes it; did rank 0 fail?)")
        time.sleep(0.2)


def run_probe(variants: str, out: Path) -> None:
    """For each variant (comma-separated): a 1-step SFT run under `out/<variant>/`, plus `probe.pt` holding the
    parameter change and the recorded micro-batches."""
    rank, world = launch_rank()
    cfg = load({**PROBE_CFG, "task": {**PROBE_CFG["task"], "n_train": GA * world}})
    base = out / "base"
    if rank == 0 and not (base / "model" / "config.json").exists():
        tok = models.build_tokenizer()
        models.save_checkpoint(models.build_tiny_model(cfg.models[0], tok, seed=0), tok, base / "model")
    _wait_for(base / "model" / "config.json")  # the other ranks start from rank 0's base (renamed into place whole)
    for variant in variants.split(","):
        record: list = []
        metrics = run_sft(cfg, "probe", variant, 0, base, out / variant, overrides=OVERRIDES, record=record)
        if rank == 0:
            save_checkpoint(out / variant / "probe.pt", {
                "variant": variant, "deepspeed_version": metrics["deepspeed_version"], "world_size": world,
                "delta": {k: torch.tensor(v) for k, v in metrics["delta"].items()},
                "batches": record,
            })
        else:
            save_checkpoint(out / variant / f"batches_rank{rank}.pt", {"rank": rank, "batches": record})
