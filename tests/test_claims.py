"""Claims: interval verdicts on hand-made evidence (every verdict, every check kind), the evidence constructors
against scipy, the registry's own well-formedness, and the report built from an evidence file."""

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import stats

from gradfidelity.claims import evidence as ev
from gradfidelity.claims.report import write_claims_report
from gradfidelity.claims.verify import (
    ARITHMETIC_BAD,
    ARITHMETIC_OK,
    INCONCLUSIVE,
    NOT_MEASURED,
    NOT_REPRODUCED,
    REPRODUCED,
    describe_check,
    interval_verdict,
    judge,
    load_evidence,
    load_registry,
    verify,
)
from gradfidelity.errors import UserError

ROW = {"id": "X1", "study": "s", "paper": "p", "statement": "s", "paper_value": "v", "metric": "m",
       "check": {"kind": "gt", "threshold": 1.0}, "scales": ["smoke", "cpu"], "why": "w", "min_n": 3,
       "level": 0.95, "evidence": "measured"}


def rec(estimate, low=None, high=None, n=5, **kw):
    return {"estimate": estimate, "low": low, "high": high, "level": 0.95, "exact": False, "n": n, **kw}


def test_registry_lists_every_claim_with_min_n_and_level():
    rows = load_registry()
    ids = {row["id"] for row in rows}
    expected = {f"A{i}" for i in range(1, 10)} | {"B1", "B2", "B3", "B4", "B6", "B7", "B8"} | {
        f"C{i}" for i in range(1, 11)}
    assert expected <= ids
    assert {"B5-muon", "B5-adamw", "B9-sync_start", "B9-sync_cooldown", "B9-taylor"} <= ids
    assert all(row["min_n"] >= 1 and 0 < row["level"] < 1 for row in rows)
    assert [r["id"] for r in rows if r["evidence"] == "arithmetic"] == ["C5"]


@pytest.mark.parametrize("check,low,high,expected", [
    ({"kind": "gt", "threshold": 0}, 0.1, 0.5, REPRODUCED),
    ({"kind": "gt", "threshold": 0}, -0.1, 0.5, INCONCLUSIVE),   # spans the threshold
    ({"kind": "gt", "threshold": 0}, -0.5, 0.0, NOT_REPRODUCED),  # whole interval <= 0
    ({"kind": "ge", "threshold": 0}, 0.0, 0.5, REPRODUCED),
    ({"kind": "lt", "threshold": 1}, 0.2, 0.9, REPRODUCED),
    ({"kind": "lt", "threshold": 1}, 0.9, 1.1, INCONCLUSIVE),
    ({"kind": "lt", "threshold": 1}, 1.0, 1.3, NOT_REPRODUCED),
    ({"kind": "le", "threshold": 1}, 1.0, 1.0, REPRODUCED),
    ({"kind": "between", "range": [50, 70]}, 55, 65, REPRODUCED),
    ({"kind": "between", "range": [50, 70]}, 45, 65, INCONCLUSIVE),
    ({"kind": "between", "range": [50, 70]}, 71, 90, NOT_REPRODUCED),
    ({"kind": "between", "range": [50, 70]}, 10, 49, NOT_REPRODUCED),
    ({"kind": "between", "range": [50, 70]}, 40, 80, INCONCLUSIVE),  # covers the range and beyond
    ({"kind": "outside", "range": [-0.005, 0.005]}, 0.030, 0.111, REPRODUCED),   # wholly above the band
    ({"kind": "outside", "range": [-0.005, 0.005]}, -0.2, -0.006, REPRODUCED),   # wholly below
    ({"kind": "outside", "range": [-0.005, 0.005]}, -0.004, 0.004, NOT_REPRODUCED),  # wholly inside
    ({"kind": "outside", "range": [-0.005, 0.005]}, -0.005, 0.005, NOT_REPRODUCED),  # the band itself: inside
    ({"kind": "outside", "range": [-0.005, 0.005]}, 0.001, 0.02, INCONCLUSIVE),  # straddles an end
    ({"kind": "outside", "range": [-0.005, 0.005]}, 0.005, 0.02, INCONCLUSIVE),  # touches the band
    ({"kind": "outside", "range": [-0.005, 0.005]}, -0.02, 0.02, INCONCLUSIVE),  # covers the band
    ({"kind": "equals", "value": 3}, 3, 3, REPRODUCED),
    ({"kind": "equals", "value": 3}, 2, 3.5, INCONCLUSIVE),
    ({"kind": "equals", "value": 0}, 2, 2, NOT_REPRODUCED),
])
def test_interval_verdict(check, low, high, expected):
    assert interval_verdict(check, low, high) == expected


