"""Tidy CSV -> the claim evidence of study C (`gradfidelity.claims.evidence`; intervals at `level_for(id)`).

  C1, C2  paired_ratio of tokens/s, async RGC (C1) / async Broadcast (C2) vs BP, main corpus at the main width
  C3      paired_ratio over the memory probe's seeds of (async RGC peak PSS - its own bare tree's) / (BP's - its
          own): the model's memory, interpreters cancelled (memory.py); gate: the model's memory reaches the
          interpreters' (else the probe is too small to say anything about the model); the raw ratio in the detail
  C4      mean_ci (90%, registry) of the per-seed gap %, Broadcast vs BP, decided on the interval against the 1%
          margin (issue 57): above it = worse beyond the margin, below it = non-inferior, across it = inconclusive.
          Broadcast = async where it ran, serial on the quality seeds (the same arithmetic bit for bit, checked on
          every seed that has both). Beside the verdict: the paper's test at the paper's n = 5 (the share of
          disjoint 5-seed blocks, in seed order, whose one-sided 95% upper bound exceeds the margin), the zero-gap
          control's spread (thread-matched BP vs BP), the n an 80% chance of a decision needs and its cost, and the
          retired rule's reading ("old rule: ...")
  C6      mean_ci of the per-seed gap %, async Broadcast vs BP, TinyStories at the main width; not measured on the
          embedded stand-in (it is not TinyStories-like text: a claim about TinyStories needs real text)
  C7      mean_ci of the per-seed (ratio at the smallest width - ratio at the largest), async Broadcast / BP
  C8      mean_ci of the per-seed bits-per-byte difference Broadcast - RGC, serial and async cells together when
          every seed that has both is bit-identical (the async runtime computes the serial method exactly), else
          the serial cells alone
  C9      mean_ci (90%, the TOST's interval) of the per-seed RGC serial - Live Local bits per byte, decided on the
          interval against the +-equivalence_bpb band (issue 57): wholly outside = not equivalent, wholly inside =
          equivalent, else inconclusive; beside it the paper's TOST at n = 5 over disjoint blocks, the zero-gap
          control's spread and the retired rule's reading
  C10     mean_ci of the per-seed (async Broadcast / best BP in budget) / (async Broadcast / BP), the best BP
          being the faster of BP and thread-matched BP in that cell (stats.best_bp; the choice is in the detail);
          not measured without the thread-matched arm, or where BP does not speed up with threads (the confound
          the claim is about cannot exist there)

Every record also carries `hosts` (the host types of the runs it read; its detail names them, and says so when a
contrast's arms come from more than one) and `power` (claims.evidence.POWER_SCHEMA: the deciding per-seed values,
what their interval must clear, on which side, at which level, the paper's effect where it converts to ours, and
the wall time one more seed of the claim's arms costs, from the committed runs' wall times).

Diverged seeds (a seed enters a record only if every run the record needs on that seed finished ok):
- throughput and memory claims (C1, C2, C3, C7, C10): a diverged run has no meaningful rate, so its seed is
  excluded explicitly: `n` counts the survivors, `diverged` the dropped seeds, `detail` names them. With fewer
  than the registry's min_n survivors `verify` reports "not measured".
- quality claims (C4, C6, C8, C9): a divergence *is* a quality outcome, and the survivors alone would flatter the
  method (round 1: one of four seeds diverged, C4 reported n = 3 and stayed true). The claim is not measured
  (estimate null, the diverged seeds named), as in the other studies.

Sources: the run directories (each with its committed metrics.json and provenance.json), the runs table that
collects them (results/<scale>/runs/local.csv) and the paper tables; never the tidy CSV, a build product.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from gradfidelity.claims.evidence import gate, level_for, mean_ci, not_measured, paired_ratio
from gradfidelity.claims.verdict import NOT_MEASURED
from gradfidelity.claims.verify import interval_verdict
from gradfidelity.stats import equivalence_tost, noninferiority
from gradfidelity.stats.power import decision_probability, seeds_to_decide
from gradfidelity.studies.local.aggregate import LABEL, Aligned, align, corpus_label, hosts_of, seed_wall_s, source_of
from gradfidelity.studies.local.config import StudyConfig
from gradfidelity.studies.local.stats import (
    CONTROL,
    POOLED,
    best_bp,
    blocks,
    gaps_pct,
    pooled_broadcast,
)

# 5: C4 and C9 decided on their interval against the margin / band, the control rule retired (issue 57);
# every record carries hosts and power
EVIDENCE_VERSION = 5
PAPER_GAP_PCT = 0.841  # C4's paper value: the mean gap of async Broadcast vs BP (registry, docs/sources.md)
PAPER_N = 5  # the paper's paired seeds: its own test is read on disjoint blocks of this size
PAPER_RATIO = {"C1": 1.382, "C2": 1.369}  # the paper's speed-ups (registry): log ratios on our scale


@dataclass(frozen=True)
class Decision:
    """What the power table reads of a claim (POWER_SCHEMA): the deciding statistic per seed, what the interval of
    its mean must clear and on which side, its unit, and the paper's effect on the same scale where it converts."""

    cid: str
    statistic: str
    threshold: float | tuple[float, float]
    side: str
    unit: str
    paper_effect: float | None = None
    note: str = ""

    def power(self, per_seed, wall: tuple[float | None, str]) -> dict:
        out = {"statistic": self.statistic, "per_seed": [float(v) for v in per_seed],
               "threshold": list(self.threshold) if isinstance(self.threshold, tuple) else float(self.threshold),
               "side": self.side, "level": level_for(self.cid), "wall_s_per_seed": wall[0],
               "paper_effect": self.paper_effect, "unit": self.unit}
        note = "; ".join(x for x in (self.note, f"one more seed: {wall[1]}") if x)
        return dict(out, note=note)

    def not_applicable(self, why: str) -> dict:
        return {"statistic": self.statistic, "not_applicable": why}


