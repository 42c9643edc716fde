"""Study B's round-6 design (issue 60) on hand-made configs and runs: seeds a claim's power asks for train that
claim's cells alone (with their references) and no other claim counts them missing; each sync and 2bw LR choice is
checked at a longer budget by the same rule."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest

from gradfidelity.errors import UserError
from gradfidelity.studies.async_pp.claims import claims
from gradfidelity.studies.async_pp.lr_select import check, round_choices
from gradfidelity.studies.async_pp.pairing import Gaps
from gradfidelity.studies.async_pp.plan import Cell, cells, check_cells, eval_cells, lr_label
from tests.async_pp._cfg import study
from tests.async_pp._world import _SECTION, HOLDS, _runs


def _cfg(claim_seeds: dict, seeds: int = 3, **lr_selection):
    section = copy.deepcopy(_SECTION)
    section["claim_seeds"] = claim_seeds
    section["sweeps"]["width"] = {"widths": []}
    section["lr_selection"] = {**section["lr_selection"], "check_steps": None, "check_optimizers": None,
                               **lr_selection}
    return study(section, seeds=seeds)


def test_claim_seeds_train_only_that_claims_cells_and_their_references():
    cfg = _cfg({"B9-taylor": 5})
    extra = [c for c in eval_cells(cfg) if c.seed >= 3]
    assert {c.seed for c in extra} == {3, 4}
    # the mitigation sweep's optimizers only, on sync (their ladders) and 2bw (plain and with Taylor)
    assert {c.optimizer for c in extra} == set(cfg.sweeps.mitigation.optimizers)
    assert {c.mitigation for c in extra} == {"none", "taylor"}
    assert {c.schedule for c in extra} == {"sync", "2bw"}
    for opt in cfg.sweeps.mitigation.optimizers:  # the whole ladder of each, on each added seed
        assert {c.steps for c in extra if c.optimizer == opt and c.schedule == "sync" and c.seed == 4} == \
            set(cfg.sweeps.ladder.of(opt))
    base = {c for c in eval_cells(_cfg({}))}
    assert base == {c for c in eval_cells(cfg) if c.seed < 3}  # the first seeds are untouched
    # the selection seed must lie above every evaluation seed, the added ones included
    with pytest.raises(UserError, match="lr_selection.seed"):
        _cfg({"B9-taylor": 101})


def test_a_claim_reads_its_added_seeds_and_no_other_claim_counts_them_missing():
    cfg = _cfg({"B9-taylor": 5, "B4": 4})
    values = claims(Gaps(_runs(HOLDS, cfg), cfg), "cpu")["values"]
    assert values["B9-taylor"]["n"] == 5 and not values["B9-taylor"].get("diverged")
    assert values["B4"]["n"] == 4
    for cid in ("B6", "B9-sync_start", "B5-adamw"):  # the base seeds only, and nothing dropped
        assert values[cid]["n"] == 3 and not values[cid].get("diverged"), (cid, values[cid])
    # B2 reads Muon's ladder and 2bw: the references of B9-taylor's added seeds, so it reads them too
    assert values["B2"]["n"] == 5
    # the false case: an added seed's run that is missing is a missing run of its claim, named as dropped
    runs = _runs(HOLDS, cfg)
    gone = (runs["mitigation"] == "taylor") & (runs["seed"] == 4) & (runs["optimizer"] == "adamw")
    values = claims(Gaps(runs[~gone], cfg), "cpu")["values"]
    assert values["B9-taylor"]["n"] == 4 and values["B9-taylor"]["diverged"] == 1


def test_a_claim_seed_for_an_untrained_mitigation_is_refused_naming_the_key():
    section = copy.deepcopy(_SECTION)
    section["sweeps"]["mitigation"]["mitigations"] = ["taylor"]
    section["claim_seeds"] = {"B9-sync_start": 4}
    with pytest.raises(UserError, match="claim_seeds.*sync_start"):
        eval_cells(study(section, seeds=3))


def _round_doc(grid: dict) -> dict:
    return {"grid": [{"optimizer": o, "momentum": m, "schedule": s, "depth": 1,
                      "losses": {f"{k:g}": v for k, v in losses.items()}} for (o, m, s), losses in grid.items()],
            "extension": []}


def test_the_check_plans_each_sync_and_2bw_choice_and_its_neighbours_at_the_longer_budget():
    cfg = _cfg({}, check_steps=240)
    doc = _round_doc({("adamw", 0.9, "sync"): {0.5: 2.0, 1: 1.9, 2: 1.95},
                      ("muon", 0.95, "2bw"): {0.5: 2.0, 1: 1.97, 2: 1.96}})  # muon: a near-tie at sd 0.05
    choices = round_choices(doc, {"muon": 0.05})
    assert choices == {("adamw", 0.9, "sync", 1, 0): 1.0, ("muon", 0.95, "2bw", 1, 0): 1.0}
    planned = check_cells(cfg, choices)
    assert {(c.optimizer, c.schedule, c.lr) for c in planned} == {
        (o, s, lr_label(k)) for o, s in (("adamw", "sync"), ("muon", "2bw")) for k in (0.5, 1, 2)}
    assert {(c.steps, c.seed, c.mitigation) for c in planned} == {(240, cfg.lr_selection.seed, "none")}
    assert check_cells(_cfg({}), choices) == []  # no check_steps: no check
    only = _cfg({}, check_steps=240, check_optimizers=["muon"])
    assert {c.optimizer for c in check_cells(only, choices)} == {"muon"}
    assert not set(planned) & set(cells(cfg))  # the check's runs are its own cells
    with pytest.raises(UserError, match="check_steps"):
        _cfg({}, check_steps=cfg.train.steps)


def _check_record(tmp_path, cell: Cell, loss: float) -> str:
    run = tmp_path / cell.dir("r")
    run.mkdir(parents=True)
    ok = math.isfinite(loss)
    (run / "metrics.json").write_text(json.dumps({
        "status": "ok" if ok else "diverged", "scale": "cpu", "metrics": {"final_val_loss": loss if ok else None},
        "cell": {"study": "async_pp", **cell.wildcards()}}))
    return str(run / "metrics.json")


def test_the_check_says_whether_each_choice_holds_at_the_longer_budget(tmp_path, monkeypatch):
    cfg = _cfg({}, check_steps=240)
    selection = {"near_tie_sd": {"adamw": 0.0, "adan": 0.3}, "choices": [
        {"optimizer": "adamw", "momentum": 0.9, "schedule": "sync", "depth": 1, "multiplier": 1.0},
        {"optimizer": "adamw", "momentum": 0.9, "schedule": "2bw", "depth": 1, "multiplier": 1.0},
        {"optimizer": "muon", "momentum": 0.95, "schedule": "sync", "depth": 1, "multiplier": 2.0},
        {"optimizer": "adan", "momentum": 0.98, "schedule": "sync", "depth": 1, "multiplier": 4.0},
        {"optimizer": "adan", "momentum": 0.98, "schedule": "2bw", "depth": 1, "multiplier": 4.0}]}
    losses = {("adamw", "sync"): {0.5: 1.9, 1: 1.8, 2: 1.85},  # holds
              ("adamw", "2bw"): {0.5: 1.7, 1: 1.8, 2: 1.9},  # moves down to x0.5
              ("muon", "sync"): {1: 1.7, 2: math.nan},  # the chosen LR diverged, x4 not trained
              # the chosen x4 still the best, x2 within Adan's sd: only the near-tie step moves it (cpu's Adan 2bw)
              ("adan", "sync"): {2: 3.07, 4: 2.995, 8: 3.074},
              ("adan", "2bw"): {2: 3.0, 4: 3.2, 8: 2.8}}  # the best moves up to x8, and x4 is no near-tie of it
    mom = {"adamw": 0.9, "muon": 0.95, "adan": 0.98}
    paths = [_check_record(tmp_path, Cell(o, lr_label(k), "untied", s, "none", 1, mom[o], 240,
                                          cfg.lr_selection.seed), v)
             for (o, s), grid in losses.items() for k, v in grid.items()]
    monkeypatch.setattr("gradfidelity.harness.results.load_run_records", _fake_loader)
    rows = {(r["optimizer"], r["schedule"]): r for r in check(selection, paths, "cpu", 240)}
    assert rows["adamw", "sync"]["check"] == "holds" and rows["adamw", "sync"]["check_chosen"] == 1.8
    assert rows["adamw", "2bw"]["check"] == "moves to x0.5" and rows["adamw", "2bw"]["check_multiplier"] == 0.5
    assert rows["adamw", "2bw"]["check_best"] == 0.5
    assert rows["muon", "sync"]["check"].startswith("not checked: x4 not trained")
    assert rows["adan", "sync"]["check"] == "moves to x2 (a near-tie step: x4, the chosen, is still the best)"
    assert rows["adan", "sync"]["check_best"] == 4 and rows["adan", "sync"]["check_multiplier"] == 2
    assert rows["adan", "2bw"]["check"] == "moves to x8" and rows["adan", "2bw"]["check_best"] == 8


def _fake_loader(paths, scale):
    out = []
    for p in paths:
        rec = json.loads(open(p).read())
        out.append({**rec, "path": p, "run_dir": p.rsplit("/", 1)[0]})
    return out


# ------------------------------------------------------------------------------------------ the width ladder
def _width_cfg(seeds_64: int = 3):
    section = copy.deepcopy(_SECTION)
    section["sweeps"]["main"] = {"optimizers": [*section["sweeps"]["main"]["optimizers"], "muon_all"]}
    section["sweeps"]["width"] = {"widths": [{"d_model": 64, "steps": 2 * section["train"]["steps"],
                                              "optimizers": ["adamw", "muon", "muon_all"], "seeds": seeds_64}]}
    return study(section, seeds=3)


def _width_world(f_at_64: dict):
    """HOLDS at the model's own width; at d 64 the f given per optimizer (the same on every seed)."""
    from tests.async_pp._world import _loss, sync_loss

    def loss(c):
        if c.width != 64 or c.schedule == "sync":
            return _loss(HOLDS, c) if c.optimizer != "muon_all" else sync_loss(c.steps * (
                1.0 if c.schedule == "sync" else 0.9), c.seed)
        return sync_loss(f_at_64[c.optimizer] * c.steps, c.seed)
    return loss


