"""Tidy CSV -> the two figures of study C: the quality-throughput-memory frontier and the width scaling."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from gradfidelity.claims.registry import interval_level
from gradfidelity.plots import new_figure, save_figure, style_axes
from gradfidelity.studies.local.aggregate import LABEL
from gradfidelity.studies.local.config import ASYNC, StudyConfig
from gradfidelity.studies.local.stats import POOLED, main_table


def _log_ratio_axis(axis) -> None:
    """Readable ticks on a log axis of ratios: majors at 1, 2, 5 x 10^k printed plainly, no minor labels (round 1
    let matplotlib label every minor tick of a narrow range, which overlapped into one unreadable string)."""
    lo, hi = sorted(axis.get_view_interval())
    decades = math.log10(hi / lo) if lo > 0 and hi > lo else 1.0
    subs = (1.0, 2.0, 5.0) if decades <= 2 else (1.0,)  # wide ranges (few seeds): decades only
    axis.set_major_locator(LogLocator(base=10, subs=subs, numticks=12))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def frontier_figure(main: pd.DataFrame, s: StudyConfig, path: Path) -> None:
    sub = main[main.width == s.main_width]
    corpora = sorted(sub.corpus.unique())
    fig, axes = new_figure(ncols=max(1, len(corpora)), width=4.2, height=3.4)
    for ax, corpus in zip(axes[0], corpora, strict=False):
        c = sub[sub.corpus == corpus]
        pss_bp = c.pss_bp_gib.iloc[0]
        ax.scatter([1.0], [0.0], s=400 * pss_bp, c="k", alpha=0.6, label=f"BP ({pss_bp:.2f} GiB)")
        for _, r in c.iterrows():
            if not np.isfinite(r.ratio_vs_bp) or not np.isfinite(r.get("mean_gap_pct", math.nan)):
                continue
            xerr = None
            if np.isfinite(r.ratio_low):
                xerr = [[r.ratio_vs_bp - r.ratio_low], [r.ratio_high - r.ratio_vs_bp]]
            ax.errorbar(r.ratio_vs_bp, r.mean_gap_pct, xerr=xerr, fmt="none", ecolor="0.6", lw=0.8)
            ax.scatter(r.ratio_vs_bp, r.mean_gap_pct, s=400 * r.pss_method_gib, alpha=0.6,
                       label=f"{LABEL[r.method]} ({r.pss_method_gib:.2f} GiB)")
            if np.isfinite(r.get("upper_pct", math.nan)):
                ax.plot([r.ratio_vs_bp] * 2, [r.mean_gap_pct, r.upper_pct], color="0.3", lw=0.8, ls=":")
        ax.axhline(s.margin_pct, color="r", lw=0.8, ls="--")
        ax.set_xscale("log")  # ratios; with few seeds the t intervals can span decades
        _log_ratio_axis(ax.xaxis)
        style_axes(ax, title=f"{corpus} ({c.source.iloc[0]}), width {s.main_width}",
                   xlabel=f"throughput / BP (paired {interval_level():.0%} CI)",
                   ylabel="mean gap % vs BP (dotted: 95% upper bound)")
        ax.legend(fontsize=6)
    save_figure(fig, path, caption="Quality-throughput-memory frontier: marker area ~ peak process-tree PSS; "
                "red dashed line: the 1% non-inferiority margin.")


def width_figure(main: pd.DataFrame, path: Path) -> None:
    """Speed-up and quality gap by width, async runs. The quality panel's points are the async runs' own seeds
    (each labelled with its n); C4's Broadcast also reads serial Broadcast on the quality seeds, so its mean gap
    (the main table's pooled row) is drawn apart, as a square, and named as C4's."""
    fig, axes = new_figure(ncols=2, width=4.0, height=3.2)
    sub = main[main.method.isin(ASYNC)]
    for (corpus, method), g in sub.groupby(["corpus", "method"]):
        g = g.sort_values("width")
        yerr = [g.ratio_vs_bp - g.ratio_low, g.ratio_high - g.ratio_vs_bp]
        line = axes[0][0].errorbar(g.width, g.ratio_vs_bp, yerr=yerr if g.ratio_low.notna().all() else None,
                                   marker="o", capsize=2, label=f"{LABEL[method]}, {corpus}")
        if "ratio_vs_best" in g:
            axes[0][0].plot(g.width, g.ratio_vs_best, ls="--", marker="x", color=line[0].get_color())
        quality = axes[0][1].plot(g.width, g.mean_gap_pct, marker="o", label=f"{LABEL[method]}, {corpus}, async "
                                  "seeds only")
        for _, r in g.iterrows():
            axes[0][1].annotate(f"n={r.n:g}", (r.width, r.mean_gap_pct), fontsize=6, xytext=(3, 3),
                                textcoords="offset points", color=quality[0].get_color())
    for _, r in main[main.method == POOLED].iterrows():
        if np.isfinite(r.get("mean_gap_pct", math.nan)):
            axes[0][1].plot([r.width], [r.mean_gap_pct], marker="s", ls="none", color="k",
                            label=f"C4's Broadcast (async + serial seeds), {r.corpus}, n={r.n:g}")
    axes[0][0].axhline(1.0, color="k", lw=0.8)
    axes[0][0].set_yscale("log")
    _log_ratio_axis(axes[0][0].yaxis)
    style_axes(axes[0][0], title="speed-up vs width", xlabel="width", ylabel="throughput / BP (dashed: / best BP "
               "in budget)")
    style_axes(axes[0][1], title="quality gap vs width (async seeds)", xlabel="width", ylabel="mean gap % vs BP")
    axes[0][0].legend(fontsize=6)
    axes[0][1].legend(fontsize=6)
    save_figure(fig, path, caption=f"Async speed-up (paired {interval_level():.0%} CI) and mean bits-per-byte gap "
                "against BP by width. The quality panel's lines are the async runs' own seeds only (n beside each "
                "point); the square is C4's Broadcast, async where it ran and serial on the quality seeds, whose "
                "mean gap C4 decides on (claims).")


def write_figures(df: pd.DataFrame, s: StudyConfig, frontier: Path, scaling: Path) -> None:
    """Reads main_width and margin_pct of the config."""
    main = main_table(df, s)
    frontier_figure(main, s, frontier)
    width_figure(main, scaling)