def _notes(al: Aligned) -> str:
    out = ""
    if al.diverged:
        per = "; ".join(f"seed {k}: {', '.join(arms)}" for k, arms in sorted(al.diverged.items()))
        out += f"; {len(al.diverged)} seed(s) dropped because a run diverged ({per})"
    if al.missing:  # by design (e.g. the power cells run BP and Broadcast only) or a run that is not there
        out += "; not paired: " + "; ".join(f"{arm} on seed(s) {seeds}" for arm, seeds in al.absent.items())
    return out


def _interval(rec: dict) -> str:
    return f" [{rec['low']:.3f}, {rec['high']:.3f}]" if rec.get("low") is not None else " (one seed: no interval)"


def _vals(values) -> str:
    return "[" + ", ".join(f"{float(v):.5g}" for v in values) + "]"


def _hosts(df: pd.DataFrame, run_dirs: Iterable[str]) -> tuple[list[str], str]:
    """The host types of the runs among `run_dirs`, and the detail's phrase: one host type named, or every arm's
    host types where the runs come from more than one (a contrast across host types says so)."""
    run_dirs = {str(r) for r in run_dirs}
    hosts = hosts_of(df, run_dirs)
    if not hosts:
        return [], "host type: no run"
    if len(hosts) == 1:
        return hosts, f"host type: {hosts[0]}"
    rows = df[df.run_dir.astype(str).isin(run_dirs)]
    per_arm = "; ".join(f"{LABEL.get(m, m)} w{w}: {', '.join(hosts_of(g, g.run_dir))}"
                        for (m, w), g in rows.groupby(["method", "width"]))
    return hosts, (f"host types: {len(hosts)}, the contrast's runs mix them, and no drift between them is measured "
                   f"here ({per_arm})")


def _finish(rec: dict, df: pd.DataFrame, run_dirs: Iterable[str], power: dict) -> dict:
    hosts, text = _hosts(df, run_dirs)
    detail = rec.get("detail") or ""
    return dict(rec, hosts=hosts, power=power, detail=f"{detail}; {text}" if detail else text)


def _evidence(df: pd.DataFrame, al: Aligned, what: str, tables: list[str],
              make: Callable[..., tuple[dict, str, np.ndarray]], decision: Decision,
              wall: tuple[float | None, str], need: int = 1, quality: bool = False) -> dict:
    """The record of one claim: `make(*per-arm values)` returns (record, what it found, the deciding per-seed
    values), or not_measured when fewer than `need` complete paired seeds remain, or (quality claims) when any seed
    diverged. Hosts and power are added to every record."""
    sources = list(dict.fromkeys([*al.sources, *tables]))
    notes = _notes(al)
    if quality and al.diverged:
        why = (f"{what}: not measured, a diverged run is a quality outcome that the surviving seeds would hide"
               f"{notes}")
        rec = not_measured(why, n=al.n, sources=sources, diverged=len(al.diverged))
        return _finish(rec, df, al.sources, decision.not_applicable(why))
    if al.n < need:
        why = f"{what}: {al.n} complete paired seed(s), needs >= {need}{notes}"
        rec = not_measured(why, n=al.n, sources=sources, diverged=len(al.diverged))
        return _finish(rec, df, al.sources, decision.not_applicable(why))
    rec, found, per_seed = make(*al.values)
    rec = dict(rec, detail=f"{what}: {found}{notes}", sources=sources)
    if al.diverged:
        rec["diverged"] = len(al.diverged)
    return _finish(rec, df, al.sources, decision.power(per_seed, wall))


