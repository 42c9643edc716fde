"""runs.csv / curves.csv / the LR selection -> the paper tables of study B (CSV + Markdown, gradfidelity.tables).

The primary number is the effective compute fraction f = S*/T (compute_fraction.py): the share of its budget that
the async run got out of it, read off the sync ladder of its own optimizer, momentum and head on the same seed.
`lost_pct` = 100 (1 - f). The nats gap (async - sync at the same budget) stays beside it as a secondary column. Every
number of a row is over the row's paired seeds (pairing.py); an interval is the project's one t interval
(`stats.intervals.t_interval`) at the registry's level of the claim it feeds, so a table and its claim show one
interval for one number. `gate` is the transient gate of the row's key at its budget (pairing.transient).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from gradfidelity.claims.evidence import level_for
from gradfidelity.errors import UserError
from gradfidelity.stats.intervals import t_interval
from gradfidelity.studies.async_pp.lr_select import RULE
from gradfidelity.studies.async_pp.pairing import Fractions, Gaps, Paired, Spec, ef_recovery, fractions, transient
from gradfidelity.studies.async_pp.plan import OWN, TUNED, default_momentum, f_keys, grid_budget, secondary_optimizers
from gradfidelity.tables import write_table

GATE_NOTE = ("gate = the transient gate of the row's optimizer at the row's budget T (pairing.transient): pass when "
             "a paired TOST shows f(2T) - f(T) within +-0.05 (its 90% t interval inside the margin: the delay's "
             "cost has stopped changing with the budget) and the sync loss falls from T to 2T (its 95% interval "
             "above 0); else 'rises with the budget' / 'falls with the budget' (the interval excludes 0), 'too few "
             "seeds' (it includes 0 and its half-width exceeds the margin), 'no clear change' (it includes 0 and is "
             "narrower), and/or 'saturated' (the sync loss does not fall). A reading, not the claims' rule: since "
             "round 5 a claim is decided at T when its own verdict is the same at T and 2T (claims.py)")
F_NOTE = ("f = S*/T: S* = the sync budget whose final loss equals the async run's, interpolated linearly in "
          "log(steps) between the ladder's budgets (each a full run with its own LR schedule) of the same optimizer, "
          "momentum, head and seed; lost_pct = 100 (1 - f), the compute the delay costs; f_low/f_high: the t "
          "interval over the paired seeds; nan when f lies outside the ladder on a seed (never extrapolated)")


def _mean(x) -> float:
    x = np.asarray(x, dtype=float)
    return float(x.mean()) if len(x) and np.isfinite(x).all() else math.nan


def _ci(values, level: float) -> tuple[float, float]:
    x = np.asarray(values, dtype=float)
    if len(x) < 2 or not np.isfinite(x).all():
        return math.nan, math.nan
    iv = t_interval(x, level)
    return (math.nan if iv.low is None else iv.low), (math.nan if iv.high is None else iv.high)


def _diverged_cell(p: Paired, fr: Fractions | None = None) -> str:
    parts = [f"seed {s}: {', '.join(why)}" for s, why in sorted(p.dropped.items())]
    parts += [o.split(": ", 1)[1] for o in (fr.outside if fr else [])]
    return "; ".join(parts) or "none"


def _f_cols(fr: Fractions, name: str, level: float) -> dict:
    f = fr.f[name]
    low, high = _ci(f, level)
    return {"f": _mean(f), "f_low": low, "f_high": high, "lost_pct": _mean(100 * (1 - f))}


def _gate_cell(g: Gaps, opt: str, steps: int | None = None, momentum=None, lr: str = OWN) -> str:
    rec, info = transient(g, opt, momentum=momentum, steps=steps, level=level_for("B1"), lr=lr)
    if rec["passed"]:
        return "pass"
    return info.get("reason") or rec["reason"].split(": ", 1)[-1]


def main_table(g: Gaps) -> pd.DataFrame:
    """Per optimizer of the main sweep at the main budget T: sync and async losses, the nats gap, f and the gate."""
    rows, level = [], level_for("B1")
    for opt in g.cfg.sweeps.main.optimizers:
        fr = fractions(g, {"2bw": Spec(opt, "2bw")}, extra={"sync": Spec(opt)})
        p = fr.p
        gap = p["2bw"] - p["sync"]
        gap_low, gap_high = _ci(gap, level)
        f_sync_lr = math.nan
        if opt in secondary_optimizers(g.cfg):
            f_sync_lr = _mean(fractions(g, {"a": Spec(opt, "2bw", lr=TUNED)}).f["a"])
        rows.append({"optimizer": opt, "sync": _mean(p["sync"]), "async_2bw": _mean(p["2bw"]),
                     **_f_cols(fr, "2bw", level), "f_sync_lr": f_sync_lr, "gate": _gate_cell(g, opt),
                     "gap": _mean(gap),
                     "gap_low": gap_low, "gap_high": gap_high, "seeds": p.n, "diverged": _diverged_cell(p, fr)})
    return pd.DataFrame(rows)


def width_table(g: Gaps) -> pd.DataFrame:
    """The width ladder (issue 60): per width (the model's own first) and optimizer, the model's size, its budget
    and tokens per parameter, the share of the embedding and head in its parameters, and f at T and 2T with their
    intervals (each width's f off its own sync ladder, at its own LRs)."""
    from gradfidelity.studies.async_pp.plan import width_steps

    level, rows = level_for("B2"), []
    widths = [(0, [o for o in dict.fromkeys(o for o, _m, _h in f_keys(g.cfg)) if o in _width_optimizers(g)])]
    widths += [(w.d_model, list(w.optimizers)) for w in g.cfg.sweeps.width.widths]
    for width, optimizers in widths:
        model = g.cfg.model.at_width(width) if width else g.cfg.model
        T = width_steps(g.cfg, width)
        for opt in optimizers:
            fr = fractions(g, {"T": Spec(opt, "2bw", width=width, steps=T),
                               "2T": Spec(opt, "2bw", width=width, steps=2 * T)})
            n_params = _n_params(g, opt, width)
            body = n_params - model.n_params(0, g.head == "tied") if math.isfinite(n_params) else math.nan
            row = {"d_model": model.d_model, "optimizer": opt, "params": n_params, "T": T,
                   "tokens_per_param": T * g.cfg.train.tokens_per_step / n_params if n_params else math.nan,
                   "epochs_2T": _epochs(g, opt, width, 2 * T),
                   "embed_head_share": body / n_params if n_params else math.nan}
            for b in ("T", "2T"):
                low, high = _ci(fr.f[b], level)
                row |= {f"f_{b}": _mean(fr.f[b]), f"f_{b}_low": low, f"f_{b}_high": high}
            rows.append({**row, "seeds": fr.n, "diverged": _diverged_cell(fr.p, fr)})
    return pd.DataFrame(rows)


def _width_optimizers(g: Gaps) -> set[str]:
    """The optimizers the width table shows at the model's own width: those the width ladder trains, or B1-B2's."""
    return {o for w in g.cfg.sweeps.width.widths for o in w.optimizers} or {"adamw", "muon"}


def _epochs(g: Gaps, opt: str, width: int, steps: int) -> float:
    """The share of the training split the width's runs at `steps` draw (runs.csv epochs; > 1 repeats text)."""
    runs = g.runs
    if "epochs" not in runs.columns:
        return math.nan
    w = runs["width"].fillna(0) if "width" in runs.columns else pd.Series(0, index=runs.index)
    got = pd.to_numeric(runs.loc[(runs["optimizer"] == opt) & (w == width) & (runs["steps"] == steps), "epochs"],
                        errors="coerce").dropna()
    return float(got.median()) if len(got) else math.nan


def _n_params(g: Gaps, opt: str, width: int) -> float:
    """The parameters of the model an optimizer's sync runs at `width` trained (runs.csv n_params)."""
    runs = g.runs
    if "n_params" not in runs.columns:
        return math.nan
    w = runs["width"].fillna(0) if "width" in runs.columns else pd.Series(0, index=runs.index)
    got = pd.to_numeric(runs.loc[(runs["optimizer"] == opt) & (w == width) & (runs["schedule"] == "sync"),
                                 "n_params"], errors="coerce").dropna()
    return float(got.iloc[0]) if len(got) else math.nan


def _ladder_key_rows(g: Gaps, opt: str, momentum=None, label: str = "") -> list[dict]:
    """One optimizer's ladder: per budget the sync loss and its fall per doubling from the budget below; where a 2bw
    run exists at the budget, its f and the transient gate."""
    ladder = g.cfg.sweeps.ladder.of(opt)
    tok = g.cfg.train.tokens_per_step
    lad = g.paired({n: Spec(opt, momentum=momentum, steps=n) for n in ladder})
    async_at = {g.steps, 2 * g.steps} | ({int(n) for n in g.cfg.sweeps.length.steps}
                                         if opt in g.cfg.sweeps.length.optimizers and momentum is None else set())
    secondary = momentum is None and opt in secondary_optimizers(g.cfg)
    rows = []
    for i, n in enumerate(ladder):
        row = {"optimizer": label or opt, "steps": n, "tokens": n * tok, **_budget_scale(g, opt, momentum, n),
               "sync": _mean(lad[n])}
        if i:
            fall = (lad[ladder[i - 1]] - lad[n]) / math.log2(n / ladder[i - 1])
            row["fall_per_doubling"] = _mean(fall)
            row["fall_se"] = float(np.std(fall, ddof=1) / math.sqrt(len(fall))) if len(fall) > 1 else math.nan
        if n in async_at:
            fr = fractions(g, {"a": Spec(opt, "2bw", momentum=momentum, steps=n)},
                           extra={"s": Spec(opt, momentum=momentum, steps=n)})
            row.update({"async_2bw": _mean(fr.p["a"]), **_f_cols(fr, "a", level_for("B7")),
                        "gap": _mean(fr.p["a"] - fr.p["s"])})
            row["gate"] = (_gate_cell(g, opt, n, momentum) if 2 * n in async_at
                           else f"n/a (no 2bw run at {2 * n} steps)")
            row["seeds"], row["diverged"] = fr.n, _diverged_cell(fr.p, fr)
            if secondary:  # the same budget at the LR chosen on sync (issue 37's secondary reading)
                fr2 = fractions(g, {"a": Spec(opt, "2bw", momentum=momentum, steps=n, lr=TUNED)})
                cols = _f_cols(fr2, "a", level_for("B7"))
                row.update({"async_2bw_sync_lr": _mean(fr2.p["a"]), "f_sync_lr": cols["f"],
                            "f_sync_lr_low": cols["f_low"], "f_sync_lr_high": cols["f_high"],
                            "gate_sync_lr": (_gate_cell(g, opt, n, momentum, lr=TUNED) if 2 * n in async_at
                                             else "n/a"),
                            "seeds_sync_lr": fr2.n})
        else:
            row["gate"], row["seeds"], row["diverged"] = "-", lad.n, _diverged_cell(lad)
        rows.append(row)
    return rows


def _grid_steps(g: Gaps) -> int | str:
    """The budget the LRs were chosen at (plan.grid_budget), or T where the job was not given lr_selection."""
    return grid_budget(g.cfg) if g.cfg.lr_selection is not None else g.steps


def _budget_scale(g: Gaps, opt: str, momentum, n: int) -> dict:
    """Tokens per parameter and epochs of the sync runs at budget n (issue 47: how far the ladder's top is from the
    paper's ~20 tokens a parameter), from runs.csv's `n_params` and `epochs` (nan where a runs table predates them)."""
    runs = g.runs
    mom = default_momentum(opt) if momentum is None else float(momentum)
    sel = runs[(runs["optimizer"] == opt) & (runs["schedule"] == "sync") & (runs["steps"] == n)
               & ((runs["momentum"] - mom).abs() < 1e-9) & (runs["status"] == "ok")]
    params = sel["n_params"].dropna() if "n_params" in sel else pd.Series(dtype=float)
    epochs = sel["epochs"].dropna() if "epochs" in sel else pd.Series(dtype=float)
    tok = n * g.cfg.train.tokens_per_step
    return {"tokens_per_param": tok / float(params.median()) if len(params) else math.nan,
            "epochs": float(epochs.median()) if len(epochs) else math.nan}


def length_table(g: Gaps) -> pd.DataFrame:
    """Every optimizer's sync ladder (main and length sweeps, default momentum): does the sync loss still fall by a
    clear margin per doubling, and what is f at each budget that has an async run."""
    sw = g.cfg.sweeps
    opts = list(dict.fromkeys([*sw.main.optimizers, *sw.length.optimizers]))
    cols = ["optimizer", "steps", "tokens", "tokens_per_param", "epochs", "sync", "fall_per_doubling", "fall_se",
            "async_2bw", "f", "f_low", "f_high", "lost_pct", "gap", "gate", "async_2bw_sync_lr", "f_sync_lr",
            "f_sync_lr_low", "f_sync_lr_high", "gate_sync_lr", "seeds", "seeds_sync_lr", "diverged"]
    return pd.DataFrame([r for o in opts for r in _ladder_key_rows(g, o)], columns=cols)


def momentum_table(g: Gaps) -> pd.DataFrame:
    """Per optimizer and momentum of the momentum sweep at T: f, the gate, the nats gap."""
    rows, level = [], level_for("B4")
    sw = g.cfg.sweeps.momentum
    for opt in sw.optimizers:
        for m in sw.momenta:
            fr = fractions(g, {"2bw": Spec(opt, "2bw", momentum=m)}, extra={"sync": Spec(opt, momentum=m)})
            rows.append({"optimizer": opt, "momentum": m, "sync": _mean(fr.p["sync"]), "async_2bw": _mean(fr.p["2bw"]),
                         **_f_cols(fr, "2bw", level), "gate": _gate_cell(g, opt, momentum=m),
                         "gap": _mean(fr.p["2bw"] - fr.p["sync"]), "seeds": fr.n,
                         "diverged": _diverged_cell(fr.p, fr)})
    return pd.DataFrame(rows)


def mitigations_table(g: Gaps) -> pd.DataFrame:
    """Per optimizer: f of 2bw and of 2bw + each mitigation, the share of the lost compute each recovers, and the
    nats gaps (secondary)."""
    rows = []
    sw = g.cfg.sweeps.mitigation
    for opt in sw.optimizers:
        asyncs = {"2bw": Spec(opt, "2bw")} | {m: Spec(opt, "2bw", m) for m in sw.mitigations}
        fr = fractions(g, asyncs, extra={"sync": Spec(opt)})
        p, lost = fr.p, fr.lost("2bw")
        row = {"optimizer": opt, "f_2bw": _mean(fr.f["2bw"]), "lost_pct_2bw": _mean(100 * lost)}
        for mit in sw.mitigations:
            row[f"f_{mit}"] = _mean(fr.f[mit])
            row[f"recovered_pct_{mit}"] = (_mean(100 * (fr.f[mit] - fr.f["2bw"]) / lost)
                                           if p.n and (lost > 0).all() else math.nan)
        row["gap_2bw"] = _mean(p["2bw"] - p["sync"])
        for mit in sw.mitigations:
            row[f"gap_{mit}"] = _mean(p[mit] - p["sync"])
        if "error_feedback" in sw.mitigations:
            row["ef_recovery_pct_nats"] = _mean(ef_recovery(p["sync"], p["2bw"], p["error_feedback"]))
        rows.append({**row, "gate": _gate_cell(g, opt), "seeds": p.n, "diverged": _diverged_cell(p, fr)})
    return pd.DataFrame(rows)


def write_tables(g: Gaps, main_csv: str, mitig_csv: str, scale: str, length_csv: str | None = None,
                 momentum_csv: str | None = None, width_csv: str | None = None) -> None:
    extra = g.cfg.claim_seeds or {}
    n = f"{g.base_seeds} seed(s) per cell" + (
        " (" + ", ".join(f"{k}'s cells {v}" for k, v in sorted(extra.items())) + ": config claim_seeds)"
        if extra else "")
    note = (f"scale {scale}, {n}, main budget T = {g.steps} steps of "
            f"{g.cfg.train.tokens_per_step} tokens (corpus: config/{scale}/async_pp.yaml, `data`); losses in nats "
            "per token")
    paired = ("every number of a row is over the row's paired seeds (`seeds`): a seed on which one of the row's runs "
              "(its ladder included) diverged or is missing is left out of the whole row and named in `diverged`, "
              "as is a seed whose f lies outside the ladder; nan = no seed left")
    gap = ("gap = async - sync at the same budget per seed, then the mean (nats, secondary); gap_low/gap_high: its t "
           "interval")
    write_table(main_table(g), main_csv,
                title="Study B: the one-step delay as lost compute, each arm at its own LR",
                notes=[note, paired, F_NOTE, "f: 2bw at its own LR (lr~own, the primary); f_sync_lr: 2bw at the LR "
                       "chosen on sync (lr~tuned, secondary; its own paired seeds, no interval here: "
                       "async_pp_length)", gap, GATE_NOTE])
    write_table(mitigations_table(g), mitig_csv, title="Study B: mitigations of the one-step delay",
                notes=[note, paired, F_NOTE, "recovered_pct_<m> = 100 (f(2bw + m) - f(2bw)) / (1 - f(2bw)) per seed, "
                       "then the mean: the share of the lost compute the mitigation wins back (nan if 2bw loses no "
                       "compute on a seed); ef_recovery_pct_nats = 100 (async - async_EF) / (async - sync) in nats "
                       "(secondary)", "gate: the transient gate of the optimizer's plain 2bw at T (the table reads "
                       "the mitigations at T; the claims' budget rule reads them at 2T too)", GATE_NOTE])
    if length_csv:
        write_table(length_table(g), length_csv,
                    title="Study B: the sync ladder (does the loss still fall?) and f by training budget",
                    notes=[note, paired, "each budget is a separate run with its own full LR schedule (warmup, "
                           f"constant, linear decay over the last {g.cfg.train.decay_frac:.0%}); the sync ladder at "
                           f"the LR chosen on sync at {_grid_steps(g)} steps, the 2bw runs of the f columns at their "
                           "own LR (below); tokens = steps x tokens per step; tokens_per_param = tokens / the "
                           "model's parameters (runs.csv n_params; the paper trains about 20); epochs = the sync "
                           "runs' median share of an epoch of the training split",
                           "fall_per_doubling = (sync at the budget below - sync here) / log2(ratio of the budgets) "
                           "per seed, then the mean; fall_se its standard error: a corpus in the paper's regime keeps "
                           "this clearly above 0 at every budget (the embedded corpus of round 2 did not)",
                           F_NOTE, GATE_NOTE + "; n/a where the ladder has no 2bw run at twice the budget",
                           "f, gate: the 2bw arm at its own LR (lr~own, chosen on 2bw: every claim's primary); "
                           "*_sync_lr: the same budget at the LR chosen on sync (lr~tuned, the secondary reading: the "
                           "delay's cost at an LR the async arm did not choose), over its own paired seeds "
                           "(seeds_sync_lr)",
                           "B7 reads f at the longest length against f at the smallest length whose gate passes"])
    if width_csv:
        tpp = g.cfg.sweeps.width.tokens_per_parameter
        write_table(width_table(g), width_csv,
                    title="Study B: the delay's cost by width (the width ladder, B1 and B2's scale argument)",
                    notes=[note, paired, F_NOTE,
                           "d_model: the model's own width first, then sweeps.width.widths (d_ff in proportion; depth, "
                           "heads and vocabulary fixed); T = each width's budget"
                           + (f", held at {tpp:g} tokens a parameter" if tpp else "")
                           + "; params from runs.csv n_params; epochs_2T = the share of the training split a run "
                           "at 2T draws (runs.csv epochs; above 1 the width's runs, sync and async alike, repeat the "
                           "text); embed_head_share = the embedding and untied head's "
                           "share of the parameters (in the muon arm they train with AdamW; muon_all trains them "
                           "with Muon)",
                           "f_T, f_2T: 2bw at its own LR at T and 2T, read off that width's own sync ladder (its "
                           "budgets the same multiples of T), each width with its own LR grid at its T; intervals: "
                           "two-sided t at B2's level",
                           "B1, B1-abs and B2 read the widest width whose f has the claims' min_n paired seeds; the "
                           "narrower widths "
                           "are readings beside it (each claim's detail)"])
    if momentum_csv:
        write_table(momentum_table(g), momentum_csv, title="Study B: lost compute by momentum (B4)",
                    notes=[note, paired, "each momentum trains at its own LR (chosen on sync at that momentum) and "
                           "AdamW's beta2 = (1 + beta1) / 2, so beta1 < sqrt(beta2) at every point", F_NOTE,
                           GATE_NOTE])


def lr_selection_table(doc: dict) -> pd.DataFrame:
    """The selection document (lr_select.select): per arm (optimizer, momentum, schedule, depth) the grid's final
    validation losses, the points added past the configured grid, the best point and the choice (a near-tie moves
    it one step down)."""
    rows = []
    for c in doc["choices"]:
        row = {"optimizer": c["optimizer"], "momentum": c["momentum"], "schedule": c.get("schedule", "sync"),
               "depth": c.get("depth", 1), "width": c.get("width", 0),
               "lr_label": "tuned" if c.get("schedule", "sync") == "sync" else "own",
               "default_lr": c["default_lr"], "chosen_multiplier": c["multiplier"], "chosen_lr": c["lr"],
               "best_multiplier": c.get("best_multiplier", c["multiplier"]), "near_tie": c.get("near_tie", False),
               "extended": " ".join(f"x{m:g}" for m in c["extended"]) or "-", "bracketed": c["bracketed"]}
        for r in c["grid"]:
            row[f"loss_x{r['multiplier']:g}"] = r["final_val_loss"]
        rows.append(row)
    df = pd.DataFrame(rows)
    losses = sorted((k for k in df.columns if k.startswith("loss_x")), key=lambda k: float(k[len("loss_x"):]))
    return df[[k for k in df.columns if not k.startswith("loss_x")] + losses]


CHECK_COLS = ("check_steps", "check_half", "check_chosen", "check_twice", "check_best", "check_multiplier", "check")


def write_lr_selection(doc: dict, table_csv: str, check_rows: list[dict] | None = None) -> None:
    """The selection table; with `check_rows` (lr_select.check) each sync and 2bw row also gets its check at the
    longer budget: the final losses at half, at and twice the chosen multiplier, what the rule picks there, and
    whether that holds."""
    seeds = sorted({r["seed"] for c in doc["choices"] for r in c["grid"]})
    base = ", ".join(f"x{m:g}" for m in doc["base_multipliers"])
    sds = ", ".join(f"{o} {v:g}" for o, v in (doc.get("near_tie_sd") or {}).items()) or "none (exact ties only)"
    df = lr_selection_table(doc)
    notes = []
    if check_rows:
        # the check reads the sync and 2bw arms (depth 1) at the model's own width
        check = pd.DataFrame(check_rows)[["optimizer", "momentum", "schedule", *CHECK_COLS]].assign(depth=1, width=0)
        df = df.merge(check, on=["optimizer", "momentum", "schedule", "depth", "width"], how="left",
                      validate="one_to_one")
        steps = ", ".join(str(n) for n in sorted({int(r["check_steps"]) for r in check_rows}))
        moved = [f"{r['optimizer']} {r['momentum']:g} {r['schedule']} ({r['check']})" for r in check_rows
                 if r["check"] != "holds"]
        notes.append(f"the check (lr_selection.check_steps = {steps}): each sync and 2bw arm at half, at and twice "
                     "its chosen multiplier (check_half, check_chosen, check_twice: final validation loss), on the "
                     "selection seed, judged by the same rule (near-tie sd included); check_best = the lowest loss "
                     "of the three, check_multiplier = what the rule picks there (a near-tie steps one below the "
                     "best), check = holds or where the choice moves. Not holding: "
                     + ("; ".join(moved) if moved else "none"))
    write_table(df, table_csv,
                title="Study B: learning-rate selection, each arm (sync, 2bw, PipeDream per depth) on its own grid",
                notes=[f"scale {doc['scale']}; rule: {RULE}", f"selection seed(s) {seeds} (not evaluation seeds); "
                       "loss_x<m> = final validation loss of the row's schedule at m x the default LR, nan = "
                       "diverged, blank = not trained for this row",
                       "width = the width ladder's d_model (0: the model's own; each width's grid runs at its T)",
                       "lr_label = the cells that train at the row's choice: tuned (sync's choice: every sync cell "
                       "and the secondary async column) or own (the async arm's choice: every claim's primary, and "
                       "the mitigations on top of it)",
                       f"configured grid {base}; extended = points added 2x past a winning edge, round by round "
                       "(Snakemake checkpoint async_pp_lr_round); bracketed = the best point has a grid point on both "
                       "sides (False: it is still at an edge after lr_selection.max_extensions points)",
                       f"near_tie = the next smaller point was within the optimizer's seed-to-seed sd of the best "
                       f"(best_multiplier) and was chosen instead (one step; sd per optimizer: {sds})", *notes])


# --------------------------------------------------------------- the drift between host types, per arm (issue 60)
# A round-6 run and an archived run (rounds 4-5) of the same cell, seed and LR value are the same training twice:
# on one host type they must agree bit for bit (a record stands for the config that made it), and across two host
# types their difference is the drift between those hosts, measured per arm on every pair there is.
DRIFT_KEYS = ["optimizer", "schedule", "mitigation", "depth", "momentum", "head", "steps", "seed", "width"]


def _host_type(runs: pd.DataFrame) -> pd.Series:
    return (runs["cpu_vendor"].astype(str) + " " + runs["cpu_family"].astype(str) + "/"
            + runs["cpu_model_number"].astype(str))


def _paired_runs(current: pd.DataFrame, archive: pd.DataFrame) -> pd.DataFrame:
    def prepared(runs: pd.DataFrame) -> pd.DataFrame:
        runs = runs[runs["status"] == "ok"].copy()
        runs["width"] = runs["width"].fillna(0).astype(int) if "width" in runs else 0
        runs["lr_key"] = runs["lr_value"].map(lambda v: float(f"{float(v):.12g}"))  # the LR value, not its label
        runs["host"] = _host_type(runs)
        # an arm whose own LR is its sync-tuned one trains the same cell twice (lr~own, lr~tuned): on one host type
        # the two must agree bit for bit before one of them may stand for both
        twice = runs.groupby([*DRIFT_KEYS, "lr_key", "host"])["final_val_loss"].nunique()
        if (twice > 1).any():
            raise UserError(f"{int((twice > 1).sum())} cell(s) trained twice in one round on one host type at one LR "
                            f"value end at different losses (first: {twice[twice > 1].index[0]}): a record does not "
                            "stand for the config that made it")
        return runs[[*DRIFT_KEYS, "lr_key", "final_val_loss", "host"]]

    # one pair per cell, seed, LR value and pair of host types
    pairs = prepared(current).merge(prepared(archive), on=[*DRIFT_KEYS, "lr_key"], suffixes=("", "_archive"))
    return pairs.drop_duplicates(subset=[*DRIFT_KEYS, "lr_key", "host", "host_archive"])


def host_drift_table(current: pd.DataFrame, archive: pd.DataFrame) -> pd.DataFrame:
    """Per (archived run's host type, current run's host type, arm): the pairs, how many agree bit for bit, and the
    final validation loss's difference (current - archived: its largest magnitude, median magnitude and mean); one
    'every arm' row per pair of host types first."""
    pairs = _paired_runs(current, archive)
    pairs["diff"] = pairs["final_val_loss"] - pairs["final_val_loss_archive"]
    arm = ["optimizer", "schedule", "mitigation", "momentum"]

    def summary(group: pd.DataFrame) -> dict:
        d = group["diff"]
        return {"pairs": len(d), "bit_identical": int((d == 0).sum()), "max_abs_diff": float(d.abs().max()),
                "median_abs_diff": float(d.abs().median()), "mean_diff": float(d.mean())}

    rows = []
    for (old, new), by_hosts in pairs.groupby(["host_archive", "host"], sort=True):
        rows.append({"host_archive": old, "host": new, "optimizer": "every arm", **summary(by_hosts)})
        for key, group in by_hosts.groupby(arm, sort=True):
            rows.append({"host_archive": old, "host": new, **dict(zip(arm, key, strict=True)), **summary(group)})
    columns = ["host_archive", "host", *arm, "pairs", "bit_identical", "max_abs_diff", "median_abs_diff",
               "mean_diff"]
    return pd.DataFrame(rows, columns=columns)


def write_host_drift(current: pd.DataFrame, archive: pd.DataFrame, table_csv: str, archive_name: str) -> None:
    """The host-drift table; refused where a pair of one host type disagrees (a record that does not stand for its
    config is a defect to find, not a drift to report)."""
    table = host_drift_table(current, archive)
    same = table[(table["host_archive"] == table["host"]) & (table["optimizer"] == "every arm")]
    bad = same[same["bit_identical"] < same["pairs"]]
    if len(bad):
        raise UserError(f"{archive_name}: {int((bad['pairs'] - bad['bit_identical']).sum())} run(s) trained twice on "
                        f"one host type ({', '.join(bad['host'])}) with the same cell, seed and LR value end at a "
                        "different loss: a record does not stand for the config that made it")
    write_table(table, table_csv, floatfmt=".3g",
                title="Study B: the drift between host types, per arm (the same training in two rounds)",
                notes=[f"pairs = a current run and an archived run ({archive_name}) of the same cell, seed and LR "
                       "value (the LR's value, not its label: the rounds chose their LRs at different budgets, so "
                       "only the arms whose choice did not move pair up); both finished",
                       "host_archive, host = the CPU (vendor family/model) each ran on; on one host type every pair "
                       "must agree bit for bit (this table is refused otherwise), across two the difference is "
                       "the drift between them",
                       "*_diff = final validation loss, current minus archived, nats: the largest and the median "
                       "magnitude, and the mean (a sign shared by an arm's pairs would be a bias, not noise)",
                       "the claims read the current runs only, every contrast on one host type (each claim's "
                       "hosts); this table says how far a contrast across these two host types would have moved"])
