"""Issue 57 on study B's claims, with made-up runs (the hand-made world of test_claims.py, whose f is known by
construction): why an open claim is open ('moves' against 'imprecise at 2T'), a near-tie reading at an LR the
evaluation seeds reject against one they keep, the host types of every record (a contrast across two says so, with
the drift measured between them), and the power record (the per-seed values the interval is computed on, the bound,
the cost of one more seed)."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from gradfidelity.claims.verify import INCONCLUSIVE, NOT_MEASURED, NOT_REPRODUCED, REPRODUCED, judge
from gradfidelity.harness.provenance import describe_host
from gradfidelity.studies.async_pp.claims import (
    AT_REJECTED,
    KEPT,
    MOVES,
    BudgetReading,
    _evidence,
    budget_readings,
    budget_table,
)
from gradfidelity.studies.async_pp.pairing import Gaps, drift_between
from tests.async_pp._world import AMD, CFG, HOLDS, INTEL, ROWS, T, _loss, _runs, _selection, sync_loss, world_f

AMD_HOST, INTEL_HOST = describe_host(AMD), describe_host(INTEL)


def _reading(v_T: str, v_2T: str, change: dict | None, part_verdicts: dict | None = None) -> BudgetReading:
    """A one-statistic claim's budget reading with the verdicts and the change given."""
    return BudgetReading("B9-taylor", 60, v_T, "", v_2T, "", NOT_MEASURED, "", {None: ("a", "b", change)},
                         part_verdicts if part_verdicts is not None else {None: (v_T, v_2T)})


# ------------------------------------------------------------------------------- why an open claim is open
def test_a_change_that_excludes_0_or_verdicts_on_opposite_sides_move_and_anything_else_is_imprecise():
    rises = {"estimate": 0.1, "low": 0.05, "high": 0.15, "n": 5, "label": "rises with the budget"}
    spans = {"estimate": 0.004, "low": -0.05, "high": 0.059, "n": 5, "label": "too few seeds"}
    assert _reading(REPRODUCED, INCONCLUSIVE, rises).why_open == MOVES
    assert _reading(REPRODUCED, NOT_REPRODUCED, spans).why_open == MOVES  # opposite sides of the bound
    assert _reading(REPRODUCED, INCONCLUSIVE, spans).why_open == "imprecise at 2T"  # round 5's B9-sync_start
    assert _reading(INCONCLUSIVE, REPRODUCED, spans).why_open == "imprecise at T"
    assert _reading(REPRODUCED, INCONCLUSIVE, None).why_open == "imprecise at 2T"  # no paired change: no move shown
    assert _reading(REPRODUCED, REPRODUCED, rises).why_open == ""  # decided, whatever the change
    assert _reading(REPRODUCED, NOT_MEASURED, None).why_open == "not measured at 2T"
    # a part that moved but keeps its verdict does not make an open claim 'moves': the open part decides
    two = BudgetReading("B1", 60, NOT_REPRODUCED, "", INCONCLUSIVE, "", NOT_MEASURED, "",
                        {"difference": ("a", "b", rises), "ratio": ("a", "b", spans)},
                        {"difference": (REPRODUCED, REPRODUCED), "ratio": (NOT_REPRODUCED, INCONCLUSIVE)})
    assert two.why_open == "imprecise at 2T"
    two.parts["ratio"] = ("a", "b", rises)
    assert two.why_open == MOVES


def _moving_adamw(c):
    """AdamW's f is 0.2 higher at 2T on every seed: B1-abs's lost compute falls across its bound of 0.6."""
    if c.optimizer == "adamw" and c.schedule == "2bw" and c.mitigation == "none" and c.steps == 2 * T:
        return sync_loss((world_f(HOLDS, c) + 0.2) * c.steps, c.seed)
    return _loss(HOLDS, c)


def _scattered_muon(c):
    """Muon's async runs at 2T scatter across B2's bound (lost 0.03, 0.13, 0.23 by seed): the change spans 0."""
    if c.optimizer == "muon" and c.schedule == "2bw" and c.mitigation == "none" and c.steps == 2 * T:
        return sync_loss((world_f(HOLDS, c) - 0.1 * (c.seed % 3)) * c.steps, c.seed)
    return _loss(HOLDS, c)


