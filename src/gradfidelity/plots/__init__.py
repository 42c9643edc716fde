"""One house style for every figure: the Agg backend (no screen), readable fonts, atomic PNG writes."""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from gradfidelity.harness.io import atomic_savefig  # noqa: E402

STYLE = {
    "figure.dpi": 110, "savefig.dpi": 150, "font.size": 9, "axes.titlesize": 10, "axes.labelsize": 9,
    "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False, "axes.spines.right": False,
    "legend.frameon": False, "figure.constrained_layout.use": True,
}
plt.rcParams.update(STYLE)


def new_figure(ncols: int = 1, nrows: int = 1, width: float = 4.0, height: float = 3.0):
    return plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)


def style_axes(ax, title: str | None = None, xlabel: str | None = None, ylabel: str | None = None) -> None:
    if title:
        ax.set_title(title)
    if xlabel:
        ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)


def save_figure(fig, path: str | os.PathLike, caption: str | None = None) -> Path:
    """Save atomically; a caption, if given, goes under the figure so a PNG read alone still says what it shows."""
    if caption:
        fig.text(0.01, -0.02, caption, fontsize=7, ha="left", va="top", wrap=True)
    out = atomic_savefig(fig, path, bbox_inches="tight")
    plt.close(fig)
    return out
