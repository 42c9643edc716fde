"""Tidy CSV -> the claim evidence of study C (`gradfidelity.claims.evidence`; intervals at `level_for(id)`).

  C1, C2  paired_ratio of tokens/s, async RGC (C1) / async Broadcast (C2) vs BP, enwik8 at the main width
  C3      paired_ratio of peak process-tree PSS (each method in a fresh process), async RGC vs BP, same cell
  C4      exact: one-sided 95% upper bound of the mean gap %, async Broadcast vs BP (the paper's decision statistic)
  C6      mean_ci of the per-seed gap %, async Broadcast vs BP, TinyStories at the main width
  C7      mean_ci of the per-seed (ratio at the smallest width - ratio at the largest), async Broadcast / BP, enwik8
  C8      mean_ci of the per-seed bits-per-byte difference Broadcast serial - RGC serial (mechanism cell)
  C9      exact: largest |end| of the paired 90% CI (TOST) of RGC serial - Live Local (mechanism cell)
  C10     mean_ci of the per-seed (async Broadcast / best BP in budget) / (async Broadcast / BP), the best BP
          being the faster of BP and thread-matched BP in that cell (stats.best_bp; the choice is in the detail)

Diverged seeds (a seed enters a record only if every run the record needs on that seed finished ok):
- throughput and memory claims (C1, C2, C3, C7, C10): a diverged run has no meaningful rate, so its seed is
  excluded explicitly: `n` counts the survivors, `diverged` the dropped seeds, `detail` names them. With fewer
  than the registry's min_n survivors `verify` reports "not measured".
- quality claims (C4, C6, C8, C9): a divergence *is* a quality outcome, and the survivors alone would flatter the
  method (round 1: one of four seeds diverged, C4 reported n = 3 and stayed true). The claim is not measured
  (estimate null, the diverged seeds named), as in the other studies.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd

from gradfidelity.claims.evidence import exact, level_for, mean_ci, not_measured, paired_difference, paired_ratio
from gradfidelity.stats import equivalence_tost, noninferiority
from gradfidelity.studies.local.aggregate import LABEL, Aligned, align, source_of
from gradfidelity.studies.local.config import StudyConfig
from gradfidelity.studies.local.stats import best_bp, gaps_pct, seeds_80pct


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
              need: int = 1, quality: bool = False) -> dict:
    """The record of one claim: `make(*per-arm values)` returns (record, what it found), or not_measured when fewer
    than `need` complete paired seeds remain, or (quality claims) when any seed diverged."""
    sources = list(dict.fromkeys([*al.sources, *tables]))
    notes = _notes(al)
    if quality and al.diverged:
        return not_measured(f"{what}: not measured, a diverged run is a quality outcome that the surviving seeds "
                            f"would hide{notes}", n=al.n, sources=sources, diverged=len(al.diverged))
    if al.n < need:
        return not_measured(f"{what}: {al.n} complete paired seed(s), needs >= {need}{notes}", n=al.n,
                            sources=sources, diverged=len(al.diverged))
    rec, found = make(*al.values)
    rec = dict(rec, detail=f"{what}: {found}{notes}", sources=sources)
    if al.diverged:
        rec["diverged"] = len(al.diverged)
    return rec


def claims(df: pd.DataFrame, s: StudyConfig, scale: str, tables: dict[str, str | Path] | None = None) -> dict:
    """The claim evidence file: {"study": "local", "scale": ..., "values": {claim id: evidence record}}.

    `tables`: paths of the aggregate, main and mechanism tables (keys aggregate, main, mechanism), named in the
    records' sources. Reads main_width, margin_pct, equivalence_bpb, mechanism_corpora and mechanism_widths.
    """
    tables = {k: str(v) for k, v in (tables or {}).items()}
    main_src = [tables[k] for k in ("aggregate", "main") if k in tables]
    mech_src = [tables[k] for k in ("aggregate", "mechanism") if k in tables]
    W, vals = s.main_width, {}

    def src(corpus: str) -> str:
        return f"{corpus} ({source_of(df[df.corpus == corpus])})"

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
        f"peak process-tree PSS RGC (async) / BP, each in a fresh process, width {W}, {src('enwik8')}", main_src,
        lambda a, b: (paired_ratio(a, b, level_for("C3")), f"GiB per seed RGC {_vals(a)}, BP {_vals(b)}"))

    def upper(m, b):
        ni = noninferiority(m, b, s.margin_pct)
        return exact(ni.upper_pct, n=ni.n), (
            f"mean gap {ni.mean_gap_pct:.4g}%, sd {ni.sd_gap_pct:.4g}, one-sided 95% upper bound {ni.upper_pct:.4g}% "
            f"vs margin {s.margin_pct}% (non-inferior: {ni.non_inferior}); per-seed gaps {_vals(ni.gaps_pct)}; "
            f"seeds for 80% power {seeds_80pct(ni.mean_gap_pct, ni.sd_gap_pct, s.margin_pct):g}")
    vals["C4"] = _evidence(align(df, [("enwik8", W, "broadcast_async"), ("enwik8", W, "bp")], "val_bpb"),
                           f"gap % Broadcast (async) vs BP, width {W}, {src('enwik8')}", main_src, upper, need=2,
                           quality=True)

    def gap(m, b):
        g = gaps_pct(m, b, s.margin_pct)
        return mean_ci(g, level_for("C6")), f"per-seed gaps % {_vals(g)}"
    vals["C6"] = _evidence(align(df, [("tinystories", W, "broadcast_async"), ("tinystories", W, "bp")], "val_bpb"),
                           f"mean gap % Broadcast (async) vs BP, width {W}, {src('tinystories')}", main_src, gap,
                           quality=True)

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
        lambda a, b: (paired_difference(a, b, level_for("C8")), f"per-seed differences {_vals(a - b)}"),
        quality=True)

    def tost(a, b):
        e = equivalence_tost(a, b, s.equivalence_bpb)
        return exact(e["max_abs_ci"], n=e["n"]), (
            f"mean {e['mean_diff']:.5f} bpb, 90% CI {e['ci_low']:.5f} to {e['ci_high']:.5f}, largest |end| "
            f"{e['max_abs_ci']:.5f}; equivalent within +-{s.equivalence_bpb}: {e['equivalent']}; per-seed "
            f"differences {_vals(a - b)}")
    vals["C9"] = _evidence(align(df, [(mc, mw, "rgc_serial"), (mc, mw, "live_local")], "val_bpb"),
                           f"TOST of RGC (serial) - Live Local, bits per byte, width {mw}, {src(mc)}", mech_src,
                           tost, need=2, quality=True)

    cell = df[(df.corpus == "enwik8") & (df.width == W)]
    best = best_bp(cell)
    rates = ", ".join(f"{LABEL[k]} {v[1]:g} threads {v[0]:.4g} tokens/s" for k, v in best["rates"].items())

    def system(ba, tm, bp):
        rr = (ba / tm) / (ba / bp)
        return mean_ci(rr, level_for("C10")), (f"per-seed ratios vs best BP {_vals(ba / tm)}, vs BP "
                                               f"{_vals(ba / bp)}, ratio of ratios {_vals(rr)}")
    vals["C10"] = _evidence(
        align(df, [("enwik8", W, "broadcast_async"), ("enwik8", W, best["method"]), ("enwik8", W, "bp")],
              "tokens_per_s"),
        f"(Broadcast (async) / best BP in budget) / (Broadcast (async) / BP) tokens per s, width {W}, "
        f"{src('enwik8')}; best BP = {LABEL[best['method']]} (geometric means: {rates}); async threads "
        f"{threads('enwik8', W, 'broadcast_async')}", main_src, system)
    return {"study": "local", "scale": scale, "values": vals}


def write_claims(s: StudyConfig, scale: str, tables: dict[str, str | Path], out: Path) -> None:
    """The evidence file of the `local-claims` job, from the tidy CSV at tables["aggregate"]."""
    from gradfidelity.harness.io import atomic_write_json
    from gradfidelity.studies.local.aggregate import read_aggregate

    atomic_write_json(out, claims(read_aggregate(tables["aggregate"]), s, scale, tables))
