"""One probe step through the real `deepspeed.initialize` (CPU accelerator, gloo).

Why a client optimizer: SGD(lr=1) makes the parameter delta equal to the applied gradient. DeepSpeed replaces a
client optimizer by DeepSpeedCPUAdam under offload unless `zero_force_ds_cpu_optimizer` is false, and refuses an
optimizer it has not tested under ZeRO unless `zero_allow_untested_optimizer` is true. The bug sits in
the ZeRO wrapper's gradient buffers, not in the inner optimizer, so SGD sees exactly what Adam would.

Each micro-step does `engine(x, k)`, `engine.backward(loss)` (backward_calls times: >1 is the PR #7981 case, with
`engine.set_gradient_accumulation_boundary(False)` before every backward but the last, the documented way, #7665, to
accumulate several backward() calls into one step with GA 1) and `engine.step()`; DeepSpeed steps the optimizer
at the accumulation boundary, once. The step runs under
`torch.no_grad()`: with several ranks, torch 2.13's gloo `all_gather_single` writes the updated partitions into
views produced by `split` and autograd refuses that in grad mode ("Output 0 of Split is a view and is being modified
inplace", the failure an unguarded two-rank step hits). An optimizer step is never differentiated, so no_grad
changes nothing else; the gradients were accumulated before, during backward().
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass

import torch

from gradfidelity.studies.ds_audit.probe import (
    DTYPES,
    ProbeResult,
    ProbeSpec,
    TaggedRegression,
    analyse,
    loss_fn,
    micro_batch,
    reference,
)


@dataclass(frozen=True)
class DSCase:
    """One row of the fault matrix (or one user audit): DeepSpeed settings plus the probe shape."""

    zero_stage: int
    offload: str  # "none" | "cpu"
    ga: int
    dtype: str  # "fp32" | "bf16"
    backward_calls: int = 1
    micro_batch: int = 2
    clip: float = 0.0
    zero_extra: tuple = ()  # extra zero_optimization items from a user config, as sorted (key, value) pairs

    def spec(self, world: int) -> ProbeSpec:
        return ProbeSpec(
            ga=self.ga,
            world=world,
            backward_calls=self.backward_calls,
            micro_batch=self.micro_batch,
            dtype=self.dtype,
            clip=self.clip,
        )

    def ds_config(self, world: int) -> dict:
        zero = dict(self.zero_extra)
        zero["stage"] = self.zero_stage
        if self.offload == "none":
            zero.pop("offload_optimizer", None)
        else:
            zero["offload_optimizer"] = {**zero.get("offload_optimizer", {}), "device": self.offload}
        return {
            "train_micro_batch_size_per_gpu": self.micro_batch,
            "gradient_accumulation_steps": self.ga,
            "train_batch_size": self.micro_batch * self.ga * world,
            "zero_optimization": zero,
            "bf16": {"enabled": self.dtype == "bf16"},
            "gradient_clipping": self.clip,
            "zero_allow_untested_optimizer": True,
            "zero_force_ds_cpu_optimizer": False,
            "steps_per_print": 1 << 30,
            "wall_clock_breakdown": False,
        }


def init_distributed() -> tuple[int, int]:
    """Join (or create) the gloo process group from RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT/LOCAL_RANK."""
    import deepspeed
    import torch.distributed as dist

    for key, default in (("MASTER_ADDR", "127.0.0.1"), ("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        os.environ.setdefault(key, default)
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 20000))
    if not dist.is_initialized():
        deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    return dist.get_rank(), dist.get_world_size()


def _full_params(engine, model: TaggedRegression) -> torch.Tensor:
    """Flat fp32 master parameters (P,) on every rank: the optimizer's own copy when DeepSpeed keeps one
    (ZeRO-1/2/3, bf16), else the module parameters (ZeRO-0 fp32). Collective under ZeRO: call on every rank."""
    from deepspeed.utils import safe_get_full_fp32_param

    out = []
    for p in (model.w, model.tag):
        hp = safe_get_full_fp32_param(p)
        out.append((p.detach() if hp is None else hp).float().reshape(-1).cpu())
    return torch.cat(out)


def run_case(case: DSCase) -> ProbeResult:
    """One optimizer step of the probe under DeepSpeed on this rank; every rank gets the same result."""
    import deepspeed

    rank, world = init_distributed()
    spec = case.spec(world)
    ref = reference(spec)
    torch.manual_seed(0)
    model = TaggedRegression(spec.dim, spec.n_slots, spec.tag_scale)
    opt = torch.optim.SGD(model.parameters(), lr=1.0, momentum=0.0, weight_decay=0.0)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=case.ds_config(world))
    try:
        before = _full_params(engine, model)
        for m in range(spec.ga):
            for call in range(spec.backward_calls):
                if spec.backward_calls > 1:  # the documented multi-backward API (#7665): boundary on the last only
                    engine.set_gradient_accumulation_boundary(call == spec.backward_calls - 1)
                k = spec.slot(rank, m, call)
                x, y = micro_batch(spec, k, ref.y_scale)
                loss = loss_fn(engine(x.to(DTYPES[spec.dtype]), k), y)
                engine.backward(loss)
            with torch.no_grad():  # see the module docstring: gloo all_gather into split views under grad mode
                engine.step()
        steps = engine.global_steps
        norm = engine.get_global_grad_norm()
        norm = None if norm is None else float(norm)
        after = _full_params(engine, model)
        result = analyse(spec, ref, before, after, norm)
        result.extra = {"optimizer_steps": int(steps), "deepspeed": deepspeed.__version__}
        return result
    finally:
        if hasattr(engine, "destroy"):
            engine.destroy()
        del engine, opt, model
        gc.collect()