def test_the_width_ladder_plans_each_width_at_its_own_budget_grid_and_ladder():
    cfg = _width_cfg()
    T, Tw = cfg.train.steps, 2 * cfg.train.steps
    at64 = [c for c in cells(cfg) if c.width == 64]
    grid = [c for c in at64 if c.seed == cfg.lr_selection.seed]
    assert {c.steps for c in grid} == {Tw} and {c.schedule for c in grid} == {"sync", "2bw"}
    assert {c.optimizer for c in grid} == {"adamw", "muon", "muon_all"}
    ev = [c for c in at64 if c.seed != cfg.lr_selection.seed]
    assert {c.steps for c in ev if c.schedule == "sync"} == {round(n * Tw / T) for n in cfg.sweeps.ladder.steps}
    assert {c.steps for c in ev if c.schedule == "2bw"} == {Tw, 2 * Tw} and {c.lr for c in ev} == {"tuned", "own"}
    assert all(c.dir("r").startswith("r/width~64/optimizer~") for c in at64)
    base = [c for c in cells(cfg) if not c.width]  # the model's own width keeps its paths, without a prefix
    assert all(c.dir("r").startswith("r/optimizer~") and "width" not in c.wildcards() for c in base)


def test_the_claims_read_the_widest_width_that_ran_with_the_narrower_beside_it():
    cfg = _width_cfg()
    runs = _runs(HOLDS, cfg, loss=_width_world({"adamw": 0.3, "muon": 0.99, "muon_all": 0.98}))
    values = claims(Gaps(runs, cfg), "cpu")["values"]
    b2 = values["B2"]
    assert b2["estimate"] == pytest.approx(0.01, abs=1e-9)  # d 64's Muon, not d 32's (HOLDS: 0.03 there)
    assert "read at d 64" in b2["detail"] and "narrower widths (readings): d 32 (3 seeds): lost 0.03" in b2["detail"]
    assert "muon_all (the embedding and head on Muon too) at d 64: lost 0.020" in b2["detail"]
    assert any("/width~64/" in s for s in b2["sources"])
    assert values["B1-abs"]["estimate"] == pytest.approx(0.7, abs=1e-9)
    # the false case: at d 64 Muon loses half its compute, so B2 is read there and fails, whatever d 32 says
    runs = _runs(HOLDS, cfg, loss=_width_world({"adamw": 0.3, "muon": 0.5, "muon_all": 0.5}))
    assert claims(Gaps(runs, cfg), "cpu")["values"]["B2"]["estimate"] == pytest.approx(0.5, abs=1e-9)
    # a width whose runs are not there is not read: the model's own width decides, and no seed counts as missing
    values = claims(Gaps(runs[runs["width"] == 0], cfg), "cpu")["values"]
    assert values["B2"]["estimate"] == pytest.approx(0.03, abs=0.002) and not values["B2"].get("diverged")


