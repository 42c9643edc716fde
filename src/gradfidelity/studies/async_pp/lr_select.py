"""The learning-rate selection rule of study B, fixed before any async run (issue 13, item 1; grown in issue 25).

Rule: per arm (plan.arm_keys: optimizer, momentum, schedule, depth; the schedules are sync, 2bw and the depth
sweep's PipeDream at each depth), train the arm's schedule at every multiplier m of config
`lr_selection.multipliers` times the optimizer's default LR (config.DEFAULTS), on the selection seed
`lr_selection.seed` (not an evaluation seed), for the grid budget `lr_selection.steps` (default: the main budget
`train.steps`). While the lowest final validation loss sits at an edge of the grid, add one point 2x past that edge
and train it (a round; at most `lr_selection.max_extensions` past one edge). Then choose the multiplier with the
lowest final loss (diverged runs excluded; an exact tie goes to the lower median of the tied points, of two the
smaller LR: lr_grid.choose), unless the next smaller point is within the optimizer's seed-to-seed sd
(`lr_selection.near_tie_sd`, fixed before the run from the previous round's seeds): then that smaller LR, recorded
as a near-tie (issue 37: on one selection seed AdamW-0.95's 8x beat 4x by 0.008 nats and Adan's 16x beat 8x by
0.01, and Adan's evaluation seeds were unstable at 16x). The sync arm's choice is
`lr~tuned` (every sync cell, and the async cells of the secondary column); an async arm's choice is `lr~own` (its
cells, and the mitigations on top of it).

Why grow the grid: in round 2 Adan, Lion and MARS won at the top of a fixed grid, and Adan at 8x was 0.04 nats
better than at 4x: its delay gap was measured under-tuned. Why per momentum: the best LR moves with the momentum,
and a sweep that holds the LR of 0.9 measures the mistuning at 0.98 as much as the momentum. Why per schedule
(issue 37): round 3 chose every LR on sync (4-16x the default), and f at that LR partly measured how far a
sync-tuned LR overshoots under delay (AdamW's 2bw at its sync LR reached at 512 steps what the default-LR pilot
reached at 320); the practitioner's question is what the delay costs when each schedule gets its best LR.

The rounds are a Snakemake checkpoint (rule async_pp_lr_round): each round's document lists the points the next
round trains (`extension_round`), and the selection reads every round's runs (`select`).
"""

from __future__ import annotations

import math

from gradfidelity import lr_grid
from gradfidelity.errors import UserError
from gradfidelity.harness.io import atomic_write_json
from gradfidelity.studies.async_pp.config import DEFAULTS, OPTIMIZERS, SCHEDULES
from gradfidelity.studies.async_pp.plan import OWN, TUNED, cell_from_run, lr_multiplier

RULE = ("per arm (optimizer, momentum, schedule, depth), the multiplier of the default LR with the lowest final "
        "validation loss of that schedule on the selection seed, the grid grown 2x past a winning edge until "
        "bracketed (diverged runs excluded, exact ties to their lower median, of two the smaller LR), then the next "
        "smaller point if it is within the optimizer's seed-to-seed sd (a near-tie); sync's choice = lr~tuned, an "
        "async arm's = lr~own")
FACTOR = 2.0  # an extension's step past the winning edge


def _width(width: int) -> dict:
    """The `width` field of a selection entry: only on the width ladder (an entry without one is the model's own
    width, as every document before issue 60)."""
    return {"width": int(width)} if width else {}


def choose(grid: dict[float, float]) -> float:
    """The selected multiplier from {multiplier: final sync val loss (nan = diverged)} (lr_grid.choose)."""
    return lr_grid.choose(grid, higher_is_better=False, what="async_pp")


