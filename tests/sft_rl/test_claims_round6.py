"""Study A's evidence, round 6 (issues 57 and 59), on hand-made run directories: A6 decided on the paper's
proposition both ways with the stricter one beside it, its deciding contrast's own SE and half-width against scipy;
every reading named by its arms or method (A8's nll reading decided by another method than its verdict); the host
types of every claim's runs and a contrast across two host types said so; the power blocks (per-seed values, level,
wall time of one more seed, the paper's effect); the `both` arm's RL stage beside `rl_learns` and the per-seed
headroom where it fails."""

import json
import re
import zlib
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from scipy import stats

from gradfidelity.claims.evidence import RECORD_SCHEMA
from gradfidelity.claims.verify import NOT_MEASURED, NOT_REPRODUCED, REPRODUCED, judge, load_registry
from gradfidelity.errors import UserError
from gradfidelity.harness.io import atomic_write_json
from gradfidelity.harness.provenance import describe_host
from gradfidelity.harness.results import load_run_records
from gradfidelity.studies.sft_rl import aggregate as agg
from gradfidelity.studies.sft_rl import claims as claims_mod
from gradfidelity.studies.sft_rl.baseline import constant_baseline
from gradfidelity.studies.sft_rl.tables import write_tables
from tests.sft_rl._hosts import AMD, INTEL, set_wall, write_provenance
from tests.sft_rl._runs import SCALE, _cfg, _noise, _two_budgets, write_runs

ROWS = {row["id"]: row for row in load_registry() if row["study"] == "sft_rl"}
SEEDS = [0, 1, 2]


def _tables(tmp_path) -> dict:
    t = tmp_path / "paper_tables"
    return {"main": [t / "sft_rl_main.csv", t / "sft_rl_main.md"],
            "ablation": [t / "sft_rl_bug_ablation.csv", t / "sft_rl_bug_ablation.md"]}


def _through_csv(tmp_path, cfg, paths):
    """The rule's path: write_aggregate (every run's provenance read), then the CSV read back."""
    agg.write_aggregate(cfg, paths, SCALE, tmp_path / "aggregate.csv")
    return agg.read_aggregate(tmp_path / "aggregate.csv")


def _evidence(tmp_path, cfg, df) -> dict:
    ev = claims_mod.claims(df, cfg, SCALE, _tables(tmp_path), constant_baseline(cfg))
    for rec in ev["values"].values():
        jsonschema.validate(rec, RECORD_SCHEMA)
    return ev["values"]


def _world(tmp_path, machine_of=None, **kw):
    cfg = _cfg(SEEDS)
    paths = write_provenance(write_runs(tmp_path / "results" / "sft_rl", cfg, **kw),
                             machine_of or (lambda p: INTEL))
    df = _through_csv(tmp_path, cfg, paths)
    return cfg, paths, df, _evidence(tmp_path, cfg, df)


def _cell(path: str) -> tuple[str, str]:
    variant, method = path.split("/")[-4:-2]
    return variant, method


def _per_seed(df, variant: str, method: str, key: str = "acc_counted") -> np.ndarray:
    """The arm's score per seed, straight from the tidy CSV (every set counts in the default world: id, long and
    ood are all above their constant answers)."""
    g = df[(df.variant == variant) & (df.method == method) & (df.budget == df.budget.max())].sort_values("seed")
    if key == "acc_counted":
        return g[["acc_id", "acc_long", "acc_ood"]].astype(float).mean(axis=1).to_numpy()
    return g[key].astype(float).to_numpy()


# ---------------------------------------------------------------- A6: the paper's proposition, both ways
A6_CASES = {  # (ds_bug SFT, agg_bug SFT) against fixed SFT at 60: the paper's verdict, the stricter reading
    "damage_mostly_optimizer": ((50.0, 57.0), REPRODUCED, "holds"),         # d 10, a 3
    "aggregation_helps_more": ((50.0, 75.0), REPRODUCED, "fails"),          # d 10, a -15: no aggregation damage
    "aggregation_helps_as_much": ((50.0, 70.0), REPRODUCED, "undecided"),  # d 10, a -10: d + a about 0
    "aggregation_hurts_more": ((58.0, 50.0), NOT_REPRODUCED, "fails"),      # d 2, a 10: d - a = -8
    "optimizer_helps": ((66.0, 55.0), NOT_REPRODUCED, "fails"),            # d -6, a 5: all damage is aggregation's
}