def test_a_margin_claim_is_decided_on_its_interval_against_the_margin_both_ways():
    """C4's shape (issue 57): "fails the 1% margin" reads reproduced when the gap's 90% interval lies wholly above
    the margin, not reproduced when wholly below it (non-inferior), inconclusive across it; made-up gaps each way."""
    row = dict(ROW, level=0.90, check={"kind": "gt", "threshold": 1.0})
    rng = np.random.default_rng(4)
    worse = ev.mean_ci(1.8 + 0.3 * rng.standard_normal(40), 0.90)
    fine = ev.mean_ci(0.2 + 0.3 * rng.standard_normal(40), 0.90)
    between = ev.mean_ci([0.2, 1.9, -0.4, 1.1, 0.8, 2.3, -0.6, 0.9, 1.4, 0.1], 0.90)
    assert worse["low"] > 1.0 and judge(row, worse, True, "cpu")[0] == REPRODUCED
    assert fine["high"] < 1.0 and judge(row, fine, True, "cpu")[0] == NOT_REPRODUCED
    assert between["low"] < 1.0 < between["high"] and judge(row, between, True, "cpu")[0] == INCONCLUSIVE
    lt = dict(row, check={"kind": "lt", "threshold": 1.0})  # the mirror
    assert judge(lt, fine, True, "cpu")[0] == REPRODUCED and judge(lt, worse, True, "cpu")[0] == NOT_REPRODUCED


def test_a_band_claim_is_decided_on_its_interval_against_the_band_both_ways():
    """C9's shape (issue 57): "not equivalent within +-0.005" reads reproduced when the interval lies wholly
    outside the band, not reproduced when wholly inside it, else inconclusive; made-up differences each way."""
    row = dict(ROW, check={"kind": "outside", "range": [-0.005, 0.005]})
    apart = ev.mean_ci([0.09, 0.06, 0.08, 0.05, 0.07], 0.95)
    close = ev.mean_ci([0.001, -0.002, 0.0005, 0.0015, -0.001, 0.0, 0.002, -0.0005], 0.95)
    edge = ev.mean_ci([0.001, 0.012, 0.004, 0.009, 0.006], 0.95)
    assert apart["low"] > 0.005 and judge(row, apart, True, "cpu")[0] == REPRODUCED
    assert -0.005 < close["low"] and close["high"] < 0.005 and judge(row, close, True, "cpu")[0] == NOT_REPRODUCED
    assert edge["low"] < 0.005 < edge["high"] and judge(row, edge, True, "cpu")[0] == INCONCLUSIVE
    inside = dict(row, check={"kind": "between", "range": [-0.005, 0.005]})  # the mirror: equivalence
    assert judge(inside, close, True, "cpu")[0] == REPRODUCED and judge(inside, apart, True, "cpu")[0] == (
        NOT_REPRODUCED)


def test_the_registry_reads_an_outside_check_with_an_ordered_range(tmp_path):
    def registry(check):
        path = tmp_path / "r.yaml"
        row = {k: v for k, v in ROW.items() if k not in ("level", "evidence")}
        path.write_text(yaml.safe_dump({"interval_level": 0.95, "claims": [dict(row, check=check)]}))
        return load_registry(path)

    assert describe_check(registry({"kind": "outside", "range": [-0.005, 0.005]})[0]["check"]) == (
        "outside [-0.005, 0.005]")
    with pytest.raises(UserError, match="needs 'range'"):
        registry({"kind": "outside", "threshold": 0.005})
    with pytest.raises(UserError, match="not ordered"):
        registry({"kind": "outside", "range": [0.005, -0.005]})


def test_a_point_on_the_right_side_with_an_interval_across_the_threshold_is_inconclusive():
    verdict, _ = judge(ROW, rec(1.4, 0.8, 2.0), True, "cpu")
    assert verdict == INCONCLUSIVE
    assert judge(ROW, rec(1.4, 1.1, 1.7), True, "cpu")[0] == REPRODUCED
    assert judge(ROW, rec(0.6, 0.2, 0.9), True, "cpu")[0] == NOT_REPRODUCED


