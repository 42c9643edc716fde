"""The sft_rl aggregate, tables and claim evidence A5-A9 on hand-made run directories: each claim where it holds,
where it is false, with too few seeds, with a diverged run and with each failed gate (`reference_learned` against
the base model, `rl_learns`, `arms_learned`); the counted-set score; A9's recipe gate; tables that show diverged
runs and each arm's start, gain and budget; an aggregation that reads each run's plan cell from its records, not
its path; a table interval that is the claims' interval on the same values."""

import json
import re

import jsonschema
import numpy as np
import pandas as pd
import pytest

from gradfidelity.claims.evidence import RECORD_SCHEMA, level_for, mean_ci
from gradfidelity.claims.verify import (
    INCONCLUSIVE,
    NOT_MEASURED,
    NOT_REPRODUCED,
    REPRODUCED,
    judge,
    load_evidence,
    load_registry,
)
from gradfidelity.errors import UserError
from gradfidelity.harness.io import atomic_write_json
from gradfidelity.harness.provenance import describe_host
from gradfidelity.harness.results import load_run_records
from gradfidelity.studies.sft_rl import aggregate as agg
from gradfidelity.studies.sft_rl import claims as claims_mod
from gradfidelity.studies.sft_rl.baseline import CONSTANT, GATE, constant_baseline
from gradfidelity.studies.sft_rl.figures import write_figures
from gradfidelity.studies.sft_rl.tables import macro_intervals, write_tables
from tests.sft_rl._hosts import INTEL, write_provenance
from tests.sft_rl._runs import (
    BASE_ACC,
    HOLDS,
    LR,
    REWARD,
    SCALE,
    TASK,
    _cfg,
    _noise,
    _ramp,
    _two_budgets,
    write_runs,
)

ROWS = {row["id"]: row for row in load_registry() if row["study"] == "sft_rl"}

# what makes each claim false (the rest of HOLDS unchanged)
FALSE = {
    "A5": {("ds_bug", "sft"): 70.0},                                  # the optimizer bug raises SFT
    "A6": {("ds_bug", "sft"): 58.0, ("agg_bug", "sft"): 50.0},        # aggregation bug hurts more
    "A6-helps": {("ds_bug", "sft"): 66.0, ("agg_bug", "sft"): 55.0},  # the optimizer bug helps, the aggregation
                                                                      # bug hurts: all the damage is the latter's
    "A7": {("fixed", "hpt"): 80.0},                                   # one mixed method beats SFT-then-RL
    "A8": {("both", "sft_then_rl"): 75.0},                            # no mixed method ahead under both bugs
    "A8-mech": {("both", "sft_then_rl"): 80.0},                       # the lead grows under both bugs
    "A9": {("fixed", "sft_then_rl_truncated"): 55.0},                 # truncated run loses on accuracy
    "A9-one": {("fixed", "srft"): 80.0},                              # one mixed method beats the truncated run
}
RL_CLAIMS = ("A7", "A8", "A8-mech", "A9")


def tables_of(tmp_path) -> dict:
    t = tmp_path / "paper_tables"
    return {"main": [t / "sft_rl_main.csv", t / "sft_rl_main.md"],
            "ablation": [t / "sft_rl_bug_ablation.csv", t / "sft_rl_bug_ablation.md"]}


def evidence(tmp_path, cfg, **kw) -> dict:
    root = tmp_path / "results" / "sft_rl"
    records = load_run_records(write_provenance(write_runs(root, cfg, **kw)), scale=SCALE)
    df = agg.collect(cfg, records, *agg.provenance_facts(records))  # runs of round 6, after A6's rule
    ev = claims_mod.claims(df, cfg, SCALE, tables_of(tmp_path), constant_baseline(cfg))
    assert ev["study"] == "sft_rl" and ev["scale"] == SCALE and set(ev["values"]) == set(ROWS)
    assert ev["evidence_version"] == claims_mod.EVIDENCE_VERSION == 5
    for cid, rec in ev["values"].items():
        jsonschema.validate(rec, RECORD_SCHEMA)
        want = {"A5": [GATE], "A6": [GATE, "rule_before_runs"]}.get(
            cid, [GATE, claims_mod.RL_GATE, claims_mod.ARMS_GATE])
        assert rec["sources"] and [g["name"] for g in rec["gates"]] == want, cid
    return ev["values"]


def verdict(values, cid):
    return judge(ROWS[cid], values[cid], True, SCALE)


@pytest.fixture(scope="module")
def holds(tmp_path_factory):
    return evidence(tmp_path_factory.mktemp("holds"), _cfg([0, 1, 2]))


@pytest.mark.parametrize("cid", sorted(ROWS))
def test_claim_holds(holds, cid):
    v, why = verdict(holds, cid)
    assert v == REPRODUCED, (why, holds[cid])
    assert holds[cid]["n"] == 3 and all(g["passed"] for g in holds[cid]["gates"])


@pytest.mark.parametrize("case", sorted(FALSE))
def test_claim_false_is_not_reproduced(tmp_path, case):
    cid = case.split("-")[0]
    values = evidence(tmp_path, _cfg([0, 1, 2]), acc=FALSE[case])
    v, why = verdict(values, cid)
    assert v == NOT_REPRODUCED, (why, values[cid])


