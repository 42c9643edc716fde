"""The DeepSpeed fault matrix: every (version, ZeRO stage, offload, GA, dtype, ranks) cell probed for real.

Why a matrix and not one case: the claim (the paper's bug description, docs/sources.md, "Study A: DeepSpeed bug")
is a statement about exactly which configurations lose data; each row is a one-step probe whose contribution vector
is compared with what that description predicts for the row (`predicted`, `agrees_with_prediction`). Rows that
cannot run stay in the table with DeepSpeed's error text, so a refusal is never mistaken for a pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gradfidelity.errors import UserError
from gradfidelity.studies.ds_audit.ds_step import DSCase

AFFECTED = ((0, 15, 2), (0, 18, 9))  # PR #6550 shipped in 0.15.2, PR #7967 fixed it in 0.19.0 (docs/sources.md)


@dataclass(frozen=True)
class MultiBackward:
    calls: int = 4
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    offload: tuple[str, ...] = ("none", "cpu")
    dtypes: tuple[str, ...] = ("fp32",)


@dataclass(frozen=True)
class MatrixConfig:
    versions: tuple[str, ...] = ("0.18.9", "0.19.8")
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    offload: tuple[str, ...] = ("none", "cpu")
    ga: tuple[int, ...] = (1, 2, 3, 4, 8)
    dtypes: tuple[str, ...] = ("fp32", "bf16")
    ranks: tuple[int, ...] = (1, 2)
    micro_batch: int = 2
    case_timeout_s: float = 120.0
    multi_backward: MultiBackward = field(default_factory=MultiBackward)

    @classmethod
    def from_dict(cls, d: dict) -> MatrixConfig:
        d = dict(d)
        mb_cfg = d.pop("multi_backward", {})
        mb = MultiBackward(**{k: tuple(v) if isinstance(v, list) else v for k, v in mb_cfg.items()})
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise UserError(f"ds_audit.matrix: unknown keys {sorted(unknown)}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}, multi_backward=mb)

    def cases(self) -> list[DSCase]:
        """The cases of one (version, ranks) group, in table order."""
        out = [DSCase(s, o, g, t, 1, self.micro_batch) for s in self.zero_stages for o in self.offload
               for g in self.ga for t in self.dtypes]
        mb = self.multi_backward
        if mb.calls > 1:
            out += [DSCase(s, o, 1, t, mb.calls, self.micro_batch) for s in mb.zero_stages for o in mb.offload
                    for t in mb.dtypes]
        return out


def _vtuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split(".")[:3])


def prediction(version: str, case: DSCase, ranks: int) -> tuple[list[int] | None, str]:
    """The bug description's prediction: (contribution vector over all ranks' micro-batches, or None if open; basis)."""
    n = case.ga * case.backward_calls
    ones = [1] * n
    affected = AFFECTED[0] <= _vtuple(version) <= AFFECTED[1] and case.zero_stage in (1, 2)
    if not (affected and case.offload != "none"):
        return ones * ranks, "exact (not an affected version/stage/offload)"
    if case.backward_calls > 1:
        # PR #7981's description: ZeRO-1/2 + offload, GA 1, several backward() per step (boundary set with
        # set_gradient_accumulation_boundary): all but the last backward dropped; non-offload ZeRO-1/2 exact.
        if case.zero_stage == 1:
            return None, "open: PR #7981 names ZeRO-1/2, stage 1 was never shown to drop here"
        return ([0] * (n - 1) + [1]) * ranks, "PR #7981: all but the last backward dropped"
    if case.zero_stage == 1:
        if ranks == 1 and case.ga >= 3:
            return ones, "an earlier one-rank probe of stage 1 at GA 4/8 found all ones (open question)"
        if ranks > 1 and case.ga >= 3:
            return None, "open: stage 1 with several ranks was never measured"
        return ones * ranks, "GA <= 2 is exact"
    if case.ga >= 3:
        return ([1] + [0] * (n - 2) + [1]) * ranks, "bug: micro-batches 1..N-2 dropped (PR #6550)"
    return ones * ranks, "GA <= 2 is exact by accident"


def compare(result: dict, pred: list[int] | None) -> str:
    """'yes' | 'NO' | 'open' against the prediction, within the probe's tolerance."""
    if pred is None:
        return "open"
    c = result["contributions"]
    tol = result["tolerance"]
    if len(c) != len(pred):
        return "NO"
    ok = all(abs(a - b) <= tol for a, b in zip(c, pred, strict=True)) and result["residual"] <= tol
    return "yes" if ok else "NO"


def fmt_vector(c: list[float], tol: float) -> str:
    """[1, 0, 0, 1] when every weight is within tolerance of an integer, else two decimals."""
    parts = [str(int(round(x))) if abs(x - round(x)) <= tol else f"{x:.2f}" for x in c]
    return "[" + ", ".join(parts) + "]"


def rows_for_group(version: str, ranks: int, cases: list[DSCase], states: list[dict]) -> list[dict]:
    """Table rows (one per case) from `worker.run_group` states."""
    rows = []
    for case, st in zip(cases, states, strict=True):
        pred, basis = prediction(version, case, ranks)
        row = {
            "deepspeed": version, "zero_stage": case.zero_stage, "offload": case.offload, "ga": case.ga,
            "backward_calls": case.backward_calls, "dtype": case.dtype, "ranks": ranks, "status": st["status"],
            "contributions": "", "contributions_raw": "", "dropped": "", "faithful": None,
            "grad_norm_ratio": None, "applied_norm_ratio": None, "max_param_dev": None, "residual": None,
            "predicted": "open" if pred is None else str(pred).replace(" ", ""),
            "prediction_basis": basis, "agrees_with_prediction": "error", "error": st.get("error", ""),
        }
        if st["status"] == "ok":
            r = st["result"]
            row.update(
                contributions=fmt_vector(r["contributions"], r["tolerance"]),
                contributions_raw=" ".join(f"{x:.5f}" for x in r["contributions"]),
                dropped=" ".join(map(str, r["dropped"])), faithful=r["faithful"],
                grad_norm_ratio=r["grad_norm_ratio"], applied_norm_ratio=r["applied_norm_ratio"],
                max_param_dev=r["max_param_dev"], residual=r["residual"], agrees_with_prediction=compare(r, pred),
            )
            if r.get("extra", {}).get("deepspeed") not in (None, version):
                raise RuntimeError(f"group labelled {version} ran deepspeed {r['extra']['deepspeed']}")
        rows.append(row)
    return rows