@pytest.mark.parametrize("case", sorted(A6_CASES))
def test_a6_decides_the_papers_proposition_with_the_stricter_one_beside(tmp_path, case):
    (ds, ag), want, stricter = A6_CASES[case]
    cfg, _, df, values = _world(tmp_path, acc={("ds_bug", "sft"): ds, ("agg_bug", "sft"): ag})
    rec = values["A6"]
    assert judge(ROWS["A6"], rec, True, SCALE)[0] == want, rec["detail"]
    f, d_, a_ = (_per_seed(df, v, "sft") for v in ("fixed", "ds_bug", "agg_bug"))
    d, a = f - d_, f - a_
    ci = stats.ttest_1samp(d - a, 0.0).confidence_interval(0.95)
    assert rec["estimate"] == pytest.approx(np.mean(d - a)) and (rec["low"], rec["high"]) == pytest.approx(
        (ci.low, ci.high))
    # the stricter |E[a]| < E[d], read beside: 'holds' when both parts' intervals lie above 0, 'fails' when one lies
    # below, else undecided
    cis = [stats.ttest_1samp(x, 0.0).confidence_interval(0.95) for x in (d - a, d + a)]
    word = "holds" if min(c.low for c in cis) > 0 else "fails" if min(c.high for c in cis) <= 0 else "undecided"
    assert word == stricter
    assert f"|E[a]| < E[d] (E[d] - E[a] > 0 and E[d] + E[a] > 0, the weaker deciding), a reading: {word}" in \
        rec["detail"], rec["detail"]
    assert rec["power"]["per_seed"] == pytest.approx(list(d - a)) and rec["power"]["side"] == "gt"


def test_a6_gives_its_deciding_contrasts_own_se_and_half_width_as_scipy_does(tmp_path):
    cfg, _, df, values = _world(tmp_path, acc={("ds_bug", "sft"): 50.0, ("agg_bug", "sft"): 75.0})
    f, d_, a_ = (_per_seed(df, v, "sft") for v in ("fixed", "ds_bug", "agg_bug"))
    detail = values["A6"]["detail"]
    for name, x in {"deciding contrast": a_ - d_, "d + a deciding": 2 * f - d_ - a_}.items():
        sd, se = float(np.std(x, ddof=1)), float(stats.sem(x))
        half = (stats.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=se)[1] - x.mean())
        text = f"per-seed sd {sd:.2f}, SE {se:.2f}, 95% half-width {half:.2f}"
        assert detail.split(name, 1)[1].split(";")[0].endswith(text), (name, text, detail)
    got = claims_mod.se_and_half_width([61.25, 58.5, 63.0, 59.75], 0.95)
    x = np.array([61.25, 58.5, 63.0, 59.75])
    ci = stats.ttest_1samp(x, 0.0).confidence_interval(0.95)
    assert got == pytest.approx((np.std(x, ddof=1), stats.sem(x), (ci.high - ci.low) / 2))


# ---------------------------------------------------------------- labels: every reading names its arms or method
def _scatter_nll(paths, nll_of):
    """Every RL-stage and SFT run's nll_id = nll_of(variant, method) plus a per-run scatter (so that no interval has
    zero width and the largest t is a real choice)."""
    for path in paths:
        rec = json.loads(Path(path).read_text())
        if rec["status"] != "ok" or rec["cell"].get("stage") not in ("sft", "rl"):
            continue
        v, m = _cell(path)
        cell = "/".join(path.split("/")[-4:-1])  # variant/method/seed: the same scatter wherever tmp_path is
        rec["metrics"]["nll_id"] = nll_of(v, m) + (zlib.crc32(cell.encode()) % 11 - 5) * 0.004
        atomic_write_json(path, rec)


def test_a8_nll_reading_names_its_method_and_says_it_is_not_the_verdicts(tmp_path):
    """On accuracy luffy leads SFT-then-RL under `both` most (64 vs 55); on nll_id hpt does (its nll far below every
    other arm's): the nll reading is hpt's comparison, named, and says the verdict's is luffy's (round 5's A8 read
    HPT's nll beside SRFT's accuracy without a word)."""
    cfg = _cfg(SEEDS)
    paths = write_provenance(write_runs(tmp_path / "results" / "sft_rl", cfg))
    _scatter_nll(paths, lambda v, m: 0.2 if m == "hpt" else 0.5)
    values = _evidence(tmp_path, cfg, _through_csv(tmp_path, cfg, paths))
    a8 = values["A8"]
    assert a8["detail"].split(": ", 1)[1].startswith("deciding method: luffy (largest t)")
    assert a8["power"]["statistic"] == "both/luffy - both/sft_then_rl" and a8["power"]["level"] == ROWS["A8"]["level"]
    nll = a8["detail"].split("on nll_id, a reading")[1]
    assert re.search(r"^[^:]*: both/hpt - both/sft_then_rl \+0\.\d{3} \[.*\] \(n=3\) \(another comparison than "
                     r"the verdict's, both/luffy - both/sft_then_rl\)", nll), nll
    assert "fixed/sft - ds_bug/sft" in values["A5"]["detail"].split("on nll_id")[1]
    assert "E[d] - E[a] = agg_bug/sft - ds_bug/sft" in values["A6"]["detail"].split("on nll_id")[1]
    a7 = values["A7"]["detail"].split("on nll_id")[1]
    assert all(f"vs_{m} fixed/sft_then_rl - fixed/{m} " in a7 for m in ("luffy", "srft", "relift", "hpt"))


