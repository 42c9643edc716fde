"""Infrastructure variants: which DeepSpeed and which loss aggregation a training stage runs on.

    fixed    deepspeed 0.19.x (PR #7967 in), global token mean over the accumulation window
    ds_bug   deepspeed 0.18.9 (the CPU-offload accumulation bug; docs/sources.md, Study A), global token mean
    agg_bug  deepspeed 0.19.x, per-micro-batch token mean scaled by 1/GA (OpenRLHF before its fix)
    both     deepspeed 0.18.9 and the per-micro-batch mean

Every variant runs the same ZeRO-2 + CPU optimizer offload engine through the Trainer's DeepSpeed integration
(Accelerate), so the only differences are the library version and the loss aggregation. The version is not
chosen in Python: the Snakemake rule puts the 0.18.9 overlay first on PYTHONPATH (`{DS0189_ENV}`), and
`check_deepspeed_version` refuses to train when the imported deepspeed does not match the variant, so a
mislabelled run cannot happen silently.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from gradfidelity.errors import UserError
from gradfidelity.harness.extensions import use_deepspeed_extensions_dir
from gradfidelity.studies.sft_rl.config import DeepSpeedConfig
from gradfidelity.studies.sft_rl.plan import VARIANTS

BUGGY_DS = "0.18.9"


@dataclass(frozen=True)
class Infra:
    variant: str
    ds_buggy: bool      # expects deepspeed 0.18.9
    per_micro_mean: bool  # loss aggregation bug

    @classmethod
    def of(cls, variant: str) -> Infra:
        if variant not in VARIANTS:
            raise UserError(f"sft_rl variant {variant!r}: expected one of {list(VARIANTS)}")
        return cls(variant, variant in ("ds_bug", "both"), variant in ("agg_bug", "both"))


def ds_config(cfg: DeepSpeedConfig, lr: float, weight_decay: float) -> dict | None:
    """The DeepSpeed JSON handed to TrainingArguments(deepspeed=...); 'auto' fields come from the Trainer."""
    if not cfg.enabled:
        return None
    zero: dict = {"stage": cfg.zero_stage, "contiguous_gradients": True, "overlap_comm": False,
                  "reduce_bucket_size": cfg.bucket_size, "allgather_bucket_size": cfg.bucket_size}
    if cfg.offload_optimizer == "cpu":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
    out = {
        "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto", "gradient_clipping": "auto",
        "zero_optimization": zero, "bf16": {"enabled": False}, "fp16": {"enabled": False},
        # a client optimizer (torch AdamW) together with offload needs both of these (DeepSpeed refuses it otherwise)
        "zero_allow_untested_optimizer": True, "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 10**9, "wall_clock_breakdown": False,
    }
    if cfg.optimizer == "ds_cpu_adam":
        out["optimizer"] = {"type": "AdamW", "params": {"lr": lr, "weight_decay": weight_decay,
                                                         "betas": [0.9, 0.999], "eps": 1e-8}}
    return out


def process_env(version: str | None = None) -> None:
    """DeepSpeed wants a process group even on one process: set the rendezvous variables of a one-rank group
    unless a launcher (torchrun) already set them, and give each deepspeed version its own JIT-extension cache
    (see gradfidelity.harness.extensions). The accelerator is left to DeepSpeed's detection (the workflow sets
    DS_ACCELERATOR=cpu on the CPU scales; on a GPU node DeepSpeed finds the GPUs)."""
    if version:
        use_deepspeed_extensions_dir(version)
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    for key, val in {"MASTER_ADDR": "127.0.0.1", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
                     "LOCAL_WORLD_SIZE": "1"}.items():
        os.environ.setdefault(key, val)


def deepspeed_version() -> str | None:
    try:
        import deepspeed
    except ImportError:
        return None
    return deepspeed.__version__


def check_deepspeed_version(infra: Infra, cfg: DeepSpeedConfig) -> str | None:
    """Refuse a run whose imported deepspeed contradicts its variant (e.g. ds_bug without the overlay)."""
    if not cfg.enabled:
        if infra.ds_buggy:
            raise UserError(f"variant {infra.variant} needs deepspeed (sft_rl.deepspeed.enabled is false)")
        return None
    version = deepspeed_version()
    if version is None:
        raise UserError("sft_rl.deepspeed.enabled is true but deepspeed is not importable")
    if infra.ds_buggy and version != BUGGY_DS:
        raise UserError(f"variant {infra.variant} needs deepspeed {BUGGY_DS} (run with the DS0189 overlay on "
                        f"PYTHONPATH); imported {version}")
    if not infra.ds_buggy and tuple(int(x) for x in version.split(".")[:2]) < (0, 19):
        raise UserError(f"variant {infra.variant} needs deepspeed >= 0.19.0 (the fixed release); imported {version}")
    return version