def extension(grid: dict[float, float], factor: float = FACTOR) -> list[float]:
    """The multipliers to add so that the chosen one is bracketed (lr_grid.extension): none when the winner has a
    grid point on both sides (a diverged neighbour counts: it is worse), else one point `factor` past the winning
    edge (issue 25: Adan, Lion and MARS won at the top of round 2's grid, and Adan at 8x was 0.04 nats better than
    at 4x). Applied round after round (each round's runs, then this again) until it returns nothing."""
    return lr_grid.extension(grid, factor, higher_is_better=False, what="async_pp")


Key = tuple[str, float, str, int, int]  # an arm: optimizer, momentum, schedule, depth, width (0 = the model's)


def _read_grid(metrics_paths: list[str], scale: str) -> dict[Key, list[dict]]:
    """The grid runs' records, per arm, in multiplier order. Each run's cell is read from its records
    (harness.results.cell_of), not from its path."""
    from gradfidelity.harness.results import cell_of, load_run_records

    by_key: dict[tuple[str, float], list[dict]] = {}
    for rec in load_run_records(metrics_paths, scale=scale):
        c = cell_from_run(cell_of(rec))
        if c.lr in (TUNED, OWN) or c.mitigation != "none":
            raise UserError(f"{rec['path']}: not an LR-grid run (lr~x<m>, no mitigation)")
        ok = rec["status"] == "ok"
        m = lr_multiplier(c.lr)
        by_key.setdefault((c.optimizer, c.momentum, c.schedule, c.depth, c.width), []).append(
            {"multiplier": m, "lr": DEFAULTS[c.optimizer]["lr"] * m,
             "final_val_loss": float(rec["metrics"]["final_val_loss"]) if ok else math.nan,
             "status": rec["status"], "seed": c.seed, "steps": c.steps, "run_dir": rec["run_dir"]})
    return {k: sorted(v, key=lambda r: r["multiplier"])
            for k, v in sorted(by_key.items(), key=lambda kv: (kv[0][4], OPTIMIZERS.index(kv[0][0]), kv[0][1],
                                                                  SCHEDULES.index(kv[0][2]), kv[0][3]))}


def extension_round(metrics_paths: list[str], scale: str, base: list[float], max_extensions: int) -> dict:
    """One round's document: the grid so far and the points the next round trains (`extension`: one per key whose
    winner sits at an edge, unless that side already holds `max_extensions` added points)."""
    grid = _read_grid(metrics_paths, scale)
    ext = []
    for (opt, mom, sched, depth, width), rows in grid.items():
        losses = {r["multiplier"]: r["final_val_loss"] for r in rows}
        for m in lr_grid.next_points(losses, base, FACTOR, max_extensions, higher_is_better=False, what="async_pp"):
            ext.append({"optimizer": opt, "momentum": mom, "schedule": sched, "depth": depth, "multiplier": m,
                        **_width(width)})
    budgets = {str(w): sorted({r["steps"] for k, rows in grid.items() if k[4] == w for r in rows})
               for w in sorted({k[4] for k in grid})}
    return {"study": "async_pp", "scale": scale, "base_multipliers": list(base), "budgets": budgets,
            "grid": [{"optimizer": o, "momentum": mom, "schedule": sched, "depth": depth, **_width(width),
                      "losses": {f"{r['multiplier']:g}": r["final_val_loss"] for r in rows}}
                     for (o, mom, sched, depth, width), rows in grid.items()],
            "extension": ext}