def test_a_smaller_budgets_reading_names_its_method(tmp_path):
    cfg, paths = _two_budgets(tmp_path)
    df = agg.collect(cfg, load_run_records(paths, scale=SCALE))
    a8 = _evidence(tmp_path, cfg, df)["A8"]["detail"]
    early = a8.split("at 160 rollouts (5 RL steps), a reading (not a verdict): ")[1]
    assert re.match(r"both/\w+ - both/sft_then_rl [+-]\d+\.\d\d \[", early), early


# ---------------------------------------------------------------- host types
def test_every_claim_lists_its_host_types_and_a_contrast_across_two_says_so(tmp_path):
    """ds_bug's and both's SFT runs on an AMD host, every other run on an Intel one: A5 and A6 (ds_bug) and A8,
    A8-mech (both/sft_then_rl starts from both/sft) read two host types and say which arm ran where; A7 and A9 read
    one; the tables name the host types with their cells."""
    amd = {("ds_bug", "sft"), ("both", "sft")}
    cfg, _, df, values = _world(tmp_path, machine_of=lambda p: AMD if _cell(p) in amd else INTEL)
    intel, amd_text = describe_host(INTEL), describe_host(AMD)
    assert set(df.host) == {intel, amd_text}
    for cid in ("A5", "A6", "A8", "A8-mech"):
        assert values[cid]["hosts"] == sorted([intel, amd_text]), cid
    for cid in ("A7", "A9"):
        assert values[cid]["hosts"] == [intel], cid
        assert "host types, so this contrast" not in values[cid]["detail"], cid
        assert f"host types of its runs: {intel}" in values[cid]["detail"]
    assert re.search(r"the arms' runs come from 2 host types, so this contrast also measures the host: fixed/sft on "
                     r"GenuineIntel[^;]*; ds_bug/sft on AuthenticAMD", values["A5"]["detail"]), values["A5"]["detail"]
    assert f"both/sft_then_rl on {amd_text} + {intel}" in values["A8"]["detail"]
    assert all(p["hosts"] for p in values["A7"]["parts"].values())
    t = _tables(tmp_path)
    write_tables(df, cfg, *t["main"], *t["ablation"])
    main = t["main"][1].read_text()
    assert "the runs come from 2 host types" in main and f"{amd_text}: both/sft, both/sft_start, ds_bug/sft" in main


def test_a_run_without_its_provenance_is_refused_by_the_aggregate(tmp_path):
    cfg = _cfg(SEEDS)
    paths = write_provenance(write_runs(tmp_path / "results" / "sft_rl", cfg))
    (Path(paths[0]).parent / "provenance.json").unlink()
    with pytest.raises(UserError, match="provenance.json is missing"):
        agg.write_aggregate(cfg, paths, SCALE, tmp_path / "aggregate.csv")
    df = agg.collect(cfg, load_run_records(paths, scale=SCALE))  # without provenance: said, never guessed
    assert claims_mod.claims(df, cfg, SCALE, _tables(tmp_path))["values"]["A5"]["hosts"] == [
        claims_mod.HOST_UNRECORDED]


# ---------------------------------------------------------------- power
WALL = {"sft": 10.0, "sft_then_rl": 100.0, "luffy": 20.0, "srft": 30.0, "relift": 40.0, "hpt": 50.0,
        "rl": 5.0, "base": 1000.0}


