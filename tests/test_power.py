"""The power of a claim's decision (stats/power.py) against statsmodels, scipy's noncentral t, an independent
quadrature, a simulation of the verdict itself and published numbers; the power table (claims/power_table.py) on
made-up evidence, its loud errors, and the "n = k of the N its power needs" reason it feeds `verify`."""

import json
import math

import numpy as np
import pytest
from scipy import stats
from statsmodels.stats.power import TTestPower

from gradfidelity.claims import evidence as ev
from gradfidelity.claims.power_table import (
    NO_POWER,
    NOT_APPLICABLE,
    PLANNED,
    STALE,
    power_table,
    read_power_csv,
    write_power_table,
)
from gradfidelity.claims.verify import INCONCLUSIVE, NOT_MEASURED, REPRODUCED, interval_verdict, load_evidence, verify
from gradfidelity.errors import UserError
from gradfidelity.stats.power import (
    band_event_probabilities,
    decision_probability,
    expected_verdict,
    inside_probability,
    sd_interval,
    seeds_to_decide,
    tail_probabilities,
)


def _nct_two_sided(d, n, level):
    """The two-sided t test's power written out with scipy: both tails of the noncentral t."""
    c = stats.t.ppf((1 + level) / 2, n - 1)
    return stats.nct.sf(c, n - 1, d * math.sqrt(n)) + stats.nct.cdf(-c, n - 1, d * math.sqrt(n))


@pytest.mark.parametrize("mean,sd,n,level", [(0.68, 1.383, 40, 0.90), (0.3, 1.0, 8, 0.95), (-2.0, 1.5, 3, 0.95),
                                             (1.05, 0.02, 25, 0.9875)])
def test_one_threshold_power_is_statsmodels_and_scipys_noncentral_t_and_the_quadrature(mean, sd, n, level):
    """Three ways to the same number: statsmodels' TTestPower (the code's), scipy's nct tails written out, and the
    quadrature over s of a band of zero width (no inside event), for either side of the threshold."""
    got = decision_probability(mean, sd, n, 1.0, "gt", level)
    d = abs(mean - 1.0) / sd
    assert got == pytest.approx(TTestPower().power(d, n, 1 - level, alternative="two-sided"), rel=1e-12)
    assert got == pytest.approx(_nct_two_sided(d, n, level), rel=1e-9)
    below, inside, above = band_event_probabilities(mean, sd, n, 1.0, 1.0, level)
    assert inside == 0 and below + above == pytest.approx(got, abs=1e-7)
    assert decision_probability(mean, sd, n, 1.0, "lt", level) == got  # "decided" does not care which side


@pytest.mark.parametrize("mean,sd,n", [(0.003, 0.02, 30), (0.07, 0.05, 5), (0.0, 0.02, 200), (-0.004, 0.01, 12)])
def test_band_tails_are_scipys_noncentral_t_and_the_inside_integral_matches_a_plain_quadrature(mean, sd, n):
    lo, hi, level = -0.005, 0.005, 0.90
    below, inside, above = band_event_probabilities(mean, sd, n, lo, hi, level)
    nct_below, nct_above = tail_probabilities(mean, sd, n, lo, hi, level)
    assert (nct_below, nct_above) == (pytest.approx(below, abs=1e-8), pytest.approx(above, abs=1e-8))
    assert inside_probability(mean, sd, n, lo, hi, level) == pytest.approx(inside, abs=1e-7)
    assert inside_probability(mean, sd, [n, n + 1], lo, hi, level)[0] == pytest.approx(inside, abs=1e-7)
    total = decision_probability(mean, sd, n, [lo, hi], "outside", level)
    assert total == pytest.approx(below + inside + above, abs=1e-7)
    assert decision_probability(mean, sd, n, [lo, hi], "inside", level) == total