def test_a_moved_claim_reads_moves_and_an_imprecise_one_reads_imprecise():
    for loss, cid, want, other in ((_moving_adamw, "B1-abs", MOVES, "B2"),
                                   (_scattered_muon, "B2", "imprecise at 2T", "B5-adamw")):
        runs = _runs(HOLDS, loss=loss)
        records, readings = budget_readings(Gaps(runs, CFG), "cpu")
        verdict, reason = judge(ROWS[cid], records[cid], True, "cpu")
        assert verdict == NOT_MEASURED and readings[cid].why_open == want, (cid, reason)
        table = budget_table(readings).set_index("claim")
        assert table.loc[cid, "why_open"] == want  # the budget-rule table shows the label
        if want == MOVES:
            assert reason.startswith("gate failed: budget: the verdict moves with the budget: ")
        else:
            assert reason.startswith("gate failed: budget: imprecise at 2T: ") and "moves with the budget" not in \
                reason.split("(round 5 read")[0]
            assert "(round 5 read 'the verdict moves with the budget')" in reason  # the old reading beside
        assert table.loc[other, "why_open"] == "" and table.loc[other, "new_verdict"] == REPRODUCED  # decided


# ------------------------------------------------------------------------------- near-tie at a rejected LR
def _other_lr_world(shift):
    """AdamW 0.9's 2bw at its other LR (x1) ends `shift(seed)` nats above its chosen LR on every evaluation seed."""
    def loss(c):
        if c.optimizer == "adamw" and c.lr == "x1" and c.seed < CFG.seeds:
            return _loss(HOLDS, replace(c, lr="own")) + shift(c.seed)
        return _loss(HOLDS, c)
    return loss


@pytest.mark.parametrize("case", ["rejected", "kept"])
def test_a_near_tie_reading_at_an_lr_the_evaluation_seeds_reject_is_labelled_and_a_kept_one_is_not(case):
    """Rejected: x1 ends 0.05-0.07 nats worse on all three seeds (its interval lies above 0). Kept: it ends -0.01,
    +0.02, -0.01 nats from the chosen LR (its interval spans 0). The LR check is scipy's paired t interval."""
    shift = (lambda s: 0.05 + 0.01 * s) if case == "rejected" else (lambda s: (-0.01, 0.02, -0.01)[s])
    runs = _runs(HOLDS, loss=_other_lr_world(shift))
    doc, _, near, _ = _evidence(Gaps(runs, CFG), "cpu", ["runs.csv"], _selection())
    table = pd.DataFrame(near).set_index("claim")
    diff = [shift(s) for s in range(CFG.seeds)]
    ci = stats.ttest_1samp(diff, 0.0).confidence_interval(0.95)
    check = table.loc["B1-abs", "lr_checks"]
    assert f"{np.mean(diff):+.3f} [{ci.low:+.3f}, {ci.high:+.3f}] at {T}" in check, check
    b1abs = doc["values"]["B1-abs"]["detail"]
    if case == "rejected":
        assert check.endswith("other LR rejected")
        assert table.loc["B1-abs", "lr_status"] == f"{AT_REJECTED} (adamw 0.9 2bw at lr~x1)"
        # B1-abs reads no other near-tie arm: no reading at a kept near-tie is left
        assert table.loc["B1-abs", "verdict_kept_lr"].startswith("none")
        # B1 also reads Muon's near-tie (kept: its other LR equals the chosen one here): read with that one only
        assert table.loc["B1", "kept_arms"] == "muon 0.95 2bw at lr~tuned (x1)"
        assert table.loc["B1", "verdict_kept_lr"] == REPRODUCED
        assert "near-tie reading at a rejected LR (" in b1abs and "shown for the record" in b1abs
        assert "near-tie reading (" not in b1abs
    else:
        assert check.endswith(KEPT) and table.loc["B1-abs", "lr_status"] == KEPT
        assert table.loc["B1-abs", "verdict_kept_lr"] == table.loc["B1-abs", "verdict_near_tie_lr"]
        assert "near-tie reading (adamw 0.9 2bw at lr~x1" in b1abs and AT_REJECTED not in b1abs


