"""runs.csv / curves.csv -> the figures of study B (gradfidelity.plots' house style), at the paths the rule passes.

The gaps are the paired-seed means of pairing.Gaps; the gap-vs-tokens figure draws the length table (tables.py), so
a figure and its table show the same numbers.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from gradfidelity.plots import new_figure, save_figure, style_axes
from gradfidelity.studies.async_pp.config import StudyConfig
from gradfidelity.studies.async_pp.pairing import Gaps
from gradfidelity.studies.async_pp.plan import default_momentum
from gradfidelity.studies.async_pp.tables import length_table


def _line(ax, xs, ys, label, **kw):
    xs, ys = np.asarray(xs, float), np.asarray(ys, float)
    ax.plot(xs, ys, marker="o", label=label, **kw)


def fig_momentum(g: Gaps, path: str) -> None:
    fig, axes = new_figure()
    ax = axes[0, 0]
    sw = g.cfg.sweeps.momentum
    for opt in sw.optimizers:
        _line(ax, sw.momenta, [g.gap(opt, momentum=m) for m in sw.momenta], opt)
    ax.axhline(0, color="grey", lw=0.8)
    style_axes(ax, "One-step-delay gap vs momentum", "momentum (beta1 / mu)", "gap (2bw - sync), nats")
    ax.legend()
    save_figure(fig, path, caption="Paper claim B4: higher momentum -> smaller gap. Missing points: diverged.")


def fig_depth(g: Gaps, path: str) -> None:
    fig, axes = new_figure()
    ax = axes[0, 0]
    sw = g.cfg.sweeps.depth
    for i, opt in enumerate(sw.optimizers):
        color = f"C{i}"
        for schedule, ls in (("pipedream", "-"), ("pipedream_vsync", ":")):
            if schedule in sw.schedules:
                _line(ax, sw.depths, [g.gap(opt, schedule, depth=P, head="untied") for P in sw.depths],
                      f"{opt} {schedule}", color=color, ls=ls)
        ax.plot(sw.depths, [g.gap(opt, head="untied")] * len(sw.depths), color=color, ls="--",
                label=f"{opt} 2bw")
    ax.set_xscale("log", base=2)
    style_axes(ax, "Gap vs pipeline depth P (untied head)", "pipeline depth P", "gap vs sync, nats")
    ax.legend(fontsize=7)
    save_figure(fig, path, caption="Claim B6: PipeDream's staleness is P-1-k per stage, 2BW's is 1 at any depth.")


def fig_gap_vs_tokens(g: Gaps, path: str) -> None:
    fig, axes = new_figure()
    ax = axes[0, 0]
    table = length_table(g)
    for i, (opt, rows) in enumerate(table.groupby("optimizer", sort=False)):
        _line(ax, rows.tokens, rows.gap, f"{opt} gap", color=f"C{i}")
        _line(ax, rows.tokens, rows.sync_plateau_delta.abs(), f"{opt} |sync change, last 10%|", color=f"C{i}",
              ls=":")
        ax.plot(rows.tokens, rows.plateau_limit, color=f"C{i}", ls="--", lw=0.8, alpha=0.6,
                label=f"{opt} gate limit")
    ax.set_xscale("log")
    # the gaps span 0.2 to 1e-3 nats: log scale, or symlog (linear below 1e-3) when a gap is <= 0
    positive = bool((table.gap > 0).all() and (table.sync_plateau_delta.abs() > 0).all())
    if positive:
        ax.set_yscale("log")
    else:
        ax.set_yscale("symlog", linthresh=1e-3)
        ax.axhline(0, color="grey", lw=0.8)
    style_axes(ax, "Gap and sync plateau vs training length", "training tokens (separate runs, full LR schedule)",
               "nats" + ("" if positive else " (symlog: linear below 1e-3)"))
    ax.legend(fontsize=7)
    save_figure(fig, path, caption="Claim B7: the gap should not grow with training length. The plateau gate "
                                   "passes where the dotted line is below the dashed one, max(|gap|, 1% of sync) / 4.")


def fig_curves(curves: pd.DataFrame, g: Gaps, path: str) -> None:
    opts = g.cfg.sweeps.main.optimizers
    ncols = min(3, len(opts))
    nrows = math.ceil(len(opts) / ncols)
    fig, axes = new_figure(ncols=ncols, nrows=nrows, width=3.2, height=2.6)
    c = curves[(curves.depth == 1) & (curves.steps == g.steps) & (curves["lr"] == "tuned")
               & (curves["head"] == g.head)]
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
    fig_gap_vs_tokens(g, paths["gap_vs_tokens"])
    fig_curves(pd.read_csv(curves_csv), g, paths["curves"])