def claims(df: pd.DataFrame, s: StudyConfig, scale: str, tables: dict[str, str | Path] | None = None,
           mem: pd.DataFrame | None = None) -> dict:
    """The claim evidence file: {"study": "local", "scale": ..., "evidence_version": ..., "values": {claim id:
    evidence record}}.

    `tables`: paths named in the records' sources (keys runs: the runs table; main, mechanism, memory_table: the
    paper tables; the tidy CSVs aggregate and memory are build products and never cited); `mem`: the memory
    probes' tidy CSV (None: C3 not measured). Reads main_corpus, main_width, margin_pct, equivalence_bpb,
    mechanism_corpora and mechanism_widths.
    """
    tables = {k: str(v) for k, v in (tables or {}).items()}
    main_src = [tables[k] for k in ("runs", "main") if k in tables]
    mech_src = [tables[k] for k in ("runs", "mechanism") if k in tables]
    W, M, vals = s.main_width, s.main_corpus, {}

    def src(corpus: str) -> str:
        return corpus_label(df[df.corpus == corpus], corpus)

    def threads(corpus: str, width: int, method: str) -> str:
        t = df[(df.corpus == corpus) & (df.width == width) & (df.method == method)].compute_threads.dropna()
        return f"{t.max():g}" if len(t) else "?"

    for cid, method in (("C1", "rgc_async"), ("C2", "broadcast_async")):
        def ratio(a, b, cid=cid):
            return paired_ratio(a, b, level_for(cid)), f"per-seed ratios {_vals(a / b)}", np.log(a / b)
        arms = [(M, W, method), (M, W, "bp")]
        al = align(df, arms, "tokens_per_s")
        decision = Decision(cid, f"log tokens/s ratio {LABEL[method]} / BP", 0.0, "gt", "log ratio",
                            math.log(PAPER_RATIO[cid]), "the paper's speed-up on 31 cores, ours on this machine")
        vals[cid] = _evidence(
            df, al, f"{LABEL[method]} / BP tokens per s (geometric mean over paired seeds), width {W}, {src(M)}, "
            f"threads {threads(M, W, method)} vs {threads(M, W, 'bp')}", main_src, ratio, decision,
            seed_wall_s(df, arms, al.seeds))

    vals["C3"] = memory_evidence(mem, [tables[k] for k in ("memory_table", "runs") if k in tables])
    vals["C4"] = _c4(df, s, f"gap % Broadcast vs BP, width {W}, {src(M)}", main_src)

    ts = df[df.corpus == "tinystories"]
    c6 = Decision("C6", "gap % async Broadcast vs BP, TinyStories", 2.5, "gt", "%",
                  note="the paper states > 2.5%, no point value")
    if ts.empty or source_of(ts) in ("embedded", "?"):
        what = ("no tinystories corpus is trained at this scale" if ts.empty else
                "the tinystories corpus at this scale is the embedded stand-in, which is not TinyStories-like text "
                "(on real TinyStories BP reaches about 2.7 bits per byte at the cpu budget, on the stand-in 0.27)")
        why = (f"not measured: {what}; a claim about TinyStories is decided only on real text: give "
               "local.corpora.tinystories a file (source: file) of TinyStories-like stories")
        vals["C6"] = _finish(not_measured(why, sources=main_src), df, ts.run_dir, c6.not_applicable(why))
    else:
        def gap(m, b):
            g = gaps_pct(m, b, s.margin_pct)
            return mean_ci(g, level_for("C6")), f"per-seed gaps % {_vals(g)}", g
        arms = [("tinystories", W, "broadcast_async"), ("tinystories", W, "bp")]
        al = align(df, arms, "val_bpb")
        vals["C6"] = _evidence(df, al, f"mean gap % Broadcast (async) vs BP, width {W}, {src('tinystories')}",
                               main_src, gap, c6, seed_wall_s(df, arms, al.seeds), quality=True)

    vals["C7"] = _c7(df, M, src(M), main_src)
    mc, mw = s.mechanism_corpora[0], s.mechanism_widths[0]
    vals["C8"] = _c8(df, mc, mw, f"held-out bits per byte Broadcast - RGC, width {mw}, {src(mc)}", mech_src)
    vals["C9"] = _c9(df, s, f"RGC (serial) - Live Local, bits per byte, width {mw}, {src(mc)}", mech_src)
    vals["C10"] = _c10(df, M, W, src(M), threads(M, W, "broadcast_async"), main_src)
    return {"study": "local", "scale": scale, "evidence_version": EVIDENCE_VERSION, "values": vals}


def write_claims(s: StudyConfig, scale: str, tables: dict[str, str | Path], out: Path) -> None:
    """The evidence file of the `local-claims` job, from the tidy CSV at tables["aggregate"]. The records cite the
    runs table of the same results root (results/<scale>/runs/local.csv, the committed collection of these runs:
    report.smk's runs_table) unless tables["runs"] names another."""
    from gradfidelity.harness.io import atomic_write_json
    from gradfidelity.studies.local.aggregate import read_aggregate, read_memory

    tables = dict(tables)
    tables.setdefault("runs", str(Path(tables["aggregate"]).parents[1] / "runs" / "local.csv"))
    mem = read_memory(tables["memory"]) if tables.get("memory") else None
    atomic_write_json(out, claims(read_aggregate(tables["aggregate"]), s, scale, tables, mem))