def test_n_below_min_n_is_never_a_verdict_even_with_a_clear_interval():
    verdict, reason = judge(ROW, rec(5.0, 4.0, 6.0, n=2), True, "cpu")
    assert verdict == NOT_MEASURED and reason == "n = 2 < min_n = 3"
    verdict, reason = judge(ROW, rec(5.0, n=1), True, "cpu")  # one seed: no interval at all
    assert verdict == NOT_MEASURED and "min_n" in reason


def test_a_failed_gate_is_not_measured_with_its_reason():
    gates = [ev.gate("reference_learned", False, "fixed SFT 20% vs constant answer 23%"),
             ev.gate("plateau", True, "ok")]
    verdict, reason = judge(ROW, rec(5.0, 4.0, 6.0, gates=gates), True, "cpu")
    assert verdict == NOT_MEASURED
    assert reason == "gate failed: reference_learned: fixed SFT 20% vs constant answer 23%"


def test_behind_a_failed_gate_a_parts_claim_shows_its_parts_as_a_one_number_claim_shows_its_estimate():
    """Issue 46: A8 (one number) showed its estimate behind the failed arms_learned gate while A7, A8-mech and A9
    (parts) showed none. Both kinds now show their numbers; identical parts are named together once."""
    failed = [ev.gate("arms_learned", False, "arm did not learn")]
    single = rec(-4.04, -9.0, 1.0, gates=failed)
    parts_row = dict(ROW, id="X2", check={"kind": "true", "parts": {"a": {"kind": "gt", "threshold": 0.0},
                                                                      "b": {"kind": "gt", "threshold": 0.0},
                                                                      "c": {"kind": "gt", "threshold": 0.0}}})
    parted = ev.with_parts({"a": rec(36.73, 20.98, 52.48), "b": rec(36.73, 20.98, 52.48), "c": rec(40.5, 22.7, 58.3)},
                           gates=failed)
    df = verify([ROW, parts_row], {"s": {"study": "s", "values": {"X1": single, "X2": parted}}}, "cpu")
    df = df.set_index("id")
    assert (df["verdict"] == NOT_MEASURED).all()
    assert df.loc["X1", "estimate"] == -4.04 and df.loc["X1", "parts"] == ""
    assert df.loc["X2", "parts"] == "a, b +36.73 [+20.98, +52.48]; c +40.5 [+22.7, +58.3]"


def test_scale_missing_study_missing_value_and_null_are_not_measured():
    assert judge(ROW, rec(5.0, 4.0, 6.0), True, "paper") == (NOT_MEASURED, "measurable at smoke, cpu only")
    assert judge(ROW, None, False, "cpu")[0] == NOT_MEASURED
    assert "reported no value" in judge(ROW, None, True, "cpu")[1]
    assert judge(ROW, ev.not_measured("seed 1 diverged"), True, "cpu") == (NOT_MEASURED, "seed 1 diverged")


def test_exact_values_have_zero_width_and_need_no_level():
    assert judge(dict(ROW, min_n=1), ev.exact(2.0, n=1), True, "cpu")[0] == REPRODUCED
    assert judge(dict(ROW, min_n=1), ev.exact(1.0, n=1), True, "cpu")[0] == NOT_REPRODUCED
    bad = dict(ev.exact(2.0, n=3), low=1.0)
    with pytest.raises(UserError, match="zero-width"):
        judge(ROW, bad, True, "cpu")


def test_an_interval_at_another_level_or_around_another_point_is_refused():
    with pytest.raises(UserError, match="level"):
        judge(ROW, dict(rec(1.4, 1.1, 1.7), level=0.8), True, "cpu")
    with pytest.raises(UserError, match="outside its interval"):
        judge(ROW, rec(3.0, 1.1, 1.7), True, "cpu")


def test_arithmetic_rows_are_checked_not_reproduced():
    row = dict(ROW, evidence="arithmetic", check={"kind": "between", "range": [422, 424]}, min_n=1)
    assert judge(row, ev.exact(423.4, n=5), True, "smoke")[0] == ARITHMETIC_OK
    assert judge(row, ev.exact(500.0, n=5), True, "smoke")[0] == ARITHMETIC_BAD


