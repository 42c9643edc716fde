"""The LR selection's config checks and the RL stage's LR resolution (train.rl_lr): a bad combination fails with
the key named, before any work; a tuned run reads its arm's chosen LR from the selection file."""

import pytest

from gradfidelity.errors import UserError
from gradfidelity.harness.io import atomic_write_json
from gradfidelity.studies.sft_rl import plan
from gradfidelity.studies.sft_rl.train import rl_lr
from tests.sft_rl._config import make_cfg

SELECT = {"lrs": [1e-4, 3e-4], "seed": 100}


def test_selection_seed_must_not_be_an_evaluation_seed():
    with pytest.raises(UserError, match="lr_selection.seed"):
        make_cfg({"seeds": [0, 100], "task": {"n_val": 8}, "lr_selection": SELECT})


def test_selection_needs_a_val_set():
    with pytest.raises(UserError, match="task.n_val"):
        make_cfg({"lr_selection": SELECT})


def test_rl_lr_resolution(tmp_path):
    off = make_cfg({"rl": {"lr": 2e-5}})
    assert not off.lr_selection.enabled and rl_lr(off, "m", "luffy", None, None) == 2e-5
    on = make_cfg({"task": {"n_val": 8}, "lr_selection": SELECT})
    assert rl_lr(on, "m", "luffy", 3e-4, None) == 3e-4                  # a grid run
    with pytest.raises(UserError, match="--lr-selection"):
        rl_lr(on, "m", "luffy", None, None)                              # a tuned run without its choice
    sel = tmp_path / "lr_selection.json"
    atomic_write_json(sel, {"choices": [{"model": "m", "method": "luffy", "lr": 1e-3},
                                        {"model": "m", "method": "hpt", "lr": 1e-5}]})
    assert rl_lr(on, "m", "luffy", None, sel) == 1e-3 and rl_lr(on, "m", "hpt", None, sel) == 1e-5
    with pytest.raises(UserError, match="srft"):
        rl_lr(on, "m", "srft", None, sel)
    with pytest.raises(UserError, match="not both"):
        rl_lr(on, "m", "luffy", 1e-4, sel)


def test_grid_plan_covers_every_tuned_arm_and_starts_like_the_arm():
    cfg = make_cfg({"task": {"n_val": 8}, "lr_selection": SELECT,
                    "methods": ["sft", "sft_then_rl_truncated", "luffy", "hpt"]})
    assert plan.tuned_methods(cfg) == ["sft_then_rl", "luffy", "hpt"]    # the truncation needs sft_then_rl's LR
    runs = plan.grid_runs(cfg, "R")
    assert len(runs) == 3 * 2 and "R/m/lr_grid/luffy/lr0.0003/seed100/metrics.json" in runs
    assert plan.grid_init_dir(cfg, "R", "m", "sft_then_rl") == plan.run_dir("R", "m", "fixed", "sft", 100)
    assert plan.grid_init_dir(cfg, "R", "m", "hpt") == plan.base_dir("R", "m", 0)
