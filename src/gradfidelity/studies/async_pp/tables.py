"""runs.csv / curves.csv / the LR selection -> the paper tables of study B (CSV + Markdown, gradfidelity.tables).

Every number of a row is over the row's paired seeds (pairing.py); the gap's interval is the one t interval of the
project (`stats.intervals.t_interval`) at the registry's level of the claim it feeds, so a table and its claim show
one interval for one number.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from gradfidelity.claims.evidence import level_for
from gradfidelity.stats.intervals import t_interval
from gradfidelity.studies.async_pp.lr_select import RULE
from gradfidelity.studies.async_pp.pairing import (
    Gaps,
    Paired,
    Spec,
    ef_recovery,
    extra_steps,
    plateau_gate,
    plateau_limit,
)
from gradfidelity.studies.async_pp.plan import TUNED, default_momentum
from gradfidelity.tables import write_table

# "(analysis.py)" names the module these tables came from before the split (now pairing.plateau_gate): the tables'
# text is kept byte for byte across the refactor; correct it with the next change that is allowed to move a table.
GATE_NOTE = ("sync_plateau_delta = sync val loss at 90% of the steps minus at the end; plateau_limit = max(|gap|, "
             "1% of the sync loss) / 4; plateau_gate = pass if |sync_plateau_delta| < plateau_limit, the gate of every "
             "claim on this optimizer at this budget (analysis.py)")


def _mean(x) -> float:
    x = np.asarray(x, dtype=float)
    return float(x.mean()) if len(x) and np.isfinite(x).all() else math.nan


def _diverged_cell(p: Paired) -> str:
    return "; ".join(f"seed {s}: {', '.join(why)}" for s, why in sorted(p.dropped.items())) or "none"


def _curve(curves: pd.DataFrame | None, g: Gaps, spec: Spec, seed: int):
    if curves is None or curves.empty:
        return [], []
    c = curves[(curves.optimizer == spec.optimizer) & (curves.schedule == spec.schedule)
               & (curves.mitigation == spec.mitigation) & (curves.depth == 1) & (curves.steps == g.steps)
               & (curves.seed == seed) & np.isclose(curves.momentum, default_momentum(spec.optimizer))]
    if "lr" in c.columns:
        c = c[c["lr"] == TUNED]
    if "head" in c.columns:
        c = c[c["head"] == g.head]  # not c.head: DataFrame.head is a method
    c = c.sort_values("step")
    return c.step.to_numpy(), c.val_loss.to_numpy()


def _gap_row(p: Paired, sync: str, asyn: str, level: float) -> dict:
    """sync, async, the gap with its t interval, and the sync plateau gate of one optimizer's paired cells."""
    gap = p[asyn] - p[sync]
    ci = t_interval(gap, level) if p.n else None
    gates = plateau_gate(p, [("", sync, gap)])
    return {"sync": _mean(p[sync]), "async_2bw": _mean(p[asyn]), "gap": _mean(gap),
            "gap_low": math.nan if ci is None or ci.low is None else ci.low,
            "gap_high": math.nan if ci is None or ci.high is None else ci.high,
            "gap_pct_of_sync": _mean(100 * gap / p[sync]), "sync_plateau_delta": _mean(p.plateau[sync]),
            "plateau_limit": plateau_limit(_mean(gap), _mean(p[sync])) if p.n else math.nan,
            "plateau_gate": ("pass" if gates[0]["passed"] else "FAIL") if gates else "n/a"}


def main_table(g: Gaps, curves: pd.DataFrame | None = None) -> pd.DataFrame:
    rows = []
    level = level_for("B1-abs")
    for opt in g.cfg.sweeps.main.optimizers:
        p = g.paired({"sync": Spec(opt), "2bw": Spec(opt, "2bw")})
        row = _gap_row(p, "sync", "2bw", level)
        extra = [extra_steps(*_curve(curves, g, Spec(opt), s), p["2bw"][i]) for i, s in enumerate(p.seeds)]
        gate_cols = {k: row.pop(k) for k in ("sync_plateau_delta", "plateau_limit", "plateau_gate")}
        rows.append({"optimizer": opt, **row, "extra_steps": _mean(extra),
                     "extra_steps_pct": _mean(100 * np.asarray(extra, dtype=float) / g.steps), **gate_cols,
                     "seeds": p.n, "diverged": _diverged_cell(p)})
    return pd.DataFrame(rows)


def length_table(g: Gaps) -> pd.DataFrame:
    """The length sweep: per optimizer and budget (separate runs, each with its full LR schedule), the gap and
    the sync plateau gate. It shows how the gap and the sync loss's end-of-run change scale with the budget."""
    rows = []
    sw = g.cfg.sweeps.length
    tok = g.cfg.train.tokens_per_step
    for opt in sw.optimizers:
        for steps in sorted(int(s) for s in sw.steps):
            p = g.paired({"sync": Spec(opt, steps=steps), "2bw": Spec(opt, "2bw", steps=steps)})
            rows.append({"optimizer": opt, "steps": steps, "tokens": steps * tok,
                         **_gap_row(p, "sync", "2bw", level_for("B7")), "seeds": p.n, "diverged": _diverged_cell(p)})
    return pd.DataFrame(rows)


