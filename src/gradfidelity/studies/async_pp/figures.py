"""runs.csv / curves.csv -> the figures of study B (gradfidelity.plots' house style), at the paths the rule passes.

Each figure draws a table of tables.py (the ladder and f by budget, f by momentum) or the same pairing functions, so a
figure and its table show the same numbers. The unit is lost compute, 100 (1 - f) (compute_fraction.py).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.ticker import NullLocator

from gradfidelity.claims.registry import load_registry
from gradfidelity.plots import new_figure, save_figure, style_axes
from gradfidelity.studies.async_pp.config import StudyConfig
from gradfidelity.studies.async_pp.pairing import Gaps, Spec, fractions
from gradfidelity.studies.async_pp.plan import default_momentum
from gradfidelity.studies.async_pp.tables import length_table, momentum_table, width_table


def _line(ax, xs, ys, label, **kw):
    xs, ys = np.asarray(xs, float), np.asarray(ys, float)
    ax.plot(xs, ys, marker="o", label=label, **kw)


def _lost(g: Gaps, spec: Spec) -> float:
    fr = fractions(g, {"a": spec})
    return float(np.mean(100 * fr.lost("a"))) if fr.n else math.nan


def fig_momentum(g: Gaps, path: str) -> None:
    fig, axes = new_figure()
    ax = axes[0, 0]
    table = momentum_table(g)
    for opt, rows in table.groupby("optimizer", sort=False):
        _line(ax, rows.momentum, rows.lost_pct, opt)
    ax.axhline(0, color="grey", lw=0.8)
    style_axes(ax, "Lost compute vs momentum", "momentum (beta1 / mu), own LR each", "lost compute, % of T")
    ax.legend()
    save_figure(fig, path, caption="Claim B4: higher momentum -> less compute lost to the delay. Missing points: "
                                   "diverged or f outside the sync ladder.")


def fig_depth(g: Gaps, path: str) -> None:
    fig, axes = new_figure()
    ax = axes[0, 0]
    sw = g.cfg.sweeps.depth
    for i, opt in enumerate(sw.optimizers):
        color = f"C{i}"
        for schedule, ls in (("pipedream", "-"), ("pipedream_vsync", ":")):
            if schedule in sw.schedules:
                _line(ax, sw.depths, [_lost(g, Spec(opt, schedule, depth=P, head="untied")) for P in sw.depths],
                      f"{opt} {schedule}", color=color, ls=ls)
        ax.plot(sw.depths, [_lost(g, Spec(opt, "2bw", head="untied"))] * len(sw.depths), color=color, ls="--",
                label=f"{opt} 2bw")
    ax.set_xscale("log", base=2)
    style_axes(ax, "Lost compute vs pipeline depth P (untied head)", "pipeline depth P", "lost compute, % of T")
    ax.legend(fontsize=7)
    save_figure(fig, path, caption="Claim B6: PipeDream's staleness is P-1-k per stage, 2BW's is 1 at any depth.")


def fig_ladder(g: Gaps, path: str) -> None:
    """Left: the sync loss against the budget (separate runs), with each async run beside its sync budget; right:
    f at each budget that has an async run, with its interval."""
    fig, axes = new_figure(ncols=2, width=3.6, height=2.8)
    left, right = axes[0, 0], axes[0, 1]
    table = length_table(g)
    for i, (opt, rows) in enumerate(table.groupby("optimizer", sort=False)):
        color = f"C{i}"
        _line(left, rows.tokens, rows.sync, f"{opt} sync", color=color)
        a = rows.dropna(subset=["async_2bw"])
        left.scatter(a.tokens, a.async_2bw, marker="x", color=color, label=f"{opt} 2bw")
        f = rows.dropna(subset=["f"])
        if len(f):
            yerr = np.vstack([f.f - f.f_low, f.f_high - f.f]).clip(min=0)
            right.errorbar(f.tokens, f.f, yerr=np.nan_to_num(yerr), marker="o", color=color, label=opt, capsize=2)
    left.set_xscale("log")
    right.set_xscale("log")
    right.axhline(1, color="grey", lw=0.8)
    style_axes(left, "Sync loss by budget (each a full run)", "training tokens", "final val loss, nats/token")
    style_axes(right, "Effective compute fraction f", "training tokens", "f = S* / T")
    left.legend(fontsize=6)
    right.legend(fontsize=7)
    save_figure(fig, path, caption="Left: the sync loss must still fall per doubling (the regime of LLM "
                                   "pretraining). Right: f = the share of its budget the async run got; B7: f does "
                                   "not fall with the budget.")


def fig_width(g: Gaps, path: str) -> None:
    """Lost compute 1 - f at T against the width (the width ladder, issue 60), per optimizer, with its interval;
    muon_all (Muon on the embedding and head too) dashed beside Muon."""
    fig, axes = new_figure()
    ax = axes[0, 0]
    table = width_table(g)
    for i, (opt, rows) in enumerate(table.groupby("optimizer", sort=False)):
        rows = rows.dropna(subset=["f_T"])
        if not len(rows):
            continue
        lost = 100 * (1 - rows.f_T)
        yerr = np.vstack([100 * (rows.f_T_high - rows.f_T), 100 * (rows.f_T - rows.f_T_low)]).clip(min=0)
        ax.errorbar(rows.d_model, lost, yerr=np.nan_to_num(yerr), marker="o", capsize=2, label=opt, color=f"C{i}",
                    ls="--" if opt == "muon_all" else "-")
    ax.set_xscale("log", base=2)
    widths = sorted(int(d) for d in table.d_model.unique())
    ax.set_xticks(widths, [str(d) for d in widths])  # the widths themselves, not 2^5 .. 2^7
    ax.xaxis.set_minor_locator(NullLocator())
    ax.axhline(0, color="grey", lw=0.8)
    # the claims' own bounds, from the registry (never restated here): B1-abs's AdamW bound, B2's Muon band
    rows = {r["id"]: r["check"] for r in load_registry() if r["id"] in ("B1-abs", "B2")}
    ax.axhline(100 * rows["B1-abs"]["threshold"], color="C0", lw=0.8, ls=":",
               label=f"B1-abs: AdamW > {100 * rows['B1-abs']['threshold']:g}%")
    ax.axhline(100 * max(rows["B2"]["range"]), color="C1", lw=0.8, ls=":",
               label=f"B2: Muon < {100 * max(rows['B2']['range']):g}%")
    style_axes(ax, "Lost compute vs width (each width at its T)", "d_model", "lost compute 1 - f, % of T")
    ax.legend(fontsize=7)
    seeds = ", ".join(f"d {int(r.d_model)} {r.optimizer} {int(r.seeds)}" for r in table.itertuples())
    save_figure(fig, path, caption="The paper's scale argument, as far as this machine reaches: B2 says Muon loses "
                                   "about 6% at SmolLM's size; muon_all trains the embedding and head with Muon too. "
                                   f"Dotted: the claims' bounds. Paired seeds: {seeds}.")


def fig_curves(curves: pd.DataFrame, g: Gaps, path: str) -> None:
    opts = g.cfg.sweeps.main.optimizers
    ncols = min(3, len(opts))
    nrows = math.ceil(len(opts) / ncols)
    fig, axes = new_figure(ncols=ncols, nrows=nrows, width=3.2, height=2.6)
    own_width = curves["width"].fillna(0) == 0 if "width" in curves.columns else True
    c = curves[(curves.depth == 1) & (curves.steps == g.steps) & (curves["lr"] == "tuned")
               & (curves["head"] == g.head) & own_width]
    for i, opt in enumerate(opts):
        ax = axes[i // ncols, i % ncols]
        sel = c[(c.optimizer == opt) & np.isclose(c.momentum, default_momentum(opt))]
        for schedule, mitigation, label in (("sync", "none", "sync"), ("2bw", "none", "2bw"),
                                            ("2bw", "error_feedback", "2bw+EF")):
            s = sel[(sel.schedule == schedule) & (sel.mitigation == mitigation)]
            if len(s):
                mean = s.groupby("tokens")["val_loss"].mean()
                ax.plot(mean.index, mean.values, label=label)
        style_axes(ax, opt, "tokens", "val loss")
        if i == 0:
            ax.legend()
    for j in range(len(opts), nrows * ncols):
        axes[j // ncols, j % ncols].set_visible(False)
    save_figure(fig, path, caption="Validation loss curves (mean over seeds); a diverged run has no curve.")


def write_figures(runs_csv: str, curves_csv: str, cfg: StudyConfig, paths: dict) -> None:
    g = Gaps(pd.read_csv(runs_csv), cfg)  # runs.csv is refused at another scale by the tables and claims rules
    fig_momentum(g, paths["momentum"])
    fig_depth(g, paths["depth"])
    fig_ladder(g, paths["ladder"])
    fig_curves(pd.read_csv(curves_csv), g, paths["curves"])
    if paths.get("width"):
        fig_width(g, paths["width"])
