"""Runs -> aggregate CSV -> paired statistics -> tables, figures and claim evidence for study C.

The statistics are the paper's prespecified ones (its protocol is summarised in docs/sources.md, section
"Study C"), computed with `gradfidelity.stats`: per paired seed gap% = 100 (bpb_method - bpb_BP) / bpb_BP;
non-inferior iff the one-sided 95% upper bound of the mean gap <= margin (1 point); throughput ratio = geometric
mean of per-seed ratios with a paired 95% t interval on the log scale; seeds for 80% power from the observed mean
and sd. A cell's "joint" verdict (our reading of the paper's "met their joint criteria") = non-inferior AND the
lower end of the throughput CI above 1.

Pairing is by seed: the same seed gives BP and every method the same initial weights and the same batch order.
A diverged run is never averaged away: its seed is dropped from the statistics, tables count it, and the verdict
and the claim evidence say so.

Claim evidence (`gradfidelity.claims.evidence`; a seed enters a record only if every run the record needs on that
seed finished ok; a seed with a diverged run is dropped, counted in `diverged` and named in `detail`):
  C1, C2  paired_ratio of tokens/s, async RGC (C1) / async Broadcast (C2) vs BP, enwik8 at the main width
  C3      paired_ratio of peak process-tree PSS, async RGC vs BP, same cell
  C4      exact: one-sided 95% upper bound of the mean gap %, async Broadcast vs BP (the paper's decision statistic)
  C6      mean_ci of the per-seed gap %, async Broadcast vs BP, TinyStories at the main width
  C7      mean_ci of the per-seed (ratio at the smallest width - ratio at the largest), async Broadcast / BP, enwik8
  C8      mean_ci of the per-seed bits-per-byte difference Broadcast serial - RGC serial (mechanism cell)
  C9      exact: largest |end| of the paired 90% CI (TOST) of RGC serial - Live Local (mechanism cell)
  C10     mean_ci of the per-seed (async Broadcast / thread-matched BP) / (async Broadcast / BP)
Intervals are at the registry's level for the claim (`level_for`).

Speed-up decomposition (async methods, per seed, then averaged), with T_bp = BP's training wall time, B_s = busy
(compute) time of stage s, W = the async run's wall time:
  speed-up T_bp / W = (T_bp / sum B_s) x (sum B_s / max B_s) x (max B_s / W)
                       work ratio         parallelism         orchestration efficiency
and load imbalance = max B_s / mean B_s (1 = perfectly balanced; parallelism = S / imbalance).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from gradfidelity.claims.evidence import exact, level_for, mean_ci, not_measured, paired_difference, paired_ratio
from gradfidelity.errors import UserError
from gradfidelity.harness.io import atomic_write_csv, atomic_write_json
from gradfidelity.harness.results import load_run_records
from gradfidelity.plots import new_figure, save_figure, style_axes
from gradfidelity.stats import equivalence_tost, noninferiority, paired_ratio_ci, seeds_for_power
from gradfidelity.studies.local.settings import ASYNC, SERIAL_LOCAL, LocalSettings
from gradfidelity.tables import write_table

LABEL = {"bp": "BP", "bp_tm": "BP (thread-matched)", "live_local": "Live Local (serial)",
         "broadcast_serial": "Broadcast (serial)", "rgc_serial": "RGC (serial)",
         "broadcast_async": "Broadcast (async)", "rgc_async": "RGC (async)"}
_KEYS = ("path", "run_dir", "status", "seed", "scale", "corpus", "width", "method")
_METRICS = ("val_bpb", "corpus_source", "n_params", "n_stages", "steps")
_TIMING = ("tokens_per_s", "train_s", "peak_pss_gib", "compute_threads", "model_tflops_per_s")
_DIVERGED = ("diverged_at_step", "diverged_what")


# ----------------------------------------------------------------------------------------------- aggregate
def aggregate(paths: list[str], scale: str | None = None) -> pd.DataFrame:
    """One row per run (diverged runs included, with empty metric cells), read through the harness loader.

    Corpus, width and method come from the run layout <corpus>/w<width>/<method>/seed<k>/metrics.json (runner.py);
    a finished run's own metrics must agree with it. With `scale`, runs made at another scale are refused.
    """
    rows = []
    for rec in load_run_records(paths, scale=scale):
        parts = Path(rec["path"]).parts
        if len(parts) < 5 or not parts[-4].startswith("w") or not parts[-4][1:].isdigit():
            raise UserError(f"{rec['path']}: not a study C run (<corpus>/w<width>/<method>/seed<k>/metrics.json)")
        row = {"path": rec["path"], "run_dir": rec["run_dir"], "status": rec["status"], "seed": int(rec["seed"]),
               "scale": rec.get("scale"), "corpus": parts[-5], "width": int(parts[-4][1:]), "method": parts[-3]}
        m, t = rec["metrics"], rec.get("timing") or {}
        if rec["status"] == "ok":
            for key in ("corpus", "width", "method"):
                if key in m and m[key] != row[key]:
                    raise UserError(f"{rec['path']}: metrics say {key}={m[key]!r} but the path says {row[key]!r}")
            row.update({k: m.get(k) for k in _METRICS})
            row.update({k: t.get(k) for k in _TIMING})
            row["stage_busy_s"] = json.dumps(t["stage_busy_s"]) if "stage_busy_s" in t else ""
        else:
            row.update({k: m.get(k) for k in _DIVERGED})
        rows.append(row)
    df = pd.DataFrame(rows).reindex(columns=[*_KEYS, *_METRICS, *_TIMING, "stage_busy_s", *_DIVERGED])
    return df.sort_values(["corpus", "width", "method", "seed"]).reset_index(drop=True)


@dataclass(frozen=True)
class Aligned:
    """Per-seed values of one column for several arms (corpus, width, method), on the seeds where all finished ok."""
    arms: list[tuple[str, int, str]]
    seeds: list[int]
    values: list[np.ndarray]  # one array per arm, in the order of `seeds`
    diverged: dict[int, list[str]] = field(default_factory=dict)  # dropped seed -> the arms that diverged on it
    missing: list[int] = field(default_factory=list)  # seeds without a run of some arm
    sources: list[str] = field(default_factory=list)  # run directories of every arm on every seed considered

    @property
    def n(self) -> int:
        return len(self.seeds)


def _arm(arm: tuple[str, int, str]) -> str:
    return f"{LABEL.get(arm[2], arm[2])} ({arm[0]}, w{arm[1]})"


def align(df: pd.DataFrame, arms: list[tuple[str, int, str]], col: str) -> Aligned:
    per_arm = []
    for corpus, width, method in arms:
        a = df[(df.corpus == corpus) & (df.width == width) & (df.method == method)].set_index("seed")
        if not a.index.is_unique:
            raise UserError(f"{_arm((corpus, width, method))}: more than one run per seed")
        per_arm.append(a)
    kept, diverged, missing, sources = [], {}, [], []
    for seed in sorted(set().union(*(set(a.index) for a in per_arm))):
        rows = [a.loc[seed] if seed in a.index else None for a in per_arm]
        sources += [str(r.run_dir) for r in rows if r is not None]
        bad = [_arm(arm) for arm, r in zip(arms, rows, strict=True) if r is not None and r.status != "ok"]
        if bad:
            diverged[int(seed)] = bad
        elif any(r is None for r in rows):
            missing.append(int(seed))
        else:
            kept.append(int(seed))
    return Aligned(list(arms), kept, [a.loc[kept, col].to_numpy(float) for a in per_arm], diverged, missing,
                   sources)


def _paired(cell: pd.DataFrame, method: str, base: str, col: str) -> Aligned:
    """`col` of method and base on the seeds of one (corpus, width) cell where both finished ok."""
    if cell.empty:
        return Aligned([], [], [np.array([]), np.array([])])
    corpus, width = cell.corpus.iloc[0], int(cell.width.iloc[0])
    return align(cell, [(corpus, width, method), (corpus, width, base)], col)


def _ratio(a: np.ndarray, b: np.ndarray) -> dict:
    if len(a) >= 2:
        r = paired_ratio_ci(a, b)
        return {"ratio": r.ratio, "low": r.low, "high": r.high}
    if len(a) == 1:
        return {"ratio": float(a[0] / b[0]), "low": math.nan, "high": math.nan}
    return {"ratio": math.nan, "low": math.nan, "high": math.nan}


def _decomposition(df: pd.DataFrame, method: str) -> dict:
    a = df[(df.method == method) & (df.status == "ok")].set_index("seed")
    b = df[(df.method == "bp") & (df.status == "ok")].set_index("seed")
    parts = []
    for seed in sorted(set(a.index) & set(b.index)):
        if not a.at[seed, "stage_busy_s"]:
            continue
        busy = np.array(json.loads(a.at[seed, "stage_busy_s"]))
        t_bp, wall = float(b.at[seed, "train_s"]), float(a.at[seed, "train_s"])
        parts.append({"work_ratio": t_bp / busy.sum(), "parallelism": busy.sum() / busy.max(),
                      "orchestration_eff": busy.max() / wall, "imbalance": busy.max() / busy.mean()})
    if not parts:
        return {}
    return {k: float(np.exp(np.mean(np.log([p[k] for p in parts])))) for k in parts[0]}


def _seeds(mean: float, sd: float, margin: float) -> float:
    """Paired seeds for 80% power (exact noncentral t from gradfidelity.stats). Where statsmodels' solver fails
    (very large or tiny effects), fall back to the normal approximation ((z_.95 + z_.80) sd / (margin - mean))^2."""
    if not sd > 0:
        return math.nan
    try:
        return float(seeds_for_power(mean, sd, margin)["exact_t"])
    except ValueError:
        if margin <= mean:
            return math.inf
        return float(math.ceil(((stats.norm.ppf(0.95) + stats.norm.ppf(0.80)) * sd / (margin - mean)) ** 2))


def _gaps_pct(m: np.ndarray, b: np.ndarray, margin: float) -> np.ndarray:
    """Per-seed gap% = 100 (method - BP) / BP (from gradfidelity.stats.noninferiority where n >= 2)."""
    if len(m) >= 2:
        return np.array(noninferiority(m, b, margin).gaps_pct)
    return 100.0 * (m - b) / b


def cell_stats(df: pd.DataFrame, method: str, margin: float) -> dict:
    """Everything the main table says about one method in one (corpus, width) cell."""
    al = _paired(df, method, "bp", "val_bpb")
    m_bpb, b_bpb = al.values
    n, lost = al.n, len(al.diverged)
    out = {"n": n, "diverged_seeds": lost}
    if n >= 2:
        ni = noninferiority(m_bpb, b_bpb, margin)
        out.update(mean_gap_pct=ni.mean_gap_pct, sd_gap_pct=ni.sd_gap_pct, upper_pct=ni.upper_pct,
                   non_inferior=ni.non_inferior)
        out["seeds_80pct"] = _seeds(ni.mean_gap_pct, ni.sd_gap_pct, margin)
    elif n == 1:
        out.update(mean_gap_pct=float(_gaps_pct(m_bpb, b_bpb, margin)[0]), upper_pct=math.nan)
    r = _ratio(*_paired(df, method, "bp", "tokens_per_s").values)
    out.update(ratio_vs_bp=r["ratio"], ratio_low=r["low"], ratio_high=r["high"])
    if method in ASYNC and (df.method == "bp_tm").any():
        r = _ratio(*_paired(df, method, "bp_tm", "tokens_per_s").values)
        out.update(ratio_vs_tm=r["ratio"], tm_low=r["low"], tm_high=r["high"])
        out.update(_decomposition(df, method))
    ok_rows = df[(df.status == "ok")]
    out["pss_bp_gib"] = ok_rows[ok_rows.method == "bp"].peak_pss_gib.mean()
    out["pss_method_gib"] = ok_rows[ok_rows.method == method].peak_pss_gib.mean()
    out["threads_bp"] = ok_rows[ok_rows.method == "bp"].compute_threads.max()
    out["threads_method"] = ok_rows[ok_rows.method == method].compute_threads.max()
    if lost:
        out["verdict"] = f"fails: diverged on {lost} seed(s)"
    elif n < 2:
        out["verdict"] = "no verdict (n < 2 seeds)"
    else:
        out["verdict"] = "non-inferior" if out["non_inferior"] else "not non-inferior"
    faster = out.get("ratio_low", math.nan) > 1
    out["joint"] = bool(out.get("non_inferior", False) and faster and not lost)
    return out


def _source(cell: pd.DataFrame) -> str:
    s = cell.corpus_source.dropna()
    return str(s.iloc[0]) if len(s) else "?"


# ----------------------------------------------------------------------------------------------- tables
def main_table(df: pd.DataFrame, s: LocalSettings) -> pd.DataFrame:
    rows = []
    for (corpus, width), cell in df.groupby(["corpus", "width"]):
        for method in [m for m in (*ASYNC, *SERIAL_LOCAL) if (cell.method == m).any()]:
            st = cell_stats(cell, method, s.margin_pct)
            rows.append({"corpus": corpus, "source": _source(cell), "width": width, "method": method, **st})
    return pd.DataFrame(rows)


def mechanism_table(df: pd.DataFrame, s: LocalSettings) -> pd.DataFrame:
    rows = []
    for (corpus, width), cell in df.groupby(["corpus", "width"]):
        if not (cell.method == "live_local").any():
            continue
        for method in [m for m in SERIAL_LOCAL if (cell.method == m).any()]:
            runs = cell[cell.method == method]
            ok = runs[runs.status == "ok"]
            row = {"corpus": corpus, "source": _source(cell), "width": width, "method": method, "n": len(ok),
                   "diverged": int((runs.status == "diverged").sum()), "mean_bpb": ok.val_bpb.mean(),
                   "sd_bpb": ok.val_bpb.std(ddof=1), "tokens_per_s": ok.tokens_per_s.mean()}
            st = cell_stats(cell, method, s.margin_pct)
            row.update({"mean_gap_vs_bp_pct": st.get("mean_gap_pct"), "upper_pct": st.get("upper_pct")})
            if method != "live_local":
                a, b = _paired(cell, method, "live_local", "val_bpb").values
                row["minus_live_local_bpb"] = float(np.mean(a - b)) if len(a) else math.nan
                if len(a) >= 2:
                    e = equivalence_tost(a, b, s.equivalence_bpb)
                    row.update(tost90_low=e["ci_low"], tost90_high=e["ci_high"], equivalent=e["equivalent"])
            rows.append(row)
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------------- claims
def _notes(al: Aligned) -> str:
    out = ""
    if al.diverged:
        per = "; ".join(f"seed {k}: {', '.join(arms)}" for k, arms in sorted(al.diverged.items()))
        out += f"; {len(al.diverged)} seed(s) dropped because a run diverged ({per})"
    if al.missing:
        out += f"; seed(s) {al.missing} lack a run of some arm"
    return out


def _vals(values) -> str:
    return "[" + ", ".join(f"{float(v):.5g}" for v in values) + "]"


def _evidence(al: Aligned, what: str, tables: list[str], make: Callable[..., tuple[dict, str]],
              need: int = 1) -> dict:
    """The record of one claim: `make(*per-arm values)` returns (record, what it found), or not_measured when fewer
    than `need` complete paired seeds remain. Every record gets its sources and the diverged seeds."""
    sources = list(dict.fromkeys([*al.sources, *tables]))
    notes = _notes(al)
    if al.n < need:
        return not_measured(f"{what}: {al.n} complete paired seed(s), needs >= {need}{notes}", n=al.n,
                            sources=sources, diverged=len(al.diverged))
    rec, found = make(*al.values)
    rec = dict(rec, detail=f"{what}: {found}{notes}", sources=sources)
    if al.diverged:
        rec["diverged"] = len(al.diverged)
    return rec


def claims(df: pd.DataFrame, s: LocalSettings, scale: str, tables: dict[str, str | Path] | None = None) -> dict:
    """The claim evidence file: {"study": "local", "scale": ..., "values": {claim id: evidence record}}.

    `tables`: paths of the aggregate, main and mechanism tables (keys aggregate, main, mechanism), named in the
    records' sources.
    """
    tables = {k: str(v) for k, v in (tables or {}).items()}
    main_src = [tables[k] for k in ("aggregate", "main") if k in tables]
    mech_src = [tables[k] for k in ("aggregate", "mechanism") if k in tables]
    W, vals = s.main_width, {}

    def src(corpus: str) -> str:
        return f"{corpus} ({_source(df[df.corpus == corpus])})"

    def threads(corpus: str, width: int, method: str) -> str:
        t = df[(df.corpus == corpus) & (df.width == width) & (df.method == method)].compute_threads.dropna()
        return f"{t.max():g}" if len(t) else "?"

    for cid, method in (("C1", "rgc_async"), ("C2", "broadcast_async")):
        def ratio(a, b, cid=cid):
            return paired_ratio(a, b, level_for(cid)), f"per-seed ratios {_vals(a / b)}"
        vals[cid] = _evidence(
            align(df, [("enwik8", W, method), ("enwik8", W, "bp")], "tokens_per_s"),
            f"{LABEL[method]} / BP tokens per s (geometric mean over paired seeds), width {W}, {src('enwik8')}, "
            f"threads {threads('enwik8', W, method)} vs {threads('enwik8', W, 'bp')}", main_src, ratio)

    vals["C3"] = _evidence(
        align(df, [("enwik8", W, "rgc_async"), ("enwik8", W, "bp")], "peak_pss_gib"),
        f"peak process-tree PSS RGC (async) / BP, width {W}, {src('enwik8')}", main_src,
        lambda a, b: (paired_ratio(a, b, level_for("C3")), f"GiB per seed RGC {_vals(a)}, BP {_vals(b)}"))

    def upper(m, b):
        ni = noninferiority(m, b, s.margin_pct)
        return exact(ni.upper_pct, n=ni.n), (
            f"mean gap {ni.mean_gap_pct:.4g}%, sd {ni.sd_gap_pct:.4g}, one-sided 95% upper bound {ni.upper_pct:.4g}% "
            f"vs margin {s.margin_pct}% (non-inferior: {ni.non_inferior}); per-seed gaps {_vals(ni.gaps_pct)}; "
            f"seeds for 80% power {_seeds(ni.mean_gap_pct, ni.sd_gap_pct, s.margin_pct):g}")
    vals["C4"] = _evidence(align(df, [("enwik8", W, "broadcast_async"), ("enwik8", W, "bp")], "val_bpb"),
                           f"gap % Broadcast (async) vs BP, width {W}, {src('enwik8')}", main_src, upper, need=2)

    def gap(m, b):
        g = _gaps_pct(m, b, s.margin_pct)
        return mean_ci(g, level_for("C6")), f"per-seed gaps % {_vals(g)}"
    vals["C6"] = _evidence(align(df, [("tinystories", W, "broadcast_async"), ("tinystories", W, "bp")], "val_bpb"),
                           f"mean gap % Broadcast (async) vs BP, width {W}, {src('tinystories')}", main_src, gap)

    ws = sorted(df[(df.corpus == "enwik8") & (df.method == "broadcast_async")].width.unique())
    if len(ws) >= 2:
        lo, hi = int(ws[0]), int(ws[-1])

        def trend(a_lo, b_lo, a_hi, b_hi):
            r_lo, r_hi = a_lo / b_lo, a_hi / b_hi
            return mean_ci(r_lo - r_hi, level_for("C7")), (f"per-seed ratios {_vals(r_lo)} at width {lo}, "
                                                            f"{_vals(r_hi)} at width {hi}")
        arms = [("enwik8", lo, "broadcast_async"), ("enwik8", lo, "bp"), ("enwik8", hi, "broadcast_async"),
                ("enwik8", hi, "bp")]
        vals["C7"] = _evidence(align(df, arms, "tokens_per_s"),
                               f"Broadcast (async) / BP tokens per s at width {lo} minus at width {hi}, "
                               f"{src('enwik8')}", main_src, trend)
    else:
        vals["C7"] = not_measured(f"only width(s) {[int(w) for w in ws]} of Broadcast (async) on enwik8 at this "
                                  "scale; the trend needs two", sources=main_src)

    mc, mw = s.mechanism_corpora[0], s.mechanism_widths[0]
    vals["C8"] = _evidence(
        align(df, [(mc, mw, "broadcast_serial"), (mc, mw, "rgc_serial")], "val_bpb"),
        f"held-out bits per byte Broadcast (serial) - RGC (serial), width {mw}, {src(mc)}", mech_src,
        lambda a, b: (paired_difference(a, b, level_for("C8")), f"per-seed differences {_vals(a - b)}"))

    def tost(a, b):
        e = equivalence_tost(a, b, s.equivalence_bpb)
        return exact(e["max_abs_ci"], n=e["n"]), (
            f"mean {e['mean_diff']:.5f} bpb, 90% CI {e['ci_low']:.5f} to {e['ci_high']:.5f}, largest |end| "
            f"{e['max_abs_ci']:.5f}; equivalent within +-{s.equivalence_bpb}: {e['equivalent']}; per-seed "
            f"differences {_vals(a - b)}")
    vals["C9"] = _evidence(align(df, [(mc, mw, "rgc_serial"), (mc, mw, "live_local")], "val_bpb"),
                           f"TOST of RGC (serial) - Live Local, bits per byte, width {mw}, {src(mc)}", mech_src,
                           tost, need=2)

    def system(ba, tm, bp):
        rr = (ba / tm) / (ba / bp)
        return mean_ci(rr, level_for("C10")), (f"per-seed ratios vs thread-matched BP {_vals(ba / tm)}, vs BP "
                                               f"{_vals(ba / bp)}, ratio of ratios {_vals(rr)}")
    vals["C10"] = _evidence(
        align(df, [("enwik8", W, "broadcast_async"), ("enwik8", W, "bp_tm"), ("enwik8", W, "bp")], "tokens_per_s"),
        f"(Broadcast (async) / thread-matched BP) / (Broadcast (async) / BP) tokens per s, width {W}, "
        f"{src('enwik8')}, threads BP {threads('enwik8', W, 'bp')}, thread-matched BP "
        f"{threads('enwik8', W, 'bp_tm')}, async {threads('enwik8', W, 'broadcast_async')}", main_src, system)
    return {"study": "local", "scale": scale, "values": vals}


# ----------------------------------------------------------------------------------------------- figures
def frontier_figure(main: pd.DataFrame, s: LocalSettings, path: Path) -> None:
    sub = main[main.width == s.main_width]
    corpora = sorted(sub.corpus.unique())
    fig, axes = new_figure(ncols=max(1, len(corpora)), width=4.2, height=3.4)
    for ax, corpus in zip(axes[0], corpora, strict=False):
        c = sub[sub.corpus == corpus]
        pss_bp = c.pss_bp_gib.iloc[0]
        ax.scatter([1.0], [0.0], s=400 * pss_bp, c="k", alpha=0.6, label=f"BP ({pss_bp:.2f} GiB)")
        for _, r in c.iterrows():
            xerr = None
            if np.isfinite(r.ratio_low):
                xerr = [[r.ratio_vs_bp - r.ratio_low], [r.ratio_high - r.ratio_vs_bp]]
            ax.errorbar(r.ratio_vs_bp, r.mean_gap_pct, xerr=xerr, fmt="none", ecolor="0.6", lw=0.8)
            ax.scatter(r.ratio_vs_bp, r.mean_gap_pct, s=400 * r.pss_method_gib, alpha=0.6,
                       label=f"{LABEL[r.method]} ({r.pss_method_gib:.2f} GiB)")
            if np.isfinite(r.get("upper_pct", math.nan)):
                ax.plot([r.ratio_vs_bp] * 2, [r.mean_gap_pct, r.upper_pct], color="0.3", lw=0.8, ls=":")
        ax.axhline(s.margin_pct, color="r", lw=0.8, ls="--")
        ax.set_xscale("log")  # ratios; with 2 seeds the t intervals span decades
        style_axes(ax, title=f"{corpus} ({c.source.iloc[0]}), width {s.main_width}",
                   xlabel="throughput / BP (paired 95% CI)", ylabel="mean gap % vs BP (dotted: 95% upper bound)")
        ax.legend(fontsize=6)
    save_figure(fig, path, caption="Quality-throughput-memory frontier: marker area ~ peak process-tree PSS; "
                "red dashed line: the 1% non-inferiority margin.")


def width_figure(main: pd.DataFrame, path: Path) -> None:
    fig, axes = new_figure(ncols=2, width=4.0, height=3.2)
    sub = main[main.method.isin(ASYNC)]
    for (corpus, method), g in sub.groupby(["corpus", "method"]):
        g = g.sort_values("width")
        yerr = [g.ratio_vs_bp - g.ratio_low, g.ratio_high - g.ratio_vs_bp]
        line = axes[0][0].errorbar(g.width, g.ratio_vs_bp, yerr=yerr if g.ratio_low.notna().all() else None,
                                   marker="o", capsize=2, label=f"{LABEL[method]}, {corpus}")
        if "ratio_vs_tm" in g:
            axes[0][0].plot(g.width, g.ratio_vs_tm, ls="--", marker="x", color=line[0].get_color())
        axes[0][1].plot(g.width, g.mean_gap_pct, marker="o", label=f"{LABEL[method]}, {corpus}")
    axes[0][0].axhline(1.0, color="k", lw=0.8)
    axes[0][0].set_yscale("log")
    style_axes(axes[0][0], title="speed-up vs width", xlabel="width", ylabel="throughput / BP (dashed: / thread-"
               "matched BP)")
    style_axes(axes[0][1], title="quality gap vs width", xlabel="width", ylabel="mean gap % vs BP")
    axes[0][0].legend(fontsize=6)
    save_figure(fig, path, caption="Async speed-up (paired 95% CI) and mean bits-per-byte gap against BP by width.")


# ----------------------------------------------------------------------------------------------- entry
def _fmt(df: pd.DataFrame) -> pd.DataFrame:
    out = df.copy()
    out["method"] = out.method.map(LABEL)
    return out


def _ci(r, mid: str, lo: str, hi: str) -> str:
    if mid not in r or not np.isfinite(r[mid]):
        return ""
    return f"{r[mid]:.3f} ({r[lo]:.3f}-{r[hi]:.3f})" if np.isfinite(r[lo]) else f"{r[mid]:.3f}"


def _readable_main(main: pd.DataFrame) -> pd.DataFrame:
    """The Markdown view: CIs as one cell, the decomposition as one cell; the CSV keeps every column."""
    rows = []
    for _, r in main.iterrows():
        dec = (f"{r['work_ratio']:.2f} x {r['parallelism']:.2f} x {r['orchestration_eff']:.2f} "
               f"(imb. {r['imbalance']:.2f})") if np.isfinite(r.get("work_ratio", math.nan)) else ""
        rows.append({
            "corpus": f"{r.corpus} ({r.source})", "width": r.width, "method": LABEL[r.method], "n": r.n,
            "diverged": r.diverged_seeds,
            "threads (BP/method)": f"{r.threads_bp:g}/{r.threads_method:g}",
            "x BP (95% CI)": _ci(r, "ratio_vs_bp", "ratio_low", "ratio_high"),
            "x thread-matched BP (95% CI)": _ci(r, "ratio_vs_tm", "tm_low", "tm_high"),
            "work x parallel x orch.": dec,
            "PSS GiB (BP/method)": f"{r.pss_bp_gib:.3f}/{r.pss_method_gib:.3f}",
            "mean gap %": r.get("mean_gap_pct"), "upper %": r.get("upper_pct"),
            "seeds 80%": r.get("seeds_80pct"), "verdict": r.verdict, "joint": r.joint,
        })
    return pd.DataFrame(rows)


def report(paths: list[str], s: LocalSettings, scale: str, out: dict[str, Path]) -> None:
    df = aggregate(paths, scale=scale)
    atomic_write_csv(df, out["aggregate"])
    main = main_table(df, s)
    mech = mechanism_table(df, s)
    src_note = ("corpus source `embedded` = the deterministic built-in stand-in corpus (no download possible on "
                "this machine), not the real enwik8/TinyStories")
    t = s.train
    write_table(_readable_main(main), out["main_csv"], out["main_md"], title="Study C: async local training vs BP",
                notes=[src_note,
                       f"{t.n_layer} layers, {t.n_stages} stages, {t.steps} steps of {t.batch_size}x{t.block_size} "
                       f"bytes; BP {t.bp_threads} thread(s), async {t.n_stages} processes x "
                       f"{t.threads_per_stage} thread(s), thread-matched BP {t.async_threads} threads",
                       "n = paired seeds in the statistics; diverged = paired seeds dropped because BP or the "
                       f"method diverged (their runs are listed in {out['aggregate']}); a diverged seed fails the "
                       "method's verdict",
                       "ratio = geometric mean of per-seed throughput ratios, low/high = paired 95% CI; "
                       "upper = one-sided 95% upper bound of the mean gap; margin "
                       f"{s.margin_pct}%; joint = non-inferior and CI low > 1",
                       "work x parallel x orch. = T_BP / sum(stage busy) x sum(busy) / max(busy) x max(busy) / "
                       "wall = the speed-up over BP; imb. = max/mean stage busy time (see analysis.py)",
                       "serial methods run in a separate job: their throughput is not time-paired with BP"])
    atomic_write_csv(_fmt(main), out["main_csv"])  # the CSV keeps every column
    write_table(_fmt(mech), out["mech_csv"], out["mech_md"], title="Study C mechanism: serial local methods",
                notes=[src_note, "n = finished runs of the method, diverged = its diverged runs (kept out of "
                       "every mean and interval)",
                       "minus_live_local_bpb and its 90% CI (TOST) against Live Local; equivalence "
                       f"bound +-{s.equivalence_bpb} bits per byte",
                       f"readout snapshot lag {t.readout_lag} steps, refreshed every {t.snapshot_every}"])
    frontier_figure(main, s, out["frontier"])
    width_figure(main, out["scaling"])
    tables = {"aggregate": out["aggregate"], "main": out["main_csv"], "mechanism": out["mech_csv"]}
    atomic_write_json(out["evidence"], claims(df, s, scale, tables))