def test_a9_flops_part_false(tmp_path):
    values = evidence(tmp_path, _cfg([0, 1, 2]), flops={"sft_then_rl_truncated": 9e12})
    v, why = verdict(values, "A9")
    assert v == NOT_REPRODUCED and "flops: not reproduced" in why and "accuracy: reproduced" in why
    f = values["A9"]["parts"]["flops"]
    assert f["exact"] and f["estimate"] == pytest.approx(9e12 * 1.02 / (5e12 * 1.02)) and f["n"] == 3


def test_a7_has_one_part_per_mixed_method(holds):
    parts = holds["A7"]["parts"]
    assert set(parts) == {"vs_luffy", "vs_srft", "vs_relift", "vs_hpt"}
    for name, p in parts.items():
        assert p["level"] == ROWS["A7"]["level"] and p["low"] < p["estimate"] < p["high"], name
    assert parts["vs_luffy"]["estimate"] == pytest.approx(72.0 - 64.0, abs=1.0)


def test_a7_unconfigured_method_is_not_measured(tmp_path):
    cfg = _cfg([0, 1, 2], methods=["sft", "sft_then_rl", "sft_then_rl_truncated", "luffy"])
    values = evidence(tmp_path, cfg)
    v, why = verdict(values, "A7")
    assert v == NOT_MEASURED and "srft not in sft_rl.methods" in values["A7"]["detail"]
    assert values["A7"]["parts"]["vs_luffy"]["n"] == 3


@pytest.mark.parametrize("cid", sorted(ROWS))
def test_too_few_seeds_is_not_measured(tmp_path_factory, cid):
    values = evidence(tmp_path_factory.mktemp(f"few{cid}"), _cfg([0, 1]))
    v, why = verdict(values, cid)
    assert v == NOT_MEASURED and "min_n = 3" in why
    assert values[cid]["n"] == 2


def test_diverged_run_drops_its_pair_and_is_recorded(tmp_path):
    values = evidence(tmp_path, _cfg([0, 1, 2]), diverged={("fixed", "sft", 2)})
    a5 = values["A5"]
    assert a5["n"] == 2 and a5["diverged"] == 1
    assert "fixed/sft seed2" in a5["detail"] and "dropped" in a5["detail"]
    assert verdict(values, "A5")[0] == NOT_MEASURED  # 2 pairs left < min_n
    assert values["A6"]["diverged"] == 1 and values["A6"]["n"] == 2
    assert "A7" in values and "diverged" not in values["A7"]  # A7 does not read the SFT runs' scores
    assert "2 seeds" in values["A5"]["gates"][0]["reason"] and values["A5"]["gates"][0]["passed"]


def test_diverged_mixed_run_with_enough_pairs_still_decides(tmp_path):
    values = evidence(tmp_path, _cfg([0, 1, 2, 3]), diverged={("fixed", "srft", 3)})
    a7 = values["A7"]
    assert a7["diverged"] == 1 and a7["parts"]["vs_srft"]["n"] == 3 and a7["parts"]["vs_luffy"]["n"] == 4
    assert "fixed/srft seed3" in a7["parts"]["vs_srft"]["detail"]
    assert verdict(values, "A7")[0] in (REPRODUCED, INCONCLUSIVE)


@pytest.mark.parametrize("cid", sorted(ROWS))
def test_reference_gate_fails_when_sft_is_only_base_plus_5(tmp_path_factory, cid):
    # fixed SFT 5 points above the base model (and far above every constant answer, which the round-2 gate read):
    # not the 10 points `reference_learned` asks
    acc = {("fixed", "sft"): BASE_ACC + 5, ("ds_bug", "sft"): BASE_ACC, ("agg_bug", "sft"): BASE_ACC + 2}
    values = evidence(tmp_path_factory.mktemp(f"gate{cid}"), _cfg([0, 1, 2]), acc=acc)
    v, why = verdict(values, cid)
    assert v == NOT_MEASURED and f"gate failed: {GATE}" in why and "base model's 40.0 + 10 = 50.0" in why
    assert not values[cid]["gates"][0]["passed"]


def test_constant_baseline_is_the_most_frequent_answer():
    from collections import Counter

    from gradfidelity.studies.sft_rl.task import make_split

    cfg = _cfg([0])
    base = constant_baseline(cfg)
    answers = Counter(p.answer for p in make_split(cfg.task, "id"))
    assert base["sets"]["id"]["acc"] == pytest.approx(100 * max(answers.values()) / TASK["n_eval"])
    assert answers[base["sets"]["id"]["answer"]] == max(answers.values())


