"""The RL-stage learning-rate selection rule of study A, fixed before any pilot (issue 24).

Rule: per model and RL-stage arm (plan.RL_STAGE: rl, sft_then_rl, luffy, srft, relift, hpt), train on the selection
seed `lr_selection.seed` (not an evaluation seed) at every absolute LR of `lr_selection.lrs`. The score is the
held-out validation accuracy `acc_val` (points; the `val` split, drawn like the id eval set and disjoint from train
and eval) in the run's metrics.json. While the best LR sits at an edge of the grid, add one point
`lr_selection.factor` past that edge and train it (a round; at most `lr_selection.max_extensions` past one edge).
Then choose the LR with the highest val accuracy (diverged runs excluded; a tie goes to the
lower median of the tied LRs, of two the smaller: gradfidelity.lr_grid.choose). Every
evaluation-seed run of that arm trains at that LR.

Why: the arms differ in how hard they push the policy (an SFT loss mixed in, off-policy demonstrations, a gate), so
one shared RL LR would measure each arm's LR sensitivity as much as the arm; a grid fitted on the evaluation seeds or
the eval sets would flatter the winner. The grid logic is study B's (gradfidelity.lr_grid); this module reads the
runs and writes the documents: each round's extension (`extension_round`) and the selection (`select`).
"""

from __future__ import annotations

import math

import pandas as pd

from gradfidelity import lr_grid
from gradfidelity.errors import UserError
from gradfidelity.harness.io import atomic_write_json
from gradfidelity.studies.sft_rl.plan import RL_STAGE

RULE = ("per model and RL-stage arm, the absolute LR with the highest held-out validation accuracy (acc_val) on the "
        "selection seed, the grid grown by lr_selection.factor past a winning edge until bracketed or "
        "lr_selection.max_extensions points past one edge (diverged runs excluded; ties to the lower median of the "
        "tied LRs, of two the smaller); used by every evaluation seed of that arm")
WHAT = "sft_rl"


def lr_name(lr: float) -> str:
    """An LR as it appears in a cell and a path ('0.0001', '1e-05'): one spelling everywhere."""
    return f"{lr:g}"


def _rounded(lr: float) -> float:
    """An extension point to 3 significant digits, so that 1e-4 * 3 is 0.0003 (not 0.00030000000000000003) and its
    name reads back as the same float."""
    return float(f"{lr:.3g}")


def _what(model: str, method: str) -> str:
    return f"{WHAT} {model}/{method}"


def _grid_lr(rec: dict, cell: dict) -> float:
    """The LR of a grid run, from its cell; an ok run must have trained at it (metrics["lr"])."""
    if "lr" not in cell:
        raise UserError(f"{rec['path']}: not an LR-grid run (its cell has no 'lr')")
    try:
        lr = float(cell["lr"])
    except (TypeError, ValueError):
        raise UserError(f"{rec['path']}: cell lr {cell['lr']!r} is not a number") from None
    if rec["status"] == "ok":
        trained = rec["metrics"].get("lr")
        # the cell's name carries 6 significant digits (lr_name): equal to that precision
        if not isinstance(trained, (int, float)) or not math.isclose(lr, float(trained), rel_tol=1e-6):
            raise UserError(f"{rec['path']}: trained at lr {trained!r}, but its cell says {cell['lr']!r}")
    return lr


def _read_grid(metrics_paths: list[str], scale: str) -> dict[tuple[str, str], list[dict]]:
    """The grid runs' records per (model, method), in LR order; keys by model, then plan.RL_STAGE. Each run's cell is
    read from its records (harness.results.cell_of), not from its path."""
    from gradfidelity.harness.results import cell_of, load_run_records

    by_key: dict[tuple[str, str], list[dict]] = {}
    for rec in load_run_records(metrics_paths, scale=scale):
        c = cell_of(rec)
        lr = _grid_lr(rec, c)
        if c.get("study") != WHAT or c.get("stage") != "rl" or c.get("method") not in RL_STAGE:
            raise UserError(f"{rec['path']}: not an RL-stage LR-grid run of sft_rl (method in {RL_STAGE})")
        ok = rec["status"] == "ok"
        if ok and not isinstance(rec["metrics"].get("acc_val"), (int, float)):
            raise UserError(f"{rec['path']}: no val accuracy (metrics.acc_val): set sft_rl.task.n_val and rerun it")
        rows = by_key.setdefault((c["model"], c["method"]), [])
        if any(r["lr"] == lr for r in rows):
            raise UserError(f"{rec['path']}: a second run of {c['model']}/{c['method']} at lr {lr_name(lr)}")
        rows.append({"lr": lr, "acc_val": float(rec["metrics"]["acc_val"]) if ok else math.nan,
                     "status": rec["status"], "seed": int(c.get("seed", rec.get("seed"))), "run_dir": rec["run_dir"]})
    return {k: sorted(v, key=lambda r: r["lr"])
            for k, v in sorted(by_key.items(), key=lambda kv: (kv[0][0], RL_STAGE.index(kv[0][1])))}


