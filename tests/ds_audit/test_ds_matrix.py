"""Fault-matrix bookkeeping: the bug description's predictions per row, the agreement test, and the table rows built
from made-up probe states (claim evidence on such rows: test_ds_claims.py)."""

import pandas as pd
import pytest

from gradfidelity.errors import UserError
from gradfidelity.studies.ds_audit.ds_step import DSCase
from gradfidelity.studies.ds_audit.matrix import MatrixConfig, compare, fmt_vector, prediction, rows_for_group


@pytest.mark.parametrize(("version", "case", "ranks", "want"), [
    ("0.18.9", DSCase(2, "cpu", 4, "fp32"), 1, [1, 0, 0, 1]),
    ("0.18.9", DSCase(2, "cpu", 4, "bf16"), 2, [1, 0, 0, 1, 1, 0, 0, 1]),
    ("0.18.9", DSCase(2, "cpu", 2, "fp32"), 1, [1, 1]),
    ("0.18.9", DSCase(2, "none", 8, "fp32"), 1, [1] * 8),
    ("0.18.9", DSCase(3, "cpu", 4, "fp32"), 1, [1] * 4),
    ("0.18.9", DSCase(0, "cpu", 4, "fp32"), 1, [1] * 4),
    ("0.16.3", DSCase(2, "cpu", 3, "fp32"), 1, [1, 0, 1]),
    ("0.19.8", DSCase(2, "cpu", 8, "fp32"), 1, [1] * 8),
    ("0.18.9", DSCase(2, "cpu", 1, "fp32", backward_calls=4), 1, [0, 0, 0, 1]),
    ("0.18.9", DSCase(1, "cpu", 4, "fp32"), 2, None),
    ("0.18.9", DSCase(1, "cpu", 1, "fp32", backward_calls=4), 1, None),
    ("0.18.9", DSCase(2, "none", 1, "fp32", backward_calls=4), 1, [1] * 4),
])
def test_prediction(version, case, ranks, want):
    assert prediction(version, case, ranks)[0] == want


def test_compare_and_format():
    res = {"contributions": [1.0, 1e-6, -2e-6, 0.9999], "tolerance": 1e-3, "residual": 1e-8}
    assert compare(res, [1, 0, 0, 1]) == "yes"
    assert compare(res, [1, 1, 1, 1]) == "NO"
    assert compare(res, None) == "open"
    assert compare({**res, "residual": 0.5}, [1, 0, 0, 1]) == "NO"
    assert fmt_vector(res["contributions"], 1e-3) == "[1, 0, 0, 1]"
    assert fmt_vector([1.0, 0.5], 1e-3) == "[1, 0.50]"


def test_matrix_config():
    m = MatrixConfig.from_dict({"ga": [1, 2, 3, 4, 8], "multi_backward": {"calls": 4, "dtypes": ["fp32"]}})
    assert len(m.cases()) == 4 * 2 * 5 * 2 + 4 * 2 * 1
    with pytest.raises(UserError, match="unknown keys"):
        MatrixConfig.from_dict({"gaa": [1]})


def _state(c, tol=1e-3, resid=1e-9, norm=None):
    return {"status": "ok", "seconds": 0.1, "result": {
        "contributions": c, "tolerance": tol, "residual": resid, "dropped": [i for i, x in enumerate(c) if x == 0],
        "faithful": all(x == 1 for x in c), "grad_norm_ratio": norm, "applied_norm_ratio": norm or 1.0,
        "max_param_dev": 0.0, "extra": {}}}


def test_rows_record_prediction_and_agreement():
    cases = [DSCase(2, "cpu", 4, "fp32"), DSCase(0, "none", 2, "fp32"), DSCase(1, "cpu", 4, "fp32"),
             DSCase(1, "cpu", 1, "fp32", 4)]
    states = [_state([1, 0, 0, 1]), _state([1, 0.5]), {"status": "error", "error": "RuntimeError: boom"},
              _state([0, 0, 0, 1])]
    df = pd.DataFrame(rows_for_group("0.18.9", 1, cases, states))
    assert list(df.predicted) == ["[1,0,0,1]", "[1,1]", "[1,1,1,1]", "open"]
    assert list(df.agrees_with_prediction) == ["yes", "NO", "error", "open"]
    assert df.error[2] == "RuntimeError: boom" and df.contributions[0] == "[1, 0, 0, 1]"