def test_power_blocks_carry_the_deciding_values_level_and_one_more_seeds_wall_time(tmp_path):
    cfg = _cfg(SEEDS)
    paths = write_provenance(write_runs(tmp_path / "results" / "sft_rl", cfg))
    set_wall(paths, lambda p, rec: WALL["base" if rec["cell"]["stage"] == "pretrain" else _cell(p)[1]]
             + rec["seed"])
    df = _through_csv(tmp_path, cfg, paths)
    values = _evidence(tmp_path, cfg, df)
    mean_seed = np.mean(SEEDS)
    a5 = values["A5"]["power"]
    assert a5["per_seed"] == pytest.approx(list(_per_seed(df, "fixed", "sft") - _per_seed(df, "ds_bug", "sft")))
    assert (a5["threshold"], a5["side"], a5["level"]) == (0.0, "gt", ROWS["A5"]["level"])
    assert a5["wall_s_per_seed"] == pytest.approx(2 * (10 + mean_seed))  # fixed + ds_bug SFT; the base is shared
    assert a5["paper_effect"] is None
    assert values["A6"]["power"]["wall_s_per_seed"] == pytest.approx(3 * (10 + mean_seed))
    # A7: fixed SFT + SFT-then-RL + the four mixed arms (its parts and gates), one block a part, the paper's +3.8
    a7_wall = 10 + 100 + 20 + 30 + 40 + 50 + 6 * mean_seed
    for m in ("luffy", "srft", "relift", "hpt"):
        p = values["A7"]["parts"][f"vs_{m}"]["power"]
        assert p["statistic"] == f"fixed/sft_then_rl - fixed/{m}" and p["paper_effect"] == 3.8
        assert p["per_seed"] == pytest.approx(list(_per_seed(df, "fixed", "sft_then_rl") - _per_seed(df, "fixed", m)))
        assert p["wall_s_per_seed"] == pytest.approx(a7_wall)
    assert "power" not in values["A7"]  # an intersection-union claim: one block a part, planned part by part
    # A8: at the Holm level, its runs under both (both/sft the start of both/sft_then_rl) and its gates' fixed runs
    a8 = values["A8"]["power"]
    assert a8["level"] == ROWS["A8"]["level"] == pytest.approx(1 - 0.05 / 4)
    assert a8["paper_effect"] == pytest.approx(50.1 - 48.2)
    assert a8["wall_s_per_seed"] == pytest.approx(a7_wall + 10 + 100 + 2 * mean_seed)
    assert "not_applicable" in values["A9"]["parts"]["flops"]["power"]
    assert values["A9"]["parts"]["accuracy"]["power"]["statistic"].startswith("fixed/sft_then_rl_truncated - ")


def test_power_wall_time_is_none_where_a_run_was_not_timed(tmp_path):
    _, _, _, values = _world(tmp_path)  # _runs writes "timing": {}
    assert values["A5"]["power"]["wall_s_per_seed"] is None


# ---------------------------------------------------------------- rl_learns: the both arm beside it, the headroom
def test_rl_learns_shows_the_both_arms_rl_stage_and_the_failing_claims_show_each_seeds_headroom(tmp_path):
    """SFT-then-RL's RL stage changes nothing under `fixed` (its run reads as its SFT start), while under `both` it
    gains 55 - 45 = 10 points: the gate fails, the both arm's gain is shown beside it with scipy's interval, and each
    RL claim's detail gives every seed's headroom (100 - fixed SFT acc_id) and gain (0)."""
    cfg, _, df, values = _world(tmp_path, alias={("fixed", "sft_then_rl"): ("fixed", "sft")})
    reason = values["A7"]["gates"][1]["reason"]
    assert values["A7"]["gates"][1]["name"] == claims_mod.RL_GATE and not values["A7"]["gates"][1]["passed"]
    # the start rows (sft_start): these runs made no start block, so the start is the SFT run's end
    assert (_per_seed(df, "both", "sft_start", "acc_id") == _per_seed(df, "both", "sft", "acc_id")).all()
    gain = _per_seed(df, "both", "sft_then_rl", "acc_id") - _per_seed(df, "both", "sft_start", "acc_id")
    ci = stats.ttest_1samp(gain, 0.0).confidence_interval(0.95)
    assert (f"beside it, a reading (not the gate): the `both` arm's RL stage, both/sft_then_rl minus its SFT start "
            f"(both/sft_start) on acc_id {gain.mean():+.2f} [{ci.low:+.2f}, {ci.high:+.2f}] (n=3), its reward "
            "rise +0.") in reason, reason
    start = _per_seed(df, "fixed", "sft", "acc_id")
    per = ", ".join(f"seed {s} {100 - x:.1f} / +0.0" for s, x in zip(SEEDS, start, strict=True))
    for cid in claims_mod.RL_CLAIMS:
        assert judge(ROWS[cid], values[cid], True, SCALE)[0] == NOT_MEASURED
        assert f"rl_learns fails: per seed, the RL start's headroom (100 - SFT start acc_id) / the RL stage's gain " \
               f"on acc_id (sft_then_rl minus its SFT start): fixed: {per}; mean headroom " \
               f"{np.mean(100 - start):.1f}, mean gain +0.00, the RL stage closes 0% of the headroom" in \
               values[cid]["detail"], (cid, values[cid]["detail"])
    assert "rl_learns fails" not in values["A5"]["detail"]
    assert start[0] == pytest.approx(60.0 + _noise("fixed", "sft", 0))


def test_no_headroom_note_where_rl_learns(tmp_path):
    _, _, _, values = _world(tmp_path)
    assert values["A7"]["gates"][1]["passed"]
    assert all("rl_learns fails" not in values[cid]["detail"] for cid in claims_mod.RL_CLAIMS)