def _scores(rows: list[dict]) -> dict[float, float]:
    return {r["lr"]: r["acc_val"] for r in rows}


def extension_round(metrics_paths: list[str], scale: str, base_lrs: list[float], factor: float,
                    max_extensions: int) -> dict:
    """One round's document: the grid so far and the points the next round trains (`extension`: one per key whose
    winner sits at an edge, unless that side already holds `max_extensions` added points)."""
    grid = _read_grid(metrics_paths, scale)
    ext = [{"model": model, "method": method, "lr": _rounded(lr)}
           for (model, method), rows in grid.items()
           for lr in lr_grid.next_points(_scores(rows), list(base_lrs), factor, max_extensions,
                                         higher_is_better=True, what=_what(model, method))]
    return {"study": WHAT, "scale": scale, "base_lrs": list(base_lrs),
            "grid": [{"model": model, "method": method, "acc_val": {lr_name(r["lr"]): r["acc_val"] for r in rows}}
                     for (model, method), rows in grid.items()],
            "extension": ext}


def eval_noise(p_a: float, p_b: float, n: int) -> float:
    """The half-width (points) of a 95% normal interval of the difference of two accuracies (points) on n problems
    each, taken as independent binomials: evaluation noise alone, with no training noise in it (one run each). On the
    same val set the two are positively correlated, so the true noise is smaller: `within noise` is a generous
    reading, never a verdict."""
    a, b = p_a / 100, p_b / 100
    return 100 * 1.959964 * math.sqrt((a * (1 - a) + b * (1 - b)) / n)


def _starts(starts: dict[str, str] | None, scale: str) -> dict[str, float]:
    """Each arm's start run's val accuracy: {"<model>/<method>": acc_val} from the same keys -> its start's
    metrics.json. An SFT run that made an SFT-then-RL start (sft.start_every) is read at that start: the model the
    arm's grid trained from, not the SFT run's end."""
    from gradfidelity.harness.results import load_run_records

    out = {}
    for method, path in (starts or {}).items():
        (rec,) = load_run_records([path], scale=scale)
        m = rec["metrics"] if rec["status"] == "ok" else {}
        acc = (m.get("start") or m).get("acc_val")
        if not isinstance(acc, (int, float)):
            raise UserError(f"{path}: the start of {method} has no val accuracy (metrics.acc_val)")
        out[method] = float(acc)
    return out


def select(metrics_paths: list[str], scale: str, base_lrs: list[float] | None = None,
           starts: dict[str, str] | None = None, n_val: int | None = None) -> dict:
    """Every grid run's metrics.json (all rounds) -> the selection document: per (model, method) the grid, the
    choice and its val accuracy, the points added past the configured grid, and whether the choice is bracketed (a
    grid point on both sides of it). With `starts` ({"<model>/<method>": the metrics.json the arm starts from}) and
    `n_val`,
    each choice also carries its start's val accuracy and whether its gain over it is within evaluation noise."""
    start_acc = _starts(starts, scale)
    if start_acc and not n_val:
        raise UserError("sft_rl lr selection: the start comparison needs the val set's size (--n-val)")
    choices = []
    for (model, method), rows in _read_grid(metrics_paths, scale).items():
        scores = _scores(rows)
        lr = lr_grid.choose(scores, higher_is_better=True, what=_what(model, method))
        lrs = [r["lr"] for r in rows]
        below, above = lr_grid.added(lrs, list(base_lrs or lrs))
        edge = lr in (lrs[0], lrs[-1])
        choice = {"model": model, "method": method, "lr": lr, "acc_val": scores[lr], "extended": below + above,
                  "at_grid_edge": len(lrs) > 1 and edge, "bracketed": len(lrs) > 2 and not edge, "grid": rows}
        if f"{model}/{method}" in start_acc:
            p0 = start_acc[f"{model}/{method}"]
            noise = eval_noise(scores[lr], p0, n_val)
            choice.update(start_acc_val=p0, gain=scores[lr] - p0, noise=noise,
                          within_noise=abs(scores[lr] - p0) <= noise)
        choices.append(choice)
    return {"study": WHAT, "scale": scale, "rule": RULE, "base_lrs": list(base_lrs or []), "choices": choices}