def mitigations_table(g: Gaps) -> pd.DataFrame:
    rows = []
    sw = g.cfg.sweeps.mitigation
    for opt in sw.optimizers:
        specs = {"sync": Spec(opt), "2bw": Spec(opt, "2bw")} | {m: Spec(opt, "2bw", m) for m in sw.mitigations}
        p = g.paired(specs)
        base = p["2bw"] - p["sync"]
        row = {"optimizer": opt, "gap_2bw": _mean(base)}
        for mit in sw.mitigations:
            gm = p[mit] - p["sync"]
            row[f"gap_{mit}"] = _mean(gm)
            row[f"ratio_{mit}"] = _mean(gm / base) if p.n and (base > 0).all() else math.nan
        if "error_feedback" in sw.mitigations:
            row["ef_recovery_pct"] = _mean(ef_recovery(p["sync"], p["2bw"], p["error_feedback"]))
        rows.append({**row, "seeds": p.n, "diverged": _diverged_cell(p)})
    return pd.DataFrame(rows)


def write_tables(g: Gaps, main_csv: str, mitig_csv: str, scale: str, curves: pd.DataFrame | None = None,
                 length_csv: str | None = None) -> None:
    n = len(g.seeds)
    note = (f"scale {scale}, {n} seed(s) per cell, {g.steps} steps, embedded char corpus unless the config says "
            "fineweb_edu; losses in nats per token")
    paired = ("every number of a row is over the row's paired seeds (`seeds`): a seed on which one of the row's runs "
              "diverged or is missing is left out of the whole row and named in `diverged`; nan = no seed left")
    write_table(main_table(g, curves), main_csv,
                title="Study B: final validation loss, sync vs one-step delay (2bw), at the LR chosen on sync",
                notes=[note, paired, "gap = async - sync per seed, then the mean; gap_low/gap_high: its t interval "
                       "over the paired seeds (registry level); gap_pct_of_sync = 100 gap / sync",
                       "extra_steps = T - the step at which the sync run first reached the async run's final loss "
                       "(interpolated on the validation curve): the gap as steps of sync training; nan if async "
                       "ends below sync",
                       GATE_NOTE])
    write_table(mitigations_table(g), mitig_csv, title="Study B: mitigations of the one-step delay",
                notes=[note, paired, "ratio_<m> = mean over seeds of gap(2bw + m) / gap(2bw); < 1 means the "
                       "mitigation helps; nan if the 2bw gap is <= 0 on a seed; EF recovery % = 100 (async - "
                       "async_EF) / (async - sync) per seed, then the mean (nan if async <= sync on a seed)"])
    if length_csv:
        write_table(length_table(g), length_csv,
                    title="Study B: the one-step-delay gap and the sync plateau gate by training budget",
                    notes=[f"scale {scale}, {n} seed(s) per cell; each budget is a separate run with its own full "
                           "LR schedule (warmup, constant, linear decay over the last "
                           f"{g.cfg.train.decay_frac:.0%}), at the LR chosen on sync at {g.steps} steps",
                           paired, "gap = 2bw - sync per seed, then the mean, with its t interval (registry level "
                           "of B7); B7 compares Muon's gap at the longest and the shortest budget", GATE_NOTE])


def lr_selection_table(doc: dict) -> pd.DataFrame:
    """The selection document (lr_select.select): per optimizer the grid's final sync losses and the choice."""
    rows = []
    for opt, s in doc["optimizers"].items():
        row = {"optimizer": opt, "default_lr": s["default_lr"], "chosen_multiplier": s["multiplier"],
               "chosen_lr": s["lr"], "at_grid_edge": s["at_grid_edge"]}
        for r in s["grid"]:
            row[f"loss_x{r['multiplier']:g}"] = r["final_val_loss"]
        rows.append(row)
    return pd.DataFrame(rows)


def write_lr_selection(doc: dict, table_csv: str) -> None:
    seeds = sorted({r["seed"] for s in doc["optimizers"].values() for r in s["grid"]})
    write_table(lr_selection_table(doc), table_csv, title="Study B: learning-rate selection on the sync schedule",
                notes=[f"scale {doc['scale']}; rule: {RULE}", f"selection seed(s) {seeds} (not evaluation seeds); "
                       "loss_x<m> = final sync validation loss at m x the default LR, nan = diverged",
                       "at_grid_edge: the choice is the smallest or largest multiplier (the grid may not "
                       "bracket the optimum)"])
