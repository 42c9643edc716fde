"""Tidy CSV -> the study's figures, at the paths the rule passes (one house style: gradfidelity.plots)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from gradfidelity.studies.sft_rl import plan
from gradfidelity.studies.sft_rl.aggregate import BASE, at_budget, summarise
from gradfidelity.studies.sft_rl.config import StudyConfig


def write_figures(df: pd.DataFrame, cfg: StudyConfig, score_vs_flops: Path, reward_curves: Path) -> None:
    """Score vs post-training FLOPs (mean ± sd per cell) and the RL reward / SFT loss curves, first model."""
    from gradfidelity.plots import new_figure, save_figure, style_axes

    model = cfg.models[0].name
    fig, ax = new_figure(width=5.0, height=3.6)
    ax = ax[0][0]
    colors = {m: f"C{i}" for i, m in enumerate([*cfg.methods, plan.SFT_START])}  # sft_start: SFT-then-RL's start
    # one line per arm through its RL budgets (the same runs read at each: FLOPs grow with the budget)
    per_budget = [summarise(at_budget(df, b)) for b in cfg.budgets]
    s_all = pd.concat([s.assign(budget=b) for s, b in zip(per_budget, cfg.budgets, strict=True)])
    s_all = s_all[(s_all.model == model) & s_all.variant.isin(plan.TABLE_VARIANTS)]
    for (variant, method), g in s_all.groupby(["variant", "method"], sort=False):
        g = g[~g.acc_macro_mean.isna()].sort_values("budget")
        if g.empty:
            continue
        if method == BASE:  # no post-training FLOPs: the start every arm but SFT-then-RL is measured from
            if variant == "fixed":
                ax.axhline(g.acc_macro_mean.iloc[0], color="0.5", ls=":", lw=1, label="base model (start)")
            continue
        filled = variant == "fixed"
        last = g.iloc[-1]
        div = f", {int(last.n_diverged)} diverged" if last.n_diverged else ""
        ax.errorbar(g.flops_mean, g.acc_macro_mean, yerr=g.acc_macro_sd.fillna(0), fmt="-o" if filled else "--s",
                    color=colors[method], mfc=colors[method] if filled else "none", lw=0.8,
                    label=f"{method} ({variant}{div})", capsize=2)
    ax.set_xscale("log")
    ax.legend(fontsize=6, ncol=2)
    style_axes(ax, f"score vs compute ({model})", "post-training FLOPs", "macro accuracy (points)")
    save_figure(fig, score_vs_flops,
                caption="Filled: fixed infrastructure; hollow: both bugs; dotted: the base model. Each line joins one "
                        f"arm's RL budgets ({', '.join(map(str, cfg.budgets))} RL steps, read off the same runs; SFT "
                        "has one point). Mean ± sd over the seeds that finished (the legend counts diverged seeds at "
                        "the largest budget; a cell with none finished is not drawn).")

    df = at_budget(df, cfg.rl.steps)  # the curves: each run's whole histories
    fig, axes = new_figure(ncols=2, width=4.5, height=3.4)
    ax_r, ax_l = axes[0]
    for method in (m for m in cfg.methods if m in plan.RL_STAGE):
        for variant, ls in (("fixed", "-"), ("both", "--")):
            g = df[(df.model == model) & (df.variant == variant) & (df.method == method) & (df.status == "ok")]
            curves = [c for c in g.get("reward_history", []) if isinstance(c, list) and c]
            if not curves:
                continue
            n = min(len(c) for c in curves)
            ax_r.plot(np.arange(1, n + 1), np.mean([c[:n] for c in curves], axis=0), ls=ls, color=colors[method],
                      label=f"{method} ({variant})")
    ax_r.legend(fontsize=6)
    style_axes(ax_r, "RL training reward", "RL step", "mean reward of rollouts")
    for i, variant in enumerate(cfg.variants):
        g = df[(df.model == model) & (df.variant == variant) & (df.method == "sft") & (df.status == "ok")]
        curves = [c for c in g.get("loss_history", []) if isinstance(c, list) and c]
        if curves:
            n = min(len(c) for c in curves)
            ax_l.plot(np.arange(1, n + 1), np.mean([c[:n] for c in curves], axis=0), color=f"C{i}", label=variant)
    ax_l.legend(fontsize=7)
    style_axes(ax_l, "SFT training loss", "optimizer step", "logged loss")
    save_figure(fig, reward_curves,
                caption="Left: training reward (fixed solid, both bugs dashed; runs shared between the two variants "
                        "overlap). Right: SFT loss per infrastructure variant (as logged, so the per-micro-batch "
                        "mean variants log a differently normalised loss). Diverged runs are left out.")