def test_aggregate_writes_tables_that_show_diverged_runs(tmp_path):
    cfg = _cfg([0, 1, 2])
    root = tmp_path / "results" / "sft_rl"
    paths = write_provenance(write_runs(root, cfg, diverged={("ds_bug", "sft", 1), ("fixed", "hpt", 0),
                                                             ("fixed", "hpt", 1), ("fixed", "hpt", 2)}))
    tables, ev_path = tmp_path / "paper_tables", tmp_path / "claims" / "sft_rl.json"
    agg.write_aggregate(cfg, paths, SCALE, tmp_path / "aggregate.csv")
    df = agg.read_aggregate(tmp_path / "aggregate.csv")
    t = tables_of(tmp_path)
    write_tables(df, cfg, *t["main"], *t["ablation"])
    write_figures(df, cfg, tmp_path / "figures" / "a.png", tmp_path / "figures" / "b.png")
    assert (tmp_path / "figures" / "a.png").stat().st_size > 0 and (tmp_path / "figures" / "b.png").exists()
    atomic_write_json(ev_path, claims_mod.claims(df, cfg, SCALE, t))
    main = (tables / "sft_rl_main.md").read_text()
    abl = (tables / "sft_rl_bug_ablation.md").read_text()
    assert "diverged (3/3)" in main and CONSTANT in main
    _check_macro_ci(df, tables / "sft_rl_main.csv")
    assert "(1/3 diverged)" in abl
    study = load_evidence([ev_path], SCALE)["sft_rl"]
    a8 = study["values"]["A8"]
    assert "hpt not measured" in a8["detail"] and "deciding method" in a8["detail"]
    assert str(tables / "sft_rl_main.csv") in a8["sources"]
    assert any(s.endswith("fixed/luffy/seed0") for s in a8["sources"])
    assert study["values"]["A7"]["parts"]["vs_hpt"]["estimate"] is None
    with pytest.raises(UserError, match="scale"):
        agg.write_aggregate(cfg, paths, "smoke", tmp_path / "other.csv")
    assert not (tmp_path / "other.csv").exists()


def _check_macro_ci(df, main_csv):
    """Each cell's macro_ci95 is the claims' interval (claims.evidence.mean_ci at A7's level, the claim the macro
    accuracy feeds) of the mean over its finished seeds, recomputed here from the CSV rows: one interval for one
    number in a table and in a claim."""
    level = level_for("A7")
    assert level == 0.95  # the column's name says so
    table = pd.read_csv(main_csv, keep_default_na=False).set_index(["variant", "method"])
    for (variant, method), g in df[df.status == "ok"].groupby(["variant", "method"]):
        if (variant, method) not in table.index:
            continue
        rec = mean_ci(g.acc_macro.astype(float), level)
        want = "n/a" if rec["low"] is None else f"[{rec['low']:.1f}, {rec['high']:.1f}]"
        assert table.loc[(variant, method), "macro_ci95"] == want, (variant, method)
    assert table.loc[("fixed", "hpt"), "macro_ci95"] == "n/a"  # every seed diverged: no interval


def test_table_interval_is_the_claims_interval_to_the_last_bit():
    """The table's interval function and the claims' evidence builder give the same interval on the same values,
    a zero-width one for identical units, and none for one unit."""
    from gradfidelity.stats.intervals import t_interval

    x = [61.25, 58.5, 63.0, 59.75]
    rec, iv = mean_ci(x, 0.95), t_interval(x, 0.95)
    assert (rec["estimate"], rec["low"], rec["high"]) == (iv.estimate, iv.low, iv.high)
    df = pd.DataFrame({"model": "m", "variant": ["fixed"] * 4 + ["both"] * 3 + ["agg_bug"],
                       "method": "sft", "status": "ok", "acc_macro": x + [40.0, 40.0, 40.0] + [50.0]})
    got = macro_intervals(df, 0.95)
    assert got[("m", "fixed", "sft")] == iv.fmt(1)
    assert got[("m", "both", "sft")] == "[40.0, 40.0]" and got[("m", "agg_bug", "sft")] == "n/a"


def test_missing_run_is_an_error(tmp_path):
    cfg = _cfg([0, 1, 2])
    root = tmp_path / "results" / "sft_rl"
    paths = write_runs(root, cfg)
    with pytest.raises(UserError, match="missing run"):
        agg.collect(cfg, load_run_records(paths[1:], scale=SCALE))
    with pytest.raises(UserError, match="missing run: the m base model"):
        agg.collect(cfg, load_run_records(paths[:-1], scale=SCALE))


def test_aggregate_reads_stored_metadata_not_paths(tmp_path):
    """Run directories renamed at random aggregate to the same table cells: a run's table cell is its plan cell
    (harness.results.cell_of), never its path; a run without one is refused."""
    import shutil

    cfg = _cfg([0, 1, 2])
    paths = write_runs(tmp_path / "results" / "sft_rl", cfg)
    want = agg.collect(cfg, load_run_records(paths, scale=SCALE))
    moved = []
    for i, path in enumerate(reversed(paths)):
        dst = tmp_path / "elsewhere" / f"run{i}"
        shutil.copytree(path.removesuffix("/metrics.json"), dst)
        moved.append(str(dst / "metrics.json"))
    got = agg.collect(cfg, load_run_records(moved, scale=SCALE))
    cols = [c for c in got.columns if c != "run"]
    pd.testing.assert_frame_equal(got[cols], want[cols])
    assert all("elsewhere" in r for r in got.run)
    dup = next(p for p in paths if p.endswith("/fixed/sft/seed0/metrics.json"))
    with pytest.raises(UserError, match="two runs of m/fixed/sft/0"):
        agg.collect(cfg, load_run_records(moved + [dup], scale=SCALE))
    record = tmp_path / "elsewhere" / "run0" / "metrics.json"
    atomic_write_json(record, {k: v for k, v in json.loads(record.read_text()).items() if k != "cell"})
    with pytest.raises(UserError, match="no 'cell'"):
        agg.collect(cfg, load_run_records(moved, scale=SCALE))