def _on_seeds(al: Aligned, seeds: list[int]) -> tuple[list[int], list[np.ndarray]]:
    """The aligned values on those of `seeds` that `al` has (in that order), and the seeds it lacks."""
    at = {k: i for i, k in enumerate(al.seeds)}
    lacking = [k for k in seeds if k not in at]
    return lacking, [v[[at[k] for k in seeds if k in at]] for v in al.values]


def _block_fails(seeds: list[int], values: list[np.ndarray], fails: Callable[..., bool]) -> tuple[int, int]:
    """(failing blocks, blocks): a test on each disjoint block of the paper's n seeds, in seed order."""
    at = {k: i for i, k in enumerate(seeds)}
    bs = blocks(seeds, PAPER_N)
    return sum(bool(fails(*(v[[at[k] for k in b]] for v in values))) for b in bs), len(bs)


def _blocks_text(failed: int, n_blocks: int, what: str) -> str:
    if not n_blocks:
        return f"fewer than {PAPER_N} seeds, no block"
    return f"{failed} of {n_blocks} disjoint blocks of {PAPER_N} seeds (seed order) {what} ({failed / n_blocks:.0%})"


def _decided_text(effect: float, sd: float, n: int, bound: float, level: float, wall: float | None) -> str:
    """The chance that the interval clears `bound` (either way) at this n, at the measured mean and sd, and the n and
    added wall time an 80% chance needs (gradfidelity.stats.power: what the power table plans with)."""
    if not sd > 0:  # identical seeds: a zero-width interval, decided at any n unless it sits on the bound
        return f"per-seed sd 0: the interval has no width, {'not ' if effect == bound else ''}decided at any n"
    need = seeds_to_decide(effect, sd, bound, "gt", level)
    text = (f"chance that the {level:.0%} interval clears {bound:g} at the measured mean and sd: "
            f"{decision_probability(effect, sd, n, bound, 'gt', level):.0%} at n {n}; an 80% chance needs n ")
    if need is None:
        return text + "beyond the power table's cap"
    text += f"{need}"
    if need > n and wall is not None:
        text += f" ({need - n} more seeds, about {(need - n) * wall / 3600:.1f} h of wall at {wall:.0f} s a seed)"
    return text


def _c4(df: pd.DataFrame, s: StudyConfig, what: str, sources: list[str]) -> dict:
    """C4 on its interval against the margin (module docstring), the readings beside it in the detail."""
    M, W, margin, level = s.main_corpus, s.main_width, s.margin_pct, level_for("C4")
    pooled, how = pooled_broadcast(df, M, W)
    al = align(pd.concat([df, pooled], ignore_index=True), [(M, W, POOLED), (M, W, "bp")], "val_bpb")
    control = align(df, [(M, W, CONTROL), (M, W, "bp")], "val_bpb")
    # one more seed is a quality seed (BP and serial Broadcast, one-thread jobs two at a time) where the claim
    # already reads serial seeds, else an async one
    has_async = set(df[(df.corpus == M) & (df.width == W) & (df.method == "broadcast_async")].seed)
    serial_seeds = [k for k in al.seeds if k not in has_async]
    wall = (seed_wall_s(df, [(M, W, "bp"), (M, W, "broadcast_serial")], serial_seeds) if serial_seeds
            else seed_wall_s(df, [(M, W, "bp"), (M, W, "broadcast_async")], al.seeds))
    decision = Decision("C4", "gap % Broadcast vs BP", margin, "gt", "%", PAPER_GAP_PCT)

    def make(m, b):
        g = gaps_pct(m, b, margin)
        rec = mean_ci(g, level)
        ni = noninferiority(m, b, margin)  # the paper's test on every seed: the retired rule's statistic
        sd = ni.sd_gap_pct
        worse = stats.ttest_1samp(g, 0.0, alternative="greater").pvalue
        failed, n_blocks = _block_fails(al.seeds, [m, b],
                                        lambda x, y: not noninferiority(x, y, margin).non_inferior)
        found = (
            f"mean gap {rec['estimate']:.4g}% [{rec['low']:.4g}, {rec['high']:.4g}] ({level:.0%} CI; its upper end "
            f"is the paper's one-sided 95% bound) against the {margin:g}% margin: worse beyond the margin (lower "
            f"end above it) {rec['low'] > margin}, non-inferior (upper end below it) {rec['high'] < margin}; "
            f"worse than BP at all: one-sided p {worse:.2g}; paper's mean gap {PAPER_GAP_PCT}%; sd {sd:.4g}; "
            f"{_decided_text(rec['estimate'], sd, len(g), margin, level, wall[0])}; {how}; per-seed gaps "
            f"{_vals(g)}; the paper's test at the paper's n = {PAPER_N} (one-sided 95% upper bound > {margin:g}%): "
            f"{_blocks_text(failed, n_blocks, 'fail it')}; {_control_c4(control, al.seeds, margin, sd)}; "
            f"{_old_rule_c4(control, al.seeds, ni, margin)}")
        return rec, found, g

    rec = _evidence(df, al, what, sources, make, decision, wall, need=2, quality=True)
    return dict(rec, sources=list(dict.fromkeys([*rec["sources"], *_runs_on(df, control.arms, al.seeds)])))