def test_a_near_tie_reading_names_the_comparison_that_decides_it():
    """The depth sweep's comparisons are named by their two arms, and the near-tie reading says which decides each
    part at T and 2T and which near-tie arms it reads (issue 57: B6's was attributed to an arm it does not read)."""
    runs = _runs(HOLDS)
    _, _, near, _ = _evidence(Gaps(runs, CFG), "cpu", ["runs.csv"], _selection())
    b6 = pd.DataFrame(near).set_index("claim").loc["B6", "deciding_near_tie_lr"]
    growth, excess = b6.split(" | ")
    assert growth.startswith("growth: ") and excess.startswith("excess: ")
    # both 2bw arms are near-tie arms here: each budget's deciding comparison names the one it reads, and only it
    found = re.findall(r"(\w+) P4 - (\w+) 2bw at (2?T) \(reads (.*?): (reproduced|inconclusive|not reproduced)\)",
                       excess)
    assert [b for *_, b, _, _ in found] == ["T", "2T"], excess
    for opt, opt2, _, reads, _ in found:
        assert opt == opt2 and reads == {"adamw": "adamw 0.9 2bw at lr~x1",
                                         "muon": "muon 0.95 2bw at lr~tuned (x1)"}[opt], excess
    assert "P4 - " in growth and "P2" in growth and "reads no near-tie arm" in growth  # PipeDream's are not near-ties


# ------------------------------------------------------------------------------- host types
def _two_hosts(runs: pd.DataFrame) -> pd.DataFrame:
    """The mitigations on the Intel host type, every other run on the AMD one (round 5's split at T)."""
    runs = runs.copy()
    for key in AMD:
        runs[key] = np.where(runs["mitigation"] != "none", INTEL[key], AMD[key])
    runs["wall_s"] = 2.0
    return runs


DRIFT = pd.DataFrame([
    {"study": "async_pp", "run": "r1", "metric": "final_val_loss", "capability_a": "AVX512 (AMD)",
     "capability_b": "AVX512 (Intel 6/167)", "difference": -0.00226, "rel_difference": 0.00074,
     "source": "drift_hosts_amd_vs_intel.csv"},
    {"study": "async_pp", "run": "r2", "metric": "final_val_loss", "capability_a": "AVX512 (AMD)",
     "capability_b": "AVX512 (Intel 6/167)", "difference": 0.0001, "rel_difference": 0.00003,
     "source": "drift_hosts_amd_vs_intel.csv"},
    {"study": "async_pp", "run": "r3", "metric": "final_val_loss", "capability_a": "AVX2",
     "capability_b": "AVX512", "difference": 0.5, "rel_difference": 0.1, "source": "drift_avx2_vs_avx512.csv"},
    {"study": "local", "run": "r4", "metric": "final_val_loss", "capability_a": "AVX512 (AMD)",
     "capability_b": "AVX512 (Intel 6/167)", "difference": 0.9, "rel_difference": 0.2, "source": "x.csv"}])


def test_drift_between_two_host_types_reads_only_the_measurements_of_that_pair():
    d = drift_between(DRIFT, AMD, INTEL)
    assert d == {"runs": 2, "max_abs": 0.00226, "max_rel": 0.00074, "files": ["drift_hosts_amd_vs_intel.csv"]}
    assert drift_between(DRIFT, INTEL, AMD) == d  # either order
    other_amd = {**AMD, "cpu_capability": "AVX2"}  # the AVX2 file names no vendor, but no pair of these
    assert drift_between(DRIFT, other_amd, INTEL) is None
    assert drift_between(None, AMD, INTEL) is None


