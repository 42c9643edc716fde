"""Verdicts of `audit-deepspeed` on made-up probe results: a CPU-only artefact is undecidable (never dropped or
faithful), advice follows the cause the probe established, a no-boundary loop's verdict sets the exit code like any
other (test_ds_audit_verdicts.py: leaks, exit codes, clipping threshold)."""

from dataclasses import asdict

from gradfidelity.studies.ds_audit.audit import VERDICT_EXIT, cpu_artefact, judge
from gradfidelity.studies.ds_audit.case import DSCase


def _result(c, steps=2, tol=1e-3, cpu_ok=True, resid=1e-9):
    per = [{"contributions": list(c), "residual": resid} for _ in range(steps)]
    return {"per_step": per, "tolerance": tol, "clip": 0.0, "faithful": all(x == 1 for x in c) and resid <= tol,
            "dropped": [[i for i, x in enumerate(c) if x == 0]] * steps, "extra": {"cpu_reduce_buckets_work": cpu_ok}}


NONCONTIG = (("contiguous_gradients", False),)


def test_cpu_artefact_is_undecidable_not_dropped():
    case = asdict(DSCase(2, "none", 4, "fp32", zero_extra=NONCONTIG))
    v = judge("accumulation", case, _result([0, 0, 2, 2, 2, 2, 0, 0], cpu_ok=False), "0.18.9", 2)
    assert v["verdict"] == "undecidable" and "split_half_float_double" in v["reason"]
    assert "offload" not in v["reason"].split("contiguous_gradients")[0]  # no advice about an offload that is off


def test_artefact_needs_its_whole_cause():
    r = _result([1] * 8, cpu_ok=False)
    assert cpu_artefact(asdict(DSCase(2, "none", 4, "fp32", zero_extra=NONCONTIG)), r, 1) is None  # one rank
    assert cpu_artefact(asdict(DSCase(2, "cpu", 4, "fp32", zero_extra=NONCONTIG)), r, 2) is None  # forced contiguous
    assert cpu_artefact(asdict(DSCase(2, "none", 4, "fp32")), r, 2) is None  # contiguous by default
    assert cpu_artefact(asdict(DSCase(3, "none", 4, "fp32", zero_extra=NONCONTIG)), r, 2) is None  # stage 3
    ok = _result([1] * 8, cpu_ok=True)  # 0.19.8: its bucketing sees CPU tensors
    assert cpu_artefact(asdict(DSCase(2, "none", 4, "fp32", zero_extra=NONCONTIG)), ok, 2) is None


def test_advice_follows_the_cause():
    bug = judge("accumulation", asdict(DSCase(2, "cpu", 4, "fp32")), _result([1, 0, 0, 1]), "0.18.9", 1)
    assert bug["verdict"] == "dropped" and "PR #7967" in bug["reason"] and "offload_optimizer off" in bug["reason"]
    # the same vector where the bug cannot be (no offload): no offload advice, no upgrade claim
    other = judge("accumulation", asdict(DSCase(2, "none", 4, "fp32")), _result([1, 0, 0, 1]), "0.18.9", 1)
    assert "PR #7967" not in other["reason"] and "offload" not in other["reason"]
    fixed = judge("accumulation", asdict(DSCase(2, "cpu", 4, "fp32")), _result([1, 0, 0, 1]), "0.19.8", 1)
    assert "PR #7967" not in fixed["reason"]
    multi = judge("multi-backward", asdict(DSCase(2, "cpu", 1, "fp32", 4)), _result([0, 0, 0, 1]), "0.18.9", 1)
    assert "PR #7981" in multi["reason"]
    nob = judge("multi-backward-no-boundary", asdict(DSCase(2, "none", 1, "fp32", 4, boundary="none")),
                _result([0, 0, 0, 1]), "0.19.8", 1)
    assert "set_gradient_accumulation_boundary" in nob["reason"] and nob["verdict"] == "dropped"
    assert VERDICT_EXIT[nob["verdict"]] == 3  # a measured failure of the user's loop is not silent


def test_stale_buffer_is_named():
    r = _result([1, 1, 1, 1], steps=2)
    r["per_step"][1]["residual"] = 0.7
    r["faithful"] = False
    v = judge("accumulation", asdict(DSCase(2, "cpu", 4, "fp32")), r, "0.19.8", 1)
    assert v["verdict"] == "leaking" and "stale" in v["reason"]