def _runs_on(df: pd.DataFrame, arms: list[tuple[str, int, str]], seeds: list[int]) -> list[str]:
    """The run directories of `arms` on `seeds` (the control's runs a claim's detail reads)."""
    rows = df[df.seed.isin(seeds)]
    keep = pd.Series(False, index=rows.index)
    for corpus, width, method in arms:
        keep |= (rows.corpus == corpus) & (rows.width == width) & (rows.method == method)
    return list(rows[keep].run_dir.astype(str))


def _control_c4(control: Aligned, seeds: list[int], margin: float, sd: float) -> str:
    """The zero-gap control's spread on C4's seeds (a reading: it decides nothing since round 6)."""
    lacking, (tm, bp) = _on_seeds(control, seeds)
    what = "zero-gap control (BP thread-matched vs BP)"
    if len(tm) < 2:
        return f"{what}: fewer than 2 of C4's seeds"
    g = gaps_pct(tm, bp, margin)
    sd_c = float(np.std(g, ddof=1))
    ratio = f"{(sd / sd_c) ** 2:.3g}" if sd_c > 0 else "inf"
    return (f"{what}, n {len(g)} of C4's seeds{f' (not run on {lacking})' if lacking else ''}: mean gap "
            f"{float(np.mean(g)):.4g}%, sd {sd_c:.4g} (Broadcast vs BP sd {sd:.4g}, variance ratio {ratio})")


def _old_rule_c4(control: Aligned, seeds: list[int], ni, margin: float) -> str:
    """C4's reading under the rule of evidence version 2 (retired in round 6): the exact one-sided 95% upper bound
    against the margin, decided only where the same test passed on the zero-gap control at C4's seeds."""
    lacking, (tm, bp) = _on_seeds(control, seeds)
    head = (f"old rule: (evidence version 2, retired in round 6) one-sided 95% upper bound {ni.upper_pct:.4g}% "
            f"{'>' if ni.upper_pct > margin else '<='} {margin:g}%")
    if lacking or len(tm) < 2:
        return f"{head}, the zero-gap control not run on seed(s) {lacking}: {NOT_MEASURED}"
    null = noninferiority(tm, bp, margin)
    if not null.non_inferior:
        return f"{head}, the zero-gap control fails the same test (upper bound {null.upper_pct:.4g}%): {NOT_MEASURED}"
    verdict = interval_verdict({"kind": "gt", "threshold": margin}, ni.upper_pct, ni.upper_pct)
    return f"{head}, the zero-gap control passes (upper bound {null.upper_pct:.4g}%): {verdict}"


def _c9(df: pd.DataFrame, s: StudyConfig, what: str, sources: list[str]) -> dict:
    """C9 on its interval against the band (module docstring), the readings beside it in the detail."""
    mc, mw, bound, level = s.mechanism_corpora[0], s.mechanism_widths[0], s.equivalence_bpb, level_for("C9")
    arms = [(mc, mw, "rgc_serial"), (mc, mw, "live_local")]
    al = align(df, arms, "val_bpb")
    control = align(df, [(mc, mw, CONTROL), (mc, mw, "bp")], "val_bpb")
    wall = seed_wall_s(df, arms, al.seeds)
    decision = Decision("C9", "bits per byte RGC (serial) - Live Local", (-bound, bound), "outside", "bpb",
                        note="the paper reports no difference, only that equivalence is missed")

    def make(a, b):
        d = a - b
        rec = mean_ci(d, level)
        lo, hi = rec["low"], rec["high"]
        outside, inside = lo > bound or hi < -bound, -bound < lo and hi < bound
        edge, side = (bound, "greater") if rec["estimate"] >= 0 else (-bound, "less")
        t = stats.ttest_1samp(d, edge, alternative=side)
        missed, n_blocks = _block_fails(al.seeds, [a, b],
                                        lambda x, y: not equivalence_tost(x, y, bound, level)["equivalent"])
        found = (
            f"mean {rec['estimate']:.5f} bpb, {level:.0%} CI [{lo:.5f}, {hi:.5f}] (the TOST's interval) against the "
            f"band +-{bound:g}: wholly outside (not equivalent) {outside}, wholly inside (equivalent) {inside}; "
            f"one-sided t that the difference lies beyond the band's {edge:+g} edge: t = {t.statistic:.3g}, "
            f"p = {t.pvalue:.2g}; sd {float(np.std(d, ddof=1)):.4g}; per-seed differences {_vals(d)}; the paper's "
            f"TOST at the paper's n = {PAPER_N}: {_blocks_text(missed, n_blocks, 'miss equivalence')}; "
            f"{_control_c9(control, al.seeds, level)}; {_old_rule_c9(control, al.seeds, a, b, bound)}")
        return rec, found, d

    rec = _evidence(df, al, what, sources, make, decision, wall, need=2, quality=True)
    return dict(rec, sources=list(dict.fromkeys([*rec["sources"], *_runs_on(df, control.arms, al.seeds)])))