def test_true_with_parts_needs_every_part():
    row = dict(ROW, check={"kind": "true", "parts": {"accuracy": {"kind": "gt", "threshold": 0},
                                                     "flops": {"kind": "lt", "threshold": 1}}})
    good = ev.with_parts({"accuracy": rec(2.0, 1.0, 3.0), "flops": ev.exact(0.5, n=5)})
    assert judge(row, good, True, "cpu")[0] == REPRODUCED
    one_bad = ev.with_parts({"accuracy": rec(2.0, 1.0, 3.0), "flops": ev.exact(1.5, n=5)})
    assert judge(row, one_bad, True, "cpu")[0] == NOT_REPRODUCED
    one_open = ev.with_parts({"accuracy": rec(2.0, -1.0, 5.0), "flops": ev.exact(0.5, n=5)})
    assert judge(row, one_open, True, "cpu")[0] == INCONCLUSIVE
    with pytest.raises(UserError, match="parts"):
        judge(row, ev.with_parts({"accuracy": rec(2.0, 1.0, 3.0)}), True, "cpu")


def test_true_without_parts_takes_an_exact_boolean_only():
    row = dict(ROW, check={"kind": "true"}, min_n=1)
    assert judge(row, ev.exact(True, n=4), True, "cpu")[0] == REPRODUCED
    assert judge(row, ev.exact(False, n=4), True, "cpu")[0] == NOT_REPRODUCED
    with pytest.raises(UserError, match="exact boolean"):
        judge(row, rec(1.0, 0.5, 1.5), True, "cpu")


def test_mean_ci_is_scipys_t_interval():
    x = np.random.default_rng(3).normal(1.0, 0.5, size=6)
    r = ev.mean_ci(x, 0.95)
    low, high = stats.t.interval(0.95, df=5, loc=x.mean(), scale=stats.sem(x))
    assert r["n"] == 6 and r["estimate"] == pytest.approx(x.mean())
    assert (r["low"], r["high"]) == (pytest.approx(low), pytest.approx(high))
    with pytest.raises(ValueError, match="non-finite"):
        ev.mean_ci([1.0, math.nan], 0.95)


def test_paired_ratio_is_an_interval_on_log_ratios():
    a, b = np.array([1.3, 1.5, 1.4, 1.2]), np.array([1.0, 1.1, 0.9, 1.0])
    r = ev.paired_ratio(a, b, 0.95)
    logr = np.log(a / b)
    low, high = stats.t.interval(0.95, df=3, loc=logr.mean(), scale=stats.sem(logr))
    assert r["estimate"] == pytest.approx(math.exp(logr.mean()))
    assert (r["low"], r["high"]) == (pytest.approx(math.exp(low)), pytest.approx(math.exp(high)))


def test_weakest_comparison_decides_an_every_comparison_claim():
    strong, weak, bad = rec(3.0, 2.0, 4.0), rec(1.0, 0.2, 1.8), rec(-1.0, -2.0, -0.5)
    assert ev.weakest({"a": strong, "b": weak})["low"] == 0.2
    assert ev.weakest({"a": strong, "b": weak, "c": bad})["high"] == -0.5  # a contradiction settles it
    assert "deciding comparison: c" in ev.weakest({"a": strong, "c": bad})["detail"]


def _evidence_file(tmp_path, values, scale="cpu", study="s"):
    path = tmp_path / f"{study}.json"
    path.write_text(json.dumps({"study": study, "scale": scale, "values": values}))
    return path


def test_evidence_from_another_scale_or_in_the_old_format_is_refused(tmp_path):
    with pytest.raises(UserError, match="scale"):
        load_evidence([_evidence_file(tmp_path, {}, scale="smoke")], "cpu")
    with pytest.raises(UserError, match="X1"):
        load_evidence([_evidence_file(tmp_path, {"X1": {"measured": 2.0, "n": 3}})], "cpu")


