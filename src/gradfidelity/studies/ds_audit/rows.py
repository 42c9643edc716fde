"""Fault-matrix table rows (one per case) from `worker.run_group` states, with the prediction and the agreement.

Each row keeps the raw probe result under `result` (claims read it; the table writer leaves it out of the CSV) and
flat columns for the reader: per-step vectors joined by " | ", the clipping threshold used, the comparison.
"""

from __future__ import annotations

from gradfidelity.studies.ds_audit.audit import fmt_vector
from gradfidelity.studies.ds_audit.ds_step import DSCase
from gradfidelity.studies.ds_audit.prediction import compare, prediction


def _steps(r: dict, key: str, fmt=str) -> str:
    return " | ".join(fmt(s[key]) if s[key] is not None else "" for s in r["per_step"])


def rows_for_group(version: str, ranks: int, cases: list[DSCase], states: list[dict]) -> list[dict]:
    rows = []
    for case, st in zip(cases, states, strict=True):
        pred, threshold, basis = prediction(version, case, ranks)
        clip_mode = "silent" if case.clip is None else ("active" if case.target_norm > case.clip > 0 else "off")
        row = {
            "deepspeed": version, "zero_stage": case.zero_stage, "offload": case.offload, "ga": case.ga,
            "backward_calls": case.backward_calls, "boundary": case.boundary if case.backward_calls > 1 else "",
            "clip_mode": clip_mode, "dtype": case.dtype, "ranks": ranks, "steps": case.steps, "status": st["status"],
            "contributions": "", "contributions_raw": "", "faithful": None, "clip_used": None,
            "grad_norm_ratio": "", "reported_over_kept": "", "clip_applied": "", "clip_full": "", "residual": "",
            "predicted": "open" if pred is None else str(pred).replace(" ", ""), "predicted_clip": threshold,
            "prediction_basis": basis, "agrees_with_prediction": "error", "error": st.get("error", ""),
            "result": None,
        }
        if st["status"] == "ok":
            r = st["result"]
            if r.get("extra", {}).get("deepspeed") not in (None, version):
                raise RuntimeError(f"group labelled {version} ran deepspeed {r['extra']['deepspeed']}")
            vecs = [fmt_vector(s["contributions"], r["tolerance"]) for s in r["per_step"]]
            g = "{:.4f}".format
            row.update(
                contributions=" | ".join(vecs),
                contributions_raw=" | ".join(" ".join(f"{x:.5f}" for x in s["contributions"]) for s in r["per_step"]),
                faithful=r["faithful"], clip_used=r["clip"], grad_norm_ratio=_steps(r, "grad_norm_ratio", g),
                reported_over_kept=_steps(r, "reported_over_kept", g), clip_applied=_steps(r, "clip_applied", g),
                clip_full=_steps(r, "clip_full", g), residual=_steps(r, "residual", "{:.1e}".format),
                agrees_with_prediction=compare(r, pred, threshold), result=r,
            )
        rows.append(row)
    return rows
