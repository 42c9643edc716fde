"""The claims figure: the normalised axis (the check at 0, the claim's side to the right) and the PNG written from
the claims CSV that `write_claims_report` makes."""

import json
import os
import shutil

import pytest

from gradfidelity.claims import evidence as ev
from gradfidelity.claims.figure import claims_figure, normalise
from gradfidelity.claims.report import write_claims_report
from gradfidelity.claims.verify import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, interval_verdict

GT1, LT1 = {"kind": "gt", "threshold": 1.0}, {"kind": "lt", "threshold": 1.0}


def test_gt_interval_right_of_the_threshold_lies_right_of_zero():
    est, low, high = normalise(GT1, 1.75, 1.5, 2.0)
    assert 0 < low <= est <= high


def test_lt_is_flipped_so_the_claims_side_is_right():
    est, low, high = normalise(LT1, 0.65, 0.5, 0.8)
    assert 0 < low <= est <= high
    est, low, high = normalise(LT1, 1.3, 1.2, 1.4)  # against an lt claim: left of 0
    assert low <= est <= high < 0


def test_an_interval_spanning_the_threshold_spans_zero():
    for check, interval in ((GT1, (0.8, 1.0, 1.3)), (LT1, (0.9, 1.0, 1.2)),
                            ({"kind": "between", "range": [50, 70]}, (48, 55, 62))):
        _, low, high = normalise(check, interval[1], interval[0], interval[2])
        assert low < 0 < high


def test_the_unit_keeps_estimates_within_one_and_exact_values_as_points():
    est, low, high = normalise({"kind": "gt", "threshold": 0.0}, 30.0, 10.0, 50.0)
    assert est == pytest.approx(1.0) and low == pytest.approx(1 / 3) and high == pytest.approx(5 / 3)
    assert normalise({"kind": "le", "threshold": 0.01}, 0.03, 0.03, 0.03) == pytest.approx((-1.0, -1.0, -1.0))
    assert normalise({"kind": "equals", "value": 0}, 0.0, 0.0, 0.0) == (0.0, 0.0, 0.0)
    assert normalise(GT1, 1.5) == (pytest.approx(0.5), None, None)


@pytest.mark.parametrize("check,low,high", [
    ({"kind": "gt", "threshold": 0}, 0.1, 0.5), ({"kind": "gt", "threshold": 0}, -0.1, 0.5),
    ({"kind": "ge", "threshold": 2}, -3.0, 1.0), ({"kind": "le", "threshold": -0.5}, -1.3, -0.3),
    ({"kind": "lt", "threshold": 1}, 0.2, 0.9), ({"kind": "lt", "threshold": 1}, 1.1, 1.3),
    ({"kind": "between", "range": [50, 70]}, 55, 65), ({"kind": "between", "range": [50, 70]}, 45, 65),
    ({"kind": "between", "range": [50, 70]}, 71, 90), ({"kind": "between", "range": [50, 70]}, 10, 49),
    ({"kind": "between", "range": [85, 90]}, 52, 116),
])
def test_the_side_of_zero_matches_the_verdict(check, low, high):
    _, nlow, nhigh = normalise(check, (low + high) / 2, low, high)
    verdict = interval_verdict(check, low, high)
    side = REPRODUCED if nlow > 0 else NOT_REPRODUCED if nhigh < 0 else INCONCLUSIVE  # no case on a boundary
    assert side == verdict


def _report(tmp_path, values_by_study):
    paths = []
    for study, values in values_by_study.items():
        path = tmp_path / f"{study}.json"
        path.write_text(json.dumps({"study": study, "scale": "cpu", "values": values}))
        paths.append(path)
    csv = tmp_path / "claims.csv"
    write_claims_report(paths, csv, tmp_path / "claims.md", "cpu")
    return csv


def test_figure_is_written_from_the_claims_csv(tmp_path):
    lvl = 0.95
    csv = _report(tmp_path, {
        "ds_audit": {"A1": ev.exact(0, n=36), "A1-z1-r1": ev.exact(True, n=4), "A3": ev.exact(1.02, n=1)},
        "sft_rl": {"A5": ev.mean_ci([2.0, 3.1, 1.2], lvl), "A6": ev.mean_ci([-1, 0.5, -2.0], lvl),
                   "A9": ev.not_measured("arm diverged", gates=[ev.gate("sft_learned", False, "SFT at chance")])},
        "async_pp": {"B1": ev.paired_ratio([3.0, 2.5, 4.0], [0.1, 0.12, 0.09], lvl),
                     "B2": ev.mean_ci([0.004, 0.006, 0.005], lvl), "B5-muon": ev.mean_ci([55, 61, 64], lvl),
                     "B9-taylor": ev.mean_ci([0.95], lvl)},
        "local": {"C1": ev.paired_ratio([1.40, 1.38, 1.37], [1.0, 1.0, 1.01], lvl),
                  "C6": ev.mean_ci([0.5, 1.0, 0.8], lvl), "C9": ev.exact(1e6, n=5)},  # far off: still one unit
    })
    out = tmp_path / "fig" / "claims.png"
    out.parent.mkdir()
    claims_figure(csv, out, "cpu")
    if keep := os.environ.get("CLAIMS_FIGURE_KEEP"):  # to look at it: CLAIMS_FIGURE_KEEP=/tmp/x.png pytest ...
        shutil.copy(out, keep)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert not list(out.parent.glob("*.tmp*"))  # written atomically, nothing left behind


def test_figure_without_any_evidence_still_lists_every_claim(tmp_path):
    csv = _report(tmp_path, {})
    out = tmp_path / "claims.png"
    claims_figure(csv, out, "cpu")
    assert out.stat().st_size > 0