def test_every_record_names_its_host_types_and_a_contrast_across_two_says_so_with_the_drift():
    values = _evidence(Gaps(_two_hosts(_runs(HOLDS)), CFG), "cpu", ["runs.csv"], drift=DRIFT)[0]["values"]
    for cid in ("B2", "B1-abs", "B3", "B4", "B7"):  # no mitigation read: one host type at both budgets
        assert values[cid]["hosts"] == [AMD_HOST], cid
        assert f"at {T} steps: one host type ({AMD_HOST})" in values[cid]["detail"]
    for cid in ("B5-adamw", "B9-taylor", "B9-sync_start"):
        rec = values[cid]
        assert rec["hosts"] == sorted([AMD_HOST, INTEL_HOST])
        detail = rec["detail"]
        assert f"at {T} steps: runs of 2 host types, a contrast across them: " in detail
        intel = detail.split(f"{INTEL_HOST}: ")[1]
        mit = "error_feedback" if cid == "B5-adamw" else cid.removeprefix("B9-")
        want = f"adamw 2bw+{mit} lr~own ({T} steps)" + (
            "" if cid == "B5-adamw" else f", muon 2bw+{mit} lr~own ({T} steps)")
        assert intel.startswith(want + ";"), intel
        assert "final validation loss at most 0.0023 nats (0.074%)" in detail  # the pair's rows only
        assert "drift_hosts_amd_vs_intel.csv: 2 study-B runs" in detail
    # the parts carry theirs: B6 reads no mitigation
    assert {h for p in values["B6"]["parts"].values() for h in p["hosts"]} == {AMD_HOST}
    # no drift measurement given: the contrast still says it crosses host types, and that none was given
    bare = _evidence(Gaps(_two_hosts(_runs(HOLDS)), CFG), "cpu", ["runs.csv"])[0]["values"]
    assert "no drift measurement between AuthenticAMD 25/17/1 and GenuineIntel 6/167/1 was given" \
        in bare["B9-taylor"]["detail"]


# ------------------------------------------------------------------------------- power
def test_the_power_record_holds_the_values_the_interval_is_computed_on():
    values = _evidence(Gaps(_two_hosts(_runs(HOLDS)), CFG), "cpu", ["runs.csv"])[0]["values"]
    for cid in ("B2", "B4", "B5-adamw", "B9-taylor", "B7"):
        rec, pw = values[cid], values[cid]["power"]
        check = ROWS[cid]["check"]
        assert pw["level"] == 0.95 and pw["side"] == {"between": "inside", "le": "lt", "lt": "lt", "gt": "gt"}[
            check["kind"]]
        assert pw["threshold"] == (check["range"] if check["kind"] == "between" else check["threshold"])
        x = np.asarray(pw["per_seed"])
        assert len(x) == rec["n"] == 3
        # the values the record's interval is computed on (scipy's one-sample t interval, independently)
        ci = stats.ttest_1samp(x, 0.0).confidence_interval(0.95)
        assert (x.mean(), ci.low, ci.high) == pytest.approx((rec["estimate"], rec["low"], rec["high"]))
        if cid != "B7":  # the budget rule's second budget, in the note
            assert f"the budget rule decides only where 2T = {2 * T} steps agrees" in pw["note"]
    # one more seed of B2 costs the runs it reads at T and 2T: Muon's 2bw at 60 and 120 steps and the sync rungs
    # up to the one that brackets S* from above (f = 0.97: every rung 5-60 at T, 5-120 at 2T): 7 cells at 2 s,
    # two at a time on 2 cores
    assert values["B2"]["power"]["wall_s_per_seed"] == pytest.approx(7 * 2.0 / 2)
    assert values["B2"]["power"]["paper_effect"] == 0.06 and values["B5-muon"]["power"]["paper_effect"] == 60.0
    assert values["B9-taylor"]["power"]["paper_effect"] is None  # the paper states no size
    # a claim of parts: each part carries its own; the claim says so
    parts = values["B1"]["parts"]
    assert all("per_seed" in p["power"] for p in parts.values())
    assert values["B1"]["power"]["not_applicable"].startswith("decided by its parts")
    assert values["B8"]["power"]["not_applicable"].startswith("paper only")


def test_a_record_without_values_has_power_not_applicable():
    runs = _runs(HOLDS)
    runs = runs[~((runs.optimizer == "muon") & (runs.mitigation == "error_feedback"))]
    values = _evidence(Gaps(runs, CFG), "cpu", ["runs.csv"])[0]["values"]
    pw = values["B5-muon"]["power"]
    assert "per_seed" not in pw and pw["not_applicable"].startswith(f"no interval at T = {T} steps")
    assert not math.isnan(values["B5-adamw"]["power"]["per_seed"][0])