def select(metrics_paths: list[str], scale: str, base: list[float] | None = None,
           near_tie_sd: dict[str, float] | None = None) -> dict:
    """Every grid run's metrics.json (all rounds: the rule's {input}) -> the selection document: per arm the grid,
    the best point, the choice (the best, or its smaller neighbour on a near-tie within `near_tie_sd[optimizer]`;
    an optimizer it does not name has sd 0: exact ties only), the points added past the configured grid, and
    whether the best is bracketed (a grid point on both sides of it)."""
    sds = near_tie_sd or {}
    choices = []
    for (opt, mom, sched, depth, width), rows in _read_grid(metrics_paths, scale).items():
        losses = {r["multiplier"]: r["final_val_loss"] for r in rows}
        best = choose(losses)
        sd = float(sds.get(opt, 0.0))
        mult, tie = lr_grid.near_tie(losses, sd, higher_is_better=False, what=f"async_pp {opt} {sched}")
        mults = [r["multiplier"] for r in rows]
        below, above = lr_grid.added(mults, base or mults)
        edge = best in (mults[0], mults[-1])
        choices.append({"optimizer": opt, "momentum": mom, "schedule": sched, "depth": depth, **_width(width),
                        "default_lr": DEFAULTS[opt]["lr"], "multiplier": mult, "lr": DEFAULTS[opt]["lr"] * mult,
                        "best_multiplier": best, "near_tie": tie, "near_tie_sd": sd, "extended": below + above,
                        "at_grid_edge": len(mults) > 1 and edge, "bracketed": len(mults) > 2 and not edge,
                        "grid": rows})
    return {"study": "async_pp", "scale": scale, "rule": RULE, "base_multipliers": list(base or []),
            "near_tie_sd": dict(sds), "choices": choices}


def check_round(doc: dict, path: str, budgets: dict[int, int]) -> None:
    """A round document stands only for a grid at the budgets this config trains it at ({width: steps}; the model's
    own width is 0): a committed one made at another budget (round 5's at 256 steps, when the grid moved to 512) or
    before documents named their budgets is refused, naming the file, instead of feeding its extension points to this
    grid."""
    want = {str(w): [int(n)] for w, n in sorted(budgets.items())}
    got = doc.get("budgets")
    if got != want:
        raise UserError(f"{path}: this LR round's document stands for a grid at {got or 'unnamed budgets'} "
                        f"({{width: steps}}), the config's grid is at {want}: move the old rounds aside (with the "
                        "selection they made) before the new grid runs, e.g. to results/<scale>/archive/")


def round_choices(doc: dict, near_tie_sd: dict[str, float] | None = None) -> dict[Key, float]:
    """{arm: chosen multiplier} from the last LR round's document (its grid holds every round's losses): the same
    rule as `select` (lr_grid.near_tie), so the workflow can plan the LR check (plan.check_cells) from the
    checkpoint before the selection file exists."""
    sds = near_tie_sd or {}
    out = {}
    for row in doc["grid"]:
        losses = {float(m): float(v) for m, v in row["losses"].items()}
        key = (row["optimizer"], float(row["momentum"]), row["schedule"], int(row["depth"]), int(row.get("width", 0)))
        out[key] = lr_grid.near_tie(losses, float(sds.get(row["optimizer"], 0.0)), higher_is_better=False,
                                    what=f"async_pp {key}")[0]
    return out


