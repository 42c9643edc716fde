"""Issue 37, item 1: every async arm gets its own LR by the same grid rule, and a near-tie on the selection seed
goes to the smaller LR and is recorded. Hand-made grids on made-up loss surfaces (the independent reference: the
surface's own minimum)."""

from __future__ import annotations

import json
import math

import pytest

from gradfidelity import lr_grid
from gradfidelity.errors import UserError
from gradfidelity.studies.async_pp.config import DEFAULTS
from gradfidelity.studies.async_pp.lr_select import extension_round, select, tuned_lr, write_selection
from gradfidelity.studies.async_pp.plan import OWN, TUNED, Cell
from gradfidelity.studies.async_pp.tables import lr_selection_table
from gradfidelity.studies.async_pp.train import cell_lr


def _run(root, opt, mult, loss, schedule="sync", depth=1):
    c = Cell(opt, f"x{mult:g}", "untied", schedule, "none", depth, DEFAULTS[opt]["momentum"], 120, 100)
    d = root / f"run{len(list(root.iterdir()))}"
    d.mkdir()
    rec = ({"status": "ok", "metrics": {"final_val_loss": loss}} if math.isfinite(loss)
           else {"status": "diverged", "metrics": {"diverged_at_step": 3}})
    (d / "metrics.json").write_text(json.dumps({**rec, "timing": {}, "scale": "smoke", "seed": 100,
                                                "cell": {"study": "async_pp", **c.wildcards()}}))
    return str(d / "metrics.json")


def surface(mult: float, delay: int) -> float:
    """A made-up loss over log2(LR multiplier) whose optimum moves down by 2 doublings per step of delay (a stale
    gradient makes a large step costlier): sync's optimum at 8x, one-step delay's at 2x, P = 4 PipeDream's at
    0.5x; each delay also costs a constant."""
    return 3.0 + 0.1 * delay + 0.05 * (math.log2(mult) - (3 - 2 * delay)) ** 2


def _grow(root, paths, opt, schedule, depth, delay, base):
    """Run the extension rounds to the end, as the Snakemake checkpoint does."""
    for _ in range(10):
        ext = [e for e in extension_round(paths, "smoke", base, 4)["extension"]
               if (e["optimizer"], e["schedule"], e["depth"]) == (opt, schedule, depth)]
        if not ext:
            return paths
        paths = paths + [_run(root, opt, e["multiplier"], surface(e["multiplier"], delay), schedule, depth)
                         for e in ext]
    raise AssertionError("the grid did not stop growing")


def test_the_async_grids_pick_their_own_lr_on_a_made_up_surface(tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    base = [1, 2, 4, 8]
    arms = (("sync", 1, 0), ("2bw", 1, 1), ("pipedream", 4, 2))
    paths = [_run(root, "adamw", m, surface(m, d), s, P) for s, P, d in arms for m in base]
    for s, P, d in arms:
        paths = _grow(root, paths, "adamw", s, P, d, base)
    doc = select(paths, "smoke", base)
    got = {(c["schedule"], c["depth"]): c for c in doc["choices"]}
    assert got[("sync", 1)]["multiplier"] == 8 and got[("sync", 1)]["extended"] == [16]
    assert got[("2bw", 1)]["multiplier"] == 2 and got[("2bw", 1)]["extended"] == []
    assert got[("pipedream", 4)]["multiplier"] == 0.5 and got[("pipedream", 4)]["extended"] == [0.25, 0.5]
    assert all(c["bracketed"] and not c["near_tie"] for c in got.values())
    out = tmp_path / "sel.json"
    write_selection(paths, "smoke", str(out), base)
    lr0 = DEFAULTS["adamw"]["lr"]
    cell = Cell("adamw", TUNED, "untied", "2bw", "none", 1, 0.9, 60, 0)
    assert cell_lr(cell, str(out)) == pytest.approx(8 * lr0)  # the secondary: the LR sync chose
    assert cell_lr(Cell("adamw", OWN, "untied", "2bw", "none", 1, 0.9, 60, 0), str(out)) == pytest.approx(2 * lr0)
    assert cell_lr(Cell("adamw", OWN, "untied", "pipedream", "none", 4, 0.9, 60, 0), str(out)) == pytest.approx(
        0.5 * lr0)
    with pytest.raises(UserError, match="on pipedream at depth 2"):
        tuned_lr(str(out), "adamw", 0.9, "pipedream", 2)
    table = lr_selection_table(doc).set_index(["optimizer", "schedule", "depth"])
    assert table.loc[("adamw", "2bw", 1), "chosen_multiplier"] == 2
    assert table.loc[("adamw", "pipedream", 4), "loss_x0.25"] == pytest.approx(surface(0.25, 2))
    assert math.isnan(table.loc[("adamw", "sync", 1), "loss_x0.25"])  # not trained for that arm


def test_a_round_3_selection_document_still_reads_as_sync_choices(tmp_path):
    doc = {"choices": [{"optimizer": "muon", "momentum": 0.95, "lr": 0.016}]}
    path = tmp_path / "sel.json"
    path.write_text(json.dumps(doc))
    assert tuned_lr(str(path), "muon", 0.95) == 0.016
    with pytest.raises(UserError, match="no chosen LR"):
        tuned_lr(str(path), "muon", 0.95, "2bw")


def test_a_near_tie_goes_one_step_to_the_smaller_lr_and_is_recorded(tmp_path):
    # round 3's AdamW-0.95 grid: 8x beat 4x by 0.008 nats; AdamW's seed-to-seed sd 0.065 makes it a near-tie
    grid = {2.0: 3.554, 4.0: 3.473, 8.0: 3.465, 16.0: 3.87}
    assert lr_grid.near_tie(grid, 0.065, higher_is_better=False, what="t") == (4.0, True)
    assert lr_grid.near_tie(grid, 0.005, higher_is_better=False, what="t") == (8.0, False)
    # one step only: 2x is within 0.1 of 4x but the rule never walks further down than the best's neighbour
    assert lr_grid.near_tie(grid, 0.1, higher_is_better=False, what="t") == (4.0, True)
    # sd 0 is the plain rule exactly; a diverged smaller neighbour is skipped; the best at the bottom stays
    assert lr_grid.near_tie(grid, 0.0, higher_is_better=False, what="t") == (lr_grid.choose(
        grid, higher_is_better=False, what="t"), False)
    assert lr_grid.near_tie({1.0: math.nan, 2.0: 3.0, 4.0: 2.99}, 0.05, higher_is_better=False,
                            what="t") == (2.0, True)
    assert lr_grid.near_tie({1.0: 3.0, 2.0: 3.5}, 1.0, higher_is_better=False, what="t") == (1.0, False)
    # higher is better (study A's direction)
    assert lr_grid.near_tie({1e-4: 0.40, 3e-4: 0.41}, 0.02, higher_is_better=True, what="t") == (1e-4, True)
    with pytest.raises(UserError, match="near-tie sd"):
        lr_grid.near_tie(grid, -1.0, higher_is_better=False, what="t")
    root = tmp_path / "runs"
    root.mkdir()
    paths = [_run(root, "adamw", m, v) for m, v in grid.items()]
    choice = select(paths, "smoke", [2, 4, 8, 16], near_tie_sd={"adamw": 0.065})["choices"][0]
    assert (choice["multiplier"], choice["best_multiplier"], choice["near_tie"], choice["near_tie_sd"]) == (
        4.0, 8.0, True, 0.065)
    plain = select(paths, "smoke", [2, 4, 8, 16])["choices"][0]
    assert (plain["multiplier"], plain["near_tie"]) == (8.0, False)
