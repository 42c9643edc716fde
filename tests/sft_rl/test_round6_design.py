"""Study A's round-6 design on hand-made run directories (issue 59): SFT-then-RL starts from its SFT run's `start`
block (the sft_start row, with the SFT cost up to it), every seed's base is named, the starts table says whether
every seed has room (and names the seeds that do not), the claims show the base-to-base difference as a reading
(against scipy's Welch interval), and an RL run made from another start than its SFT record's is refused."""

import json

import pytest
from scipy import stats

from gradfidelity.errors import UserError
from gradfidelity.harness.io import atomic_write_json
from gradfidelity.harness.results import load_run_records
from gradfidelity.studies.sft_rl import aggregate as agg
from gradfidelity.studies.sft_rl import claims as claims_mod
from gradfidelity.studies.sft_rl import plan
from gradfidelity.studies.sft_rl.baseline import constant_baseline
from gradfidelity.studies.sft_rl.tables import HEADROOM, starts_table
from tests.sft_rl._config import make_cfg
from tests.sft_rl._runs import METHODS, SCALE, TASK, write_runs

SEEDS = [0, 1, 2, 3, 4, 5]


def _cfg():
    return make_cfg({"seeds": SEEDS, "base_seeds": [0, 1], "methods": METHODS, "bug_stages": ["sft"], "task": TASK,
                     "sft": {"start_every": 10, "start_max_val": 70.0}})


def _df(tmp_path, start, **kw):
    cfg = _cfg()
    paths = write_runs(tmp_path / "results" / "sft_rl", cfg, start=start, base_acc={0: 30.0, 1: 20.0}, **kw)
    return cfg, paths, agg.collect(cfg, load_run_records(paths, scale=SCALE))


def test_each_seed_starts_from_its_base_and_sft_then_rl_from_its_start(tmp_path):
    start = {s: (60 + 10 * (s % 3), 40.0) for s in SEEDS}
    cfg, _, df = _df(tmp_path, start)
    base = df[(df.method == "base") & (df.variant == "fixed")].set_index("seed")
    assert [int(base.loc[s, "base_seed"]) for s in SEEDS] == [0, 1, 0, 1, 0, 1]
    assert [float(base.loc[s, "acc_id"]) for s in SEEDS] == [30.0, 20.0] * 3  # each seed's own base
    rows = df[df.budget == cfg.rl.steps]
    st = rows[(rows.method == plan.SFT_START) & (rows.variant == "fixed")].set_index("seed")
    sft = rows[(rows.method == "sft") & (rows.variant == "fixed")].set_index("seed")
    for s in SEEDS:
        assert int(st.loc[s, "start_step"]) == start[s][0]
        assert float(st.loc[s, "acc_id"]) == pytest.approx(float(sft.loc[s, "acc_id"]) - 40.0)
        assert float(st.loc[s, "flops"]) == pytest.approx(float(sft.loc[s, "flops"]) * start[s][0] / 200)
    assert (rows[rows.method == "sft_then_rl"].start_step.dropna().astype(int).sort_values().tolist()
            == sorted(start[s][0] for s in SEEDS for _ in ("fixed", "both")))


def test_the_starts_table_shows_room_and_names_a_seed_without(tmp_path):
    cfg, _, df = _df(tmp_path, {s: (60, 40.0) for s in SEEDS})
    out = starts_table(df, cfg, tmp_path / "s.csv", tmp_path / "s.md")
    assert len(out) == 2 * len(SEEDS) and (out.headroom_id.astype(float) >= HEADROOM).all()
    md = (tmp_path / "s.md").read_text()
    assert f"every start is at least {HEADROOM:g} id points below the ceiling (12 starts)" in md
    assert "sft.start_max_val 70" in md and set(out.base_seed) == {0, 1}
    # seed 3 starts 30 points above its SFT end: too close to the ceiling, and the table says so
    start = {s: (60, 40.0) for s in SEEDS} | {3: (190, -30.0)}
    cfg, _, df = _df(tmp_path / "b", start)
    out = starts_table(df, cfg, tmp_path / "t.csv", tmp_path / "t.md")
    room = out.set_index(["variant", "seed"]).headroom_id.astype(float)
    assert room[("fixed", 3)] < HEADROOM
    text = (tmp_path / "t.md").read_text()
    assert "1 of 12 starts are fewer than 20 id points below the ceiling: " in text
    assert f"fixed seed 3 ({room[('fixed', 3)]:.1f})" in text


def test_the_claims_read_the_base_to_base_difference_against_scipys_welch(tmp_path):
    cfg, _, df = _df(tmp_path, {s: (60, 40.0) for s in SEEDS})
    values = claims_mod.claims(df, cfg, SCALE, {"main": ["m"], "ablation": ["a"]}, constant_baseline(cfg))["values"]
    full = df[df.budget == cfg.rl.steps]

    def per_seed(variant, method):
        g = full[(full.variant == variant) & (full.method == method)].sort_values("seed")
        return g[["acc_id", "acc_long", "acc_ood"]].astype(float).mean(axis=1).to_numpy()
    d = per_seed("fixed", "sft") - per_seed("ds_bug", "sft")
    b0, b1 = d[0::2], d[1::2]
    ci = stats.ttest_ind(b1, b0, equal_var=False).confidence_interval(0.95)
    detail = values["A5"]["detail"]
    assert (f"base 1 - base 0 {b1.mean() - b0.mean():+.2f} [{ci.low:+.2f}, {ci.high:+.2f}] (Welch, 95%)"
            in detail), detail
    assert f"per base base 0 {b0.mean():+.2f} (n 3), base 1 {b1.mean():+.2f} (n 3)" in detail


def test_one_base_gives_no_base_reading(tmp_path):
    cfg = make_cfg({"seeds": SEEDS, "methods": METHODS, "bug_stages": ["sft"], "task": TASK})
    paths = write_runs(tmp_path / "results" / "sft_rl", cfg)
    df = agg.collect(cfg, load_run_records(paths, scale=SCALE))
    assert set(df.base_seed) == {0}
    values = claims_mod.claims(df, cfg, SCALE, {"main": ["m"], "ablation": ["a"]}, constant_baseline(cfg))["values"]
    assert all("base to base" not in v["detail"] for v in values.values())


def test_an_rl_run_from_another_start_is_refused(tmp_path):
    cfg, paths, _ = _df(tmp_path, {s: (60, 40.0) for s in SEEDS})
    run = next(p for p in paths if "/fixed/sft_then_rl/seed2/" in p)
    rec = json.loads(open(run).read())
    rec["metrics"]["start_step"] = 200  # made from the SFT run's end, not from its recorded start
    atomic_write_json(run, rec)
    with pytest.raises(UserError, match="started at SFT step 200, but its SFT run .* records its start at step 60"):
        agg.collect(cfg, load_run_records(paths, scale=SCALE))