def check(selection: dict, check_paths: list[str], scale: str, steps: int,
          optimizers: list[str] | None = None) -> list[dict]:
    """The LR check (issue 60): per sync and 2bw arm of the selection, its chosen multiplier and the neighbours half
    and twice it, trained at `steps` (lr_selection.check_steps) on the selection seed, judged by the same rule
    (lr_grid.near_tie with the optimizer's sd). `holds`: the rule picks the same multiplier at `steps`; else the
    row says where it moves. An arm with a check run missing or diverged says so instead of a verdict. `optimizers`
    (lr_selection.check_optimizers): the arms read, None = all."""
    from gradfidelity.harness.results import cell_of, load_run_records

    runs: dict[Key, dict[float, float]] = {}
    for rec in load_run_records(check_paths, scale=scale):
        c = cell_from_run(cell_of(rec))
        if c.lr in (TUNED, OWN) or c.mitigation != "none" or c.steps != steps:
            raise UserError(f"{rec['path']}: not an LR-check run (lr~x<m>, no mitigation, {steps} steps)")
        ok = rec["status"] == "ok"
        runs.setdefault((c.optimizer, c.momentum, c.schedule, c.depth, c.width), {})[lr_multiplier(c.lr)] = \
            float(rec["metrics"]["final_val_loss"]) if ok else math.nan
    sds = selection.get("near_tie_sd") or {}
    rows = []
    for c in selection["choices"]:
        if c["schedule"] not in ("sync", "2bw") or c.get("width", 0) \
                or (optimizers is not None and c["optimizer"] not in optimizers):
            continue  # the model's own width, and lr_selection.check_optimizers: the arms the check reads
        key = (c["optimizer"], float(c["momentum"]), c["schedule"], int(c["depth"]), 0)
        m = float(c["multiplier"])
        got = runs.get(key, {})
        losses = {k: got.get(k, math.nan) for k in (m / 2, m, 2 * m)}
        row = {"optimizer": key[0], "momentum": key[1], "schedule": key[2], "check_steps": steps,
               "chosen_multiplier": m, **{f"check_{n}": losses[k] for n, k in zip(("half", "chosen", "twice"),
                                                                                 (m / 2, m, 2 * m), strict=True)}}
        missing = [k for k in losses if k not in got]
        if missing or not math.isfinite(losses[m]):
            why = f"x{', x'.join(f'{k:g}' for k in missing)} not trained" if missing else "the chosen LR diverged"
            rows.append({**row, "check_multiplier": math.nan, "check": f"not checked: {why}"})
            continue
        at_check, _ = lr_grid.near_tie(losses, float(sds.get(key[0], 0.0)), higher_is_better=False,
                                       what=f"async_pp check {key}")
        best = lr_grid.choose(losses, higher_is_better=False, what=f"async_pp check {key}")
        rows.append({**row, "check_best": best, "check_multiplier": at_check, "check": _check_label(m, at_check, best)})
    return rows


def _check_label(chosen: float, at_check: float, best: float) -> str:
    """'holds', or where the rule's choice moves; where only the near-tie step moves it (the chosen multiplier is
    still the lowest loss of the three, and its smaller neighbour within the sd), it says so: with the optimizer's sd
    as wide as Adan's, the step is taken whatever the budget, so it is no sign that the best LR moved."""
    if at_check == chosen:
        return "holds"
    if best == chosen:
        return f"moves to x{at_check:g} (a near-tie step: x{chosen:g}, the chosen, is still the best)"
    return f"moves to x{at_check:g}" + (f" (best x{best:g}, a near-tie step below it)" if best != at_check else "")


def write_selection(metrics_paths: list[str], scale: str, out_json: str, base: list[float] | None = None,
                    near_tie_sd: dict[str, float] | None = None) -> dict:
    """The selection document, written to `out_json` (what every lr~tuned and lr~own cell reads); its table:
    tables.py."""
    doc = select(metrics_paths, scale, base, near_tie_sd)
    atomic_write_json(out_json, doc)
    return doc


def tuned_lr(selection_path: str, optimizer: str, momentum: float, schedule: str = "sync", depth: int = 1,
             width: int = 0) -> float:
    """The chosen LR of an arm from the selection file: `optimizer` at `momentum` on `schedule` (sync: what a
    `lr~tuned` cell trains at; 2bw, or PipeDream at `depth`: what a `lr~own` cell trains at), at `width` (0: the
    model's own)."""
    depth = int(depth) if schedule.startswith("pipedream") else 1

    def match(c):  # a document without schedules (round 3) holds sync choices only
        return (c["optimizer"] == optimizer and float(c["momentum"]) == float(momentum)
                and c.get("schedule", "sync") == schedule and int(c.get("depth", 1)) == depth
                and int(c.get("width", 0)) == int(width))

    where = f" on {schedule}" + (f" at depth {depth}" if depth > 1 else "") + (f" at width {width}" if width else "")
    return lr_grid.chosen_lr(selection_path, "async_pp", match, f"{optimizer!r} at momentum {momentum:g}{where}")