def test_tidy_csv_round_trip(tmp_path):
    cfg = _cfg([0, 1, 2])
    paths = write_provenance(write_runs(tmp_path / "results" / "sft_rl", cfg, diverged={("fixed", "hpt", 1)}))
    df = agg.write_aggregate(cfg, paths, SCALE, tmp_path / "aggregate.csv")
    back = agg.read_aggregate(tmp_path / "aggregate.csv")
    assert list(back.columns) == list(agg.COLUMNS) and len(back) == len(df)
    for k in ("acc_macro", "nll_id", "flops"):
        np.testing.assert_array_equal(back[k].to_numpy(float), df[k].to_numpy(float))
    assert back.loc[back.method == "rl", "reward_history"].iloc[0] == pytest.approx(_ramp(*REWARD, 0))
    base = back[back.method == agg.BASE]
    assert len(base) == 2 * 3 and set(base.run_variant) == {"shared"} and (base.flops == 0).all()
    assert (back.loc[(back.method == "hpt") & (back.seed == 1), "status"] == "diverged").all()
    assert set(back.loc[(back.variant == "both") & (back.method == "rl"), "run_variant"]) == {"fixed"}
    assert set(back.host) == {describe_host(INTEL)}  # every run's host type, from its provenance.json
    with pytest.raises(UserError, match="does not exist"):
        agg.read_aggregate(tmp_path / "nope.csv")


def test_diverged_run_behind_every_part_is_counted_once(tmp_path):
    values = evidence(tmp_path, _cfg([0, 1, 2, 3]), diverged={("fixed", "sft_then_rl", 3)})
    a7, a9 = values["A7"], values["A9"]
    assert a7["diverged"] == 1 and all(p["n"] == 3 and p["diverged"] == 1 for p in a7["parts"].values())
    assert a9["diverged"] == 1 and a9["parts"]["accuracy"]["n"] == 3 and a9["parts"]["flops"]["n"] == 3
    assert "fixed/sft_then_rl_truncated seed3" in a9["parts"]["flops"]["detail"]
    assert verdict(values, "A7")[0] == REPRODUCED and verdict(values, "A9")[0] == REPRODUCED


def test_a8_is_decided_per_method_at_the_holm_level(holds):
    a8 = holds["A8"]
    assert a8["level"] == ROWS["A8"]["level"] == pytest.approx(1 - 0.05 / 4)
    assert "deciding method: luffy" in a8["detail"]  # luffy 64 is the largest margin over both/sft_then_rl 55
    for m in ("luffy", "srft", "relift", "hpt"):
        assert f"{m} +" in a8["detail"] and "Holm p" in a8["detail"]


def test_a8_not_reproduced_when_every_mixed_method_is_behind(tmp_path):
    acc = {("both", "sft_then_rl"): 90.0}
    values = evidence(tmp_path, _cfg([0, 1, 2]), acc=acc)
    assert verdict(values, "A8")[0] == NOT_REPRODUCED


def test_a8_one_small_lead_is_not_enough_after_holm(tmp_path):
    # hpt a little ahead: a plain 95% interval excludes 0 but the Holm-level one does not -> inconclusive
    acc = {("both", "sft_then_rl"): 61.0, ("fixed", "luffy"): 50.0, ("fixed", "srft"): 50.0,
           ("fixed", "relift"): 50.0, ("fixed", "hpt"): 62.5}
    values = evidence(tmp_path, _cfg([0, 1, 2, 3, 4]), acc=acc)
    rec = values["A8"]
    assert "deciding method: hpt" in rec["detail"] and rec["low"] < 0 < rec["estimate"]
    from scipy import stats

    half95 = (rec["high"] - rec["low"]) / 2 * stats.t.ppf(0.975, 4) / stats.t.ppf(0.5 + rec["level"] / 2, 4)
    assert rec["estimate"] - half95 > 0  # what a max-of-means check at 95% would have called reproduced
    assert verdict(values, "A8")[0] == INCONCLUSIVE


