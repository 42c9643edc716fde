"""Gradient alignment of real SFT micro-batches: the Gram matrices ds_audit's A3 reads for the paper's "about 2/N".

Why this exists: under the DeepSpeed 0.15.2-0.18.9 ZeRO-1/2 + CPU-offload bug the optimizer of an N-micro-batch
window receives g0 + g(N-1), and the paper says its norm is "about 2/N" of the true one. That number is not a property
of DeepSpeed (ds_audit measures what DeepSpeed does, exactly) but of how aligned the micro-batch gradients are:
N identical gradients give ||g0 + g(N-1)|| / ||sum g_i|| = 2/N, N orthogonal gradients of equal norm give sqrt(2/N).
So it is measured here, on the study's own data, where the bug would act: the first `alignment_windows` optimizer
windows of SFT (the `fixed` variant's global token mean, TRL's own `get_batch_samples` and `compute_loss`), at the
base model SFT starts from, in the Trainer's data order of seed 0 and with `sft.micro_batch_size` x `sft.grad_accum`.

The output is the Gram matrix <g_i, g_j> (float64) of each window's per-micro-batch gradients: every norm of a sum of
micro-batch gradients follows from it, and ds_audit reads it as a file (studies never import each other).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from gradfidelity.errors import UserError
from gradfidelity.harness import Run
from gradfidelity.studies.sft_rl import models
from gradfidelity.studies.sft_rl.config import StudyConfig
from gradfidelity.studies.sft_rl.train import STUDY, common_args, train_problems


def _flat_grad(params: list[torch.nn.Parameter]) -> torch.Tensor:
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten().double() for p in params])


def window_grams(trainer, windows: int, ga: int) -> list[torch.Tensor]:
    """[windows] Gram matrices (ga x ga, float64) of the per-micro-batch gradients of the Trainer's first windows,
    each micro-batch's loss scaled by the window's token count exactly as the Trainer scales it."""
    model = trainer.model
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    batches = iter(trainer.get_train_dataloader())
    grams = []
    for w in range(windows):
        micro, num_items = trainer.get_batch_samples(batches, ga, torch.device("cpu"))
        if len(micro) < ga:
            raise UserError(f"sft_rl.alignment_windows: the SFT data has only {w} full windows of {ga} micro-batches")
        grads = []
        for inputs in micro:
            model.zero_grad(set_to_none=True)
            loss = trainer.compute_loss(model, trainer._prepare_inputs(inputs), num_items_in_batch=num_items)
            loss.backward()
            grads.append(_flat_grad(params))
        g = torch.stack(grads)  # [ga, n_params]
        grams.append(g @ g.T)
    model.zero_grad(set_to_none=True)
    return grams


def sft_trainer(cfg: StudyConfig, base: Path, trainer_dir: Path, seed: int = 0):
    """The SFT Trainer of the `fixed` variant on the base model (no DeepSpeed: alignment does not depend on it),
    with the study's data, micro-batching and data order; it is never trained."""
    from datasets import Dataset
    from trl import SFTConfig

    from gradfidelity.studies.sft_rl.trainers import GFSFTTrainer

    s = cfg.sft
    model, tok = models.load_checkpoint(base / "model")
    data = Dataset.from_list([{"prompt": p.prompt, "completion": p.solution} for p in train_problems(cfg)])
    args = SFTConfig(per_device_train_batch_size=s.micro_batch_size, gradient_accumulation_steps=s.grad_accum,
                     max_steps=1, learning_rate=s.lr, max_length=256,
                     **{**common_args(cfg, trainer_dir, seed), "save_strategy": "no"})
    return GFSFTTrainer(model=model, args=args, train_dataset=data, processing_class=tok)


def run_alignment(cfg: StudyConfig, model_name: str, base: Path, out: Path, seed: int = 0,
                  cell: dict | None = None) -> dict:
    """The alignment run: `cfg.alignment_windows` Gram matrices in `out/metrics.json` (harness Run)."""
    s, windows = cfg.sft, cfg.alignment_windows
    run_cfg = {"stage": "alignment", "model": model_name, **cfg.record()}
    with Run(out, study=STUDY, config=run_cfg, seed=seed, threads=cfg.threads,
             cell={**(cell or {}), "stage": "alignment"}) as run, \
            tempfile.TemporaryDirectory(prefix="gf_align_") as tmp:
        trainer = sft_trainer(cfg, base, Path(tmp), seed)
        grams = window_grams(trainer, windows, s.grad_accum)
        metrics = {"stage": "alignment", "model": model_name, "micro_batch_size": s.micro_batch_size,
                   "grad_accum": s.grad_accum, "windows": windows, "n_params": models.n_params(trainer.model),
                   "data_seed": seed, "grams": [g.tolist() for g in grams]}
        run.finish(metrics)
    return metrics
