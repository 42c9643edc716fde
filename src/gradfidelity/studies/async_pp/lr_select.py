"""The learning-rate selection rule of study B, fixed before any async run (issue 13, item 1).

Rule: per optimizer, train the `sync` schedule at every multiplier m of config `lr_selection.multipliers` times the
optimizer's default LR (config.DEFAULTS), on the selection seed `lr_selection.seed` (not an evaluation seed), for
the main budget `train.steps`; choose the multiplier with the lowest final sync validation loss (diverged runs
excluded; a tie goes to the smaller LR). Every other cell of the optimizer (every schedule, mitigation, momentum,
depth and length) then trains at that LR (`lr~tuned`). A choice at the edge of the grid is flagged in the table:
the grid may not bracket the optimum.
"""

from __future__ import annotations

import json
import math

from gradfidelity.errors import UserError
from gradfidelity.harness.io import atomic_write_json
from gradfidelity.studies.async_pp.config import DEFAULTS, OPTIMIZERS
from gradfidelity.studies.async_pp.plan import TUNED, cell_from_run, lr_multiplier

RULE = ("per optimizer, the multiplier of the default LR with the lowest final sync validation loss on the selection "
        "seed (diverged runs excluded, ties to the smaller LR); used by every schedule")


def choose(grid: dict[float, float]) -> float:
    """The selected multiplier from {multiplier: final sync val loss (nan = diverged)}."""
    finite = {m: v for m, v in grid.items() if math.isfinite(v)}
    if not finite:
        raise UserError(f"async_pp LR selection: every grid point diverged ({sorted(grid)}); widen the grid")
    best = min(finite.values())
    return min(m for m, v in finite.items() if v == best)


def extension(grid: dict[float, float], factor: float = 2.0) -> list[float]:
    """The multipliers to add so that the chosen one is bracketed: none when the winner has a grid point on both
    sides (a diverged neighbour counts: it is worse), else one point `factor` past the winning edge (issue 25: Adan,
    Lion and MARS won at the top of round 2's grid, and Adan at 8x was 0.04 nats better than at 4x). Applied round
    after round (each round's runs, then this again) until it returns nothing."""
    best = choose(grid)
    ms = sorted(grid)
    if best == ms[-1]:
        return [best * factor]
    if best == ms[0]:
        return [best / factor]
    return []


def select(metrics_paths: list[str], scale: str) -> dict:
    """The grid runs' metrics.json (the rule's {input}) -> the selection document. Each run's cell is read from its
    records (harness.results.cell_of), not from its path."""
    from gradfidelity.harness.results import cell_of, load_run_records

    by_opt: dict[str, list[dict]] = {}
    for rec in load_run_records(metrics_paths, scale=scale):
        c = cell_from_run(cell_of(rec))
        if c.lr == TUNED or c.schedule != "sync":
            raise UserError(f"{rec['path']}: not an LR-grid run (sync, lr~x<m>)")
        ok = rec["status"] == "ok"
        loss = float(rec["metrics"]["final_val_loss"]) if ok else math.nan
        m = lr_multiplier(c.lr)
        by_opt.setdefault(c.optimizer, []).append(
            {"multiplier": m, "lr": DEFAULTS[c.optimizer]["lr"] * m, "final_val_loss": loss,
             "status": rec["status"], "seed": c.seed, "steps": c.steps, "run_dir": rec["run_dir"]})
    out = {}
    for opt in sorted(by_opt, key=OPTIMIZERS.index):
        grid = sorted(by_opt[opt], key=lambda r: r["multiplier"])
        mult = choose({r["multiplier"]: r["final_val_loss"] for r in grid})
        mults = [r["multiplier"] for r in grid]
        out[opt] = {"default_lr": DEFAULTS[opt]["lr"], "multiplier": mult, "lr": DEFAULTS[opt]["lr"] * mult,
                    "at_grid_edge": len(mults) > 1 and mult in (mults[0], mults[-1]), "grid": grid}
    return {"study": "async_pp", "scale": scale, "rule": RULE, "optimizers": out}


def write_selection(metrics_paths: list[str], scale: str, out_json: str) -> dict:
    """The selection document, written to `out_json` (what every lr~tuned cell reads); its table: tables.py."""
    doc = select(metrics_paths, scale)
    atomic_write_json(out_json, doc)
    return doc


def tuned_lr(selection_path: str, optimizer: str) -> float:
    """The chosen LR of `optimizer` from the selection file (what a `lr~tuned` cell trains at)."""
    try:
        doc = json.loads(open(selection_path).read())
        return float(doc["optimizers"][optimizer]["lr"])
    except FileNotFoundError:
        raise UserError(f"async_pp: LR selection file {selection_path} is missing (run the LR grid first)") from None
    except (KeyError, TypeError, ValueError, json.JSONDecodeError):
        raise UserError(f"async_pp: {selection_path} has no chosen LR for {optimizer!r}") from None
