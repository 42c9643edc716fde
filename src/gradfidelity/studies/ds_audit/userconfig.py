"""A user's DeepSpeed JSON config -> the probe case that exercises the same ZeRO code path.

Why translate instead of running the file as is: the probe must use its own tiny model, SGD(lr=1) client optimizer
and batch sizes, so `optimizer`, `scheduler` and the batch-size triple are replaced; everything that selects the
gradient path (ZeRO stage and its knobs, optimizer offload, dtype, clipping, GA) is kept. Values a GPU-only feature
needs are mapped to the nearest CPU-runnable path and reported as notes:
- fp16 -> bf16 (this CPU refuses fp16; the bug is in which buffer slots are kept, not in the dtype);
- offload to nvme -> cpu (same ZeRO-1/2 offload path, without the async-io library);
- "auto" (filled by the Hugging Face Trainer/Accelerate at run time): gradient_accumulation_steps "auto" needs
  --gradient-accumulation-steps (it decides the verdict, so no default is guessed); a micro-batch size "auto"
  becomes 2 (the bug does not depend on it); gradient_clipping "auto" becomes the Trainer's default 1.0;
  bf16/fp16 "enabled": "auto" becomes fp32 unless --dtype says otherwise; other "auto" values are dropped.
Every value that cannot be used raises UserError naming its key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from gradfidelity.errors import UserError
from gradfidelity.studies.ds_audit.ds_step import DSCase

# zero_optimization keys passed through to the probe (the rest cannot change which gradients are accumulated).
ZERO_KEYS = (
    "overlap_comm", "contiguous_gradients", "reduce_bucket_size", "allgather_bucket_size", "reduce_scatter",
    "allgather_partitions", "round_robin_gradients", "offload_param", "sub_group_size",
    "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold", "stage3_max_live_parameters",
    "stage3_max_reuse_distance", "stage3_gather_16bit_weights_on_model_save", "cpu_offload",
)
DEFAULT_MICRO_BATCH = 2
MULTI_BACKWARD_CALLS = 4  # the PR #7981 pattern probed whenever GA == 1


@dataclass
class AuditPlan:
    """The probe cases for one user config plus notes on how the config was interpreted."""

    cases: list[DSCase]
    notes: list[str] = field(default_factory=list)
    summary: str = ""


def _int(value, key: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UserError(f"{key} = {value!r}: expected an integer >= {minimum}")
    return value


def _enabled(cfg: dict, name: str) -> bool | str:
    sec = cfg.get(name, {})
    if sec is None:
        return False
    if not isinstance(sec, dict):
        raise UserError(f"{name} = {sec!r}: expected an object like {{\"enabled\": true}}")
    val = sec.get("enabled", False)
    if val == "auto":
        return "auto"
    if not isinstance(val, bool):
        raise UserError(f"{name}.enabled = {val!r}: expected true, false or \"auto\"")
    return val


def load_config(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"config file not found: {path}")
    try:
        cfg = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise UserError(f"{path}: a DeepSpeed config must be a JSON object, got {type(cfg).__name__}")
    return cfg


def plan_audit(
    cfg: dict,
    ga_override: int | None = None,
    micro_override: int | None = None,
    dtype_override: str | None = None,
    backward_calls: int | None = None,
    ranks: int = 1,
) -> AuditPlan:
    """Translate a parsed DeepSpeed config; raises UserError (naming the key) for anything unusable."""
    notes: list[str] = []
    zero = cfg.get("zero_optimization", {}) or {}
    if not isinstance(zero, dict):
        raise UserError(f"zero_optimization = {zero!r}: expected an object")
    stage = zero.get("stage", 0)
    stage = _int(stage, "zero_optimization.stage", 0)
    if stage > 3:
        raise UserError(f"zero_optimization.stage = {stage}: expected 0, 1, 2 or 3")

    ga = cfg.get("gradient_accumulation_steps", None)
    if ga_override is not None:
        ga = _int(ga_override, "--gradient-accumulation-steps", 1)
        notes.append(f"gradient_accumulation_steps taken from the command line: {ga}")
    elif ga == "auto":
        raise UserError(
            "gradient_accumulation_steps = \"auto\" (the Trainer fills it at run time): pass "
            "--gradient-accumulation-steps N with the value your run uses"
        )
    elif ga is None:
        tbs, mbs = cfg.get("train_batch_size"), cfg.get("train_micro_batch_size_per_gpu")
        if isinstance(tbs, int) and isinstance(mbs, int) and mbs > 0 and tbs % (mbs * ranks) == 0:
            ga = tbs // (mbs * ranks)
            notes.append(f"gradient_accumulation_steps derived as train_batch_size / (micro-batch x {ranks} ranks)"
                         f" = {ga}")
        else:
            ga = 1
            notes.append("gradient_accumulation_steps absent: DeepSpeed's default 1")
    ga = _int(ga, "gradient_accumulation_steps", 1)

    mbs = cfg.get("train_micro_batch_size_per_gpu", DEFAULT_MICRO_BATCH)
    if micro_override is not None:
        mbs = micro_override
    elif mbs == "auto":
        mbs = DEFAULT_MICRO_BATCH
        notes.append(f"train_micro_batch_size_per_gpu = \"auto\": probed with {DEFAULT_MICRO_BATCH} "
                     "(does not change which micro-batches count)")
    mbs = _int(mbs, "train_micro_batch_size_per_gpu", 1)

    bf16, fp16 = _enabled(cfg, "bf16"), _enabled(cfg, "fp16")
    if bf16 is True and fp16 is True:
        raise UserError("bf16.enabled and fp16.enabled are both true: DeepSpeed accepts only one")
    if dtype_override is not None:
        dtype = dtype_override
    elif bf16 is True:
        dtype = "bf16"
    elif fp16 is True:
        dtype = "bf16"
        notes.append("fp16 probed as bf16: this CPU refuses fp16; the gradient buffers under test do not depend "
                     "on the dtype")
    else:
        dtype = "fp32"
        if "auto" in (bf16, fp16):
            notes.append("bf16/fp16 enabled = \"auto\": probed in fp32 (pass --dtype bf16 to probe bf16)")

    clip = cfg.get("gradient_clipping", 0.0)
    if clip == "auto":
        clip = 1.0
        notes.append("gradient_clipping = \"auto\": probed with the Trainer's default max_grad_norm 1.0")
    if isinstance(clip, bool) or not isinstance(clip, (int, float)) or clip < 0:
        raise UserError(f"gradient_clipping = {clip!r}: expected a number >= 0")

    offload = zero.get("offload_optimizer", {}) or {}
    if zero.get("cpu_offload") is True:  # the pre-0.10 spelling of offload_optimizer.device = cpu
        offload = {"device": "cpu"}
    if not isinstance(offload, dict):
        raise UserError(f"zero_optimization.offload_optimizer = {offload!r}: expected an object")
    device = offload.get("device", "none") or "none"
    if device not in ("none", "cpu", "nvme"):
        raise UserError(f"zero_optimization.offload_optimizer.device = {device!r}: expected none, cpu or nvme")
    if device == "nvme":
        notes.append("offload_optimizer.device nvme probed as cpu (same ZeRO offload path, no async-io library here)")
        device = "cpu"
    if device == "cpu" and stage == 0:
        notes.append("offload_optimizer is ignored by ZeRO stage 0")

    extra = {}
    for k in ZERO_KEYS:
        if k in zero and zero[k] != "auto" and k != "cpu_offload":
            v = zero[k]
            if k == "offload_param" and isinstance(v, dict) and v.get("device") == "nvme":
                v = {**{a: b for a, b in v.items() if a != "nvme_path"}, "device": "cpu"}
                notes.append("offload_param.device nvme probed as cpu")
            extra[k] = v
    if offload:
        extra["offload_optimizer"] = {a: b for a, b in offload.items() if a not in ("nvme_path", "device")}
    zero_extra = tuple(sorted(extra.items()))

    cases = [DSCase(stage, device, ga, dtype, 1, mbs, float(clip), zero_extra)]
    bc = backward_calls if backward_calls is not None else (MULTI_BACKWARD_CALLS if ga == 1 else 1)
    bc = _int(bc, "--backward-calls", 1)
    if bc > 1:
        cases.append(DSCase(stage, device, ga, dtype, bc, mbs, float(clip), zero_extra))
        notes.append(f"also probed: {bc} backward() calls per optimizer step with "
                     "engine.set_gradient_accumulation_boundary (the PR #7981 pattern)")
    summary = (f"ZeRO-{stage}, offload_optimizer={device}, GA {ga}, micro-batch {mbs}, {dtype}, "
               f"clipping {clip:g}, {ranks} rank{'s' if ranks > 1 else ''}")
    return AuditPlan(cases=cases, notes=notes, summary=summary)

