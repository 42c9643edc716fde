"""Claim evidence, tables and aggregation of study B on hand-made runs: every claim computation is shown to give
"reproduced" on runs where the claim holds, "not reproduced" where it is false, and "not measured" with fewer
seeds than the registry's min_n (here: a seed whose sync runs diverged, which must be dropped and counted)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import jsonschema
import pandas as pd
import pytest

from gradfidelity.claims.evidence import RECORD_SCHEMA, level_for
from gradfidelity.claims.verify import NOT_MEASURED, NOT_REPRODUCED, REPRODUCED, judge, load_evidence, load_registry
from gradfidelity.errors import UserError
from gradfidelity.studies.async_pp.aggregate import aggregate
from gradfidelity.studies.async_pp.claims import CLAIM_IDS, claims, write_claims
from gradfidelity.studies.async_pp.config import DEFAULTS, OPTIMIZERS, StudyConfig
from gradfidelity.studies.async_pp.pairing import Gaps, extra_steps
from gradfidelity.studies.async_pp.plan import cells
from gradfidelity.studies.async_pp.rules import job_section
from gradfidelity.studies.async_pp.tables import length_table, main_table, mitigations_table, write_tables
from tests.async_pp._cfg import study, validated

SMOKE_CFG = study()
CFG = study(seeds=3)
STEPS = SMOKE_CFG.train.steps
ROWS = {r["id"]: r for r in load_registry() if r["study"] == "async_pp"}
MEASURED = [cid for cid in CLAIM_IDS if cid != "B8"]
ROOT = "results/async_pp"


def _noise(opt: str, seed: int) -> float:
    """A seed- and optimizer-dependent factor (0.96, 1.0, 1.04) so per-seed values are not all equal."""
    return 1.0 + 0.04 * (((seed + OPTIMIZERS.index(opt)) % 3) - 1)


HOLDS = {  # a world where every claim B1..B9 holds
    "gap": {"adamw": 0.3, "muon": 0.01, "soap": 0.05, "adan": 0.1, "lion": 0.2, "mars": 0.2},
    "momentum": lambda mom, default: (1 - mom) / (1 - default),  # higher momentum, smaller gap
    "length": lambda steps, s: 1.0 if steps == STEPS else 1 + 0.02 * (s - 1),  # no growth
    "pipedream": lambda P: 0.1 * P,  # grows with depth, above 2bw's gap at P > 2
    "plateau": 0.001,  # the sync loss is flat at the end
    "ef": lambda opt, s: {"muon": 0.6 + 0.01 * (s - 1), "adamw": 0.875 + 0.002 * (s - 1)}.get(opt, 0.5),
    "mit": {"taylor": 0.9, "sync_start": 0.95, "sync_cooldown": 0.5},
}
FALSE = {  # a world where every one of them is false
    "gap": {"adamw": 0.03, "muon": 0.1, "soap": 0.5, "adan": 0.5, "lion": 0.5, "mars": 0.2},
    "momentum": lambda mom, default: mom / default,
    "length": lambda steps, s: steps / STEPS,
    "pipedream": lambda P: 0.5 / P,
    "plateau": 0.001,
    "ef": lambda opt, s: 0.2 + 0.01 * (s - 1),
    "mit": {"taylor": 1.5, "sync_start": 1.2, "sync_cooldown": 1.3},
}


def _loss(world: dict, c) -> float:
    base = 2.0 + 0.01 * c.seed
    if c.schedule == "sync":
        return base
    f = _noise(c.optimizer, c.seed)
    if c.schedule.startswith("pipedream"):
        return base + world["pipedream"](c.depth) * f
    default = DEFAULTS[c.optimizer]["momentum"]
    g = world["gap"][c.optimizer] * f * world["momentum"](c.momentum, default) * world["length"](c.steps, c.seed)
    if c.mitigation == "error_feedback":
        g *= 1 - world["ef"](c.optimizer, c.seed)
    elif c.mitigation != "none":
        g *= world["mit"][c.mitigation] * (1 + 0.02 * (c.seed - 1))
    return base + g


def _runs(world: dict, cfg: StudyConfig = CFG, loss=None) -> pd.DataFrame:
    loss = loss or (lambda c: _loss(world, c))
    return pd.DataFrame([{"optimizer": c.optimizer, "lr": c.lr, "head": c.head, "schedule": c.schedule,
                          "mitigation": c.mitigation, "depth": c.depth, "momentum": c.momentum, "steps": c.steps,
                          "seed": c.seed, "status": "ok", "final_val_loss": loss(c),
                          "plateau_delta": world["plateau"], "run_dir": c.dir(ROOT)}
                         for c in cells(cfg)])


def _diverge(runs: pd.DataFrame, mask) -> pd.DataFrame:
    runs = runs.copy()
    runs.loc[mask, "status"] = "diverged"
    runs.loc[mask, "final_val_loss"] = math.nan
    return runs


def _scale(cid: str) -> str:
    return "cpu" if "cpu" in ROWS[cid]["scales"] else "paper"


def _verdicts(runs: pd.DataFrame, cfg: StudyConfig = CFG) -> tuple[dict, dict]:
    values = claims(Gaps(runs, cfg), "cpu")["values"]
    for rec in values.values():
        jsonschema.validate(rec, RECORD_SCHEMA)
    return values, {cid: judge(ROWS[cid], values[cid], True, _scale(cid)) for cid in CLAIM_IDS}


def test_every_registry_row_of_the_study_gets_a_record():
    assert set(ROWS) == set(CLAIM_IDS)


@pytest.mark.parametrize("cid", MEASURED)
def test_claim_reproduced_where_it_holds(cid):
    values, verdicts = _verdicts(_runs(HOLDS))
    assert verdicts[cid][0] == REPRODUCED, (verdicts[cid], values[cid])
    rec = values[cid]
    assert rec["n"] == 3 and rec.get("diverged", 0) == 0
    if "parts" not in rec:
        assert rec["level"] == level_for(cid) and rec["low"] <= rec["estimate"] <= rec["high"]


@pytest.mark.parametrize("cid", MEASURED)
def test_claim_not_reproduced_where_it_is_false(cid):
    values, verdicts = _verdicts(_runs(FALSE))
    assert verdicts[cid][0] == NOT_REPRODUCED, (verdicts[cid], values[cid])


@pytest.mark.parametrize("cid", CLAIM_IDS)
def test_fewer_seeds_than_min_n_is_not_measured_and_the_dropped_seed_is_counted(cid):
    runs = _runs(HOLDS)
    values, verdicts = _verdicts(_diverge(runs, (runs.schedule == "sync") & (runs.seed == 2)))
    verdict, reason = verdicts[cid]
    assert verdict == NOT_MEASURED
    rec = values[cid]
    if cid == "B8":
        assert rec["estimate"] is None and "paper-only" in rec["detail"]
        return
    assert rec["n"] == 2 and rec["diverged"] == 1
    assert reason == "n = 2 < min_n = 3"
    details = [p["detail"] for p in rec["parts"].values()] if "parts" in rec else [rec["detail"]]
    assert all(re.search(r"dropped seed 2 \([^)]*sync[^)]* diverged", d) for d in details), details


def test_b8_is_never_measured():
    values, verdicts = _verdicts(_runs(HOLDS))
    assert values["B8"]["estimate"] is None and verdicts["B8"][0] == NOT_MEASURED


def test_a_missing_run_is_dropped_like_a_diverged_one():
    runs = _runs(HOLDS)
    runs = runs[~((runs.optimizer == "muon") & (runs.schedule == "2bw") & (runs.mitigation == "none")
                  & (runs.seed == 0))]
    values, _ = _verdicts(runs)
    assert values["B2"]["n"] == 2 and values["B2"]["diverged"] == 1
    assert "seed 0 (muon 2bw missing)" in values["B2"]["detail"]
    assert values["B5-adamw"]["n"] == 3 and values["B5-adamw"].get("diverged", 0) == 0  # not behind B5-adamw


def test_b1_ratio_with_a_non_positive_gap_on_a_seed_is_not_measured():
    runs = _runs(HOLDS)
    mask = (runs.optimizer == "muon") & (runs.schedule == "2bw") & (runs.mitigation == "none") & (runs.seed == 1)
    runs.loc[mask, "final_val_loss"] = 2.0 + 0.01 * 1 - 0.001  # async below sync on seed 1
    values, verdicts = _verdicts(runs)
    ratio = values["B1"]["parts"]["ratio"]
    assert ratio["estimate"] is None and "<= 0 on some seed" in ratio["detail"]
    assert verdicts["B1"][0] == NOT_MEASURED
    assert values["B1"]["parts"]["difference"]["estimate"] > 0  # the difference part is still measured
    assert verdicts["B1-abs"][0] == REPRODUCED  # AdamW's gap alone is still measured


def test_b1_is_a_geometric_mean_of_per_seed_ratios():
    values, _ = _verdicts(_runs(HOLDS))
    ratios = [0.3 * _noise("adamw", s) / (0.01 * _noise("muon", s)) for s in range(3)]
    assert values["B1"]["parts"]["ratio"]["estimate"] == pytest.approx(math.prod(ratios) ** (1 / 3))


def test_b6_fails_when_one_optimizer_contradicts_growth():
    def world_loss(c):
        if c.schedule == "pipedream" and c.optimizer == "muon":
            return 2.0 + 0.01 * c.seed + 0.8 / c.depth  # muon: shrinks with depth
        return _loss(HOLDS, c)

    values, verdicts = _verdicts(_runs(HOLDS, loss=world_loss))
    assert verdicts["B6"][0] == NOT_REPRODUCED
    assert values["B6"]["parts"]["growth"]["detail"].startswith("deciding comparison: muon")


def test_records_name_their_run_directories_and_tables(tmp_path):
    runs_csv = tmp_path / "runs.csv"
    _runs(HOLDS).assign(scale="cpu").to_csv(runs_csv, index=False)
    out = tmp_path / "claims.json"
    write_claims(str(runs_csv), CFG, "cpu", str(out), ["paper_tables/async_pp_main.csv"])
    doc = json.loads(out.read_text())
    assert doc["study"] == "async_pp" and doc["scale"] == "cpu" and set(doc["values"]) == set(CLAIM_IDS)
    b2 = doc["values"]["B2"]["sources"]
    assert (f"{ROOT}/optimizer~muon/lr~tuned/head~tied/schedule~2bw/mitigation~none/depth~1/momentum~0.95/"
            "steps~120/seed2") in b2
    assert b2[-2:] == [str(runs_csv), "paper_tables/async_pp_main.csv"]
    assert not any("adamw" in s for s in b2)
    evidence = load_evidence([out], "cpu")  # the verifier accepts the file
    assert set(evidence["async_pp"]["values"]) == set(CLAIM_IDS)
    with pytest.raises(UserError, match="not 'paper'"):
        write_claims(str(runs_csv), CFG, "paper", str(out))


def test_tables_name_diverged_runs(tmp_path):
    runs = _runs(HOLDS)
    runs = _diverge(runs, (runs.optimizer == "muon") & (runs.mitigation == "taylor") & (runs.seed == 1))
    g = Gaps(runs, CFG)
    main, mit = main_table(g), mitigations_table(g)
    muon = mit.set_index("optimizer").loc["muon"]
    assert muon["seeds"] == 2 and muon["diverged"] == "seed 1: muon 2bw+taylor diverged"
    assert main.set_index("optimizer").loc["muon", "diverged"] == "none"  # taylor is not in the main table
    assert mit.set_index("optimizer").loc["muon", "ef_recovery_pct"] == pytest.approx(60.0)
    write_tables(g, str(tmp_path / "main.csv"), str(tmp_path / "mit.csv"), "cpu")
    md = (tmp_path / "mit.md").read_text()
    assert "muon 2bw+taylor diverged" in md and "| none" in md


# ----------------------------------------------------------------------------------------------- aggregation
def _write_runs(root: Path, cfg: StudyConfig, scale: str, diverged=lambda c: False) -> list[str]:
    paths = []
    for c in cells(cfg):
        d = Path(c.dir(str(root)))
        d.mkdir(parents=True)
        if diverged(c):
            rec = {"status": "diverged", "metrics": {"diverged_at_step": 7}, "timing": {"wall_s": 1.0}}
        else:
            v = _loss(HOLDS, c)
            rec = {"status": "ok", "metrics": {"final_val_loss": v, "plateau_delta": 0.001,
                                               "curve": [[1, 512, v + 1], [2, 1024, v]]},
                   "timing": {"wall_s": 1.0, "step_s": 0.01}}
        cell = {"study": "async_pp", **c.wildcards()}  # what the harness writes: the rule's wildcards
        (d / "metrics.json").write_text(json.dumps({**rec, "study": "async_pp", "scale": scale, "seed": c.seed,
                                                    "cell": cell}))
        paths.append(str(d / "metrics.json"))
    return paths


def test_aggregate_reads_the_files_it_is_given_through_the_harness_loader(tmp_path, monkeypatch):
    cfg = SMOKE_CFG
    root = tmp_path / "runs"
    paths = _write_runs(root, cfg, "smoke", diverged=lambda c: c.optimizer == "lion" and c.schedule == "2bw"
                        and c.mitigation == "none")
    runs_csv, curves_csv = tmp_path / "runs.csv", tmp_path / "curves.csv"
    aggregate(paths, str(runs_csv), str(curves_csv), "smoke", 512)
    runs = pd.read_csv(runs_csv)
    assert len(runs) == len(cells(cfg)) and set(runs.scale) == {"smoke"}
    lion = runs[(runs.optimizer == "lion") & (runs.schedule == "2bw") & (runs.mitigation == "none")]
    assert set(lion.status) == {"diverged"} and lion.final_val_loss.isna().all()
    assert (lion.diverged_at_step == 7).all()
    assert runs.run_dir.str.startswith(str(root)).all()
    curves = pd.read_csv(curves_csv)
    assert len(curves) == 2 * (runs.status == "ok").sum()
    g = Gaps(runs, cfg)
    assert main_table(g).set_index("optimizer").loc["lion", "diverged"] == "seed 0: lion 2bw diverged"
    # only the files given are read: a subset gives a subset
    aggregate(paths[:3], str(runs_csv), str(curves_csv), "smoke")
    assert len(pd.read_csv(runs_csv)) == 3
    # the scale comes from the environment when not given, and a run of another scale is refused
    monkeypatch.setenv("GRADFIDELITY_SCALE", "cpu")
    with pytest.raises(UserError, match="not 'cpu'"):
        aggregate(paths, str(runs_csv), str(curves_csv))
    monkeypatch.delenv("GRADFIDELITY_SCALE")
    with pytest.raises(UserError, match="no scale"):
        aggregate(paths, str(runs_csv), str(curves_csv))


def test_aggregate_reads_the_cell_from_the_records_not_the_path(tmp_path):
    paths = _write_runs(tmp_path / "runs", SMOKE_CFG, "smoke")
    moved = tmp_path / "elsewhere" / "metrics.json"  # a run directory named nothing like its cell
    moved.parent.mkdir()
    moved.write_text(Path(paths[0]).read_text())
    runs_csv, curves_csv = tmp_path / "r.csv", tmp_path / "c.csv"
    aggregate([str(moved)], str(runs_csv), str(curves_csv), "smoke")
    row = pd.read_csv(runs_csv).iloc[0]
    first = cells(SMOKE_CFG)[0]
    assert (row.optimizer, row.lr, row.schedule, row.seed) == (first.optimizer, first.lr, first.schedule, first.seed)
    rec = json.loads(moved.read_text())
    for cell, match in ((None, "no 'cell'"), ({"study": "local", "seed": "0"}, "not an async_pp run")):
        if cell is None:
            rec.pop("cell")
        else:
            rec["cell"] = cell
        moved.write_text(json.dumps(rec))
        with pytest.raises(UserError, match=match):
            aggregate([str(moved)], str(runs_csv), str(curves_csv), "smoke")


def test_cli_aggregate_and_report_with_scale(tmp_path, monkeypatch):
    from gradfidelity.cli import main

    monkeypatch.delenv("GRADFIDELITY_SCALE", raising=False)
    root, runs_csv, curves_csv = tmp_path / "runs", tmp_path / "runs.csv", tmp_path / "curves.csv"
    paths = _write_runs(root, SMOKE_CFG, "smoke")
    c = json.dumps(job_section(validated(), "claims"))  # what the rule passes
    assert main(["async-pp-aggregate", "--metrics", *paths, "--runs", str(runs_csv), "--curves",
                 str(curves_csv), "--scale", "smoke"]) == 0
    out, main_csv = tmp_path / "claims.json", tmp_path / "main.csv"
    assert main(["async-pp-report", "--cfg", c, "--runs", str(runs_csv), "--curves", str(curves_csv), "--scale",
                 "smoke", "--claims", str(out), "--main-table", str(main_csv), "--mitigations-table",
                 str(tmp_path / "mit.csv")]) == 0
    values = load_evidence([out], "smoke")["async_pp"]["values"]
    assert values["B2"]["n"] == 1 and values["B2"]["sources"][-3:] == [str(runs_csv), str(main_csv),
                                                                        str(tmp_path / "mit.csv")]
    assert judge(ROWS["B2"], values["B2"], True, "smoke") == (NOT_MEASURED, "n = 1 < min_n = 3")
    assert main(["async-pp-report", "--cfg", c, "--runs", str(runs_csv), "--scale", "cpu", "--claims",
                 str(out)]) == 2  # runs.csv of another scale


# ----------------------------------------------------------------------------------------------- cases that can fail
def _world(**gap) -> dict:
    return {**HOLDS, "gap": {**HOLDS["gap"], **gap}}


def test_b3_fails_on_the_reversed_ordering():
    """Muon 0.30, AdamW 0.01 with SOAP/Adan/Lion in between: the old min/max count said 3 of 3; it must fail."""
    values, verdicts = _verdicts(_runs(_world(adamw=0.01, muon=0.3, soap=0.05, adan=0.1, lion=0.2)))
    assert verdicts["B3"][0] == NOT_REPRODUCED, values["B3"]
    assert all(verdicts_part == NOT_REPRODUCED for verdicts_part in
               (judge({**ROWS["B3"], "check": ROWS["B3"]["check"]["parts"][o]}, values["B3"]["parts"][o], True,
                      "cpu")[0] for o in ("soap", "adan", "lion")))


def test_b3_fails_when_one_optimizer_is_outside():
    values, verdicts = _verdicts(_runs(_world(lion=0.5)))  # lion above AdamW
    assert verdicts["B3"][0] == NOT_REPRODUCED
    assert values["B3"]["parts"]["lion"]["detail"].startswith("deciding comparison: adamw - lion")


def test_b1_fails_on_the_reversed_ordering_and_on_a_small_ratio():
    values, verdicts = _verdicts(_runs(_world(adamw=0.01, muon=0.3)))
    assert verdicts["B1"][0] == NOT_REPRODUCED and values["B1"]["parts"]["difference"]["high"] < 0
    values, verdicts = _verdicts(_runs(_world(adamw=0.3, muon=0.15)))  # larger, but only 2x
    assert verdicts["B1"][0] == NOT_REPRODUCED
    assert values["B1"]["parts"]["difference"]["low"] > 0 and values["B1"]["parts"]["ratio"]["high"] < 5


def test_b2_signed_gap_large_either_way_is_not_reproduced_and_a_negative_one_is_named():
    _, verdicts = _verdicts(_runs(_world(muon=0.1)))  # 5% of the sync loss
    assert verdicts["B2"][0] == NOT_REPRODUCED
    _, verdicts = _verdicts(_runs(_world(muon=-0.1)))  # async 5% below sync: not "a small gap" either
    assert verdicts["B2"][0] == NOT_REPRODUCED
    values, verdicts = _verdicts(_runs(_world(muon=-0.005)))
    assert verdicts["B2"][0] == REPRODUCED and "no gap" in values["B2"]["detail"]


def test_a_sync_loss_still_falling_makes_the_gap_claims_not_measured():
    values, verdicts = _verdicts(_runs({**HOLDS, "plateau": 0.2}))
    for cid in ("B1", "B1-abs", "B2", "B3", "B4", "B5-muon", "B5-adamw", "B6", "B7", "B9-taylor"):
        assert verdicts[cid][0] == NOT_MEASURED, cid
        assert "sync_plateau" in verdicts[cid][1] and "not plateaued" in verdicts[cid][1], verdicts[cid]


def test_a_diverged_2bw_seed_is_dropped_from_every_claim_that_needs_it():
    runs = _runs(HOLDS)
    runs = _diverge(runs, (runs.optimizer == "adamw") & (runs.schedule == "2bw") & (runs.seed == 0))
    values, verdicts = _verdicts(runs)
    for cid in ("B1", "B3", "B5-adamw"):
        assert values[cid]["n"] == 2 and values[cid]["diverged"] == 1, cid
        assert verdicts[cid] == (NOT_MEASURED, "n = 2 < min_n = 3")
    assert values["B2"]["n"] == 3  # Muon's claim does not need AdamW's runs


def test_main_table_reports_gap_intervals_extra_steps_and_the_plateau_gate():
    assert extra_steps([10, 20, 30, 40], [3.0, 2.0, 1.5, 1.0], 2.0) == pytest.approx(20.0)
    assert extra_steps([10, 20, 30, 40], [3.0, 2.0, 1.5, 1.0], 1.75) == pytest.approx(15.0)
    assert math.isnan(extra_steps([10, 20], [3.0, 2.0], 1.9))  # async below sync's final loss
    main = main_table(Gaps(_runs(HOLDS), CFG)).set_index("optimizer")
    assert main.loc["adamw", "gap_low"] < main.loc["adamw", "gap"] < main.loc["adamw", "gap_high"]
    assert main.loc["adamw", "plateau_gate"] == "pass"
    main = main_table(Gaps(_runs({**HOLDS, "plateau": 0.2}), CFG)).set_index("optimizer")
    assert main.loc["muon", "plateau_gate"] == "FAIL"


def test_length_table_gives_each_budget_its_gap_limit_and_gate():
    runs = _runs(HOLDS)
    short, long = sorted(CFG.sweeps.length.steps)
    runs.loc[runs.steps == short, "plateau_delta"] = 0.2  # still falling at the short budget only
    table = length_table(Gaps(runs, CFG)).set_index(["optimizer", "steps"])
    tuned = runs[(runs.lr == "tuned") & (runs.mitigation == "none") & (runs.depth == 1) & (runs["head"] == "tied")
                 & (runs.optimizer == "muon") & (runs.momentum == DEFAULTS["muon"]["momentum"])]
    for steps, gate in ((short, "FAIL"), (long, "pass")):
        at = tuned[tuned.steps == steps].pivot(index="seed", columns="schedule", values="final_val_loss")
        gap, sync = (at["2bw"] - at["sync"]).mean(), at["sync"].mean()
        row = table.loc[("muon", steps)]
        assert row["gap"] == pytest.approx(gap) and row["sync"] == pytest.approx(sync)
        # Muon's gap (0.01) is below 1% of its sync loss (~2.01): the floor sets the limit
        limit = 0.25 * max(abs(gap), 0.01 * sync)
        assert row["plateau_limit"] == pytest.approx(limit) and limit == pytest.approx(0.25 * 0.01 * sync)
        assert row["plateau_gate"] == gate and row["seeds"] == 3
        assert row["tokens"] == steps * CFG.train.batch_size * CFG.train.seq_len


@pytest.mark.parametrize(("muon_gap", "scale"), [(0.01, "log"), (-0.01, "symlog")])
def test_gap_vs_tokens_figure_plots_the_length_table_on_the_right_axis(tmp_path, monkeypatch, muon_gap, scale):
    from gradfidelity.studies.async_pp import figures

    seen = {}

    def spy(fig, path, caption=None):  # what the figure shows, read before it is saved and closed
        ax = fig.axes[0]
        seen.update(scale=ax.get_yscale(), lines={ln.get_label(): list(ln.get_ydata()) for ln in ax.get_lines()})
        return save_figure(fig, path, caption)

    save_figure = figures.save_figure
    monkeypatch.setattr(figures, "save_figure", spy)
    g = Gaps(_runs({**HOLDS, "gap": {**HOLDS["gap"], "muon": muon_gap}}), CFG)
    path = tmp_path / "gap_vs_tokens.png"
    figures.fig_gap_vs_tokens(g, str(path))
    muon = length_table(g).query("optimizer == 'muon'")
    assert seen["scale"] == scale
    assert seen["lines"]["muon gap"] == pytest.approx(list(muon.gap))
    assert (muon.gap < 0).all() == (muon_gap < 0)
    assert seen["lines"]["muon gate limit"] == pytest.approx(list(muon.plateau_limit))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