@pytest.mark.parametrize("mean,sd,n,band,side", [
    (0.004, 0.01, 8, [-0.005, 0.005], "outside"),   # inside the band, near an end: all three events occur
    (0.012, 0.01, 5, [-0.005, 0.005], "outside"),   # outside
    (1.0, 0.6, 6, [0.9, 1.1], "inside"),
    (0.68, 1.383, 12, 1.0, "gt"),
])
def test_the_decision_probability_is_how_often_verify_decides_simulated_seeds(mean, sd, n, band, side):
    """The independent reference: draw n normal seeds, build scipy's t interval, let verify's own interval_verdict
    decide (a band's check as 'outside', a threshold's as 'gt'), and count the decided runs."""
    level, sims = 0.90, 20000
    x = np.random.default_rng(57).normal(mean, sd, size=(sims, n))
    ci = stats.ttest_1samp(x, 0.0, axis=1).confidence_interval(level)
    check = ({"kind": "outside", "range": band} if side in ("outside", "inside")
             else {"kind": "gt", "threshold": band})
    decided = np.mean([interval_verdict(check, lo, hi) != INCONCLUSIVE for lo, hi in zip(ci.low, ci.high, strict=True)])
    p = decision_probability(mean, sd, n, band, side, level)
    assert abs(decided - p) < 4 * math.sqrt(p * (1 - p) / sims) + 1e-3


def test_hand_computed_cases():
    # at a mean on the threshold the interval excludes it exactly 1 - level of the time, at every n (central t)
    for n in (2, 5, 40):
        assert decision_probability(1.0, 0.7, n, 1.0, "gt", 0.95) == pytest.approx(0.05, abs=1e-12)
    assert seeds_to_decide(1.0, 0.7, 1.0, "gt", 0.95) is None
    # G*Power / Cohen: one-sample t, d = 0.5, two-tailed alpha 0.05, power 0.80 -> n = 34 (actual power 0.8078)
    assert seeds_to_decide(0.5, 1.0, 0.0, "gt", 0.95) == 34
    assert decision_probability(0.5, 1.0, 34, 0.0, "gt", 0.95) == pytest.approx(0.8078, abs=5e-5)
    # issue 57's C4: a gap of 0.68% against the 1% margin, sd 1.383, on its 90% interval: about 118 seeds, 78-191
    # over the sd's own 95% interval from n = 40
    assert seeds_to_decide(0.68, 1.383, 1.0, "gt", 0.90) in (117, 118)
    low, high = sd_interval(1.383, 40)
    assert 78 <= seeds_to_decide(0.68, low, 1.0, "gt", 0.90) <= 80
    assert 191 <= seeds_to_decide(0.68, high, 1.0, "gt", 0.90) <= 193
    # a band of zero width holds nothing: no interval of positive width lies inside it
    assert inside_probability(0.0, 1.0, 10, 0.5, 0.5, 0.95) == 0.0


def test_seeds_to_decide_is_the_first_n_at_the_target_both_ways():
    """The scan over n (statsmodels' power, vectorised) against statsmodels' own root finder, and the band's scan
    against the probability just below and at its answer."""
    for d, level in ((0.8, 0.95), (0.25, 0.90), (1.7, 0.9875)):
        root = TTestPower().solve_power(effect_size=d, alpha=1 - level, power=0.8, alternative="two-sided")
        assert seeds_to_decide(d, 1.0, 0.0, "gt", level) == math.ceil(root)
    need = seeds_to_decide(0.012, 0.01, [-0.005, 0.005], "outside", 0.90)
    assert decision_probability(0.012, 0.01, need, [-0.005, 0.005], "outside", 0.90) >= 0.8
    assert decision_probability(0.012, 0.01, need - 1, [-0.005, 0.005], "outside", 0.90) < 0.8
    assert seeds_to_decide(0.68, 1.383, 1.0, "gt", 0.90, cap=100) is None  # past the cap: no plan
    assert seeds_to_decide(2.0, 0.0, 1.0, "gt", 0.9) == 2 and seeds_to_decide(1.0, 0.0, 1.0, "gt", 0.9) is None


