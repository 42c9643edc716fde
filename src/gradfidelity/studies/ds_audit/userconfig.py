"""A user's DeepSpeed JSON config -> the probe cases that exercise the same ZeRO code path, and a list of every key
the probe ignores, overrides, maps or derives (`AuditPlan.assumed`, printed as "not audited / assumed").

Why translate instead of running the file as is: the probe must use its own tiny model, SGD(lr=1) client optimizer
and batch sizes, so `optimizer`, `scheduler` and the batch-size triple are replaced; everything that selects the
gradient path (ZeRO stage and its knobs, optimizer offload, dtype, clipping, GA) is kept. Nothing is dropped
silently: each key of the config that the probe does not use as given is listed with what the probe did instead.
Values a GPU-only feature needs are mapped to the nearest CPU-runnable path:
- fp16 -> bf16 (this CPU refuses fp16; the bug is in which buffer slots are kept, not in the dtype);
- offload to nvme -> cpu (same ZeRO-1/2 offload path, without the async-io library);
- "auto" (filled by the Hugging Face Trainer/Accelerate at run time): gradient_accumulation_steps "auto" needs
  --gradient-accumulation-steps (it decides the verdict, so no default is guessed); a micro-batch size "auto"
  becomes 2 (the bug does not depend on it); gradient_clipping "auto" becomes the Trainer's default 1.0;
  bf16/fp16 "enabled": "auto" becomes fp32 unless --dtype says otherwise; other "auto" values are not audited.
A missing gradient_accumulation_steps is derived as DeepSpeed derives it, from train_batch_size / (micro-batch x
the run's data-parallel size), and the derivation is listed (the run's size is --world-size, else --ranks).
Every value that cannot be used raises UserError naming its key.

Cases (`AuditCase.role`): "accumulation" (the config as given, faithful norm half the threshold: measures which
micro-batches count), "clipping" (faithful norm twice the threshold, the config's own clipping key, or none: measures
the clip coefficient applied, and the version's default threshold when the config is silent), and with
--backward-per-step K > 1 "multi-backward" (K backward() per micro-step, boundary marked with
`set_gradient_accumulation_boundary`) and/or "multi-backward-no-boundary" (the same loop without that call): which
one is the user's loop is theirs to say (`--boundary`), since each decides the exit code.

Why K > 1 is refused at GA > 1: `set_gradient_accumulation_boundary(True)` overrides DeepSpeed's micro-step counter,
so a loop that marks the last backward of each micro-step steps the optimizer every micro-step, and one that does
not leaves the boundary to the counter; where the optimizer steps then depends on how the user's loop combines the
two, which the probe (one optimizer step per GA x K backward calls) does not model. The multi-backward bug (PR
#7981) is a GA 1 pattern, and the refusal says so rather than print a verdict for a loop it did not run.

The clipping threshold the user asked for (`AuditPlan.clip_asked`): --max-grad-norm when given (the Trainer's
`max_grad_norm`; the guard passes it), else the config's `gradient_clipping`, else none (0). The audit compares it
with the threshold DeepSpeed actually used: a silent config under a version whose default clips is a warning.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from gradfidelity.errors import UserError
from gradfidelity.studies.ds_audit.case import DSCase

# zero_optimization keys passed through to the probe (the rest cannot change which gradients are accumulated).
ZERO_KEYS = (
    "overlap_comm", "contiguous_gradients", "reduce_bucket_size", "allgather_bucket_size", "reduce_scatter",
    "allgather_partitions", "round_robin_gradients", "offload_param", "sub_group_size",
    "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold", "stage3_max_live_parameters",
    "stage3_max_reuse_distance", "stage3_gather_16bit_weights_on_model_save",
)
DEFAULT_MICRO_BATCH = 2
DEFAULT_STEPS = 3
BOUNDARIES = ("manual", "none", "both")  # --boundary: the user's multi-backward loop marks the boundary, or not
CLIP_PROBE = 1.0  # threshold probed by the clipping case when the config sets none (0.19.x's default, docs/sources.md)
SCALING_KEYS = ("prescale_gradients", "gradient_predivide_factor", "communication_data_type", "data_types")
# top-level keys the probe replaces by its own value: (what it uses, why it does not matter)
OVERRIDDEN = {
    "zero_allow_untested_optimizer": "true (needed for the probe's SGD client optimizer)",
    "zero_force_ds_cpu_optimizer": "false (keeps the probe's SGD under offload)",
    "steps_per_print": "a huge value (logging only)",
    "wall_clock_breakdown": "false (timing only)",
}


@dataclass(frozen=True)
class AuditCase:
    role: str
    case: DSCase
    label: str


@dataclass
class AuditPlan:
    """The probe cases for one user config, the keys not audited as given, and a one-line summary."""

    cases: list[AuditCase]
    assumed: list[dict] = field(default_factory=list)  # {"key", "how", "detail"}
    summary: str = ""
    clip_asked: float = 0.0  # the threshold the user asked for (0: no clipping)
    clip_asked_from: str = ""  # where that threshold came from, in words


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
    backward_per_step: int = 1,
    ranks: int = 1,
    world_size: int | None = None,
    steps: int = DEFAULT_STEPS,
    boundary: str | None = None,
    max_grad_norm: float | None = None,
) -> AuditPlan:
    """Translate a parsed DeepSpeed config; raises UserError (naming the key) for anything unusable."""
    assumed: list[dict] = []

    def note(key: str, how: str, detail: str) -> None:
        assumed.append({"key": key, "how": how, "detail": detail})

    ranks = _int(ranks, "--ranks", 1)
    steps = _int(steps, "--steps", 1)
    bps = _int(backward_per_step, "--backward-per-step", 1)
    if bps > 1 and boundary not in BOUNDARIES:
        raise UserError(f"--backward-per-step {bps} needs --boundary manual|none|both: whether your loop calls "
                        "engine.set_gradient_accumulation_boundary(False) before every backward() but the last "
                        "(manual) or not (none); each pattern decides the exit code, so none is assumed")
    if bps == 1 and boundary is not None:
        raise UserError(f"--boundary {boundary} applies to several backward() calls per micro-step: pass "
                        "--backward-per-step K > 1 with it")
    if max_grad_norm is not None and (isinstance(max_grad_norm, bool) or max_grad_norm < 0):
        raise UserError(f"--max-grad-norm {max_grad_norm}: expected a number >= 0 (0: no clipping)")
    zero = cfg.get("zero_optimization", {}) or {}
    if not isinstance(zero, dict):
        raise UserError(f"zero_optimization = {zero!r}: expected an object")
    stage = _int(zero.get("stage", 0), "zero_optimization.stage", 0)
    if stage > 3:
        raise UserError(f"zero_optimization.stage = {stage}: expected 0, 1, 2 or 3")

    # ------------------------------------------------------------------ gradient accumulation and micro-batch
    ga = cfg.get("gradient_accumulation_steps", None)
    tbs, mbs_cfg = cfg.get("train_batch_size"), cfg.get("train_micro_batch_size_per_gpu")
    run_world = world_size if world_size is not None else ranks
    who = f"--world-size {world_size}" if world_size is not None else f"--ranks {ranks}; pass --world-size N if " \
        "your run has another number of data-parallel ranks"
    if ga_override is not None:
        ga = _int(ga_override, "--gradient-accumulation-steps", 1)
        if cfg.get("gradient_accumulation_steps") not in (None, ga):
            note("gradient_accumulation_steps", "overridden",
                 f"{cfg.get('gradient_accumulation_steps')!r} replaced by --gradient-accumulation-steps {ga}")
    elif ga == "auto":
        raise UserError(
            "gradient_accumulation_steps = \"auto\" (the Trainer fills it at run time): pass "
            "--gradient-accumulation-steps N with the value your run uses"
        )
    elif ga is None:
        if isinstance(tbs, int) and isinstance(mbs_cfg, int) and mbs_cfg > 0:
            if tbs % (mbs_cfg * run_world):
                raise UserError(f"train_batch_size {tbs} is not divisible by train_micro_batch_size_per_gpu "
                                f"{mbs_cfg} x {run_world} ranks: pass --gradient-accumulation-steps N")
            ga = tbs // (mbs_cfg * run_world)
            note("gradient_accumulation_steps", "derived",
                 f"absent: {ga} = train_batch_size {tbs} / (micro-batch {mbs_cfg} x {run_world} ranks, {who})")
        elif isinstance(tbs, int):
            ga = 1
            note("gradient_accumulation_steps", "derived",
                 "absent with train_batch_size only: DeepSpeed then uses GA 1 and a micro-batch of "
                 "train_batch_size / ranks; probed with GA 1")
        else:
            ga = 1
            note("gradient_accumulation_steps", "derived", "absent: DeepSpeed's default 1")
    ga = _int(ga, "gradient_accumulation_steps", 1)
    if bps > 1 and ga > 1:
        raise UserError(
            f"--backward-per-step {bps} with gradient_accumulation_steps {ga} is not modelled: "
            "set_gradient_accumulation_boundary overrides DeepSpeed's micro-step counter, so where the optimizer "
            "steps depends on how your loop combines the two. The multi-backward bug (PR #7981) is a GA 1 pattern: "
            "audit it with --gradient-accumulation-steps 1, and your accumulation without --backward-per-step")
    if "train_batch_size" in cfg:
        note("train_batch_size", "overridden", "the probe sets micro-batch x GA x --ranks")

    mbs = mbs_cfg if mbs_cfg is not None else DEFAULT_MICRO_BATCH
    if micro_override is not None:
        mbs = micro_override
    elif mbs == "auto":
        mbs = DEFAULT_MICRO_BATCH
        note("train_micro_batch_size_per_gpu", "mapped", f"\"auto\": probed with {DEFAULT_MICRO_BATCH} "
             "(does not change which micro-batches count)")
    elif mbs_cfg is None:
        note("train_micro_batch_size_per_gpu", "derived", f"absent: probed with {DEFAULT_MICRO_BATCH}")
    mbs = _int(mbs, "train_micro_batch_size_per_gpu", 1)

    # ------------------------------------------------------------------ dtype
    bf16, fp16 = _enabled(cfg, "bf16"), _enabled(cfg, "fp16")
    if bf16 is True and fp16 is True:
        raise UserError("bf16.enabled and fp16.enabled are both true: DeepSpeed accepts only one")
    if dtype_override is not None:
        dtype = dtype_override
        note("bf16/fp16", "overridden", f"--dtype {dtype_override}")
    elif bf16 is True:
        dtype = "bf16"
    elif fp16 is True:
        dtype = "bf16"
        note("fp16.enabled", "mapped", "fp16 probed as bf16: this CPU refuses fp16; the gradient buffers under "
             "test do not depend on the dtype")
    else:
        dtype = "fp32"
        if "auto" in (bf16, fp16):
            note("bf16/fp16.enabled", "mapped", "\"auto\": probed in fp32 (pass --dtype bf16 to probe bf16)")
    for sec in ("fp16", "bf16"):
        for k in sorted(set(cfg.get(sec) or {}) - {"enabled"}):
            note(f"{sec}.{k}", "not audited", "loss scaling / precision option (the probe runs no loss scaler)")

    # ------------------------------------------------------------------ clipping
    clip = cfg.get("gradient_clipping", None)
    if clip == "auto":
        clip = 1.0
        note("gradient_clipping", "mapped", "\"auto\": probed with the Trainer's default max_grad_norm 1.0")
    if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float)) or clip < 0):
        raise UserError(f"gradient_clipping = {clip!r}: expected a number >= 0")
    if clip is None:
        note("gradient_clipping", "derived", "absent: the installed DeepSpeed's own default applies (0 in 0.18.9, "
             "1.0 in 0.19.x); the threshold it used is printed")
    clip = None if clip is None else float(clip)
    if max_grad_norm is not None:
        clip_asked, clip_from = float(max_grad_norm), f"--max-grad-norm {max_grad_norm:g}"
    elif clip is not None:
        clip_asked, clip_from = clip, f"gradient_clipping {clip:g}"
    else:
        clip_asked, clip_from = 0.0, "no gradient_clipping key: no clipping asked for"

    # ------------------------------------------------------------------ offload and zero_optimization knobs
    offload = zero.get("offload_optimizer", {}) or {}
    if zero.get("cpu_offload") is True:  # the pre-0.10 spelling of offload_optimizer.device = cpu
        offload = {"device": "cpu"}
        note("zero_optimization.cpu_offload", "mapped", "probed as offload_optimizer.device cpu")
    if not isinstance(offload, dict):
        raise UserError(f"zero_optimization.offload_optimizer = {offload!r}: expected an object")
    device = offload.get("device", "none") or "none"
    if device not in ("none", "cpu", "nvme"):
        raise UserError(f"zero_optimization.offload_optimizer.device = {device!r}: expected none, cpu or nvme")
    if device == "nvme":
        note("zero_optimization.offload_optimizer.device", "mapped",
             "nvme probed as cpu (same ZeRO offload path, no async-io library here)")
        device = "cpu"
    if device == "cpu" and stage == 0:
        note("zero_optimization.offload_optimizer", "not audited", "ignored by ZeRO stage 0")

    extra = {}
    for k in sorted(zero):
        v = zero[k]
        if k in ("stage", "offload_optimizer", "cpu_offload"):
            continue
        if v == "auto":
            note(f"zero_optimization.{k}", "not audited", "\"auto\" (filled by the Trainer): DeepSpeed's default used")
        elif k in ZERO_KEYS:
            if k == "offload_param" and isinstance(v, dict) and v.get("device") == "nvme":
                v = {**{a: b for a, b in v.items() if a != "nvme_path"}, "device": "cpu"}
                note("zero_optimization.offload_param.device", "mapped", "nvme probed as cpu")
            extra[k] = v
        else:
            note(f"zero_optimization.{k}", "not audited", "not passed to the probe")
    if offload:
        kept = {a: b for a, b in offload.items() if a not in ("nvme_path", "device")}
        extra["offload_optimizer"] = kept
        for a in sorted(set(offload) & {"nvme_path"}):
            note(f"zero_optimization.offload_optimizer.{a}", "not audited", "nvme only")
    zero_extra = tuple(sorted(extra.items()))

    # ------------------------------------------------------------------ every other top-level key
    used = {"zero_optimization", "gradient_accumulation_steps", "train_batch_size", "train_micro_batch_size_per_gpu",
            "bf16", "fp16", "gradient_clipping"}
    for k in sorted(set(cfg) - used):
        if k in OVERRIDDEN:
            note(k, "overridden", OVERRIDDEN[k])
        elif k in ("optimizer", "scheduler"):
            note(k, "not audited", "replaced by the probe's SGD(lr=1) client optimizer and no scheduler; the bug "
                 "is in the ZeRO gradient buffers, which every optimizer reads alike")
        elif k in SCALING_KEYS:
            note(k, "not audited", "changes how gradients are scaled or communicated; not passed to the probe")
        else:
            note(k, "not audited", "not passed to the probe")

    # ------------------------------------------------------------------ cases
    tau = clip if clip else CLIP_PROBE  # the threshold the clipping case is built around
    low = 0.5 * min(clip if clip else 1.0, 1.0)  # faithful norm below any threshold in play (the version default <= 1)
    base = DSCase(stage, device, ga, dtype, 1, mbs, clip, zero_extra, steps=steps, target_norm=low)
    cases = [AuditCase("accumulation", base, f"one backward per micro-step, GA {ga}, {steps} optimizer steps")]
    said = {None: " (the config sets no gradient_clipping: the version's default decides)",
            0.0: " (the config sets gradient_clipping 0: no clipping)"}.get(clip, "")
    cases.append(AuditCase("clipping", DSCase(stage, device, ga, dtype, 1, mbs, clip, zero_extra, steps=1,
                                              target_norm=2.0 * tau),
                           f"clipping: faithful gradient norm {2 * tau:g} = twice the threshold {tau:g}" + said))
    if bps > 1:
        for mark, role, how in (("manual", "multi-backward", "boundary marked with "
                                 "engine.set_gradient_accumulation_boundary, the documented API"),
                                ("none", "multi-backward-no-boundary", "no set_gradient_accumulation_boundary "
                                 "call (at GA 1 every backward is a boundary)")):
            if boundary in (mark, "both"):
                cases.append(AuditCase(role, DSCase(stage, device, ga, dtype, bps, mbs, clip, zero_extra,
                                                    steps=steps, boundary=mark, target_norm=low),
                                       f"{bps} backward() calls per micro-step, {how}"))
    summary = (f"ZeRO-{stage}, offload_optimizer={device}, GA {ga}, micro-batch {mbs}, {dtype}, "
               f"clipping {'default' if clip is None else f'{clip:g}'}, {ranks} rank{'s' if ranks > 1 else ''}")
    return AuditPlan(cases=cases, assumed=assumed, summary=summary, clip_asked=clip_asked, clip_asked_from=clip_from)


def backward_calls(plan: AuditPlan) -> int:
    """Probe micro-steps (backward calls) the audit runs per rank: what its run time grows with."""
    return sum(c.case.backward_total for c in plan.cases)
