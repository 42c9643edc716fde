"""The claims figure: every claim's estimate and interval against its check, on one normalised axis.

Each numeric check is turned into a signed margin, positive on the claim's side:

- gt/ge threshold t: x - t;  lt/le threshold t: t - x (flipped, so the claim's side is always to the right);
- between [a, b]: r - |x - c| with c, r the range's centre and half-width (positive inside the range, r at its
  centre); an interval covering the centre reaches r;
- equals v: x - v (not flipped: the claim's side is exactly 0, so only a zero-width interval at 0 reproduces).

The margin is divided by a per-claim unit u = max(|t|, |estimate margin|, interval half-width) (t = the threshold,
the range's half-width r, or |v|; 1 if all are 0), so every claim fits one axis with the check at 0: an interval
wholly right of 0 reproduces, one across 0 is inconclusive, one wholly left of 0 does not reproduce (these are
exactly the rules of `verify.interval_verdict`). The real numbers are written beside each row.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from gradfidelity.claims.registry import load_registry
from gradfidelity.claims.verdict import (
    ARITHMETIC_BAD,
    ARITHMETIC_OK,
    INCONCLUSIVE,
    NOT_MEASURED,
    NOT_REPRODUCED,
    REPRODUCED,
    VERDICTS,
)
from gradfidelity.plots import new_figure, save_figure

VERDICT_COLOURS = {
    REPRODUCED: "#2ca02c", NOT_REPRODUCED: "#d62728", INCONCLUSIVE: "#ff7f0e", NOT_MEASURED: "#8c8c8c",
    ARITHMETIC_OK: "#1f77b4", ARITHMETIC_BAD: "#9467bd",
}
NUMERIC_KINDS = ("gt", "ge", "lt", "le", "between", "outside", "equals")
CLIP = 3.0  # normalised values beyond +-CLIP are drawn at the edge with an arrow head


def _number(value) -> float | None:
    """A finite float, or None for empty cells, NaN and booleans ('True' in the CSV)."""
    if value is None or isinstance(value, bool) or str(value).strip().lower() in ("true", "false", ""):
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _flag(value) -> bool:
    return str(value).strip().lower() in ("true", "1", "1.0")


def margin(check: dict, x: float) -> float:
    """Signed distance of x from the check's boundary, positive on the claim's side (equals: x - value)."""
    kind = check["kind"]
    if kind in ("gt", "ge"):
        return x - check["threshold"]
    if kind in ("lt", "le"):
        return check["threshold"] - x
    if kind == "between":
        a, b = check["range"]
        return (b - a) / 2 - abs(x - (a + b) / 2)
    if kind == "outside":  # the claim's side is outside the band
        a, b = check["range"]
        return abs(x - (a + b) / 2) - (b - a) / 2
    if kind == "equals":
        return x - check["value"]
    raise ValueError(f"check kind {kind!r} has no number to plot")


def _reference(check: dict) -> float:
    kind = check["kind"]
    if kind in ("between", "outside"):
        a, b = check["range"]
        return (b - a) / 2 or abs(a + b) / 2
    return abs(check["value"] if kind == "equals" else check["threshold"])


def normalise(check: dict, estimate: float, low: float | None = None,
              high: float | None = None) -> tuple[float, float | None, float | None]:
    """(estimate, low, high) on the common axis: the check at 0, the claim's side to the right, per-claim unit.

    low/high None (no interval) stay None; an exact value passes low == high == estimate.
    """
    me = margin(check, estimate)
    if low is None or high is None:
        ends = None
    elif check["kind"] == "between":
        a, b = check["range"]
        inside = low <= (a + b) / 2 <= high  # the margin peaks at the centre
        m = [margin(check, low), margin(check, high)]
        ends = (min(m), (b - a) / 2 if inside else max(m))
    elif check["kind"] == "outside":
        a, b = check["range"]
        inside = low <= (a + b) / 2 <= high  # the margin is lowest at the centre
        m = [margin(check, low), margin(check, high)]
        ends = (-(b - a) / 2 if inside else min(m), max(m))
    else:
        ends = tuple(sorted((margin(check, low), margin(check, high))))
    half = (ends[1] - ends[0]) / 2 if ends else 0.0
    unit = max(_reference(check), abs(me), half) or 1.0
    if ends is None:
        return me / unit, None, None
    return me / unit, ends[0] / unit, ends[1] / unit


def _rows(df: pd.DataFrame, registry: dict[str, dict]) -> list[dict]:
    rows = []
    for r in df.to_dict("records"):
        check = (registry.get(r["id"]) or {}).get("check")
        est = _number(r.get("estimate"))
        exact = _flag(r.get("exact"))
        low, high = (est, est) if exact else (_number(r.get("low")), _number(r.get("high")))
        n, min_n = _number(r.get("n")), _number(r.get("min_n"))
        row = {"id": str(r["id"]), "study": str(r["study"]), "verdict": str(r["verdict"]),
               "reason": "" if pd.isna(r.get("reason")) else str(r.get("reason")),
               "check_text": "" if pd.isna(r.get("check")) else str(r.get("check")),
               "n_text": f"n={'-' if n is None else int(n)}/{'-' if min_n is None else int(min_n)}",
               "point": None}
        if check is not None and check["kind"] in NUMERIC_KINDS and est is not None:
            row["point"] = normalise(check, est, low, high)
            shown = f"{est:.4g}" + (" exact" if exact else f" [{low:.4g}, {high:.4g}]" if low is not None
                                    else " (no interval)")
            row["value_text"] = f"{shown}  vs {row['check_text']}"
        rows.append(row)
    order = list(dict.fromkeys(r["study"] for r in rows))
    return sorted(rows, key=lambda r: order.index(r["study"]))  # stable: registry order inside a study


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3].rstrip() + "..."


def claims_figure(claims_csv: Path, out_png: Path, scale: str) -> None:
    """One row per claim (grouped by study): interval bar and estimate dot on the normalised axis, by verdict."""
    df = pd.read_csv(claims_csv, keep_default_na=True)
    registry = {row["id"]: row for row in load_registry()}
    rows = _rows(df, registry)

    # y positions top to bottom, a header line before each study
    layout, y = [], 0.0
    for i, row in enumerate(rows):
        if i == 0 or row["study"] != rows[i - 1]["study"]:
            y -= 0.4 if i == 0 else 1.0
            layout.append(("header", y, row["study"]))
            y -= 1.0
        layout.append(("row", y, row))
        y -= 1.0
    height = 1.0 + 0.2 * (-y)
    fig, axes = new_figure(width=8.0, height=height)
    ax = axes[0][0]
    lim = min(CLIP, max([1.5] + [abs(v) for r in rows if r["point"] for v in r["point"] if v is not None]) * 1.08)
    ax.set_xlim(-lim, lim)
    ax.set_ylim(y + 0.4, 0.6)
    ax.axvline(0, color="black", lw=1.0, zorder=1)
    ax.grid(axis="y", visible=False)

    ticks, labels = [], []
    for what, ypos, item in layout:
        if what == "header":
            ax.text(-lim, ypos, f" {item}", ha="left", va="center", fontsize=9, fontweight="bold",
                    color="#333333")
            ax.axhline(ypos - 0.5, color="#cccccc", lw=0.6, zorder=0)
            continue
        row, colour = item, VERDICT_COLOURS.get(item["verdict"], "#8c8c8c")
        ticks.append(ypos)
        labels.append(row["id"])
        ax.text(1.01, ypos, row["n_text"], transform=ax.get_yaxis_transform(), ha="left", va="center",
                fontsize=7.5, color="#333333")
        if row["point"] is None:
            text = row["verdict"] + (f": {row['reason']}" if row["reason"] else "")
            ax.text(-lim * 0.97, ypos, _short(text, 75), ha="left", va="center", fontsize=7, style="italic",
                    color=colour, zorder=5, bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.6})
            continue
        est, low, high = (None if v is None else max(-lim, min(lim, v)) for v in row["point"])
        if low is not None:
            ax.plot([low, high], [ypos, ypos], color=colour, lw=3.0, alpha=0.55, solid_capstyle="butt", zorder=2)
            for raw, end, marker in ((row["point"][1], low, "<"), (row["point"][2], high, ">")):
                if abs(raw) > lim:
                    ax.plot([end], [ypos], marker=marker, color=colour, ms=5, zorder=3)
        ax.plot([est], [ypos], "o", color=colour, ms=5, mec="white", mew=0.6, zorder=4)
        ax.text(1.12, ypos, _short(row["value_text"], 40), transform=ax.get_yaxis_transform(), ha="left",
                va="center", fontsize=7, color="#555555")
    ax.set_yticks(ticks, labels, fontsize=8)
    ax.tick_params(axis="y", length=0)
    ax.set_xlabel("distance from the check, signed so the claim's side is right, in per-claim units "
                  "(0 = threshold)")
    ax.set_title(f"Claims at scale {scale}: estimate (dot) and interval (bar) against each check", loc="left",
                 pad=14)
    ax.text(0.99, 1.005, "claim's side →", transform=ax.transAxes, ha="right", va="bottom", fontsize=7.5,
            color="#333333")
    ax.text(0.01, 1.005, "← against the claim", transform=ax.transAxes, ha="left", va="bottom", fontsize=7.5,
            color="#333333")
    handles = [ax.plot([], [], "o", color=VERDICT_COLOURS[v], ms=6, label=v)[0] for v in VERDICTS]
    fig.legend(handles=handles, loc="outside upper center", ncols=3, fontsize=7.5, handletextpad=0.3)
    levels = sorted({float(v) for v in df.get("level", pd.Series(dtype=float)).dropna()})
    level = ", ".join(f"{100 * v:g}%" for v in levels) or "the registry's level"
    caption = (
        "Axis: for '> t' and '>= t' the value minus t, for '< t' and '<= t' t minus the value (flipped), for "
        "'in [a, b]' the distance inside the nearer end of the range, for '== v' the value minus v; each divided "
        "by a per-claim unit max(|t| or the range's half-width or |v|, |estimate's distance|, interval "
        f"half-width). Bars: two-sided {level} intervals (a dot alone: an exact value); a bar wholly right of 0 "
        "reproduces, one across 0 is inconclusive, one wholly left does not reproduce ('== v' reproduces only "
        "as a dot at 0). Arrow heads: clipped at the axis edge. Right: the real estimate [interval] and check, "
        "n = independent units / min_n. Rows without a bar have no number to plot (not measured, a boolean, "
        "or parts): the verdict and its reason are written instead.")
    save_figure(fig, out_png, caption=caption)