def test_sd_interval_is_the_chi_square_interval():
    low, high = sd_interval(2.0, 10, 0.95)
    assert low**2 == pytest.approx(9 * 4.0 / stats.chi2.ppf(0.975, 9))
    assert high**2 == pytest.approx(9 * 4.0 / stats.chi2.ppf(0.025, 9))


def test_expected_verdict_and_bad_input():
    assert expected_verdict(0.68, 1.0, "gt") == "not reproduced" and expected_verdict(1.2, 1.0, "gt") == "reproduced"
    assert expected_verdict(0.5, 1.0, "lt") == "reproduced"
    assert expected_verdict(0.07, [-0.005, 0.005], "outside") == "reproduced"
    assert expected_verdict(0.0, [-0.005, 0.005], "outside") == "not reproduced"
    assert expected_verdict(0.0, [-0.005, 0.005], "inside") == "reproduced"
    with pytest.raises(ValueError, match="not ordered"):
        decision_probability(0.0, 1.0, 5, [1.0, -1.0], "outside", 0.9)
    with pytest.raises(ValueError, match="sd"):
        decision_probability(0.0, 0.0, 5, 1.0, "gt", 0.9)
    with pytest.raises(ValueError, match="n >= 2"):
        decision_probability(0.0, 1.0, 1, 1.0, "gt", 0.9)


def test_far_tails_scipy_cannot_compute_are_bounded_not_guessed():
    # a huge effect: scipy's far tail is NaN there; the near tail is 1, so the decision is certain
    assert decision_probability(50.0, 1.0, 2, 1.0, "gt", 0.90) == pytest.approx(1.0)
    assert seeds_to_decide(50.0, 1.0, 1.0, "gt", 0.90) == 2


# ---- the power table on made-up evidence ----

ROW = {"id": "X1", "study": "s", "paper": "p", "statement": "s", "paper_value": "v", "metric": "m",
       "check": {"kind": "gt", "threshold": 1.0}, "scales": ["smoke", "cpu"], "why": "w", "min_n": 3,
       "level": 0.90, "evidence": "measured", "evidence_version": 1}
BAND_ROW = dict(ROW, id="X2", check={"kind": "outside", "range": [-0.005, 0.005]})
GAPS = [0.2, 1.9, -0.4, 1.1, 0.8, 2.3, -0.6, 0.9, 1.4, 0.1]  # mean 0.77, spans the 1% margin at 90%


def _record(per_seed, threshold=1.0, side="gt", level=0.90, **kw):
    rec = ev.mean_ci(per_seed, level)
    rec["power"] = ev.power_record("gap %", per_seed, threshold, side, level, wall_s_per_seed=1800.0, **kw)
    return rec


def _file(tmp_path, values, study="s"):
    path = tmp_path / f"{study}.json"
    path.write_text(json.dumps({"study": study, "scale": "cpu", "values": values}))
    return load_evidence([path], "cpu")


def test_power_table_plans_each_record_and_says_where_there_is_none(tmp_path):
    band = [0.02, 0.05, 0.11, 0.08, 0.04]
    evidence = _file(tmp_path, {"X1": _record(GAPS, paper_effect=0.841),
                                "X2": _record(band, [-0.005, 0.005], "outside"),
                                "X3": ev.exact(1.0, n=4)})
    x3 = dict(ROW, id="X3")
    df = power_table([ROW, BAND_ROW, x3], evidence).set_index("id")
    x1 = df.loc["X1"]
    sd = float(np.std(GAPS, ddof=1))
    assert x1["status"] == PLANNED and x1["n"] == 10 and x1["sd"] == pytest.approx(sd)
    assert x1["n_needed"] == seeds_to_decide(np.mean(GAPS), sd, 1.0, "gt", 0.90)
    assert x1["decides"] == "not reproduced" and x1["seeds_to_add"] == x1["n_needed"] - 10
    assert float(x1["added_wall_h"]) == pytest.approx((x1["n_needed"] - 10) * 0.5, abs=0.05)
    assert x1["power_now"] == pytest.approx(decision_probability(np.mean(GAPS), sd, 10, 1.0, "gt", 0.90))
    assert x1["n_needed_paper"] == str(seeds_to_decide(0.841, sd, 1.0, "gt", 0.90))
    assert df.loc["X2", "decides"] == REPRODUCED and df.loc["X2", "status"] == PLANNED
    assert df.loc["X3", "status"] == NO_POWER


