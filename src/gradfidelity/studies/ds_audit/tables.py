"""Tables and figures of the study: fault matrix (CSV, Markdown, heat map) and loss aggregation (CSV, MD, plot).

Why Markdown lists disagreements first: a reader must not have to scan 300 rows to learn that a row contradicts the
prediction of the paper's bug description (docs/sources.md, "Study A: DeepSpeed bug"); the section says so plainly,
and the full table follows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from gradfidelity.harness.io import atomic_write_csv, atomic_write_text
from gradfidelity.tables import markdown

MATRIX_ORDER = ["deepspeed", "ranks", "clip_mode", "backward_calls", "boundary", "zero_stage", "offload", "ga", "dtype"]


def _md_table(df: pd.DataFrame) -> str:
    """A Markdown table whose text cells cannot break the table (DeepSpeed error text may hold "|" or newlines)."""
    clean = df.astype(object).mask(df.isna(), "")  # empty cells, not "nan", for values a row did not report
    for col in clean.columns:
        clean[col] = clean[col].map(lambda v: v.replace("|", "/").replace("\n", " ") if isinstance(v, str) else v)
    return markdown(clean) + "\n"


def write_matrix_table(rows: list[dict], csv: Path, md: Path) -> pd.DataFrame:
    df = pd.DataFrame(rows).sort_values(MATRIX_ORDER, kind="stable").reset_index(drop=True)
    atomic_write_csv(df.drop(columns=["result"], errors="ignore"), csv)
    shown = ["deepspeed", "ranks", "zero_stage", "offload", "ga", "backward_calls", "boundary", "clip_mode", "dtype",
             "status", "contributions", "clip_used", "clip_applied", "clip_full", "reported_over_kept", "predicted",
             "agrees_with_prediction", "error"]
    ok = df[df.status == "ok"]
    lines = [
        "# DeepSpeed fault matrix: which micro-batches reach the optimizer",
        "",
        "Several consecutive optimizer steps per row through the real `deepspeed.initialize` (CPU accelerator, gloo), "
        "SGD(lr=1) as a client optimizer, a probe model where micro-batch k alone touches parameter tag[k]. "
        "`contributions` is, per step (separated by |), the least-squares weight of each micro-batch (all ranks, "
        "rank-major) in the applied gradient: 1 = counted once, 0 = lost. `clip_mode`: off (clipping 0), active "
        "(threshold 1.0, faithful norm 2.0), silent (no gradient_clipping key: the version's default, `clip_used`). "
        "`clip_applied` = applied norm / norm of the kept micro-batches; `clip_full` = the coefficient the full "
        "gradient would give; `reported_over_kept` = reported norm / norm of the kept micro-batches. `boundary` "
        "(several backward() per step): manual = set_gradient_accumulation_boundary, none = not called. "
        "`predicted` is the vector the "
        "paper's bug description (docs/sources.md, Study A) predicts for the row; `agrees_with_prediction` says yes, "
        "NO, open (the description leaves the row open) or error (the row did not run; the error text is kept).",
        "",
        f"Rows: {len(df)}; ran: {len(ok)}; errors: {int((df.status != 'ok').sum())}; "
        f"agree: {int((df.agrees_with_prediction == 'yes').sum())}; "
        f"DISAGREE: {int((df.agrees_with_prediction == 'NO').sum())}; "
        f"open: {int((df.agrees_with_prediction == 'open').sum())}.",
        "",
        "## Rows that disagree with the prediction",
        "",
    ]
    bad = df[df.agrees_with_prediction == "NO"]
    lines.append(_md_table(bad[shown]) if len(bad) else "None: every row that ran matches the prediction.\n")
    lines += ["", "## Rows on the prediction's open questions", ""]
    opn = df[df.agrees_with_prediction == "open"]
    lines.append(_md_table(opn[shown]) if len(opn) else "None.\n")
    lines += ["", "## Rows that could not run", ""]
    err = df[df.status != "ok"]
    lines.append(_md_table(err[shown]) if len(err) else "None.\n")
    lines += ["", "## All rows", "", _md_table(df[shown])]
    atomic_write_text(md, "\n".join(lines))
    return df


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


def write_loss_tables(rows: list[dict], csv: Path, md: Path) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    atomic_write_csv(df, csv)
    summ = (df.groupby(["spread", "method"], sort=True)
              .agg(length_cv=("length_cv", "mean"), weight_min=("weight_min", "mean"),
                   weight_max=("weight_max", "mean"), rel_error=("rel_error", "mean"),
                   rel_error_sd=("rel_error", "std"), cosine=("cosine", "mean"), seeds=("seed", "nunique"))
              .reset_index())
    text = [
        "# Loss aggregation over one accumulation window",
        "",
        "Gradient of (a) the global token mean over the window (correct), (b) a token mean per micro-batch averaged "
        "over micro-batches (OpenRLHF before its fix), (c) a per-sequence mean, on a tiny Llama. `weight_min/max`: "
        "effective per-token weight relative to (a)'s 1/T; `rel_error` = ||g - g_a|| / ||g_a||; `cosine` to g_a. "
        "Sequence lengths ~ U[mean (1 - spread), mean (1 + spread)]; means over seeds.",
        "",
        _md_table(summ),
    ]
    atomic_write_text(md, "\n".join(text))
    return summ


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