def _control_c9(control: Aligned, seeds: list[int], level: float) -> str:
    """The zero-gap control's spread on C9's seeds (a reading: it decides nothing since round 6)."""
    lacking, (tm, bp) = _on_seeds(control, seeds)
    what = "zero-gap control (BP thread-matched - BP)"
    if len(tm) < 2:
        return f"{what}: fewer than 2 of C9's seeds"
    iv = mean_ci(tm - bp, level)
    return (f"{what}, n {iv['n']} of C9's seeds{f' (not run on {lacking})' if lacking else ''}: mean "
            f"{iv['estimate']:.5f} bpb, {level:.0%} CI [{iv['low']:.5f}, {iv['high']:.5f}], sd "
            f"{float(np.std(tm - bp, ddof=1)):.4g}")


def _old_rule_c9(control: Aligned, seeds: list[int], a: np.ndarray, b: np.ndarray, bound: float) -> str:
    """C9's reading under the rule of evidence version 2 (retired in round 6): the largest |end| of the TOST's 90%
    CI against the bound, decided only where the same TOST found the zero-gap control equivalent at C9's seeds."""
    e = equivalence_tost(a, b, bound)
    head = (f"old rule: (evidence version 2, retired in round 6) largest |end| of the 90% CI {e['max_abs_ci']:.5f} "
            f"vs {bound:g}")
    lacking, (tm, bp) = _on_seeds(control, seeds)
    if lacking or len(tm) < 2:
        return f"{head}, the zero-gap control not run on seed(s) {lacking}: {NOT_MEASURED}"
    null = equivalence_tost(tm, bp, bound)
    if not null["equivalent"]:
        return (f"{head}, the zero-gap control misses equivalence (90% CI {null['ci_low']:.5f} to "
                f"{null['ci_high']:.5f}): {NOT_MEASURED}")
    verdict = interval_verdict({"kind": "gt", "threshold": bound}, e["max_abs_ci"], e["max_abs_ci"])
    return f"{head}, the zero-gap control equivalent: {verdict}"


def _c7(df: pd.DataFrame, M: str, src: str, sources: list[str]) -> dict:
    decision = Decision("C7", "tokens/s ratio async Broadcast / BP, smallest minus largest width", 0.0, "gt", "ratio",
                        note="the paper's widths (128 -> 384) are not this scale's, so its effect does not convert")
    ws = sorted(df[(df.corpus == M) & (df.method == "broadcast_async")].width.unique())
    if len(ws) < 2:
        why = f"only width(s) {[int(w) for w in ws]} of Broadcast (async) on {M} at this scale; the trend needs two"
        runs = df[(df.corpus == M) & (df.method.isin(["broadcast_async", "bp"]))].run_dir
        return _finish(not_measured(why, sources=sources), df, runs, decision.not_applicable(why))
    lo, hi = int(ws[0]), int(ws[-1])

    def trend(a_lo, b_lo, a_hi, b_hi):
        r_lo, r_hi = a_lo / b_lo, a_hi / b_hi
        return (mean_ci(r_lo - r_hi, level_for("C7")),
                f"per-seed ratios {_vals(r_lo)} at width {lo}, {_vals(r_hi)} at width {hi}", r_lo - r_hi)
    arms = [(M, lo, "broadcast_async"), (M, lo, "bp"), (M, hi, "broadcast_async"), (M, hi, "bp")]
    al = align(df, arms, "tokens_per_s")
    return _evidence(df, al, f"Broadcast (async) / BP tokens per s at width {lo} minus at width {hi}, {src}",
                     sources, trend, decision, seed_wall_s(df, arms, al.seeds))