def test_stale_evidence_is_not_planned(tmp_path):
    """Evidence written for a claim's older metric (its file's evidence_version below the row's) plans nothing."""
    evidence = _file(tmp_path, {"X1": _record(GAPS)})  # no evidence_version: 1
    row = power_table([dict(ROW, evidence_version=2)], evidence).iloc[0]
    assert row["status"] == STALE and "rebuild" in row["note"]


def test_power_table_caps_and_writes_its_files(tmp_path):
    on_margin = [1.0 + g for g in (-0.5, 0.5, -0.3, 0.3, 0.0)]  # mean exactly on the threshold
    evidence_path = tmp_path / "s.json"
    evidence_path.write_text(json.dumps({"study": "s", "scale": "cpu", "values": {"X1": _record(on_margin)}}))
    df = power_table([ROW], load_evidence([evidence_path], "cpu")).set_index("id")
    assert df.loc["X1", "n_needed_text"] == "> 1000" and df.loc["X1", "seeds_to_add"] == "> 995"
    assert df.loc["X1", "decides"] == ""


def test_power_table_refuses_a_record_that_does_not_describe_its_verdict(tmp_path):
    good = _record(GAPS)
    cases = {
        "side": dict(good, power=dict(good["power"], side="lt")),
        "per-seed values": dict(good, n=9),
        "t interval": dict(good, power=dict(good["power"], per_seed=[g + 0.1 for g in GAPS])),
        "lacks": dict(good, power={k: v for k, v in good["power"].items() if k != "level"}),
        "needs": dict(good, power=dict(good["power"], threshold=[0.0, 1.0])),
    }
    for match, record in cases.items():
        with pytest.raises(UserError, match=match):
            power_table([ROW], {"s": {"values": {"X1": record}}})
    na = dict(good, power=ev.power_not_applicable("exact probe", "a deterministic probe: no seed changes it"))
    row = power_table([ROW], {"s": {"values": {"X1": na}}}).iloc[0]
    assert row["status"] == NOT_APPLICABLE and "deterministic" in row["note"]


def test_power_record_refuses_a_wrong_threshold_shape():
    with pytest.raises(ValueError, match=r"\[lo, hi\]"):
        ev.power_record("d", [1.0, 2.0], 0.005, "outside", 0.9)
    with pytest.raises(ValueError, match="non-finite"):
        ev.power_record("d", [1.0, math.nan], 1.0, "gt", 0.9)


def _power_rows(tmp_path, registry, values):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"study": "s", "scale": "cpu", "values": values}))
    write_power_table([path], tmp_path / "power.csv", tmp_path / "power.md", "cpu", registry=registry)
    return load_evidence([path], "cpu"), read_power_csv(tmp_path / "power.csv")


def test_a_claim_below_its_power_names_the_n_it_needs_and_one_without_a_power_record_says_nothing(tmp_path):
    registry = [ROW, dict(ROW, id="X4"), dict(ROW, id="X5"), dict(ROW, id="X6")]
    barely = [0.9, 1.3, 1.6, 1.9, 2.3]  # wholly above 1 at 90% (reproduced) although its power asks 7 seeds
    clear = [2.1, 2.4, 1.5, 2.9, 1.8]  # wholly above 1, with power to spare (4 seeds)
    evidence, power = _power_rows(tmp_path, registry, {"X1": _record(GAPS), "X4": ev.mean_ci(GAPS, 0.90),
                                                       "X5": _record(barely), "X6": _record(clear)})
    df = verify(registry, evidence, "cpu", power=power).set_index("id")
    need = power["X1"]["n_needed"]
    assert df.loc["X1", "verdict"] == INCONCLUSIVE and need > 10
    assert df.loc["X1", "reason"] == f"n = 10 of the {need} its power needs"
    assert df.loc["X4", "verdict"] == INCONCLUSIVE and df.loc["X4", "reason"] == ""  # no power record
    assert "its power needs" not in df.loc["X4", "detail"]
    # decided below its power: said in the detail, not as the reason for the verdict
    assert df.loc["X5", "verdict"] == REPRODUCED and power["X5"]["n_needed"] == 7
    assert df.loc["X5", "reason"] == "" and df.loc["X5", "detail"].endswith("n = 5 of the 7 its power needs")
    assert df.loc["X6", "verdict"] == REPRODUCED and "its power needs" not in df.loc["X6", "detail"]
    without = verify(registry, evidence, "cpu").set_index("id")  # no power table: no power reading
    assert without.loc["X1", "reason"] == "" and "its power needs" not in without.loc["X5", "detail"]