def test_a8_holm_p_values_are_the_paired_t_tests(tmp_path):
    """A8's Holm p values in the detail are Holm's step-down over the one-sided t tests of each method's paired
    differences (hand-computed here: p sorted ascending, k - i times each, running maximum, capped at 1)."""
    import re

    from scipy import stats

    cfg = _cfg([0, 1, 2, 3])
    acc = {("fixed", "luffy"): 55.5, ("fixed", "srft"): 56.0, ("fixed", "relift"): 54.5}  # p values not all ~0
    df = agg.collect(cfg, load_run_records(write_runs(tmp_path / "runs", cfg, acc=acc), scale=SCALE))
    a8 = claims_mod.claims(df, cfg, SCALE, tables_of(tmp_path), constant_baseline(cfg))["values"]["A8"]
    base = df[(df.variant == "both") & (df.method == "sft_then_rl")].set_index("seed").acc_macro
    raw = {}
    for m in ("luffy", "srft", "relift", "hpt"):
        mine = df[(df.variant == "both") & (df.method == m)].set_index("seed").acc_macro
        raw[m] = stats.ttest_1samp(mine - base, 0.0, alternative="greater").pvalue
    order, running, want = sorted(raw, key=raw.get), 0.0, {}
    for i, m in enumerate(order):
        running = max(running, min(1.0, (len(order) - i) * raw[m]))
        want[m] = running
    shown = dict(re.findall(r"(\w+) [+-][\d.]+ \[[^\]]*\] Holm p ([\d.e+-]+)", a8["detail"]))
    assert set(shown) == set(want), a8["detail"]
    for m, p in want.items():
        assert shown[m] == f"{p:.3g}", (m, a8["detail"])
    assert len(set(shown.values())) > 1  # the case tells the methods apart


def test_a6_decides_the_papers_proposition_and_shows_the_stricter_one_and_the_old_reading(holds):
    """d = fixed - ds_bug = 10, a = fixed - agg_bug = 3 (plus scatter): the paper's E[d] - E[a] = 7 decides (issue
    57); round 5's |E[a]| < E[d] (d - a = 7, d + a = 13) and the rounds 2-4 statistic mean(|a| - |d|) = -7 are shown
    beside it; the split-half floor is gone, the deciding contrast's own SE and half-width are there."""
    rec = holds["A6"]
    assert rec["estimate"] == pytest.approx((60 - 50) - (60 - 57), abs=1.5)
    assert "the paper's proposition, most of the damage comes from the optimizer bug: E[d] - E[a] > 0" in rec["detail"]
    assert re.search(r"round 5's stricter proposition \|E\[a\]\| < E\[d\] .*a reading: holds; d - a \+6\.\d\d "
                     r"\[.*d \+ a \+12\.\d\d \[", rec["detail"]), rec["detail"]
    assert "noise floor on the zero-effect control" not in rec["detail"]
    assert re.search(r"SE \d+\.\d\d, 95% half-width \d+\.\d\d", rec["detail"])
    assert re.search(r"the rounds 2-4 statistic \(mean per-seed \|a\| - \|d\|, check < 0\), a reading: -[67]\.\d\d",
                     rec["detail"]), rec["detail"]


# ---------------------------------------------------------------- round 3 (issue 24): gates and the counted score
RL_CASES = {  # each a run set on which RL does not learn
    "changes_nothing": {"alias": {("fixed", "sft_then_rl"): ("fixed", "sft")},   # sft_then_rl == its SFT per seed
                        "reward": {("fixed", "sft_then_rl"): (0.3, 0.3)}},      # and a flat reward
    "reward_falls": {"reward": {("fixed", "sft_then_rl"): (0.6, 0.1)}},          # accuracy rises, reward falls
    "acc_flat": {"alias": {("fixed", "sft_then_rl"): ("fixed", "sft")}},         # reward rises, accuracy flat
}


@pytest.mark.parametrize("case", sorted(RL_CASES))
def test_rl_learns_fails_when_rl_does_not_learn(tmp_path, case):
    values = evidence(tmp_path, _cfg([0, 1, 2]), **RL_CASES[case])
    for cid in RL_CLAIMS:
        v, why = verdict(values, cid)
        assert v == NOT_MEASURED and f"gate failed: {claims_mod.RL_GATE}: RL does not learn at this scale" in why, cid
        assert "acc_id" in why and "reward rise" in why, why
    for cid in ("A5", "A6"):  # SFT claims do not read the RL stage
        assert verdict(values, cid)[0] == REPRODUCED
    reason = values["A7"]["gates"][1]["reason"]
    if case != "reward_falls":
        assert "acc_id +0.00 [+0.00, +0.00] (n=3)" in reason
    if case == "reward_falls":
        assert "reward rise (mean of the last fifth of the steps minus the first fifth) -0." in reason


def test_rl_learns_passes_with_both_numbers(holds):
    g = holds["A7"]["gates"][1]
    assert g["name"] == claims_mod.RL_GATE and g["passed"] and g["reason"].startswith("RL learns: ")
    assert "acc_id +12." in g["reason"] and "reward rise" in g["reason"]


def test_mixed_arm_below_its_start_blocks_the_rl_claims(tmp_path):
    values = evidence(tmp_path, _cfg([0, 1, 2]), acc={("fixed", "srft"): BASE_ACC - 5})
    v, why = verdict(values, "A7")
    assert v == NOT_MEASURED and f"gate failed: {claims_mod.ARMS_GATE}: arm did not learn: srft -" in why
    assert "luffy" not in why.split("arm did not learn:")[1]  # only the arm that did not learn is named
    assert values["A7"]["parts"]["vs_srft"]["low"] > 0  # what the claim would have said without the gate
    assert all(verdict(values, cid)[0] == NOT_MEASURED for cid in RL_CLAIMS)
    assert verdict(values, "A5")[0] == REPRODUCED


