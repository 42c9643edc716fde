"""Plan, LR selection, the EF recovery formula, a killed-and-resumed training run, CLI errors (claims:
test_claims.py)."""

from __future__ import annotations

import copy
import json
import math

import pytest
import yaml

from gradfidelity.errors import UserError
from gradfidelity.studies.async_pp import delay as delay_mod
from gradfidelity.studies.async_pp.analysis import ef_recovery
from gradfidelity.studies.async_pp.lr_select import choose, select, tuned_lr, write_selection
from gradfidelity.studies.async_pp.names import DEFAULTS, OPTIMIZERS
from gradfidelity.studies.async_pp.plan import (
    PATTERN,
    TUNED,
    Cell,
    cell_from_path,
    cell_from_wildcards,
    cells,
    grid_cells,
)
from gradfidelity.studies.async_pp.train import eval_steps, run_cell

SMOKE = yaml.safe_load(open("config/smoke/async_pp.yaml"))
SCHEMA = yaml.safe_load(open("workflow/schemas/async_pp.schema.yaml"))


def test_plan_dedupes_shared_cells_and_paths_round_trip():
    cs = cells(SMOKE)
    assert len(cs) == len(set(cs))
    main = {(c.optimizer, c.schedule, c.mitigation) for c in cs if c.lr == TUNED and c.depth == 1}
    assert ("muon", "2bw", "error_feedback") in main and ("adamw", "sync", "none") in main
    c = Cell("muon", TUNED, "tied", "2bw", "taylor", 1, 0.95, 160, 0)
    assert c.dir() == ("results/async_pp/optimizer~muon/lr~tuned/head~tied/schedule~2bw/mitigation~taylor/depth~1/"
                       "momentum~0.95/steps~160/seed0")
    for cell in cs:
        assert cell_from_path(cell.metrics("results/smoke/async_pp")) == cell
    wc = dict(optimizer="adamw", lr="x0.5", head="tied", schedule="sync", mitigation="none", depth="1",
              momentum="0.9", steps="120", seed="100")
    assert PATTERN.format(**wc).startswith("optimizer~adamw/lr~x0.5/")
    assert cell_from_wildcards(wc) == Cell("adamw", "x0.5", "tied", "sync", "none", 1, 0.9, 120, 100)


def test_lr_grid_is_sync_on_a_seed_outside_the_evaluation_seeds():
    grid = grid_cells(SMOKE)
    assert {c.schedule for c in grid} == {"sync"} and {c.seed for c in grid} == {SMOKE["lr_selection"]["seed"]}
    assert len(grid) == len(OPTIMIZERS) * len(SMOKE["lr_selection"]["multipliers"])
    assert all(c.lr == TUNED for c in cells(SMOKE) if c not in grid)
    bad = copy.deepcopy(SMOKE)
    bad["lr_selection"]["seed"] = 0
    with pytest.raises(UserError, match="evaluation seeds"):
        cells(bad)


def test_depth_sweep_unties_the_head_with_its_own_references():
    depth = [c for c in cells(SMOKE) if c.head == "untied"]
    assert {c.schedule for c in depth} == {"sync", "2bw", "pipedream"}
    assert all(c.head == "untied" for c in cells(SMOKE) if c.schedule.startswith("pipedream"))


def test_optimizer_names_are_defined_once():
    assert SCHEMA["definitions"]["optimizer_name"]["enum"] == list(OPTIMIZERS)
    assert tuple(DEFAULTS) == OPTIMIZERS


def test_lr_selection_rule():
    assert choose({0.5: 2.0, 1.0: 1.5, 2.0: 1.7}) == 1.0
    assert choose({0.5: 1.5, 1.0: 1.5}) == 0.5  # a tie goes to the smaller LR
    assert choose({0.5: 2.0, 4.0: math.nan}) == 0.5  # diverged excluded
    with pytest.raises(UserError, match="every grid point diverged"):
        choose({1.0: math.nan})


def _grid_run(tmp_path, opt, mult, loss, scale="smoke"):
    c = Cell(opt, f"x{mult:g}", "tied", "sync", "none", 1, DEFAULTS[opt]["momentum"], 120, 100)
    d = tmp_path / c.dir("r")
    d.mkdir(parents=True)
    rec = ({"status": "ok", "metrics": {"final_val_loss": loss}} if math.isfinite(loss)
           else {"status": "diverged", "metrics": {"diverged_at_step": 3}})
    (d / "metrics.json").write_text(json.dumps({**rec, "timing": {}, "scale": scale, "seed": 100}))
    return str(d / "metrics.json")


def test_select_reads_the_grid_and_tuned_lr_reads_the_choice(tmp_path):
    paths = [_grid_run(tmp_path, "adamw", 0.5, 2.0), _grid_run(tmp_path, "adamw", 1, 1.8),
             _grid_run(tmp_path, "adamw", 2, math.nan), _grid_run(tmp_path, "muon", 0.5, 1.2),
             _grid_run(tmp_path, "muon", 1, 1.3), _grid_run(tmp_path, "muon", 2, 1.4)]
    doc = select(paths, "smoke")
    assert doc["optimizers"]["adamw"]["multiplier"] == 1 and not doc["optimizers"]["adamw"]["at_grid_edge"]
    assert doc["optimizers"]["muon"]["lr"] == pytest.approx(0.5 * DEFAULTS["muon"]["lr"])
    assert doc["optimizers"]["muon"]["at_grid_edge"]
    out = tmp_path / "sel.json"
    write_selection(paths, "smoke", str(out), str(tmp_path / "lr.csv"))
    assert tuned_lr(str(out), "muon") == pytest.approx(1e-3)
    assert "grid" in (tmp_path / "lr.md").read_text()
    with pytest.raises(UserError, match="no chosen LR"):
        tuned_lr(str(out), "lion")
    with pytest.raises(UserError, match="not 'cpu'"):
        select(paths, "cpu")