def test_a_width_reading_names_its_own_budgets_and_b1_abs_stands_when_muons_f_leaves_the_ladder():
    """The cpu run's first aggregate (seeds 0-3): at d 64 one seed's Muon 2bw at 2T beat sync's ladder end, so B1
    was not measured at 2T; B1-abs, which reads AdamW alone, was blocked with it, and both labels said T = 512 (d 32's
    budget) for a reading at d 64's 1563."""
    from gradfidelity.studies.async_pp.claims import budget_readings

    cfg = _width_cfg()
    Tw = 2 * cfg.train.steps  # d 64's T in this config
    # at d 64: AdamW keeps 0.3 of its compute; Muon's 2bw ends where sync needs 1.5 x its budget, inside the
    # ladder at T and beyond its top (2T) at 2T
    runs = _runs(HOLDS, cfg, loss=_width_world({"adamw": 0.3, "muon": 1.5, "muon_all": 0.98}))
    recs, readings = budget_readings(Gaps(runs, cfg), "cpu")
    assert readings["B1"].verdict_2T == "not measured at this scale" and not readings["B1"].decided
    # B1-abs reads AdamW only: decided at d 64 on both budgets
    b1_abs = readings["B1-abs"]
    assert b1_abs.decided and recs["B1-abs"]["estimate"] == pytest.approx(0.7, abs=1e-9)
    assert (b1_abs.T, readings["B2"].T) == (Tw, Tw)
    assert f"verdict at T = {Tw} at d 64: " in b1_abs.gate()["reason"] and f"at 2T = {2 * Tw}: " in \
        b1_abs.gate()["reason"]
    assert f"host types: at {Tw} steps: one host type" in recs["B1-abs"]["detail"]
    written = claims(Gaps(runs, cfg), "cpu")["values"]["B1-abs"]  # the width is a private key, never written
    assert written["estimate"] == pytest.approx(0.7, abs=1e-9) and not any(k.startswith("_") for k in written)
    # the false case: a claim at the model's own width keeps its T and says no width
    assert readings["B3"].T == cfg.train.steps and " at d " not in readings["B3"].gate()["reason"].split(":")[0]