def _point(row: dict) -> str:
    """A grid point as the table shows it: 'lr: val accuracy', or 'lr: diverged'."""
    return f"{lr_name(row['lr'])}: " + ("diverged" if row["status"] == "diverged" else f"{row['acc_val']:.1f}")


_START_NOTE = (
    "start_acc_val = the val accuracy of the model the arm starts from (the base model; SFT-then-RL: the fixed SFT run "
    "of the selection seed at its SFT-then-RL start, sft.start_every, else at its end); vs_start = chosen acc_val "
    "minus it, against the half-width of a 95% interval of a difference of two accuracies on the {n_val} val "
    "problems (binomial evaluation noise, one run each): 'within "
    "noise' = the arm's best LR does not score distinguishably above its own start on val")


def _vs_start(c: dict) -> str:
    if "gain" not in c:
        return "-"
    return f"{c['gain']:+.1f} (noise {c['noise']:.1f}: {'within noise' if c['within_noise'] else 'beyond noise'})"


def selection_table(doc: dict) -> pd.DataFrame:
    """One row per (model, method): the chosen LR and its val accuracy, every grid point, the added points, and
    (with starts) the gain over the arm's start, read against evaluation noise."""
    return pd.DataFrame([
        {"model": c["model"], "method": c["method"], "chosen_lr": lr_name(c["lr"]), "acc_val": c["acc_val"],
         "grid": ", ".join(_point(r) for r in c["grid"]),
         "extended": " ".join(lr_name(x) for x in c["extended"]) or "-",
         "bracketed": "yes" if c["bracketed"] else "no",
         **({"start_acc_val": c["start_acc_val"], "vs_start": _vs_start(c)} if "start_acc_val" in c else {})}
        for c in doc["choices"]])


def write_selection(metrics_paths: list[str], scale: str, out_json: str, base_lrs: list[float] | None = None,
                    table_csv: str | None = None, table_md: str | None = None, starts: dict[str, str] | None = None,
                    n_val: int | None = None) -> dict:
    """The selection document, written to `out_json` (what every evaluation-seed RL-stage run reads), and with
    `table_csv` its table."""
    from gradfidelity.tables import write_table

    doc = select(metrics_paths, scale, base_lrs, starts, n_val)
    atomic_write_json(out_json, doc)
    if table_csv:
        seeds = sorted({r["seed"] for c in doc["choices"] for r in c["grid"]})
        base = ", ".join(lr_name(x) for x in doc["base_lrs"])
        write_table(selection_table(doc), table_csv, table_md, title="Study A: RL-stage learning-rate selection",
                    notes=[f"scale {scale}; rule: {RULE}",
                           f"selection seed(s) {seeds} (not evaluation seeds); grid = 'lr: val accuracy (points)' of "
                           "each trained point, 'diverged' = the run diverged (excluded, counts as worse)",
                           f"configured grid {base or '-'}; extended = points added past a winning edge, round by "
                           "round; bracketed = the choice has a grid point on both sides (no: it is still at an edge "
                           "after lr_selection.max_extensions points)"]
                    + ([_START_NOTE.format(n_val=n_val)] if starts else []))
    return doc


def tuned_lr(selection_path: str, model: str, method: str) -> float:
    """The chosen RL-stage LR of `method` on `model` from the selection file (what its evaluation seeds train at)."""
    return lr_grid.chosen_lr(selection_path, WHAT, lambda c: c["model"] == model and c["method"] == method,
                             f"{method!r} on model {model!r}")