def test_unconfigured_mixed_arm_does_not_count_for_arms_learned(tmp_path):
    cfg = _cfg([0, 1, 2], methods=["sft", "sft_then_rl", "sft_then_rl_truncated", "luffy"])
    values = evidence(tmp_path, cfg, acc={("fixed", "srft"): BASE_ACC - 5})
    g = values["A7"]["gates"][2]
    assert g["passed"] and "luffy" in g["reason"] and "srft" not in g["reason"]


def test_score_counts_only_the_sets_above_their_constant_answer(tmp_path):
    # long and ood at 10 points for every run: below their constant answers (18.75, 25.0), so the score is `id`;
    # hpt scores 18 there, which puts it ahead of SFT-then-RL on the macro but behind on `id`
    sets = {"*": {"long": 10.0, "ood": 10.0}, ("fixed", "hpt"): {"long": 18.0, "ood": 18.0}}
    cfg = _cfg([0, 1, 2])
    root = tmp_path / "results" / "sft_rl"
    df = agg.collect(cfg, load_run_records(write_runs(root, cfg, sets=sets), scale=SCALE))
    values = evidence(tmp_path, cfg, sets=sets)
    for cid, rec in values.items():
        assert "counted: id (fixed SFT 60.0 vs constant answer 21.9); not counted: long (fixed SFT 10.0 vs " \
               "constant answer 18.8), ood (fixed SFT 10.0 vs constant answer 25.0)" in rec["detail"], cid
    assert values["A5"]["estimate"] == pytest.approx(60.0 - 50.0, abs=1.0)
    fixed = df[df.variant == "fixed"].set_index(["method", "seed"])
    macro = (fixed.loc["sft_then_rl", "acc_macro"] - fixed.loc["hpt", "acc_macro"]).to_numpy()
    assert (macro < 0).all()  # on the macro the claim would fail
    hpt = values["A7"]["parts"]["vs_hpt"]
    assert hpt["estimate"] == pytest.approx(72.0 - 63.0, abs=1.5) and hpt["low"] > 0
    assert verdict(values, "A7")[0] == REPRODUCED  # decided on `id`


def test_no_counted_set_is_not_measured(tmp_path):
    sets = {"*": {"long": 10.0, "ood": 10.0}}
    values = evidence(tmp_path, _cfg([0, 1, 2]), sets=sets, acc={("fixed", "sft"): 20.0})  # below 21.9 on id too
    for cid, rec in values.items():
        assert rec["estimate"] is None and "no eval set counted" in rec["detail"], cid


def test_a8_mech_holds_when_the_lead_shrinks_and_not_when_it_grows(holds, tmp_path):
    parts = holds["A8-mech"]["parts"]
    assert set(parts) == {"vs_luffy", "vs_srft", "vs_relift", "vs_hpt"}
    assert parts["vs_luffy"]["estimate"] == pytest.approx(72.0 - 55.0, abs=1.5)  # mixed runs shared: fixed = both
    assert parts["vs_luffy"]["level"] == ROWS["A8-mech"]["level"]
    grows = evidence(tmp_path, _cfg([0, 1, 2]), acc={("both", "sft_then_rl"): 80.0})
    assert grows["A8-mech"]["parts"]["vs_luffy"]["estimate"] == pytest.approx(72.0 - 80.0, abs=1.5)
    assert verdict(grows, "A8-mech")[0] == NOT_REPRODUCED


def test_a8_mech_unconfigured_method_is_not_measured(tmp_path):
    cfg = _cfg([0, 1, 2], methods=["sft", "sft_then_rl", "sft_then_rl_truncated", "luffy"])
    values = evidence(tmp_path, cfg)
    v, why = verdict(values, "A8-mech")
    assert v == NOT_MEASURED and "part vs_srft: srft not in sft_rl.methods" in why
    assert values["A8-mech"]["parts"]["vs_luffy"]["n"] == 3


@pytest.mark.parametrize("ratio", [0.1, 0.25, 0.6])
def test_a9_flops_part_is_measured_at_any_token_ratio_and_says_it(tmp_path, ratio):
    """Round 4 (issue 36): compute matching is dropped and A9 compares FLOPs as written; the budget's
    demonstration:rollout token ratio is printed beside the paper recipe's, not used as a gate."""
    gen = 80_000
    values = evidence(tmp_path, _cfg([0, 1, 2]), tokens={"sft_then_rl": (ratio * gen, gen)})
    v, _ = verdict(values, "A9")
    flops = values["A9"]["parts"]["flops"]
    assert v == REPRODUCED and flops["exact"]
    assert f"token ratio {ratio:g} (fixed sft_then_rl, mean of 3 seeds) against the paper recipe's 0.25" \
        in flops["detail"]