def test_a_near_tie_view_swaps_the_own_widths_arm_only_never_a_width_ladder_cell():
    """sweeps.near_tie arms train at the model's own width: the near-tie view of B1 (read at d 64) once swapped
    d 64's AdamW 2bw for a lr~x1 cell that does not exist there, and read d 32 instead."""
    from gradfidelity.studies.async_pp.claims import _reads
    from gradfidelity.studies.async_pp.pairing import Spec, fractions

    cfg = _width_cfg()
    runs = _runs(HOLDS, cfg, loss=_width_world({"adamw": 0.3, "muon": 0.99, "muon_all": 0.98}))
    view = Gaps(runs, cfg).at(lr_for={("adamw", 0.9, "2bw", 1): "x1"})
    at64 = fractions(view, {"a": Spec("adamw", "2bw", width=64)})
    assert at64.n == 3 and at64.f["a"] == pytest.approx([0.3] * 3)  # d 64's own-LR cells, untouched
    assert not any("lr~x1" in d for d in at64.p.sources)
    # the false case: at the model's own width the arm is swapped to its lr~x1 cells (sweeps.near_tie trains them)
    own = fractions(view, {"a": Spec("adamw", "2bw")})
    assert any("/optimizer~adamw/lr~x1/" in d and "width~" not in d for d in own.p.sources)
    arm = ("adamw", 0.9, "2bw", 1)
    cell = "optimizer~adamw/lr~own/head~untied/schedule~2bw/mitigation~none/depth~1/momentum~0.9/steps~60/seed0"
    assert _reads({"sources": [f"r/{cell}"]}, arm, "own")
    assert not _reads({"sources": [f"r/width~64/{cell}"]}, arm, "own")


