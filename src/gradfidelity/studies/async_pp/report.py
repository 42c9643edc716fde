"""Tables and figures of study B from runs.csv / curves.csv (see analysis.py for the gap definitions)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from gradfidelity.plots import new_figure, save_figure, style_axes
from gradfidelity.studies.async_pp.analysis import Gaps, length_table, main_table, mitigations_table
from gradfidelity.studies.async_pp.plan import default_momentum
from gradfidelity.tables import write_table

GATE_NOTE = ("sync_plateau_delta = sync val loss at 90% of the steps minus at the end; plateau_limit = max(|gap|, "
             "1% of the sync loss) / 4; plateau_gate = pass if |sync_plateau_delta| < plateau_limit, the gate of every "
             "claim on this optimizer at this budget (analysis.py)")


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
                           f"{g.cfg['train']['decay_frac']:.0%}), at the LR chosen on sync at {g.steps} steps",
                           paired, "gap = 2bw - sync per seed, then the mean, with its t interval (registry level "
                           "of B7); B7 compares Muon's gap at the longest and the shortest budget", GATE_NOTE])


def _line(ax, xs, ys, label, **kw):
    xs, ys = np.asarray(xs, float), np.asarray(ys, float)
    ax.plot(xs, ys, marker="o", label=label, **kw)


def fig_momentum(g: Gaps, path: str) -> None:
    fig, axes = new_figure()
    ax = axes[0, 0]
    sw = g.cfg["sweeps"]["momentum"]
    for opt in sw["optimizers"]:
        _line(ax, sw["momenta"], [g.gap(opt, momentum=m) for m in sw["momenta"]], opt)
    ax.axhline(0, color="grey", lw=0.8)
    style_axes(ax, "One-step-delay gap vs momentum", "momentum (beta1 / mu)", "gap (2bw - sync), nats")
    ax.legend()
    save_figure(fig, path, caption="Paper claim B4: higher momentum -> smaller gap. Missing points: diverged.")


def fig_depth(g: Gaps, path: str) -> None:
    fig, axes = new_figure()
    ax = axes[0, 0]
    sw = g.cfg["sweeps"]["depth"]
    for i, opt in enumerate(sw["optimizers"]):
        color = f"C{i}"
        for schedule, ls in (("pipedream", "-"), ("pipedream_vsync", ":")):
            if schedule in sw["schedules"]:
                _line(ax, sw["depths"], [g.gap(opt, schedule, depth=P, head="untied") for P in sw["depths"]],
                      f"{opt} {schedule}", color=color, ls=ls)
        ax.plot(sw["depths"], [g.gap(opt, head="untied")] * len(sw["depths"]), color=color, ls="--",
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
    opts = g.cfg["sweeps"]["main"]["optimizers"]
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


def write_figures(runs_csv: str, curves_csv: str, cfg: dict, paths: dict) -> None:
    g = Gaps(pd.read_csv(runs_csv), cfg)  # runs.csv is refused at another scale by the tables and claims rules
    fig_momentum(g, paths["momentum"])
    fig_depth(g, paths["depth"])
    fig_gap_vs_tokens(g, paths["gap_vs_tokens"])
    fig_curves(pd.read_csv(curves_csv), g, paths["curves"])