def _c8(df: pd.DataFrame, corpus: str, width: int, what: str, sources: list[str]) -> dict:
    """C8 on the serial and async cells together when they agree bit for bit on every seed that has both.

    The async runtime computes each serial method exactly (step-indexed readout snapshots), so an async pair of
    Broadcast and RGC is another seed of the same comparison: pooling adds the main cell's seeds for free. That is
    checked, not assumed: any seed where a serial and an async run of the same method differ at all keeps the
    claim on the serial cells alone, and the detail says so."""
    s_arms = [(corpus, width, "broadcast_serial"), (corpus, width, "rgc_serial")]
    serial = align(df, s_arms, "val_bpb")
    asyn = align(df, [(corpus, width, "broadcast_async"), (corpus, width, "rgc_async")], "val_bpb")
    both = sorted(set(serial.seeds) & set(asyn.seeds))
    si = {k: i for i, k in enumerate(serial.seeds)}
    ai = {k: i for i, k in enumerate(asyn.seeds)}
    differ = [k for k in both for j in (0, 1) if serial.values[j][si[k]] != asyn.values[j][ai[k]]]
    pooled = bool(both) and not differ
    diverged = {**asyn.diverged, **serial.diverged} if pooled else serial.diverged
    decision = Decision("C8", "bits per byte Broadcast - RGC", 0.0, "gt", "bpb",
                        note="the paper states RGC better, no value")
    runs = [*serial.sources, *(asyn.sources if pooled else [])]
    all_sources = list(dict.fromkeys([*runs, *sources]))
    if diverged:
        per = "; ".join(f"seed {k}: {', '.join(arms)}" for k, arms in sorted(diverged.items()))
        why = (f"{what}: not measured, a diverged run is a quality outcome that the surviving seeds would hide; "
               f"{len(diverged)} seed(s) dropped because a run diverged ({per})")
        rec = not_measured(why, n=len(serial.seeds), diverged=len(diverged),
                           sources=list(dict.fromkeys([*serial.sources, *asyn.sources, *sources])))
        return _finish(rec, df, [*serial.sources, *asyn.sources], decision.not_applicable(why))
    seeds = sorted(set(serial.seeds) | set(asyn.seeds)) if pooled else serial.seeds
    diff = np.array([(serial.values[0][si[k]] - serial.values[1][si[k]]) if k in si
                     else (asyn.values[0][ai[k]] - asyn.values[1][ai[k]]) for k in seeds])
    if pooled:
        how = (f"serial and async cells pooled: bit-identical on the {len(both)} seed(s) that have both {both}; "
               f"serial seeds {serial.seeds}, async seeds {asyn.seeds}")
    elif differ:
        how = (f"serial cells only: serial and async differ on seed(s) {sorted(set(differ))}, so the async cells "
               "are not the same computation")
    else:
        how = "serial cells only: no seed has both a serial and an async pair to show they are the same computation"
    if len(diff) == 0:
        why = f"{what}: no seed has a finished Broadcast and RGC pair ({how})"
        return _finish(not_measured(why, sources=all_sources), df, runs, decision.not_applicable(why))
    rec = mean_ci(diff, level_for("C8"))
    rec.update(detail=f"{what}: {how}; per-seed differences {_vals(diff)}", sources=all_sources)
    # one more seed: a serial pair (the mechanism cells), the way C8 grows without a timed main-cell job
    return _finish(rec, df, runs, decision.power(diff, seed_wall_s(df, s_arms, serial.seeds)))


def _c10(df: pd.DataFrame, M: str, W: int, src: str, async_threads: str, sources: list[str]) -> dict:
    cell = df[(df.corpus == M) & (df.width == W)]
    best = best_bp(cell)
    rates = ", ".join(f"{LABEL[k]} {v[1]:g} threads {v[0]:.4g} tokens/s" for k, v in best["rates"].items())
    what = f"(Broadcast (async) / best BP in budget) / (Broadcast (async) / BP) tokens per s, width {W}, {src}"
    decision = Decision("C10", "(Broadcast / best BP) / (Broadcast / BP) tokens/s", 1.0, "lt", "ratio",
                        note="the paper's 29 vs 24 threads do not convert to this machine's budget")
    speedup = align(df, [(M, W, CONTROL), (M, W, "bp")], "tokens_per_s")
    # thread-matched / 1-thread BP tokens per s, geometric mean over paired seeds: does BP scale with threads here?
    tm_bp = float(np.exp(np.mean(np.log(speedup.values[0] / speedup.values[1])))) if speedup.n else math.nan
    if speedup.n == 0:
        why = (f"{what}: not measured, the thread-matched BP arm ({CONTROL}) did not run at this scale, so there is "
               "no baseline with the async run's thread budget")
        return _finish(not_measured(why, sources=sources), df, speedup.sources, decision.not_applicable(why))
    if tm_bp <= 1:
        why = (f"{what}: not measured, BP does not speed up with threads within the budget on this machine (thread-"
               f"matched / 1-thread BP tokens per s {tm_bp:.3f}, {rates}), so the confound the claim is about (a "
               "speed-up bought with more threads) cannot exist here; the claim needs a machine where BP scales with "
               "threads (the many-core plan, README)")
        return _finish(not_measured(why, n=speedup.n, sources=sources), df, speedup.sources,
                       decision.not_applicable(why))

    def system(ba, tm, bp):
        rr = (ba / tm) / (ba / bp)
        return mean_ci(rr, level_for("C10")), (f"per-seed ratios vs best BP {_vals(ba / tm)}, vs BP "
                                               f"{_vals(ba / bp)}, ratio of ratios {_vals(rr)}"), rr
    arms = [(M, W, "broadcast_async"), (M, W, best["method"]), (M, W, "bp")]
    al = align(df, arms, "tokens_per_s")
    wall = seed_wall_s(df, list(dict.fromkeys(arms)), al.seeds)  # best BP may be BP itself: one run, not two
    return _evidence(df, al, f"{what}; best BP = {LABEL[best['method']]} (geometric means: {rates}); async threads "
                     f"{async_threads}", sources, system, decision, wall)


