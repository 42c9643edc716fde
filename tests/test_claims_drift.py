"""The claims report's hardware-drift column: read from verdicts recomputed under a measured drift, never written by
hand; a claim that flips says so with both verdicts and values, one none recomputed is left blank, not 'stable'."""

import json

import pandas as pd
import pytest

from gradfidelity.claims import evidence as ev
from gradfidelity.claims.report import FRAGILE, drift_flags, read_drift_verdicts, write_claims_report
from gradfidelity.errors import UserError


def _verdicts(rows):
    base = {"study": "ds_audit", "committed_value": "0 exact", "rerun_value": "0 exact",
            "values": "rerun at AVX2", "source": "drift_avx2_vs_avx512.csv"}
    return pd.DataFrame([{**base, **r} for r in rows])


def test_a_flip_is_fragile_with_its_numbers_and_no_flip_is_unchanged():
    flags = drift_flags(_verdicts([
        {"id": "C4", "committed": "inconclusive", "rerun": "reproduced", "unchanged": False,
         "committed_value": "1.342 [-0.1, 1.342]", "rerun_value": "0.98 [-0.2, 0.98]"},
        {"id": "C4", "committed": "inconclusive", "rerun": "inconclusive", "unchanged": True,
         "values": "rerun at AVX512"},
        {"id": "A2", "committed": "reproduced", "rerun": "reproduced", "unchanged": True},
        {"id": "A8", "committed": "inconclusive", "rerun": "inconclusive", "unchanged": True,
         "committed_value": "-4.042 [-14.71, 6.626] 99%", "rerun_value": "-3.604 [-13.65, 6.441] 99%"}]))
    assert flags["C4"] == (f"{FRAGILE}: inconclusive -> reproduced (1.342 [-0.1, 1.342] -> 0.98 [-0.2, 0.98], "
                           "rerun at AVX2, drift_avx2_vs_avx512.csv)")
    # an unchanged verdict says whether its value moved at all: one that did not may read no sampled run
    assert flags["A2"] == ("unchanged under rerun at AVX2 (drift_avx2_vs_avx512.csv); value identical (no sampled "
                           "run feeds it, or the rerun was bit for bit)")
    assert flags["A8"] == ("unchanged under rerun at AVX2 (drift_avx2_vs_avx512.csv); value moved: -4.042 [-14.71, "
                           "6.626] 99% -> -3.604 [-13.65, 6.441] 99% (rerun at AVX2)")
    assert "B1" not in flags  # not recomputed: absent, never "stable"


def _evidence(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"study": "ds_audit", "scale": "cpu", "values": {"A2": ev.exact(0.0, n=4)}}))
    return path


def test_the_report_shows_a_flip_as_a_column_and_a_note(tmp_path):
    vpath = tmp_path / "verdicts_avx2_vs_avx512.csv"
    _verdicts([{"id": "A2", "committed": "reproduced", "rerun": "not reproduced", "unchanged": False,
                "rerun_value": "0.01 exact"}]).to_csv(vpath, index=False)
    df = write_claims_report([_evidence(tmp_path)], tmp_path / "c.csv", tmp_path / "c.md", "cpu",
                             drift_verdicts=[vpath])
    md = (tmp_path / "c.md").read_text()
    assert "under hardware drift" in md and f"{FRAGILE}: reproduced -> not reproduced (0 exact -> 0.01 exact" in md
    assert f"1 claims recomputed with the sampled runs' values rerun at another ISA level; 1 {FRAGILE} (A2)" in md
    assert df.set_index("id").loc["A2", "verdict"] == "reproduced"  # information for the reader, not a new verdict
    assert pd.read_csv(tmp_path / "c.csv").set_index("id").loc["A2", "hardware_drift"].startswith(FRAGILE)


def test_without_a_measurement_the_report_says_it_cannot_tell(tmp_path):
    write_claims_report([_evidence(tmp_path)], tmp_path / "c.csv", tmp_path / "c.md", "cpu")
    md = (tmp_path / "c.md").read_text()
    assert "no verdict has been recomputed under measured hardware drift yet" in md
    assert "under hardware drift |" not in md and FRAGILE not in md


def test_a_verdicts_file_of_another_shape_or_another_registry_is_refused(tmp_path):
    bad = tmp_path / "verdicts_bad.csv"
    pd.DataFrame([{"id": "A2", "verdict": "reproduced"}]).to_csv(bad, index=False)
    with pytest.raises(UserError, match="not a verdicts file"):
        read_drift_verdicts([bad])
    unknown = tmp_path / "verdicts_unknown.csv"
    _verdicts([{"id": "Z9", "committed": "reproduced", "rerun": "reproduced", "unchanged": True}]).to_csv(
        unknown, index=False)
    with pytest.raises(UserError, match="Z9"):
        write_claims_report([_evidence(tmp_path)], tmp_path / "c.csv", tmp_path / "c.md", "cpu",
                            drift_verdicts=[unknown])