def test_evidence_written_for_an_older_metric_is_not_judged_by_the_new_check(tmp_path):
    """A row whose metric changed (evidence_version 2) must not judge a file written for the old one: issue 25 moved
    study B from nats gaps to lost compute, and round 2's B2 estimate (a gap of 0.4% of the loss) would otherwise
    read as 'reproduced' against the new +-10% of compute."""
    row = dict(ROW, evidence_version=2)
    old = _evidence_file(tmp_path, {"X1": rec(2.0, 1.5, 2.5)})  # no version: 1
    df = verify([row], load_evidence([old], "cpu"), "cpu").set_index("id")
    assert df.loc["X1", "verdict"] == NOT_MEASURED and "stale evidence" in df.loc["X1", "reason"]
    new = tmp_path / "new.json"
    new.write_text(json.dumps({**json.loads(Path(old).read_text()), "evidence_version": 2}))
    assert verify([row], load_evidence([new], "cpu"), "cpu").set_index("id").loc["X1", "verdict"] == REPRODUCED
    assert judge(ROW, rec(2.0, 1.5, 2.5), True, "cpu", evidence_version=1)[0] == REPRODUCED  # version 1 rows


def test_bad_registry_is_refused(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("interval_level: 0.95\nclaims:\n- id: X\n  study: s\n")
    with pytest.raises(UserError, match="claims registry"):
        load_registry(path)


def test_report_counts_verdicts_and_never_calls_a_small_n_reproduced(tmp_path):
    registry = [dict(ROW, id="X1"), dict(ROW, id="X2"), dict(ROW, id="X3"), dict(ROW, id="X4")]
    path = _evidence_file(tmp_path, {"X1": rec(2.0, 1.5, 2.5), "X2": rec(2.0, 1.5, 2.5, n=2),
                                     "X3": rec(1.2, 0.5, 1.9), "X4": rec(0.1, 0.0, 0.2)})
    df = verify(registry, load_evidence([path], "cpu"), "cpu").set_index("id")
    assert df["verdict"].to_dict() == {"X1": REPRODUCED, "X2": NOT_MEASURED, "X3": INCONCLUSIVE,
                                       "X4": NOT_REPRODUCED}


def test_claims_report_files(tmp_path):
    ds = _evidence_file(tmp_path, {"A2": ev.exact(0.0, n=4)}, study="ds_audit")
    out = write_claims_report([ds], tmp_path / "c.csv", tmp_path / "c.md", "cpu")
    md = (tmp_path / "c.md").read_text()
    assert "n / min_n" in md and "exact" in md
    assert out.set_index("id").loc["A2", "verdict"] == REPRODUCED
    assert pd.read_csv(tmp_path / "c.csv").shape[0] == len(load_registry())


def test_an_unmeasured_part_gives_its_own_reason_not_n():
    row = dict(ROW, check={"kind": "true", "parts": {"vs_a": {"kind": "gt", "threshold": 0},
                                                     "vs_b": {"kind": "gt", "threshold": 0}}})
    record = ev.with_parts({"vs_a": rec(2.0, 1.0, 3.0), "vs_b": ev.not_measured("method b is not configured")})
    assert judge(row, record, True, "cpu") == (NOT_MEASURED, "part vs_b: method b is not configured; "
                                                             "decided: vs_a reproduced")


PARTS_ROW = dict(ROW, check={"kind": "true", "parts": {"vs_a": {"kind": "gt", "threshold": 0},
                                                       "vs_b": {"kind": "gt", "threshold": 0},
                                                       "vs_c": {"kind": "gt", "threshold": 0}}})


def test_a_part_not_reproduced_decides_the_claim_whatever_an_unmeasured_part_says():
    """An AND with a false part is false: one part not reproduced and one not measured read not reproduced, the
    reason naming the false part and the unmeasured one with its own reason."""
    record = ev.with_parts({"vs_a": rec(-2.0, -3.0, -1.0), "vs_b": ev.not_measured("b: transient"),
                            "vs_c": rec(2.0, 1.0, 3.0)})
    verdict, reason = judge(PARTS_ROW, record, True, "cpu")
    assert verdict == NOT_REPRODUCED
    assert reason == (f"vs_a: {NOT_REPRODUCED}; vs_b: {NOT_MEASURED} (b: transient); vs_c: {REPRODUCED}")


def test_a_decided_part_is_listed_when_another_part_is_not_measured():
    record = ev.with_parts({"vs_a": rec(2.0, 1.0, 3.0), "vs_b": ev.not_measured("b: transient"),
                            "vs_c": rec(0.5, -1.0, 2.0)})
    assert judge(PARTS_ROW, record, True, "cpu") == (
        NOT_MEASURED, "part vs_b: b: transient; decided: vs_a reproduced, vs_c inconclusive")
    two_missing = ev.with_parts({"vs_a": rec(2.0, 1.0, 3.0), "vs_b": ev.not_measured("b: transient"),
                                 "vs_c": ev.not_measured("c: saturated")})
    assert judge(PARTS_ROW, two_missing, True, "cpu") == (
        NOT_MEASURED, "part vs_b: b: transient; part vs_c: c: saturated; decided: vs_a reproduced")


def test_a_part_is_judged_by_its_own_gates_and_the_claims_gates_apply_to_every_part():
    """A part failing its own gate is not measured even with a clear interval, and a sibling whose gates pass is
    decided; a failing claim gate (shared by every part) leaves the claim not measured even with a false part."""
    fail_b = [ev.gate("transient", False, "b at 60 steps: transient")]
    pass_ = [ev.gate("transient", True, "ok")]
    record = ev.with_parts({"vs_a": rec(2.0, 1.0, 3.0, gates=pass_), "vs_b": rec(2.0, 1.0, 3.0, gates=fail_b),
                            "vs_c": rec(2.0, 1.0, 3.0, gates=pass_)})
    assert judge(PARTS_ROW, record, True, "cpu") == (
        NOT_MEASURED, "part vs_b: gate failed: transient: b at 60 steps: transient; "
                      "decided: vs_a reproduced, vs_c reproduced")
    record["parts"]["vs_a"] = rec(-2.0, -3.0, -1.0, gates=pass_)
    assert judge(PARTS_ROW, record, True, "cpu")[0] == NOT_REPRODUCED
    record["gates"] = [ev.gate("transient", False, "adamw at 60 steps: noisy")]
    assert judge(PARTS_ROW, record, True, "cpu") == (NOT_MEASURED,
                                                     "gate failed: transient: adamw at 60 steps: noisy")


def test_all_parts_reproduced_is_reproduced():
    record = ev.with_parts({k: rec(2.0, 1.0, 3.0) for k in ("vs_a", "vs_b", "vs_c")})
    assert judge(PARTS_ROW, record, True, "cpu") == (
        REPRODUCED, f"vs_a: {REPRODUCED}; vs_b: {REPRODUCED}; vs_c: {REPRODUCED}")


def test_min_n_applies_to_each_part_and_a_shared_shortfall_is_said_once():
    short = ev.with_parts({k: rec(2.0, 1.0, 3.0, n=2) for k in ("vs_a", "vs_b", "vs_c")})
    assert judge(PARTS_ROW, short, True, "cpu") == (NOT_MEASURED, "n = 2 < min_n = 3")
    one_short = ev.with_parts({"vs_a": rec(-2.0, -3.0, -1.0), "vs_b": rec(2.0, 1.0, 3.0, n=2),
                               "vs_c": rec(2.0, 1.0, 3.0)})
    assert one_short["n"] == 2 and judge(PARTS_ROW, one_short, True, "cpu")[0] == NOT_REPRODUCED
    one_short["parts"]["vs_a"] = rec(2.0, 1.0, 3.0)
    assert judge(PARTS_ROW, one_short, True, "cpu") == (
        NOT_MEASURED, "part vs_b: n = 2 < min_n = 3; decided: vs_a reproduced, vs_c reproduced")


def test_verify_lists_each_parts_own_gates():
    row = dict(PARTS_ROW, id="X1", study="s")
    shared = [ev.gate("transient", True, "adamw ok")]
    record = ev.with_parts({"vs_a": rec(2.0, 1.0, 3.0, gates=[ev.gate("transient", True, "a ok")]),
                            "vs_b": ev.not_measured("b: transient", gates=[ev.gate("transient", False, "b")]),
                            "vs_c": rec(2.0, 1.0, 3.0, gates=shared)}, gates=shared)
    out = verify([row], {"s": {"values": {"X1": record}, "path": "e.json"}}, "cpu").iloc[0]
    assert out["gates"] == "transient=pass; vs_a: transient=pass; vs_b: transient=FAIL"
    assert out["verdict"] == NOT_MEASURED and "decided: vs_a reproduced, vs_c reproduced" in out["reason"]


def test_verify_shows_the_n_of_the_parts_that_decided_a_claim_not_reproduced():
    """A claim decided by a false part while another part has no value (n = 0) shows the decided parts' n, so that
    no decided claim reads n < min_n."""
    row = dict(PARTS_ROW, id="X1", study="s")
    record = ev.with_parts({"vs_a": rec(-2.0, -3.0, -1.0, n=4), "vs_b": ev.not_measured("b: no seed finished"),
                            "vs_c": rec(2.0, 1.0, 3.0, n=5)})
    assert record["n"] == 0
    out = verify([row], {"s": {"values": {"X1": record}, "path": "e.json"}}, "cpu").iloc[0]
    assert out["verdict"] == NOT_REPRODUCED and out["n"] == 4
    record["parts"]["vs_a"] = rec(2.0, 1.0, 3.0, n=4)
    out = verify([row], {"s": {"values": {"X1": record}, "path": "e.json"}}, "cpu").iloc[0]
    assert out["verdict"] == NOT_MEASURED and out["n"] == 0


HOST_AMD = "AuthenticAMD 25/17/1, torch AVX512, flags avx2 avx512f avx512_bf16"
HOST_INTEL = "GenuineIntel 6/167/1, torch AVX512, flags avx2 avx512f"


def test_the_claims_table_lists_host_types_and_a_detail_names_two(tmp_path):
    """Issue 57: every claim lists the host types of its runs (empty where its study recorded none), and one whose
    runs come from two host types says so in its detail; a parts claim's hosts are its parts' too."""
    registry = [dict(ROW, id="X1"), dict(ROW, id="X2"), dict(ROW, id="X3"), dict(PARTS_ROW, id="X4")]
    one = rec(2.0, 1.5, 2.5, hosts=[HOST_INTEL], detail="gap of the means")
    two = rec(2.0, 1.5, 2.5, hosts=[HOST_INTEL, HOST_AMD])
    parted = ev.with_parts({"vs_a": rec(2.0, 1.0, 3.0, hosts=[HOST_AMD]), "vs_b": rec(2.0, 1.0, 3.0),
                            "vs_c": rec(2.0, 1.0, 3.0, hosts=[HOST_INTEL])})
    path = _evidence_file(tmp_path, {"X1": one, "X2": two, "X3": rec(2.0, 1.5, 2.5), "X4": parted})
    df = verify(registry, load_evidence([path], "cpu"), "cpu").set_index("id")
    assert df.loc["X1", "hosts"] == HOST_INTEL and df.loc["X1", "detail"] == "gap of the means"
    assert df.loc["X2", "hosts"] == f"{HOST_AMD} | {HOST_INTEL}"
    assert df.loc["X2", "detail"] == f"its runs come from 2 host types ({HOST_AMD} | {HOST_INTEL})"
    assert df.loc["X3", "hosts"] == "" and df.loc["X3", "detail"] == ""
    assert df.loc["X4", "hosts"] == f"{HOST_AMD} | {HOST_INTEL}" and "2 host types" in df.loc["X4", "detail"]
    assert (df["verdict"] == REPRODUCED).all()  # a host note changes no verdict


def test_the_claims_report_files_carry_the_hosts_column(tmp_path):
    ds = _evidence_file(tmp_path, {"A2": dict(ev.exact(0.0, n=4), hosts=[HOST_AMD])}, study="ds_audit")
    write_claims_report([ds], tmp_path / "c.csv", tmp_path / "c.md", "cpu")
    csv = pd.read_csv(tmp_path / "c.csv", keep_default_na=False).set_index("id")
    assert csv.loc["A2", "hosts"] == HOST_AMD and csv.loc["A1", "hosts"] == ""
    md = (tmp_path / "c.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| id "))
    assert "hosts" in [c.strip() for c in header.split("|")]
    assert HOST_AMD in md


def test_the_committed_evidence_still_loads_and_verifies():
    """The old verdict machinery keeps reading the committed evidence (results/cpu/claims/*.json), with or without
    power and host records in it."""
    paths = sorted((Path(__file__).parents[1] / "results" / "cpu" / "claims").glob("*.json"))
    assert paths
    df = verify(load_registry(), load_evidence(paths, "cpu"), "cpu")
    assert len(df) == len(load_registry()) and "hosts" in df.columns