def memory_evidence(mem: pd.DataFrame | None, sources: list[str]) -> dict:
    """C3 from the memory probes: (async RGC - its own baseline) / (BP - its own baseline) per seed, with the gate
    that the model's memory reaches the interpreters' (else the ratio would again say more about processes)."""
    what = "peak process-tree PSS, (async RGC - its bare tree) / (BP - its bare tree)"
    decision = Decision("C3", "log ratio of the model's memory, async RGC / BP (each above its bare tree)", 0.0, "gt",
                        "log ratio", note="the paper's 2.2x is a ratio of raw peaks, interpreters included: it does "
                        "not convert to the baseline-subtracted ratio")
    if mem is None or mem.empty:
        why = f"{what}: not measured, no memory probe at this scale"
        return _finish(not_measured(why, sources=sources), pd.DataFrame({"run_dir": []}), [],
                       decision.not_applicable(why))
    a = mem[mem.method == "rgc_async"].set_index("seed")
    b = mem[mem.method == "bp"].set_index("seed")
    seeds = sorted(set(a.index) & set(b.index))
    runs = list(dict.fromkeys(mem.run_dir.astype(str)))
    sources = [*dict.fromkeys([*runs, *sources])]
    if not seeds:
        why = f"{what}: not measured, no probe seed has both methods"
        return _finish(not_measured(why, sources=sources), mem, runs, decision.not_applicable(why))
    ma, mb = a.loc[seeds, "model_gib"].to_numpy(float), b.loc[seeds, "model_gib"].to_numpy(float)
    shape = f"width {int(a.width.iloc[0])}, {int(a.n_layer.iloc[0])} layers"
    if (ma <= 0).any() or (mb <= 0).any():
        why = (f"{what}, {shape}: not measured, a method's peak with its model is not above its bare tree's (model "
               f"GiB RGC {_vals(ma)}, BP {_vals(mb)}): the probe is too small")
        return _finish(not_measured(why, n=len(seeds), sources=sources), mem, runs, decision.not_applicable(why))
    ba, bb = a.loc[seeds, "baseline_gib"].to_numpy(float), b.loc[seeds, "baseline_gib"].to_numpy(float)
    counts = bool((ma >= ba).all() and (mb >= bb).all())
    g = gate("model_state_counts", counts,
             f"the model's memory (peak - own baseline) reaches the interpreters' (the baseline): RGC "
             f"{ma.mean():.3f} vs {ba.mean():.3f} GiB, BP {mb.mean():.3f} vs {bb.mean():.3f} GiB"
             + ("" if counts else "; raise local.memory.width or n_layer"))
    raw = paired_ratio(a.loc[seeds, "pss_gib"].to_numpy(float), b.loc[seeds, "pss_gib"].to_numpy(float),
                       level_for("C3"))
    rec = paired_ratio(ma, mb, level_for("C3"), gates=[g])
    rec.update(sources=sources, detail=(
        f"{what}, {shape}, each measurement in a fresh process: per seed RGC {_vals(ma)} GiB, BP {_vals(mb)} GiB "
        f"above their baselines (RGC {_vals(ba)}, BP {_vals(bb)}); raw ratio of the peaks (interpreters included) "
        f"{raw['estimate']:.3f}{_interval(raw)}; analytic parameters + gradients + AdamW "
        f"state {float(b.state_gib.iloc[0]):.3f} GiB"))
    # one more seed: one probe (both methods, each beside its bare tree, in one job that owns the machine)
    walls = mem.drop_duplicates("run_dir").wall_s.dropna() if "wall_s" in mem else pd.Series(dtype=float)
    wall = ((float(walls.median()), f"{walls.median():.0f} s of wall a probe (median over {len(walls)} probes)")
            if len(walls) else (None, "no probe recorded its wall time"))
    return _finish(rec, mem, runs, decision.power(np.log(ma / mb), wall))