def test_a_claim_none_of_whose_runs_was_rerun_reads_not_in_the_drift_sample():
    from gradfidelity.claims.report import NOT_SAMPLED

    flags = drift_flags(_verdicts([
        {"id": "A5", "committed": "reproduced", "rerun": "reproduced", "unchanged": True, "sampled_runs": 0},
        {"id": "A7", "committed": "not measured at this scale", "rerun": "not measured at this scale",
         "unchanged": True, "sampled_runs": 2}]))
    assert flags["A5"] == f"{NOT_SAMPLED}: none of the runs it reads was rerun (drift_avx2_vs_avx512.csv)"
    assert flags["A7"] == ("unchanged under rerun at AVX2 (drift_avx2_vs_avx512.csv); value identical (2 of its runs "
                           "rerun)")
    # even a flip would not be read from a claim whose runs were not rerun: it cannot have moved
    flags = drift_flags(_verdicts([{"id": "A5", "committed": "reproduced", "rerun": "inconclusive",
                                    "unchanged": False, "sampled_runs": 0}]))
    assert flags["A5"].startswith(NOT_SAMPLED)


def test_a_measurement_of_evidence_that_has_changed_since_reads_stale_not_unchanged(tmp_path):
    """The drift file recomputed A2 when its committed value was 0.5 (an earlier evidence version): it says nothing
    about today's 0, so the report calls it stale instead of 'unchanged' or 'fragile'."""
    from gradfidelity.claims.report import STALE

    vpath = tmp_path / "verdicts_a_vs_b.csv"
    _verdicts([{"id": "A2", "committed": "reproduced", "rerun": "not reproduced", "unchanged": False,
                "committed_value": "0.5 exact", "rerun_value": "0.51 exact"}]).to_csv(vpath, index=False)
    df = write_claims_report([_evidence(tmp_path)], tmp_path / "c.csv", tmp_path / "c.md", "cpu",
                             drift_verdicts=[vpath])
    flag = df.set_index("id").loc["A2", "hardware_drift"]
    assert flag == f"{STALE}: reproduced, 0.5 exact (drift_avx2_vs_avx512.csv) then" and FRAGILE not in flag
    md = (tmp_path / "c.md").read_text()
    assert f"1 {STALE} (A2: rerun check-reference)" in md


def _run_with_record(tmp_path, metrics):
    run = tmp_path / "runs" / "seed0"
    run.mkdir(parents=True)
    (run / "metrics.json").write_text(json.dumps({"study": "ds_audit", "metrics": metrics}))
    return run


def _report_with_source(tmp_path, run, source_rows, source_name):
    """A2 today reads `run` with the same verdict and value as the drift row recorded: only the run's record can
    tell whether the measurement is of today's evidence."""
    pd.DataFrame(source_rows).to_csv(tmp_path / source_name, index=False)
    vpath = tmp_path / "verdicts_x.csv"
    _verdicts([{"id": "A2", "committed": "reproduced", "rerun": "reproduced", "unchanged": True,
                "source": source_name}]).to_csv(vpath, index=False)
    evidence = tmp_path / "ds.json"
    evidence.write_text(json.dumps({"study": "ds_audit", "scale": "cpu",
                                    "values": {"A2": ev.exact(0.0, n=4, sources=[str(run)])}}))
    df = write_claims_report([evidence], tmp_path / "c.csv", tmp_path / "c.md", "cpu", drift_verdicts=[vpath])
    return df.set_index("id").loc["A2", "hardware_drift"]


@pytest.mark.parametrize("rerun_since", [False, True])
def test_a_measurement_of_runs_rerun_since_reads_stale_though_its_verdict_and_value_repeat(tmp_path, rerun_since):
    """Study A's round 5 reran every run behind A7 (a parts claim, 'no value' on both sides, behind a failed gate
    then and now): the round-4 drift rows matched today's verdict and value and read 'unchanged ... value
    identical'. The comparison's record digest of each run, against the run's record now, tells them apart."""
    from gradfidelity.claims.report import STALE
    from gradfidelity.harness.record_compare import RECORD, record_digest

    run = _run_with_record(tmp_path, {"x": 1.0})
    digest = record_digest(json.dumps({"study": "ds_audit", "metrics": {"x": 1.0}}))
    if rerun_since:
        (run / "metrics.json").write_text(json.dumps({"study": "ds_audit", "metrics": {"x": 2.0}}))
    flag = _report_with_source(tmp_path, run, [{"run": str(run), "metric": RECORD, "committed": digest,
                                                "rerun": digest}], "check_reference_x.csv")
    assert flag.startswith(STALE) if rerun_since else flag.startswith("unchanged under")


@pytest.mark.parametrize("rerun_since", [False, True])
def test_a_two_rerun_drift_measurement_is_stale_when_todays_value_is_neither_side(tmp_path, rerun_since):
    """A drift measurement of two reruns keeps no committed value: today's value of a metric it compared must be
    one of its two sides, else the run was rerun since (round 4's base model: 36.17 at AVX512, 35.0 now)."""
    from gradfidelity.claims.report import STALE

    run = _run_with_record(tmp_path, {"acc_id": 35.0 if rerun_since else 36.166666666666664})
    flag = _report_with_source(tmp_path, run, [{"study": "sft_rl", "run": str(run), "metric": "acc_id",
                                                "capability_a": "AVX2", "value_a": 34.833333333333336,
                                                "capability_b": "AVX512", "value_b": 36.166666666666664}],
                               "drift_x.csv")
    assert flag.startswith(STALE) if rerun_since else flag.startswith("unchanged under")
