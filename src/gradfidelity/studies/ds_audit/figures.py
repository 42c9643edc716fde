"""Figures of the study: the fault matrix as a heat map (one row per configuration, one column per micro-batch
slot) and the loss aggregation against the spread of sequence lengths. The frames come from `aggregate`, the same
functions the table and claims jobs use, so a figure shows the rows the table lists.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd


def plot_matrix(df: pd.DataFrame, png: Path) -> None:
    """Heat map: one row per configuration, one column per micro-batch slot; grey = no such slot, black = error."""
    from matplotlib.colors import ListedColormap

    from gradfidelity.plots import new_figure, save_figure, style_axes

    versions = list(dict.fromkeys(df.deepspeed))
    width = int(max((len(s.split("|")[0].split()) for s in df.contributions_raw if s), default=1))
    fig, axes = new_figure(ncols=len(versions), width=4.2, height=max(3.0, 0.075 * len(df) / len(versions) + 1.0))
    cmap = ListedColormap(plt_colors()).with_extremes(bad="#d9d9d9")
    for ax, v in zip(axes[0], versions, strict=True):
        sub = df[df.deepspeed == v]
        grid = np.full((len(sub), width), np.nan)
        labels = []
        for i, r in enumerate(sub.itertuples(index=False)):
            if r.status == "ok":
                c = [float(x) for x in r.contributions_raw.split("|")[0].split()]
                grid[i, : len(c)] = c
            else:
                grid[i, :] = -1.0  # error rows: black
            mbk = f" x{r.backward_calls}bw-{r.boundary}" if r.backward_calls > 1 else ""
            mbk += f" clip-{r.clip_mode}" if r.clip_mode != "off" else ""
            labels.append(f"r{r.ranks} z{r.zero_stage} {r.offload:>4} ga{r.ga}{mbk} {r.dtype}"
                          + ("" if r.agrees_with_prediction in ("yes", "open") else f" [{r.agrees_with_prediction}]"))
        im = ax.imshow(np.ma.masked_invalid(grid), aspect="auto", cmap=cmap, vmin=-1.0, vmax=1.2,
                       interpolation="nearest")
        ax.set_yticks(range(len(labels)))
        ax.set_yticklabels(labels, fontsize=3.2, family="monospace")
        ax.set_xticks(range(width))
        ax.tick_params(axis="x", labelsize=5)
        ax.grid(False)
        style_axes(ax, title=f"DeepSpeed {v}", xlabel="micro-batch slot (rank-major)")
    fig.colorbar(im, ax=axes[0][-1], fraction=0.04, label="contribution (black: error)")
    save_figure(fig, png, caption="Contribution of each micro-batch to the first optimizer step DeepSpeed took "
                "(1 = counted once, 0 = dropped); grey = slot absent for that GA.")


def plt_colors() -> list:
    """-1 (error) black, 0 red through 1 blue: 64-step discrete map over [-1, 1.2]."""
    import matplotlib

    base = matplotlib.colormaps["RdYlBu"]
    vals = np.linspace(-1.0, 1.2, 64)
    return [(0, 0, 0, 1) if v < -0.5 else base(min(max(v, 0.0), 1.2) / 1.2) for v in vals]


def plot_loss(summ: pd.DataFrame, png: Path) -> None:
    from gradfidelity.plots import new_figure, save_figure, style_axes

    fig, axes = new_figure(ncols=3, width=3.4, height=2.8)
    for m, sub in summ.groupby("method"):
        axes[0][0].errorbar(sub.spread, sub.rel_error, yerr=sub.rel_error_sd.fillna(0), marker="o", label=m,
                            capsize=2)
        axes[0][1].plot(sub.spread, sub.cosine, marker="o", label=m)
        axes[0][2].plot(sub.spread, sub.weight_max / sub.weight_min, marker="o", label=m)
    style_axes(axes[0][0], "relative gradient error to (a)", "length spread", "||g - g_a|| / ||g_a||")
    style_axes(axes[0][1], "cosine to (a)", "length spread", "cosine")
    style_axes(axes[0][2], "token weight max / min", "length spread", "ratio")
    axes[0][0].legend(fontsize=6)
    save_figure(fig, png, caption="(a) global token mean (correct), per-micro-batch mean (OpenRLHF pre-fix), "
                "per-sequence mean; error bars: sd over seeds.")


def write(groups: list[str], loss: str, out: dict[str, str], scale: str) -> None:
    """The figure job: the group runs and the loss-aggregation run -> the figures at `out` (plan.FIGURES' names)."""
    from gradfidelity.studies.ds_audit import aggregate

    plot_matrix(aggregate.matrix_frame(aggregate.ok_runs(groups, scale)), Path(out["matrix_png"]))
    (loss_run,) = aggregate.ok_runs([loss], scale)
    plot_loss(aggregate.loss_summary(aggregate.loss_frame(loss_run)), Path(out["loss_png"]))
