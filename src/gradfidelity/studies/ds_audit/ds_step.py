"""Probe steps through the real `deepspeed.initialize` (CPU accelerator, gloo).

Why a client optimizer: SGD(lr=1) makes the parameter delta equal to the applied gradient. DeepSpeed replaces a
client optimizer by DeepSpeedCPUAdam under offload unless `zero_force_ds_cpu_optimizer` is false, and refuses an
optimizer it has not tested under ZeRO unless `zero_allow_untested_optimizer` is true. The bug sits in
the ZeRO wrapper's gradient buffers, not in the inner optimizer, so SGD sees exactly what Adam would.

Each micro-step does `engine(x, k)`, `engine.backward(loss)` (backward_calls times: >1 is the multi-backward pattern
with GA 1; `boundary="manual"` calls `engine.set_gradient_accumulation_boundary(False)` before every backward but the
last, the documented way, #7665, the PR #7981 case; `boundary="none"` does not, the pattern open-instruct fixed in
its PR #1498) and `engine.step()`; DeepSpeed steps the optimizer at the accumulation boundary, once. `steps`
optimizer steps run one after the other, each analysed on its own slots (probe.py). The step runs under
`torch.no_grad()`: with several ranks, torch 2.13's gloo `all_gather_single` writes the updated partitions into
views produced by `split` and autograd refuses that in grad mode ("Output 0 of Split is a view and is being modified
inplace", the failure an unguarded two-rank step hits). An optimizer step is never differentiated, so no_grad
changes nothing else; the gradients were accumulated before, during backward().

`clip=None` leaves `gradient_clipping` out of the config, so the version's own default applies (0 in 0.18.9, 1.0 in
0.19.x, docs/sources.md); the threshold the engine actually uses is read back from it (`engine.gradient_clipping()`).
"""

from __future__ import annotations

import gc
import os

import torch

from gradfidelity.studies.ds_audit.case import DSCase
from gradfidelity.studies.ds_audit.probe import (
    DTYPES,
    TOLERANCE,
    ProbeResult,
    TaggedRegression,
    analyse_step,
    loss_fn,
    micro_batch,
    reference,
)


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


def cpu_reduce_buckets_work() -> bool:
    """Whether this DeepSpeed's non-contiguous gradient reduction sees CPU tensors at all.

    0.18.9's `split_half_float_double` (stage_1_and_2.py) keeps tensors whose `type()` equals
    "torch.<accelerator device>.FloatTensor"; with the CPU accelerator that reads "torch.cpu.FloatTensor", which no
    CPU tensor's type() ("torch.FloatTensor") equals, so `buffered_reduce_fallback` (contiguous_gradients false)
    all-reduces nothing on CPU. On a GPU the strings match. 0.19.8 compares dtypes. Asked of the real function."""
    from deepspeed.runtime.zero import stage_1_and_2

    fn = getattr(stage_1_and_2, "split_half_float_double", None)
    return True if fn is None else bool(fn([torch.zeros(1)]))


def run_case(case: DSCase) -> ProbeResult:
    """`case.steps` optimizer steps of the probe under DeepSpeed on this rank; every rank gets the same result."""
    import deepspeed

    rank, world = init_distributed()
    spec = case.spec(world)
    ref = reference(spec)
    torch.manual_seed(0)
    model = TaggedRegression(spec.dim, spec.n_slots, spec.tag_scale)
    opt = torch.optim.SGD(model.parameters(), lr=1.0, momentum=0.0, weight_decay=0.0)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=case.ds_config(world))
    try:
        clip = float(engine.gradient_clipping() or 0.0)
        steps = []
        for s in range(spec.steps):
            before = _full_params(engine, model)
            for m in range(spec.ga):
                for call in range(spec.backward_calls):
                    if spec.backward_calls > 1 and case.boundary == "manual":  # the documented API (#7665)
                        engine.set_gradient_accumulation_boundary(call == spec.backward_calls - 1)
                    k = spec.slot(rank, m, call, s)
                    x, y = micro_batch(spec, k, ref.y_scale)
                    loss = loss_fn(engine(x.to(DTYPES[spec.dtype]), k), y)
                    engine.backward(loss)
                with torch.no_grad():  # see the module docstring: gloo all_gather into split views under grad mode
                    engine.step()
            norm = engine.get_global_grad_norm()
            norm = None if norm is None else float(norm)
            steps.append(analyse_step(spec, ref, s, before, _full_params(engine, model), norm, clip))
        result = ProbeResult(per_step=steps, tolerance=TOLERANCE[spec.dtype], slots_per_rank=spec.slots_per_rank,
                             world=world, clip=clip)
        result.extra = {"optimizer_steps": int(engine.global_steps), "deepspeed": deepspeed.__version__,
                        "cpu_reduce_buckets_work": cpu_reduce_buckets_work()}
        return result
    finally:
        if hasattr(engine, "destroy"):
            engine.destroy()
        del engine, opt, model
        gc.collect()
