"""The claims figure: the normalised axis (the check at 0, the claim's side to the right) and the PNG written from
the claims CSV that `write_claims_report` makes."""

import json
import os
import shutil

import pytest

from gradfidelity.claims import evidence as ev
from gradfidelity.claims.figure import claims_figure, normalise
from gradfidelity.claims.report import write_claims_report
from gradfidelity.claims.verify import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, interval_verdict, load_registry

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
    ({"kind": "outside", "range": [-0.005, 0.005]}, 0.03, 0.11), ({"kind": "outside", "range": [-0.005, 0.005]},
                                                                  -0.11, -0.03),
    ({"kind": "outside", "range": [-0.005, 0.005]}, -0.004, 0.003),
    ({"kind": "outside", "range": [-0.005, 0.005]}, -0.002, 0.02),
    ({"kind": "outside", "range": [-0.005, 0.005]}, -0.02, 0.02),
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


def _record_for(check, i, level=0.95):
    """A record of the right shape for any registry check (the rows' shapes change with the studies)."""
    if check["kind"] == "true":
        if check.get("parts"):
            return ev.with_parts({name: _record_for(part, i, level) for name, part in check["parts"].items()})
        return ev.exact(i % 2 == 0, n=4)
    centre = check.get("threshold", check.get("value", sum(check.get("range", [0, 0])) / 2))
    if i % 3 == 0:
        return ev.exact(centre + 1.0, n=5)
    return ev.mean_ci([centre + 0.5 * (i % 5 - 2) + d for d in (-0.2, 0.1, 0.3)], level)


def test_figure_is_written_from_the_claims_csv(tmp_path):
    values = {}
    for i, row in enumerate(load_registry()):
        if i % 4 != 3:  # leave some claims without evidence: they must still be listed
            exact = row["evidence"] == "arithmetic"  # arithmetic checks are exact by definition
            values.setdefault(row["study"], {})[row["id"]] = _record_for(row["check"], 0 if exact else i, row["level"])
    values.setdefault("local", {})["C9"] = ev.exact(1e6, n=5)  # far off: still one unit
    csv = _report(tmp_path, values)
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