def test_ef_recovery_formula():
    assert ef_recovery(2.0, 2.2, 2.05) == pytest.approx(75.0)
    assert math.isnan(ef_recovery(2.0, 1.9, 1.95))


def _tiny_cfg():
    cfg = json.loads(json.dumps(SMOKE))
    cfg["train"].update(steps=12, checkpoint_every=4, evals=3, val_batches=2)
    cfg["data"].update(train_chars=20000, val_chars=3000)
    return cfg


def test_eval_steps_include_the_plateau_point():
    assert eval_steps(100, 4) == [25, 50, 75, 90, 100]


def test_killed_and_resumed_run_repeats_exactly(tmp_path, monkeypatch):
    cfg = _tiny_cfg()
    cell = Cell("adamw", "x1", "untied", "pipedream", "none", 4, 0.9, 12, 0)
    ref = json.loads((run_cell(cfg, cell, str(tmp_path / "a"), 1) / "metrics.json").read_text())
    assert ref["metrics"]["lr"] == DEFAULTS["adamw"]["lr"]
    assert math.isfinite(ref["metrics"]["plateau_delta"])
    real_step = delay_mod.DelaySimulator.step

    def dying_step(self, t, *a, **k):
        if t == 10:
            raise KeyboardInterrupt("killed")
        return real_step(self, t, *a, **k)

    monkeypatch.setattr(delay_mod.DelaySimulator, "step", dying_step)
    with pytest.raises(KeyboardInterrupt):
        run_cell(cfg, cell, str(tmp_path / "b"), 1)
    monkeypatch.setattr(delay_mod.DelaySimulator, "step", real_step)
    out = run_cell(cfg, cell, str(tmp_path / "b"), 1)
    got = json.loads((out / "metrics.json").read_text())
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["resumed_from_step"] == 8
    assert got["metrics"] == ref["metrics"]


def test_tuned_cell_trains_at_the_selected_lr_and_refuses_without_it(tmp_path):
    cfg = _tiny_cfg()
    sel = tmp_path / "sel.json"
    sel.write_text(json.dumps({"optimizers": {"lion": {"lr": 1.234e-4}}}))
    cell = Cell("lion", TUNED, "tied", "2bw", "none", 1, 0.99, 12, 0)
    got = json.loads((run_cell(cfg, cell, str(tmp_path / "a"), 1, str(sel)) / "metrics.json").read_text())
    assert got["metrics"]["lr"] == 1.234e-4
    with pytest.raises(UserError, match="needs the LR selection"):
        run_cell(cfg, cell, str(tmp_path / "b"), 1)
    with pytest.raises(UserError, match="untied"):
        run_cell(cfg, Cell("adamw", "x1", "tied", "pipedream", "none", 2, 0.9, 12, 0), str(tmp_path / "c"), 1)
    no_delay = {k: v for k, v in cfg.items() if k != "delay"}
    with pytest.raises(UserError, match="delay"):
        run_cell(no_delay, Cell("adamw", "x1", "tied", "2bw", "taylor", 1, 0.9, 12, 0), str(tmp_path / "d"), 1)


def test_cli_bad_config_exits_2_before_work(capsys, tmp_path):
    from gradfidelity.cli import main

    out = str(tmp_path / "optimizer~adamw/lr~x1/head~tied/schedule~sync/mitigation~none/depth~1/momentum~0.9/"
              "steps~10/seed0/metrics.json")
    assert main(["async-pp-train", "--cfg", "{}", "--metrics", out]) == 2
    assert "missing key 'model'" in capsys.readouterr().err
    cfg = json.dumps({k: SMOKE[k] for k in ("model", "data", "train")})
    assert main(["async-pp-train", "--cfg", cfg, "--metrics", out.replace("sync", "3bw")]) == 2
    assert "3bw" in capsys.readouterr().err
    bad = copy.deepcopy(SMOKE)
    bad["sweeps"]["depth"]["depths"] = [2, 64]
    with pytest.raises(UserError, match="exceeds"):
        cells(bad)


def test_rule_params_carry_only_the_sections_a_job_depends_on():
    from types import SimpleNamespace

    from gradfidelity.studies.async_pp.rules import lr_arg, train_cfg, train_input

    def wc(lr="tuned", mitigation="none"):
        return SimpleNamespace(lr=lr, mitigation=mitigation)

    plain = json.loads(yaml.safe_load(train_cfg(SMOKE)(wc())))  # shlex-quoted JSON: YAML reads the quotes away
    assert set(plain) == {"model", "data", "train"}  # no bench, sweeps, delay, lr_selection
    assert set(json.loads(yaml.safe_load(train_cfg(SMOKE)(wc(mitigation="taylor"))))) == {"model", "data", "train",
                                                                                          "delay"}
    assert train_input("sel.json")(wc()) == ["sel.json"] and train_input("sel.json")(wc(lr="x2")) == []
    assert lr_arg(wc(), ["sel.json"]) == "--lr-selection sel.json" and lr_arg(wc(lr="x2"), []) == ""