def test_main_table_shows_each_arms_start_gain_and_budget(tmp_path):
    cfg = _cfg([0, 1, 2])
    df = agg.collect(cfg, load_run_records(write_runs(tmp_path / "results" / "sft_rl", cfg,
                                                      diverged={("fixed", "hpt", 2)}), scale=SCALE))
    t = tables_of(tmp_path)
    write_tables(df, cfg, *t["main"], *t["ablation"])
    table = pd.read_csv(t["main"][0], keep_default_na=False).set_index(["variant", "method"])
    for col in ("start", "gain_id_ci95", "lr", "demo_tokens", "gen_tokens", "zero_adv", "PFLOPs"):
        assert col in table.columns and col in t["main"][1].read_text(), col
    assert {("fixed", "base"), ("both", "base")} <= set(table.index)
    assert table.loc[("fixed", "base"), "start"] == "-" and table.loc[("fixed", "base"), "lr"] == "-"
    assert table.loc[("fixed", "base"), "demo_tokens"] == "0"
    assert table.loc[("fixed", "sft_then_rl"), "start"] == "sft_start"
    assert table.loc[("fixed", "luffy"), "start"] == "base"
    assert table.loc[("fixed", "luffy"), "lr"] == f"{LR:.3g}" and table.loc[("fixed", "sft"), "lr"] == "-"
    assert table.loc[("fixed", "luffy"), "demo_tokens"] == "30,000"
    assert table.loc[("fixed", "sft_then_rl"), "gen_tokens"] == "80,000"
    assert table.loc[("fixed", "luffy"), "zero_adv"] == "0.51 -> 0.69"
    assert table.loc[("fixed", "sft"), "zero_adv"] == "-"
    # the gain is the paired interval of arm minus start on `id` over the seeds both finished
    f = df[(df.variant == "fixed") & (df.status == "ok")].set_index(["method", "seed"]).acc_id
    for method, start in (("sft_then_rl", "sft"), ("luffy", "base"), ("hpt", "base")):
        d = (f.loc[method] - f.loc[start]).dropna()
        rec = mean_ci(d, level_for("A7"))
        assert table.loc[("fixed", method), "gain_id_ci95"] == \
            f"{rec['estimate']:+.1f} [{rec['low']:.1f}, {rec['high']:.1f}]", method
    assert table.loc[("fixed", "luffy"), "gain_id_ci95"].startswith("+24.")
    one = _cfg([0])
    df1 = agg.collect(one, load_run_records(write_runs(tmp_path / "one", one), scale=SCALE))
    write_tables(df1, one, *t["main"], *t["ablation"])
    table = pd.read_csv(t["main"][0], keep_default_na=False).set_index(["variant", "method"])
    assert table.loc[("fixed", "luffy"), "gain_id_ci95"] == "n/a"  # one pair: no interval


def test_every_claim_shows_its_nll_reading_beside_the_accuracy_verdict(holds):
    """Issue 46: the verdict stays on accuracy; nll_id, the continuous score, is read beside it with the sign turned
    (> 0 reads as on accuracy). The test world sets nll_id = 1 - acc_id / 100, so A5's reading is the accuracy
    difference / 100: (60 - 50) / 100 = +0.1 (plus the world's scatter)."""
    for cid in ("A5", "A6", "A7", "A8", "A8-mech", "A9"):
        assert "on nll_id, a reading (not a verdict; nats, sign turned" in holds[cid]["detail"], cid
    got = float(re.search(r"on nll_id, a reading [^:]*: fixed/sft - ds_bug/sft ([+-][\d.]+) \[",
                          holds["A5"]["detail"]).group(1))
    assert got == pytest.approx((holds["A5"]["estimate"]) / 100, abs=0.002)
    assert "accuracy " in holds["A9"]["detail"].split("on nll_id")[1] and "flops" not in \
        holds["A9"]["detail"].split("on nll_id")[1]  # the exact FLOPs part is the same on both scores


def test_identical_a8_mech_parts_are_shown_as_one_number_with_the_reuse_as_the_reason(holds):
    """The mixed arms under `both` read their `fixed` runs (plan reuse, tested in test_reuse.py), so every A8-mech
    part is SFT-then-RL's own lead change: one number, said once."""
    parts = holds["A8-mech"]["parts"]
    assert len({(p["estimate"], p["low"], p["high"]) for p in parts.values()}) == 1
    assert re.search(r"the parts vs_luffy, vs_srft, vs_relift, vs_hpt are one number, [+-][\d.]+ \[.*reuse their "
                     r"`fixed` runs", holds["A8-mech"]["detail"]), holds["A8-mech"]["detail"]


