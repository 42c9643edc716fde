"""Fault-matrix bookkeeping: the plan's cases, the bug description's predictions per row, the agreement test (per
step, with clipping), and the table rows built from made-up probe states (claim evidence on such rows:
test_ds_claims.py)."""

from dataclasses import asdict

import pandas as pd
import pytest

from gradfidelity.studies.ds_audit.aggregate import rows_for_group
from gradfidelity.studies.ds_audit.audit import fmt_vector
from gradfidelity.studies.ds_audit.case import DSCase, case_from_json
from gradfidelity.studies.ds_audit.config import load
from gradfidelity.studies.ds_audit.plan import cases
from gradfidelity.studies.ds_audit.prediction import compare, prediction
from tests.ds_audit._states import state


@pytest.mark.parametrize(("version", "case", "ranks", "want", "clip"), [
    ("0.18.9", DSCase(2, "cpu", 4, "fp32"), 1, [1, 0, 0, 1], 0.0),
    ("0.18.9", DSCase(2, "cpu", 4, "bf16"), 2, [1, 0, 0, 1, 1, 0, 0, 1], 0.0),
    ("0.18.9", DSCase(2, "cpu", 2, "fp32"), 1, [1, 1], 0.0),
    ("0.18.9", DSCase(2, "none", 8, "fp32"), 1, [1] * 8, 0.0),
    ("0.18.9", DSCase(3, "cpu", 4, "fp32"), 1, [1] * 4, 0.0),
    ("0.16.3", DSCase(2, "cpu", 3, "fp32"), 1, [1, 0, 1], 0.0),
    ("0.19.8", DSCase(2, "cpu", 8, "fp32"), 1, [1] * 8, 0.0),
    ("0.18.9", DSCase(2, "cpu", 1, "fp32", backward_calls=4), 1, [0, 0, 0, 1], 0.0),
    ("0.18.9", DSCase(1, "cpu", 4, "fp32"), 2, None, 0.0),
    ("0.18.9", DSCase(2, "none", 1, "fp32", backward_calls=4), 1, [1] * 4, 0.0),
    ("0.19.8", DSCase(2, "none", 1, "fp32", backward_calls=4, boundary="none"), 1, [0, 0, 0, 1], 0.0),
    ("0.19.8", DSCase(2, "cpu", 1, "fp32", backward_calls=4, boundary="none"), 1, None, 0.0),
    ("0.18.9", DSCase(2, "cpu", 1, "fp32", backward_calls=4, boundary="none"), 2, [0, 0, 0, 1] * 2, 0.0),
    ("0.19.8", DSCase(0, "none", 1, "fp32", clip=None), 1, [1], 1.0),  # silent config: 0.19's default 1.0
    ("0.18.9", DSCase(0, "none", 1, "fp32", clip=None), 1, [1], 0.0),  # 0.18.9's default 0
])
def test_prediction(version, case, ranks, want, clip):
    pattern, threshold, _ = prediction(version, case, ranks)
    assert pattern == want and threshold == clip


def test_compare_per_step_and_clipping():
    ok = state([1.0, 1e-6, -2e-6, 0.9999], steps=3)["result"]
    assert compare(ok, [1, 0, 0, 1]) == "yes"
    assert compare(ok, [1, 1, 1, 1]) == "NO"
    assert compare(ok, None) == "open"
    stale = state([1, 0, 0, 1], steps=3)["result"]
    stale["per_step"][1]["residual"] = 0.7  # step 2 carries an earlier step's gradient
    assert compare(stale, [1, 0, 0, 1]) == "NO"
    clipped = state([0.5, 0.5], kept_norm=2.0, clip=1.0)["result"]  # clipped on the kept norm: coefficient 0.5
    assert compare(clipped, [1, 1], 1.0) == "yes"
    assert compare(clipped, [1, 1], 0.0) == "NO"  # threshold used differs from the predicted one


def test_format():
    assert fmt_vector([1.0, 1e-6, -2e-6, 0.9999], 1e-3) == "[1, 0, 0, 1]"
    assert fmt_vector([1.0, 0.5], 1e-3) == "[1, 0.50]"


def test_plan_cases_follow_the_config():
    """The schema's defaults (the one place they live), GA 1-8, one dtype in the multi-backward rows: all families."""
    m = load({"matrix": {"ga": [1, 2, 3, 4, 8], "multi_backward": {"calls": 4, "dtypes": ["fp32"]}},
              "loss_aggregation": {}}).matrix
    got = cases(m)
    assert len(got) == 4 * 2 * 5 * 2 + 2 * 4 * 2 + 2 * 4 * 2 * 2
    assert {c.boundary for c in got if c.backward_calls > 1} == {"manual", "none"}
    assert sum(c.clip is None for c in got) == 16
    assert {(c.clip, c.target_norm) for c in got if c.clip} == {(1.0, 2.0)}  # active clipping: norm twice the threshold
    one = load({"matrix": {"multi_backward": {"calls": 1}}, "loss_aggregation": {}}).matrix
    assert not [c for c in cases(one) if c.backward_calls > 1]  # calls 1: no multi-backward rows


def test_plan_paths_are_the_committed_layout():
    from gradfidelity.studies.ds_audit import plan

    cfg = load({"matrix": {"versions": ["0.18.9", "0.19.8"], "ranks": [1, 2]}, "loss_aggregation": {}})
    assert plan.group_runs(cfg, "results/smoke") == [
        f"results/smoke/ds_audit/matrix/deepspeed~{v}/ranks~{r}/seed0/metrics.json"
        for v in ("0.18.9", "0.19.8") for r in (1, 2)]
    assert plan.group_metrics("R") == "R/ds_audit/matrix/deepspeed~{version}/ranks~{ranks}/seed0/metrics.json"
    assert plan.loss_agg_file("R") == "R/ds_audit/loss_agg/seed0/metrics.json"
    assert plan.evidence("R") == "R/claims/ds_audit.json"
    assert sorted(plan.tables("T").values()) == [f"T/{n}.{e}" for n in ("ds_fault_matrix", "ds_norm_alignment",
                                                                        "loss_aggregation") for e in ("csv", "md")]


def test_a_case_survives_its_json_payload():
    """What a worker and the table job rebuild from JSON is the case that was planned (tuples included)."""
    import json

    case = DSCase(2, "cpu", 4, "bf16", clip=None, zero_extra=(("contiguous_gradients", False),), steps=3)
    again = case_from_json(json.loads(json.dumps(asdict(case))))
    assert again == case and again.zero_extra == (("contiguous_gradients", False),)


def test_rows_record_prediction_and_agreement():
    cases = [DSCase(2, "cpu", 4, "fp32"), DSCase(0, "none", 2, "fp32"), DSCase(1, "cpu", 4, "fp32"),
             DSCase(1, "cpu", 1, "fp32", 4)]
    states = [state([1, 0, 0, 1], steps=2), state([1, 0.5]), {"status": "error", "error": "RuntimeError: boom"},
              state([0, 0, 0, 1])]
    df = pd.DataFrame(rows_for_group("0.18.9", 1, cases, states))
    assert list(df.predicted) == ["[1,0,0,1]", "[1,1]", "[1,1,1,1]", "open"]
    assert list(df.agrees_with_prediction) == ["yes", "NO", "error", "open"]
    assert df.error[2] == "RuntimeError: boom" and df.contributions[0] == "[1, 0, 0, 1] | [1, 0, 0, 1]"
    assert df.result[0]["per_step"][1]["contributions"] == [1, 0, 0, 1]  # raw values for the claims
