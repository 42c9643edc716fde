"""Plan, the EF recovery formula, a killed-and-resumed training run, CLI errors (claims: test_claims.py)."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from gradfidelity.studies.async_pp import delay as delay_mod
from gradfidelity.studies.async_pp.analysis import ef_recovery
from gradfidelity.studies.async_pp.plan import Cell, cells, groups
from gradfidelity.studies.async_pp.train import run_cell

SMOKE = yaml.safe_load(open("config/smoke/async_pp.yaml"))


def test_plan_dedupes_shared_cells_and_groups_cover_each_once():
    cs = cells(SMOKE)
    assert len(cs) == len(set(cs))
    grouped = [c for g in groups(SMOKE) for c in g.cells]
    assert sorted(grouped) == cs
    main = {(c.optimizer, c.schedule, c.mitigation) for c in cs if c.depth == 1 and c.steps == SMOKE["train"]["steps"]}
    assert ("muon", "2bw", "error_feedback") in main and ("adamw", "sync", "none") in main
    c = Cell("muon", "2bw", "taylor", 1, 0.95, 160, 0)
    assert c.dir() == ("results/async_pp/optimizer~muon/schedule~2bw/mitigation~taylor/depth~1/momentum~0.95/"
                       "steps~160/seed0")


def test_ef_recovery_formula():
    assert ef_recovery(2.0, 2.2, 2.05) == pytest.approx(75.0)
    assert math.isnan(ef_recovery(2.0, 1.9, 1.95))


def _tiny_cfg():
    cfg = json.loads(json.dumps(SMOKE))
    cfg["train"].update(steps=12, checkpoint_every=4, evals=3, val_batches=2)
    cfg["data"].update(train_chars=20000, val_chars=3000)
    return cfg


def test_killed_and_resumed_run_repeats_exactly(tmp_path, monkeypatch):
    cfg = _tiny_cfg()
    cell = Cell("adamw", "pipedream", "none", 4, 0.9, 12, 0)
    ref = json.loads((run_cell(cfg, cell, str(tmp_path / "a"), 1) / "metrics.json").read_text())
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


def test_cli_bad_config_exits_2_before_work(capsys):
    from gradfidelity.cli import main

    assert main(["async-pp-train", "--cfg", "{}", "--cells", "[]"]) == 2
    assert "missing key 'seeds'" in capsys.readouterr().err
    bad = json.loads(json.dumps(SMOKE))
    bad["sweeps"]["depth"]["depths"] = [2, 64]
    cell = json.dumps([{"optimizer": "adamw", "schedule": "sync", "mitigation": "none", "depth": 1,
                        "momentum": 0.9, "steps": 10, "seed": 0}])
    assert main(["async-pp-aggregate", "--cfg", json.dumps(bad), "--runs", "x.csv", "--curves", "y.csv"]) == 2
    assert "exceeds" in capsys.readouterr().err
    bad = json.loads(json.dumps(SMOKE))
    assert main(["async-pp-train", "--cfg", json.dumps(bad), "--cells", cell.replace("sync", "3bw")]) == 2
    assert "schedule '3bw'" in capsys.readouterr().err