def test_each_budget_reads_its_step_and_the_claims_read_the_largest(tmp_path):
    """Round 5 (issue 46): a budget below rl.steps is the run's evaluation at that step (histories cut there; the
    truncated arm at the budget's truncation step), SFT rows repeat at every budget, the claims decide on the largest
    budget and show the smaller one's reading, and the main table shows both budgets with the id intervals."""
    from gradfidelity.stats.intervals import t_interval

    cfg, paths = _two_budgets(tmp_path)
    df = agg.collect(cfg, load_run_records(paths, scale=SCALE))
    assert sorted(set(df.budget)) == [5, 10] and (df.budget == 5).sum() == (df.budget == 10).sum()
    luffy = df[(df.variant == "fixed") & (df.method == "luffy") & (df.seed == 1)].set_index("budget")
    assert luffy.loc[5, "acc_id"] == pytest.approx(80.1) and luffy.loc[10, "acc_id"] == pytest.approx(
        HOLDS[("fixed", "luffy")] + _noise("fixed", "luffy", 1))
    assert len(luffy.loc[5, "reward_history"]) == 5 and len(luffy.loc[10, "reward_history"]) == 10
    assert luffy.loc[5, "lr"] == luffy.loc[10, "lr"] == LR
    trunc = df[(df.variant == "fixed") & (df.method == "sft_then_rl_truncated") & (df.seed == 0)].set_index("budget")
    assert trunc.loc[5, "acc_id"] == 33.0 and trunc.loc[5, "rl_steps"] == 1 and trunc.loc[10, "rl_steps"] == 2
    sft = df[(df.variant == "ds_bug") & (df.method == "sft")].sort_values(["budget", "seed"])
    assert sft[sft.budget == 5].acc_id.tolist() == sft[sft.budget == 10].acc_id.tolist()

    ev = claims_mod.claims(df, cfg, SCALE, tables_of(tmp_path), constant_baseline(cfg))["values"]
    assert verdict(ev, "A7")[0] == REPRODUCED  # decided at 10 steps, where SFT-then-RL leads
    assert ("at 160 rollouts (5 RL steps), a reading (not a verdict): vs_luffy fixed/sft_then_rl - fixed/luffy -"
            in ev["A7"]["detail"])
    assert "doubling the mixed arms' FLOPs makes the FLOPs part easier to pass" in ev["A9"]["detail"]
    assert "rollouts (5 RL steps)" not in ev["A5"]["detail"]  # SFT only: one number at every budget

    t = tables_of(tmp_path)
    write_tables(df, cfg, *t["main"], *t["ablation"])
    main = pd.read_csv(t["main"][0], keep_default_na=False)
    assert main.rollouts.tolist().count("160") == main.rollouts.tolist().count("320") > 0  # 5 and 10 x 8 x 4
    row = main[(main.rollouts == "160") & (main.variant == "fixed") & (main.method == "luffy")].iloc[0]
    ids = df[(df.budget == 5) & (df.variant == "fixed") & (df.method == "luffy")].acc_id.astype(float)
    assert row.id_ci95 == t_interval(ids, level_for("A7")).fmt(1)
    nll = df[(df.budget == 10) & (df.variant == "fixed") & (df.method == "hpt")].nll_id.astype(float)
    row = main[(main.rollouts == "320") & (main.variant == "fixed") & (main.method == "hpt")].iloc[0]
    assert row.nll_id_ci95 == t_interval(nll, level_for("A7")).fmt(3)
    write_figures(df, cfg, tmp_path / "a.png", tmp_path / "b.png")
    assert (tmp_path / "a.png").stat().st_size > 0


def test_a_budget_without_its_evaluation_is_a_loud_error(tmp_path):
    cfg, paths = _two_budgets(tmp_path)
    path = next(p for p in paths if "/fixed/srft/seed2/" in p)
    rec = json.loads(open(path).read())
    del rec["metrics"]["at_step"]["5"]
    atomic_write_json(path, rec)
    with pytest.raises(UserError, match=r"fixed/srft/seed2/metrics.json: no evaluation at RL step 5"):
        agg.collect(cfg, load_run_records(paths, scale=SCALE))
    with pytest.raises(UserError, match="no rows at an RL budget of 7 steps"):
        agg.at_budget(pd.DataFrame({"budget": [5, 10]}), 7)


def test_a9_names_the_budget_effect_only_where_a_smaller_budget_is_read(holds):
    assert "makes the FLOPs part easier to pass" not in holds["A9"]["detail"]  # one budget: nothing read beside


def test_a6_is_decided_only_on_runs_made_after_its_proposition(tmp_path):
    """Issue 57: A6's round-6 proposition was chosen after round 5's runs were seen, so those runs give a reading,
    never a verdict; runs started after its commit decide (the same data, other start times)."""
    root = tmp_path / "results" / "sft_rl"
    cfg = _cfg([0, 1, 2])
    paths = write_runs(root, cfg)

    def a6(started):
        records = load_run_records(write_provenance(paths, started=started), scale=SCALE)
        df = agg.collect(cfg, records, *agg.provenance_facts(records))
        rec = claims_mod.claims(df, cfg, SCALE, tables_of(tmp_path), constant_baseline(cfg))["values"]["A6"]
        return rec, judge(ROWS["A6"], rec, True, SCALE)

    before, (verdict, reason) = a6("2026-12-05T20:00:00+00:00")
    gate = next(g for g in before["gates"] if g["name"] == "rule_before_runs")
    assert not gate["passed"] and re.match(r"(\d+) of \1 runs started before A6's proposition", gate["reason"])
    assert verdict == NOT_MEASURED and "rule_before_runs" in reason and "started before" in reason
    after, (verdict_after, _) = a6("2026-12-07T09:00:00+00:00")
    assert [g["passed"] for g in after["gates"] if g["name"] == "rule_before_runs"] == [True]
    assert verdict_after != NOT_MEASURED and after["estimate"] == before["estimate"]