def test_a_width_whose_steps_miss_the_tokens_per_parameter_is_refused_naming_the_key():
    section = copy.deepcopy(_SECTION)
    section["data"] = {"corpus": "file", "path": "x.txt", "bpe_vocab": 512}
    section["train"] = {**section["train"], "batch_size": 32, "seq_len": 64}
    section["sweeps"]["width"] = {"tokens_per_parameter": 15.0,
                                  "widths": [{"d_model": 64, "steps": 1400, "optimizers": ["muon"], "seeds": 2}]}
    with pytest.raises(UserError, match=r"sweeps.width.widths\[0\].steps.*1563 steps"):
        study(section)
    section["sweeps"]["width"]["widths"][0]["steps"] = 1563
    assert study(section).sweeps.width.rung(64).steps == 1563


def test_the_parameter_count_of_a_width_is_the_built_models():
    import torch  # noqa: F401  (the model)

    from gradfidelity.studies.async_pp.model import build_model, n_params

    cfg = study()
    for d in (32, 64, 128):
        for tied in (False, True):
            m = cfg.model.at_width(d)
            from dataclasses import replace
            built = build_model(replace(m, tie_embeddings=tied, vocab_size=512), seed=0)
            assert n_params(built) == m.n_params(512, tied), (d, tied)


def test_the_width_table_and_figure_show_each_width_with_its_budget_and_f(tmp_path):
    from gradfidelity.studies.async_pp.figures import fig_width
    from gradfidelity.studies.async_pp.tables import width_table

    cfg = _width_cfg()
    runs = _runs(HOLDS, cfg, loss=_width_world({"adamw": 0.3, "muon": 0.99, "muon_all": 0.98}))
    runs["n_params"] = [cfg.model.at_width(w or 32).n_params(40, False) for w in runs["width"]]
    runs["epochs"] = runs["steps"] / 1000  # a made-up training split of 1000 steps' tokens
    table = width_table(Gaps(runs, cfg)).set_index(["d_model", "optimizer"])
    assert table.loc[(64, "muon"), "epochs_2T"] == pytest.approx(4 * cfg.train.steps / 1000)
    assert table.loc[(64, "muon"), "f_T"] == pytest.approx(0.99) and table.loc[(32, "muon"), "f_T"] == \
        pytest.approx(0.97, abs=0.002)
    assert table.loc[(64, "muon"), "T"] == 2 * cfg.train.steps and table.loc[(64, "muon"), "seeds"] == 3
    share = table.loc[(64, "muon"), "embed_head_share"]
    assert share == pytest.approx(2 * 40 * 64 / cfg.model.at_width(64).n_params(40, False))
    assert table.loc[(32, "muon"), "embed_head_share"] > share  # the embedding's share falls with the width
    fig_width(Gaps(runs, cfg), str(tmp_path / "w.png"))
    assert (tmp_path / "w.png").stat().st_size > 0


