"""Claims verification: checks, scales, missing evidence, and that the registry itself is well-formed."""

import json

import pytest

from gradfidelity.claims.verify import (
    NOT_MEASURED,
    NOT_REPRODUCED,
    REPRODUCED,
    apply_check,
    load_evidence,
    load_registry,
    verify,
)
from gradfidelity.errors import UserError

ROW = {"id": "X1", "study": "s", "paper": "p", "statement": "s", "paper_value": "v", "metric": "m",
       "check": {"kind": "gt", "threshold": 1.0}, "scales": ["smoke", "cpu"], "why": "w"}


def test_registry_loads_and_lists_every_claim_of_facts_md():
    ids = {row["id"] for row in load_registry()}
    expected = {f"A{i}" for i in range(1, 10)} | {"B1", "B2", "B3", "B4", "B6", "B7", "B8"} | {
        f"C{i}" for i in range(1, 11)}
    assert expected <= ids
    assert {"B5-muon", "B5-adamw", "B9-sync_start", "B9-sync_cooldown", "B9-taylor"} <= ids


@pytest.mark.parametrize("check,value,expected", [
    ({"kind": "gt", "threshold": 0}, 0.1, True), ({"kind": "gt", "threshold": 0}, 0.0, False),
    ({"kind": "ge", "threshold": 0}, 0.0, True), ({"kind": "lt", "threshold": 1}, 1.0, False),
    ({"kind": "le", "threshold": 1}, 1.0, True), ({"kind": "between", "range": [50, 70]}, 70, True),
    ({"kind": "between", "range": [50, 70]}, 70.01, False), ({"kind": "equals", "value": 3}, 3, True),
    ({"kind": "equals", "value": [1, 0]}, [1, 1], False), ({"kind": "true"}, True, True),
    ({"kind": "true"}, False, False),
])
def test_apply_check(check, value, expected):
    assert apply_check(check, value) is expected


def test_a_wrong_type_is_an_error_not_a_fail():
    with pytest.raises(ValueError):
        apply_check({"kind": "true"}, 1)
    with pytest.raises(ValueError):
        apply_check({"kind": "gt", "threshold": 0}, float("nan"))


def test_verdicts_cover_scale_missing_and_null():
    rows = [dict(ROW, id="X1"), dict(ROW, id="X2"), dict(ROW, id="X3"), dict(ROW, id="X4", scales=["paper"]),
            dict(ROW, id="Y1", study="absent")]
    evidence = {"s": {"study": "s", "scale": "smoke", "values": {
        "X1": {"measured": 2.0}, "X2": {"measured": 0.5}, "X3": {"measured": None, "detail": "diverged"},
        "X4": {"measured": 5.0}}}}
    df = verify(rows, evidence, "smoke").set_index("id")
    assert df.loc["X1", "verdict"] == REPRODUCED
    assert df.loc["X2", "verdict"] == NOT_REPRODUCED
    assert df.loc["X3", "verdict"] == NOT_MEASURED and df.loc["X3", "detail"] == "diverged"
    assert df.loc["X4", "verdict"] == NOT_MEASURED  # measured, but not at a scale where it is measurable
    assert df.loc["Y1", "verdict"] == NOT_MEASURED


def test_evidence_from_another_scale_is_refused(tmp_path):
    path = tmp_path / "e.json"
    path.write_text(json.dumps({"study": "s", "scale": "cpu", "values": {}}))
    with pytest.raises(UserError, match="scale"):
        load_evidence([path], "smoke")


def test_bad_registry_is_refused(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("claims:\n- id: X\n  study: s\n")
    with pytest.raises(UserError, match="claims registry"):
        load_registry(path)