def test_past_the_cap_the_reason_says_more_than(tmp_path):
    on_margin = [1.0 + g for g in (-0.5, 0.5, -0.3, 0.3, 0.0)]
    evidence, power = _power_rows(tmp_path, [ROW], {"X1": _record(on_margin)})
    assert verify([ROW], evidence, "cpu", power=power).iloc[0]["reason"] == (
        "n = 5 of the more than 1000 its power needs")
    assert "> 1000" in (tmp_path / "power.md").read_text()


def test_below_min_n_the_reason_says_both(tmp_path):
    row = dict(ROW, min_n=12)
    evidence, power = _power_rows(tmp_path, [row], {"X1": _record(GAPS)})
    out = verify([row], evidence, "cpu", power=power).iloc[0]
    assert out["verdict"] == NOT_MEASURED
    assert out["reason"] == f"n = 10 < min_n = 12; n = 10 of the {power['X1']['n_needed']} its power needs"


def test_a_part_below_its_power_is_named(tmp_path):
    row = dict(ROW, check={"kind": "true", "parts": {"acc": {"kind": "gt", "threshold": 1.0},
                                                     "flops": {"kind": "lt", "threshold": 1.0}}})
    record = ev.with_parts({"acc": _record(GAPS), "flops": ev.exact(0.5, n=10)})
    evidence, power = _power_rows(tmp_path, [row], {"X1": record})
    out = verify([row], evidence, "cpu", power=power).iloc[0]
    assert out["verdict"] == INCONCLUSIVE
    assert out["reason"].endswith(f"part acc: n = 10 of the {power['X1.acc']['n_needed']} its power needs")


def test_stale_evidence_reads_stale_with_a_power_table_beside_it(tmp_path):
    row = dict(ROW, evidence_version=2)
    evidence, power = _power_rows(tmp_path, [row], {"X1": _record(GAPS)})
    assert power == {}
    out = verify([row], evidence, "cpu", power=power).iloc[0]
    assert out["verdict"] == NOT_MEASURED and "stale evidence" in out["reason"]
    assert "its power needs" not in out["reason"] + out["detail"]


def test_a_stale_power_table_is_an_error(tmp_path):
    evidence, power = _power_rows(tmp_path, [ROW], {"X1": _record(GAPS)})
    stale = {"X1": dict(power["X1"], n=8)}
    with pytest.raises(UserError, match="rebuild"):
        verify([ROW], evidence, "cpu", power=stale)
    with pytest.raises(UserError, match="no row"):
        verify([ROW], evidence, "cpu", power={})


def test_a_one_seed_record_has_no_plan_and_verify_asks_for_none(tmp_path):
    """The smoke scale's one-seed records (C3's probe): the table cannot plan from one value, and verify reads no
    power text for them instead of asking the table for a row it never has."""
    one = {"estimate": 1.2, "low": None, "high": None, "level": 0.90, "n": 1,
           "power": ev.power_record("gap %", [1.2], 1.0, "gt", 0.90)}
    evidence, power = _power_rows(tmp_path, [ROW], {"X1": one})
    assert power == {}
    out = verify([ROW], evidence, "cpu", power=power).iloc[0]
    assert "its power needs" not in out["reason"] + out["detail"]