def test_the_ladder_extension_reads_an_f_above_the_ladder_and_claim_seeds_do_without_it():
    from gradfidelity.studies.async_pp.pairing import Spec, fractions
    from tests.async_pp._world import _loss, sync_loss

    section = copy.deepcopy(_SECTION)
    section["sweeps"]["ladder"] = {"steps": [5, 15, 30, 60, 120], "extend": {"optimizers": ["muon"], "steps": [240]}}
    section["claim_seeds"] = {"B9-taylor": 5}
    cfg = study(section, seeds=3)
    ext = [c for c in eval_cells(cfg) if c.steps == 240]
    assert ext and {c.seed for c in ext} == {0, 1, 2} and {c.momentum for c in ext} == {0.95}  # default only
    T2 = 2 * cfg.train.steps

    def loss(c):  # Muon's plain 2bw at 2T ends where sync needs 1.5 x 2T: an f above the ladder's top
        if c.optimizer == "muon" and c.schedule == "2bw" and c.mitigation == "none" and c.steps == T2 \
                and c.lr == "own":
            return sync_loss(1.5 * T2, c.seed)
        return _loss(HOLDS, c)

    runs = _runs(HOLDS, cfg, loss=loss)
    g = Gaps(runs, cfg)
    fr = fractions(g.at(steps=T2), {"m": Spec("muon", "2bw")})
    # read off the 240 rung on seeds 0-2; seeds 3-4 (B9-taylor's, no 240 rung there) say it is outside the ladder
    assert fr.p.seeds == [0, 1, 2, 3, 4] and fr.f["m"][:3] == pytest.approx([1.5] * 3)
    assert np.isnan(fr.f["m"][3:]).all() and "seed 3" in fr.defined("m") and "seed 0" not in fr.defined("m")
    assert any("steps~240" in d for d in fr.p.sources)
    # the false case: without the extension's runs the same f is outside the ladder, named, never extrapolated
    fr = fractions(Gaps(runs[runs["steps"] != 240], cfg).at(steps=T2), {"m": Spec("muon", "2bw")})
    assert np.isnan(fr.f["m"]).all() and "better than sync at 120 steps" in fr.defined("m")
    # the added seeds (no 240 rung planned there) are read by the claim that added them
    assert claims(g, "cpu")["values"]["B9-taylor"]["n"] == 5


def test_the_lr_selection_table_carries_the_check_beside_each_sync_and_2bw_row(tmp_path):
    """PipeDream has a row per depth (the same optimizer, momentum and schedule twice): the check joins the sync and
    2bw rows only (found by the smoke DAG: the join once refused the table as not one-to-one)."""
    import pandas as pd

    from gradfidelity.studies.async_pp.tables import write_lr_selection

    def choice(schedule, depth, m):
        return {"optimizer": "adamw", "momentum": 0.9, "schedule": schedule, "depth": depth, "default_lr": 2e-3,
                "multiplier": m, "lr": 2e-3 * m, "best_multiplier": m, "near_tie": False, "extended": [],
                "bracketed": True, "grid": [{"multiplier": m, "final_val_loss": 2.0, "seed": 100}]}

    doc = {"scale": "cpu", "base_multipliers": [1, 2], "near_tie_sd": {},
           "choices": [choice("sync", 1, 2), choice("2bw", 1, 1), choice("pipedream", 2, 1), choice("pipedream", 4, 1)]}
    rows = [{"optimizer": "adamw", "momentum": 0.9, "schedule": s, "check_steps": 240, "chosen_multiplier": m,
             "check_half": 2.1, "check_chosen": 2.0, "check_twice": 2.2, "check_best": m, "check_multiplier": m,
             "check": "holds"}
            for s, m in (("sync", 2.0), ("2bw", 1.0))]
    write_lr_selection(doc, str(tmp_path / "t.csv"), rows)
    table = pd.read_csv(tmp_path / "t.csv").set_index(["schedule", "depth"])
    assert table.loc[("sync", 1), "check"] == "holds" and table.loc[("2bw", 1), "check_steps"] == 240
    assert table.loc[("pipedream", 2), "check"] != "holds" and pd.isna(table.loc[("pipedream", 4), "check_steps"])
    assert "Not holding: none" in (tmp_path / "t.md").read_text()
