"""Study B's round-6 design (issue 60) on hand-made configs and runs: seeds a claim's power asks for train that
claim's cells alone (with their references) and no other claim counts them missing; each sync and 2bw LR choice is
checked at a longer budget by the same rule."""

from __future__ import annotations

import copy
import json
import math

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
    section["lr_selection"] = {**section["lr_selection"], **lr_selection}
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
    assert choices == {("adamw", 0.9, "sync", 1): 1.0, ("muon", 0.95, "2bw", 1): 1.0}
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
    selection = {"near_tie_sd": {"adamw": 0.0}, "choices": [
        {"optimizer": "adamw", "momentum": 0.9, "schedule": "sync", "depth": 1, "multiplier": 1.0},
        {"optimizer": "adamw", "momentum": 0.9, "schedule": "2bw", "depth": 1, "multiplier": 1.0},
        {"optimizer": "muon", "momentum": 0.95, "schedule": "sync", "depth": 1, "multiplier": 2.0}]}
    losses = {("adamw", "sync"): {0.5: 1.9, 1: 1.8, 2: 1.85},  # holds
              ("adamw", "2bw"): {0.5: 1.7, 1: 1.8, 2: 1.9},  # moves down to x0.5
              ("muon", "sync"): {1: 1.7, 2: math.nan}}  # the chosen LR diverged, x4 not trained
    paths = [_check_record(tmp_path, Cell(o, lr_label(k), "untied", s, "none", 1, 0.9 if o == "adamw" else 0.95,
                                          240, cfg.lr_selection.seed), v)
             for (o, s), grid in losses.items() for k, v in grid.items()]
    monkeypatch.setattr("gradfidelity.harness.results.load_run_records", _fake_loader)
    rows = {(r["optimizer"], r["schedule"]): r for r in check(selection, paths, "cpu", 240)}
    assert rows["adamw", "sync"]["check"] == "holds" and rows["adamw", "sync"]["check_chosen"] == 1.8
    assert rows["adamw", "2bw"]["check"] == "moves to x0.5" and rows["adamw", "2bw"]["check_multiplier"] == 0.5
    assert rows["muon", "sync"]["check"].startswith("not checked: x4 not trained")


def _fake_loader(paths, scale):
    out = []
    for p in paths:
        rec = json.loads(open(p).read())
        out.append({**rec, "path": p, "run_dir": p.rsplit("/", 1)[0]})
    return out
