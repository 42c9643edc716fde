"""One probe case: the DeepSpeed settings of one fault-matrix row (or of one user audit) plus the probe's shape.

Why a module of its own, torch-free: the plan (`plan.cases`), the user audit (`userconfig`), the rank processes
(`worker`, which rebuild the cases from a JSON payload with `gradfidelity.config.build`) and the table rows all
share it, and the plan must be importable by the workflow without torch or DeepSpeed. A case is a cell of the
matrix, not configuration: its defaults are the probe's, not the study's (those live in the schema).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Probe cost per backward call per rank, everything included (DeepSpeed's forward/backward/hooks, the plain-torch
# reference columns, the per-step analysis): measured on the 2-core reference machine, ZeRO-2 + CPU offload, GA 5000,
# 3 steps + the clip case (20,000 calls in 86.7 s, 2026-12-02). Used for the audit's up-front estimate and to scale
# the hang detector's limit for a long case, never for a verdict.
SECONDS_PER_BACKWARD = 0.0045


@dataclass(frozen=True)
class DSCase:
    """One row of the fault matrix (or one user audit): DeepSpeed settings plus the probe shape."""

    zero_stage: int
    offload: str  # "none" | "cpu"
    ga: int
    dtype: str  # "fp32" | "bf16"
    backward_calls: int = 1
    micro_batch: int = 2
    clip: float | None = 0.0  # gradient_clipping; None = left out of the config (the version's default applies)
    zero_extra: tuple[tuple[str, Any], ...] = ()  # extra zero_optimization items of a user config, sorted pairs
    steps: int = 1  # consecutive optimizer steps
    boundary: str = "manual"  # multi-backward only: "manual" (set_gradient_accumulation_boundary) | "none"
    target_norm: float = 0.25  # faithful gradient norm per step (below every threshold, or 2x it: the clip case)

    def spec(self, world: int):
        """The probe's shape on `world` ranks (probe.ProbeSpec; imported here, so this module stays torch-free)."""
        from gradfidelity.studies.ds_audit.probe import ProbeSpec

        return ProbeSpec(ga=self.ga, world=world, backward_calls=self.backward_calls, micro_batch=self.micro_batch,
                         dtype=self.dtype, steps=self.steps, target_norm=self.target_norm)

    @property
    def backward_total(self) -> int:
        """Backward calls per rank over the whole case: what its run time grows with."""
        return self.ga * self.backward_calls * self.steps

    @property
    def contiguous_gradients(self) -> bool:
        """What DeepSpeed uses: the config value (default true), forced on by optimizer offload (stage_1_and_2.py)."""
        return bool(dict(self.zero_extra).get("contiguous_gradients", True)) or self.offload != "none"

    def ds_config(self, world: int) -> dict:
        zero = dict(self.zero_extra)
        zero["stage"] = self.zero_stage
        if self.offload == "none":
            zero.pop("offload_optimizer", None)
        else:
            zero["offload_optimizer"] = {**zero.get("offload_optimizer", {}), "device": self.offload}
        out = {
            "train_micro_batch_size_per_gpu": self.micro_batch,
            "gradient_accumulation_steps": self.ga,
            "train_batch_size": self.micro_batch * self.ga * world,
            "zero_optimization": zero,
            "bf16": {"enabled": self.dtype == "bf16"},
            "zero_allow_untested_optimizer": True,
            "zero_force_ds_cpu_optimizer": False,
            "steps_per_print": 1 << 30,
            "wall_clock_breakdown": False,
        }
        if self.clip is not None:
            out["gradient_clipping"] = self.clip
        return out


def case_from_json(payload: dict, where: str = "case") -> DSCase:
    """A case rebuilt from its `asdict` JSON (a worker's job list, a group run's metrics.json), by the one builder."""
    from gradfidelity.config import build

    return build(DSCase, payload, where)
