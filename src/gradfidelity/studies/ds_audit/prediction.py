"""What the bug description (docs/sources.md, Study A) predicts for one fault-matrix cell, and the comparison of a
measured probe result with it.

A prediction is (pattern, threshold, basis): `pattern` the 0/1 vector of which micro-batches reach each optimizer
step (all ranks, rank-major; None = open, the description says nothing), `threshold` the clipping threshold the
engine should use (the config's, else the version's default: 0 up to 0.18.9, 1.0 from 0.19.0), `basis` the reason.
The comparison allows for clipping: DeepSpeed scales the kept gradient by min(1, threshold / its norm), so the
measured weights must equal pattern x that coefficient, computed on the kept micro-batches' norm.
"""

from __future__ import annotations

from gradfidelity.studies.ds_audit.case import DSCase
from gradfidelity.studies.ds_audit.probe import clip_coefficient

AFFECTED = ((0, 15, 2), (0, 18, 9))  # PR #6550 shipped in 0.15.2, PR #7967 fixed it in 0.19.0 (docs/sources.md)


def _vtuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split(".")[:3])


def default_clip(version: str) -> float:
    """GRADIENT_CLIPPING_DEFAULT of the version (deepspeed/runtime/constants.py, docs/sources.md)."""
    return 1.0 if _vtuple(version) >= (0, 19, 0) else 0.0


def prediction(version: str, case: DSCase, ranks: int) -> tuple[list[int] | None, float, str]:
    n = case.ga * case.backward_calls
    ones = [1] * n
    threshold = default_clip(version) if case.clip is None else case.clip
    affected = AFFECTED[0] <= _vtuple(version) <= AFFECTED[1] and case.zero_stage in (1, 2)
    if case.backward_calls > 1 and case.boundary == "none":
        # every backward is a boundary at GA 1: measured for ZeRO-2 (docs/sources.md); 0.19.8 + offload differs
        if case.zero_stage == 2 and not (case.offload != "none" and not affected):
            return ([0] * (n - 1) + [1]) * ranks, threshold, \
                "no boundary call: only the last backward survives (ZeRO-2)"
        return None, threshold, "open: the no-boundary pattern was measured for ZeRO-2 only"
    if not (affected and case.offload != "none"):
        return ones * ranks, threshold, "exact (not an affected version/stage/offload)"
    if case.backward_calls > 1:
        # PR #7981's description: ZeRO-1/2 + offload, GA 1, several backward() per step (boundary set with
        # set_gradient_accumulation_boundary): all but the last backward dropped; non-offload ZeRO-1/2 exact.
        if case.zero_stage == 1:
            return None, threshold, "open: PR #7981 names ZeRO-1/2, stage 1 was never shown to drop here"
        return ([0] * (n - 1) + [1]) * ranks, threshold, "PR #7981: all but the last backward dropped"
    if case.zero_stage == 1:
        if ranks == 1 and case.ga >= 3:
            return ones, threshold, "an earlier one-rank probe of stage 1 at GA 4/8 found all ones (open question)"
        if ranks > 1 and case.ga >= 3:
            return None, threshold, "open: stage 1 with several ranks was never measured"
        return ones * ranks, threshold, "GA <= 2 is exact"
    if case.ga >= 3:
        return ([1] + [0] * (n - 2) + [1]) * ranks, threshold, "bug: micro-batches 1..N-2 dropped (PR #6550)"
    return ones * ranks, threshold, "GA <= 2 is exact by accident"


def compare(result: dict, pred: list[int] | None, threshold: float = 0.0) -> str:
    """'yes' | 'NO' | 'open' for a ProbeResult dict against a prediction, every step, within the probe's tolerance."""
    if pred is None:
        return "open"
    tol = result["tolerance"]
    if abs(result.get("clip", 0.0) - threshold) > 1e-9:
        return "NO"
    for s in result["per_step"]:
        c = s["contributions"]
        if len(c) != len(pred) or s["residual"] > tol + s.get("storage_rounding", 0.0):
            return "NO"
        kept = s.get("kept_norm")
        coef = clip_coefficient(kept, threshold) if kept else 1.0
        if not all(abs(a - b * coef) <= tol for a, b in zip(c, pred, strict=True)):
            return "NO"
    return "yes"
