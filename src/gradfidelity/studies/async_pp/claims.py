"""runs.csv -> the claim evidence of study B (B1-B9): one record per registry row, built with
`gradfidelity.claims.evidence` at the registry's level.

The currency is lost compute (issue 25): f = S*/T, the share of its budget an async run got, read per seed off the
sync ladder of its own optimizer, momentum and head (pairing.fractions, compute_fraction.py); lost = 1 - f. Every
statistic is computed per seed on the paired runs and then summarised over seeds with an interval. A seed on which a
run a statistic needs diverged (or is missing) is dropped from it, counted in the record's `diverged` and named in
its detail; a seed whose f lies outside its ladder makes the record "not measured" with that reason (f is never
extrapolated, and averaging the other seeds would hide the one that left the ladder).

The budget rule (issue 47, round 5; `budget_readings`): a claim is decided at T only if its verdict, by its own
registry check on its own interval, is the same at T and at 2T (every cell it reads at twice the budget, each f
against its own sync ladder), and the sync loss of every key it reads still falls from T to 2T (gate `sync_falls`).
Else the record carries the failed gate `budget`, "the verdict moves with the budget", with both budgets' estimates
and intervals and the paired change of each statistic labelled by what it shows (compute_fraction.drift_label).
Round 4's gate asked whether f itself is the same at T and 2T (a TOST within +-0.05): the wrong question for a
contrast (a common drift cannot flip a contrast of 0.24) and almost powerless at n = 5. Its reading is kept beside the
rule: in the detail of the absolute-threshold claims B1-abs and B2, and per claim in `budget_table`. B7, whose
statistic is itself a comparison across lengths, keeps its reference-length transient gate.

Round 6 (issue 57): an open claim says why (`BudgetReading.why_open`): 'moves' (a statistic that is open changes
from T to 2T with an interval that excludes 0, or the two verdicts sit on opposite sides of the bound) or 'imprecise
at 2T' (neither: more seeds could decide it). Each near-tie arm's two LRs are compared on the evaluation seeds
(`lr_checks`): a reading at an LR they reject is labelled so and the reading with only the near-ties they keep stands
beside it. Every record lists the host types of the runs it rests on at T and 2T (`hosts`; a contrast across two
says so with the drift measured between them, from the drift_*.csv given among the claim sources) and carries its
`power` (the per-seed values its t interval is computed on, its bound, the cost of one more seed).

Every async run a claim reads trains at its own schedule's LR (`lr~own`, issue 37: the paper does not state its
practice, so each arm at its own best LR is the primary); the sync-tuned reading is the tables' secondary column.

Each record's `computed_by` names the function of this module that called the evidence builder (`_stat`, `_b1`,
...): the names are part of the evidence file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from gradfidelity.claims.evidence import (
    gate,
    level_for,
    mean_ci,
    not_measured,
    paired_difference,
    power_not_applicable,
    power_record,
    weakest,
    with_parts,
)
from gradfidelity.claims.registry import load_registry
from gradfidelity.claims.verdict import INCONCLUSIVE, NOT_MEASURED, NOT_REPRODUCED, REPRODUCED
from gradfidelity.claims.verify import interval_verdict, judge
from gradfidelity.errors import UserError
from gradfidelity.harness.io import atomic_write_json
from gradfidelity.studies.async_pp.aggregate import read_runs
from gradfidelity.studies.async_pp.compute_fraction import drift_label
from gradfidelity.studies.async_pp.config import StudyConfig
from gradfidelity.studies.async_pp.pairing import (
    Fractions,
    Gaps,
    Spec,
    drift_between,
    fractions,
    hosts,
    read_drift,
    run_dirs,
    runs_by_host,
    sync_falls,
    transient,
    wall_per_seed,
)
from gradfidelity.studies.async_pp.plan import TUNED, gate_steps
from gradfidelity.tables import write_table

CLAIM_IDS = ("B1", "B1-abs", "B2", "B3", "B4", "B5-muon", "B5-adamw", "B6", "B7", "B8", "B9-sync_start",
             "B9-sync_cooldown", "B9-taylor")
B3_MIDDLE = ("soap", "adan", "lion")  # the registry's statement: these fall between Muon (largest f) and AdamW
# B1's ratio part: AdamW's log compute multiplier log(1/f) at least 3x Muon's (issue 37: on lost compute, bounded by 1,
# "3x" became impossible once Muon lost more than 0.29; the multiplier 1/f is unbounded; the paper's > 60% against
# about 6% lost are log multipliers of 0.92 and 0.062, a factor of 15).
B1_FACTOR = 3.0
# The registry rows' `evidence_version` this module computes (5: the budget rule says why an open claim is open,
# 'moves' or 'imprecise at 2T'; a near-tie reading at an LR the evaluation seeds reject is labelled so; every record
# carries its host types and its power, issue 57; 4: the budget rule, issue 47; 3: each arm at its own LR, the
# equivalence gate and per-part gates, B1's ratio on the log compute multiplier, issue 37; 2: lost compute and the
# transient gate, issue 25); raised together with the rows whenever a metric changes, so that evidence of the old
# metric is never judged by the new check.
EVIDENCE_VERSION = 5
# The absolute-threshold claims whose records also show round 4's TOST reading beside the budget rule's (issue 47).
TOST_READING = ("B1-abs", "B2")
WEAKEST = "deciding comparison: "  # how claims.evidence.weakest names the comparison that decides
_SEEDS = "_per_seed"  # the private key of a record's per-seed values (never written to the evidence file)
_WHAT = "_statistic"  # the private key of the statistic's name (the power record's `statistic`)
_WIDTH = "_width"  # the private key of the width a claim of the width ladder reads (0: the model's own)


def _gates(g: Gaps, cid: str, keys, steps: int | None = None) -> list[dict]:
    """The gate of each (optimizer, momentum, head) the claim reads, at its budget, by the view's gate mode: round
    4's transient gate (the old reading), the budget rule's sync_falls at T, or none (the rule's reading at 2T)."""
    if g.gate_mode == "none":
        return []
    check = transient if g.gate_mode == "transient" else sync_falls
    out = [check(g, o, momentum=m, head=h, steps=steps, level=level_for(cid), width=w) for o, m, h, w in keys]
    return [x[0] if isinstance(x, tuple) else x for x in out]


def _key(opt: str, momentum: float | None = None, head: str | None = None, width: int = 0) -> tuple:
    return opt, momentum, head, width


def widths_read(g: Gaps, optimizers: tuple[str, ...], min_n: int = 3) -> list[int]:
    """The widths (0 = the model's own) at which the f of every one of `optimizers` has at least `min_n` paired seeds
    at T (the claims' min_n), narrowest first (issue 60: B1, B1-abs and B2 read the widest, each narrower one is a
    reading beside it). Decided on the T view, so that both budgets of the budget rule read the same width."""
    base = g.at(steps=g.cfg.train.steps)
    out = [0]
    for w in sorted(r.d_model for r in g.cfg.sweeps.width.widths if set(optimizers) <= set(r.optimizers)):
        if fractions(base, {o: Spec(o, "2bw", width=w) for o in optimizers}).n >= min_n:
            out.append(w)
    return out


def _width_name(g: Gaps, width: int) -> str:
    return f"d {width or g.cfg.model.d_model}"


def _width_readings(g: Gaps, cid: str, optimizers: tuple[str, ...], read: int, widths: list[int], stat) -> str:
    """'; read at d 64, the widest width that ran; narrower: d 32: <stat>' (the width ladder, issue 60), where
    `stat(fr)` is the claim's statistic on one width's fractions as text; '' without a width ladder."""
    if len(widths) < 2 and not g.cfg.sweeps.width.widths:
        return ""
    text = f"; read at {_width_name(g, read)}, the widest width with the claim's min_n paired seeds"
    other = [w for w in widths if w != read]
    if other:
        parts = []
        for w in other:
            fr = fractions(g, {o: Spec(o, "2bw", width=w) for o in optimizers})
            parts.append(f"{_width_name(g, w)} ({fr.n} seeds): {stat(fr)}" if fr.n >= 2 and not
                         fr.defined(*optimizers) else f"{_width_name(g, w)}: undefined")
        text += "; narrower widths (readings): " + "; ".join(parts)
    return text


def _mean_text(values, level: float) -> str:
    from gradfidelity.stats.intervals import t_interval

    ci = t_interval(np.asarray(values, dtype=float), level)
    return f"{ci.estimate:.3f} [{ci.low:.3f}, {ci.high:.3f}]" if ci.low is not None else f"{ci.estimate:.3f}"


def _kw(fr: Fractions, src: list[str]) -> dict:
    return {"sources": fr.p.sources + src, "diverged": fr.p.diverged}


def _blocked(fr: Fractions, what: str, src: list[str], gates, *names: str) -> dict | None:
    """The not-measured record when a needed f is missing on every seed or outside its ladder on some seed."""
    if fr.n == 0:
        return not_measured(f"{what}: no seed has every run finished{fr.p.dropped_note()}", gates=gates,
                            **_kw(fr, src))
    why = fr.defined(*names)
    if why:
        return not_measured(f"{what} undefined: {why}{fr.p.dropped_note()}", n=fr.n, gates=gates, **_kw(fr, src))
    return None


def _stat(cid: str, fr: Fractions, values, what: str, src: list[str], gates, names: tuple[str, ...] = ()) -> dict:
    """A mean over seeds; `names`: the cells of `fr` it reads where that is not all of them (its sources)."""
    kw = _kw(fr, src)
    if names:
        kw["sources"] = fr.p.sources_for(*names) + src
    rec = mean_ci(values, level_for(cid), detail=f"{what}, per seed: {fr.p.per_seed(values)}{fr.p.dropped_note()}",
                  gates=gates, **kw)
    return _with_seeds(rec, fr, values, what)


def _diff(cid: str, fr: Fractions, a, b, what: str, src: list[str], gates=None, names: tuple[str, ...] = ()) -> dict:
    """A paired difference; `names`: the cells of `fr` it compares, so that its sources are the runs it reads (and
    its host types those runs'), not every run of the look-up."""
    d = np.asarray(a) - np.asarray(b)
    kw = _kw(fr, src)
    if names:
        kw["sources"] = fr.p.sources_for(*names) + src
    rec = paired_difference(a, b, level_for(cid), gates=gates, **kw,
                            detail=f"{what}, per seed: {fr.p.per_seed(d)}{fr.p.dropped_note()}")
    return _with_seeds(rec, fr, d, what)


def _with_seeds(rec: dict, fr: Fractions, values, what: str) -> dict:
    """The per-seed values behind a record and its statistic's name, kept (under private keys, stripped before the
    file is written) so that the budget rule can pair a statistic's change from T to 2T by seed, and the power
    record can carry the values the interval is computed on."""
    rec[_SEEDS] = {int(s): float(v) for s, v in zip(fr.p.seeds, values, strict=True)}
    rec[_WHAT] = what
    return rec


def _b1(g: Gaps, src: list[str]) -> dict[str, dict]:
    widths = widths_read(g, ("adamw", "muon"))
    w = widths[-1]
    fr = fractions(g, {"adamw": Spec("adamw", "2bw", width=w), "muon": Spec("muon", "2bw", width=w)})
    gates = _gates(g, "B1", [_key("adamw", width=w), _key("muon", width=w)])
    level = level_for("B1")
    at_width = _width_readings(
        g, "B1", ("adamw", "muon"), w, widths,
        lambda f: f"f(Muon) - f(AdamW) {_mean_text(f.f['muon'] - f.f['adamw'], level)}, AdamW lost "
                  f"{_mean_text(f.lost('adamw'), level)}")
    what = "f(Muon) - f(AdamW) and lost(AdamW) - 3 lost(Muon)"
    blocked = _blocked(fr, what, src, gates, "adamw", "muon")
    if blocked:
        b1 = with_parts({"difference": blocked, "ratio": blocked}, detail=blocked["detail"], gates=gates,
                        sources=blocked["sources"])
        return {"B1": dict(b1, **{_WIDTH: w}), "B1-abs": _b1_abs(g, src)}
    lost_a, lost_m = fr.lost("adamw"), fr.lost("muon")
    mult_a, mult_m = -np.log(fr.f["adamw"]), -np.log(fr.f["muon"])  # log compute multipliers log(1/f)
    parts = {"difference": _diff("B1", fr, fr.f["muon"], fr.f["adamw"], "f(Muon 2bw) - f(AdamW 2bw)", src),
             "ratio": _diff("B1", fr, mult_a, B1_FACTOR * mult_m,
                            f"log(1/f(AdamW)) - {B1_FACTOR:g} log(1/f(Muon)) (> 0: AdamW's log compute multiplier "
                            f"is at least {B1_FACTOR:g}x Muon's)", src)}
    rec = with_parts(parts, gates=gates, sources=fr.p.sources + src,
                     detail=f"Muon keeps more of its compute than AdamW (difference > 0) and AdamW's log compute "
                            f"multiplier log(1/f) is at least {B1_FACTOR:g}x Muon's (ratio part > 0); lost per seed "
                            f"adamw {fr.p.per_seed(lost_a)}, muon {fr.p.per_seed(lost_m)}; log(1/f) per seed adamw "
                            f"{fr.p.per_seed(mult_a)}, muon {fr.p.per_seed(mult_m)}{at_width}")
    if fr.p.diverged:
        rec["diverged"] = fr.p.diverged
    rec[_WIDTH] = w
    return {"B1": rec, "B1-abs": _b1_abs(g, src)}


def _lost_at_widest(g: Gaps, cid: str, opt: str, name: str, src: list[str]) -> tuple[dict, int]:
    """(the record, the width read) of `opt`'s 2bw lost compute alone, at the widest width where its f has min_n
    paired seeds, each narrower width's reading in its detail. B1-abs reads AdamW this way, so a Muon f off its
    ladder (which blocks B1) does not block it."""
    widths = widths_read(g, (opt,))
    w = widths[-1]
    fr = fractions(g, {opt: Spec(opt, "2bw", width=w)})
    gates = _gates(g, cid, [_key(opt, width=w)])
    what = f"{name} 2bw lost compute 1 - f"
    rec = _blocked(fr, what, src, gates, opt) or _stat(cid, fr, fr.lost(opt), what, src, gates)
    rec["detail"] += _width_readings(g, cid, (opt,), w, widths,
                                     lambda f: f"lost {_mean_text(f.lost(opt), level_for(cid))}")
    rec[_WIDTH] = w
    return rec, w


def _b1_abs(g: Gaps, src: list[str]) -> dict:
    return _lost_at_widest(g, "B1-abs", "adamw", "AdamW", src)[0]


def _b2(g: Gaps, src: list[str]) -> dict:
    rec, w = _lost_at_widest(g, "B2", "muon", "Muon", src)
    # the Muon-embedding arm (issue 60): Muon on every matrix, at the same width, beside the claim's arm
    if "muon_all" in _optimizers_at(g, w):
        level = level_for("B2")
        fa = fractions(g, {"muon_all": Spec("muon_all", "2bw", width=w)})
        rec["detail"] += (f"; beside it, muon_all (the embedding and head on Muon too) at {_width_name(g, w)}: "
                          + (f"lost {_mean_text(fa.lost('muon_all'), level)} ({fa.n} seeds)"
                             if fa.n >= 2 and not fa.defined("muon_all") else "undefined"))
    return rec


def _optimizers_at(g: Gaps, width: int) -> set[str]:
    """The optimizers whose f the plan trains at `width` (0: every f key's)."""
    from gradfidelity.studies.async_pp.plan import f_keys

    if not width:
        return {o for o, _m, _h in f_keys(g.cfg)}
    return set(g.cfg.sweeps.width.rung(width).optimizers)


def _b3(g: Gaps, src: list[str]) -> dict:
    """Per part (SOAP, Adan, Lion), each between AdamW and Muon, paired on its own seeds. A part reads f of AdamW,
    Muon and its own optimizer, so its gates are those three keys' (issue 47: round 4 gated a part on its own
    optimizer only and called that "its own passing gate", though the part reads AdamW's and Muon's f too)."""
    parts, sources, dropped = {}, list(src), set()
    for o in B3_MIDDLE:
        gate_o = _gates(g, "B3", [_key("adamw"), _key("muon"), _key(o)])
        fr = fractions(g, {x: Spec(x, "2bw") for x in ("adamw", "muon", o)})
        sources += fr.p.sources
        dropped |= set(fr.p.dropped)
        failed = [x for x in gate_o if not x["passed"]]
        if failed:
            parts[o] = not_measured(f"{o}: gate failed: {failed[0]['reason']}", n=fr.n, gates=gate_o,
                                    **_kw(fr, src))
            continue
        blocked = _blocked(fr, f"f of Muon, AdamW and {o}", src, gate_o, "adamw", "muon", o)
        f = fr.f
        parts[o] = blocked or dict(weakest({
            f"muon - {o}": _diff("B3", fr, f["muon"], f[o], f"f(Muon 2bw) - f({o} 2bw)", src, names=("muon", o)),
            f"{o} - adamw": _diff("B3", fr, f[o], f["adamw"], f"f({o} 2bw) - f(AdamW 2bw)", src,
                                  names=(o, "adamw"))}), gates=gate_o)
    rec = with_parts(parts, sources=list(dict.fromkeys(sources)),
                     detail="f(AdamW) < f < f(Muon) for each of SOAP, Adan, Lion (both paired differences > 0); each "
                            "part gated on the three optimizers it reads (its record's gates)")
    if dropped:
        rec["diverged"] = len(dropped)
    return rec


def _b4(g: Gaps, src: list[str]) -> dict:
    sw = g.cfg.sweeps.momentum
    opts, moms = list(sw.optimizers), [float(m) for m in sw.momenta]
    fr = fractions(g, {f"{o}/{m}": Spec(o, "2bw", momentum=m) for o in opts for m in moms})
    gates = _gates(g, "B4", [_key(o, m) for o in opts for m in moms])
    what = f"mean over {', '.join(opts)} of Spearman(momentum, lost compute) over momenta {moms}, each at its own LR"
    blocked = _blocked(fr, what, src, gates, *fr.f)
    if blocked:
        return blocked
    rhos, constant = [], []
    for i, seed in enumerate(fr.p.seeds):
        per_opt = []
        for o in opts:
            lost = [1.0 - fr.f[f"{o}/{m}"][i] for m in moms]
            if len(set(lost)) == 1:  # Spearman's rho is undefined for a constant input
                constant.append(f"seed {seed} {o}")
                continue
            per_opt.append(float(spearmanr(moms, lost).statistic))
        rhos.append(float(np.mean(per_opt)) if len(per_opt) == len(opts) else math.nan)
    if len(moms) < 2 or constant:
        why = "fewer than two momenta" if len(moms) < 2 else f"lost compute constant over momentum for {constant}"
        return not_measured(f"{what} undefined: {why}", n=fr.n, gates=gates, **_kw(fr, src))
    return _stat("B4", fr, rhos, what, src, gates)


def _b5(g: Gaps, opt: str, cid: str, src: list[str]) -> dict:
    fr = fractions(g, {"2bw": Spec(opt, "2bw"), "ef": Spec(opt, "2bw", "error_feedback")})
    gates = _gates(g, cid, [_key(opt)])
    what = f"{opt} EF recovery of lost compute % = 100 (f(async+EF) - f(async)) / (1 - f(async))"
    blocked = _blocked(fr, what, src, gates, "2bw", "ef")
    if blocked:
        return blocked
    lost = fr.lost("2bw")
    if not (lost > 0).all():
        return not_measured(f"{what} undefined: async loses no compute on some seed (lost per seed "
                            f"{fr.p.per_seed(lost)}){fr.p.dropped_note()}", n=fr.n, gates=gates, **_kw(fr, src))
    return _stat(cid, fr, 100 * (fr.f["ef"] - fr.f["2bw"]) / lost, what, src, gates)


def _b6(g: Gaps, src: list[str]) -> dict:
    sw = g.cfg.sweeps.depth
    depths = sorted(int(P) for P in sw.depths)
    if "pipedream" not in sw.schedules or not sw.optimizers:
        rec = not_measured("the depth sweep has no 'pipedream' schedule or no optimizer", sources=src)
        return with_parts({"growth": rec, "excess": rec}, detail=rec["detail"], sources=src)
    gates = _gates(g, "B6", [_key(o, head="untied") for o in sw.optimizers])
    growth, excess, sources, dropped = {}, {}, list(src), set()
    for o in sw.optimizers:
        asyncs = {"2bw": Spec(o, "2bw", head="untied")} | {f"P{P}": Spec(o, "pipedream", depth=P, head="untied")
                                                           for P in depths}
        fr = fractions(g, asyncs)
        sources += fr.p.sources
        dropped |= set(fr.p.dropped)
        blocked = _blocked(fr, f"{o} lost compute by depth", src, None, *asyncs)
        # each comparison named by its two arms (issue 57: round 5's near-tie reading was attributed to an arm the
        # deciding comparison does not read)
        for P, Q in zip(depths, depths[1:], strict=False):
            growth[f"{o} P{Q} - {o} P{P}"] = blocked or _diff(
                "B6", fr, fr.lost(f"P{Q}"), fr.lost(f"P{P}"), f"{o} PipeDream lost compute at P{Q} minus at P{P}",
                src, names=(f"P{Q}", f"P{P}"))
        for P in (P for P in depths if P > 2):
            excess[f"{o} P{P} - {o} 2bw"] = blocked or _diff(
                "B6", fr, fr.lost(f"P{P}"), fr.lost("2bw"), f"{o} PipeDream lost compute at P{P} minus {o} 2bw's",
                src, names=(f"P{P}", "2bw"))
    parts = {"growth": weakest(growth) if growth else not_measured("the depth sweep has fewer than two depths",
                                                                   sources=src),
             "excess": weakest(excess) if excess else not_measured("the depth sweep has no depth P > 2",
                                                                   sources=src)}
    rec = with_parts(parts, sources=list(dict.fromkeys(sources)), gates=gates,
                     detail="untied LM head (the last stage is fresh); lost compute = 1 - f against the untied sync "
                            "ladder; every comparison must hold; each part is decided by its weakest comparison")
    if dropped:
        rec["diverged"] = len(dropped)
    return rec


def _b7(g: Gaps, src: list[str]) -> dict:
    lengths = sorted(int(s) for s in g.cfg.sweeps.length.steps)
    if "muon" not in g.cfg.sweeps.length.optimizers or len(lengths) < 2:
        return not_measured("the length sweep lacks Muon or a second length", sources=src)
    longest = lengths[-1]
    tried = []
    for ref in lengths[:-1]:  # the reference: the smallest length whose transient gate passes
        gate_rec = transient(g, "muon", steps=ref, level=level_for("B7"))[0]
        tried.append(gate_rec)
        if gate_rec["passed"]:
            break
    else:
        return not_measured(f"Muon's transient gate fails at every length below the longest ({lengths[:-1]})",
                            gates=[dict(tried[-1], reason="; ".join(t["reason"] for t in tried))], sources=src)
    what = f"Muon f at {longest} steps - f at {ref} steps (the smallest length whose transient gate passes)"
    fr = fractions(g, {"ref": Spec("muon", "2bw", steps=ref), "long": Spec("muon", "2bw", steps=longest)})
    gates = [gate_rec]
    return _blocked(fr, what, src, gates, "ref", "long") or _diff("B7", fr, fr.f["long"], fr.f["ref"], what, src,
                                                                  gates)


def _b9(g: Gaps, mit: str, src: list[str]) -> dict:
    sw = g.cfg.sweeps.mitigation
    opts = list(sw.optimizers)
    what = f"mean over optimizers of lost(2bw+{mit}) - lost(2bw)"
    if mit not in sw.mitigations or not opts:
        return not_measured(f"{what}: the mitigation sweep does not run {mit}", sources=src)
    fr = fractions(g, {f"{o}/2bw": Spec(o, "2bw") for o in opts} | {f"{o}/{mit}": Spec(o, "2bw", mit) for o in opts})
    gates = _gates(g, f"B9-{mit}", [_key(o) for o in opts])
    blocked = _blocked(fr, what, src, gates, *fr.f)
    if blocked:
        return blocked
    diffs = np.mean([fr.lost(f"{o}/{mit}") - fr.lost(f"{o}/2bw") for o in opts], axis=0)
    return _stat(f"B9-{mit}", fr, diffs, f"{what} over {', '.join(opts)} (< 0: the mitigation wins compute back)",
                 src, gates)


def _all(g: Gaps, src: list[str]) -> dict[str, dict]:
    """Every claim's record on the view g (its budget and gate mode)."""
    out: dict[str, dict] = {}
    out.update(_b1(g, src))
    out["B2"] = _b2(g, src)
    out["B3"] = _b3(g, src)
    out["B4"] = _b4(g, src)
    out["B5-muon"] = _b5(g, "muon", "B5-muon", src)
    out["B5-adamw"] = _b5(g, "adamw", "B5-adamw", src)
    out["B6"] = _b6(g, src)
    for mit in ("sync_start", "sync_cooldown", "taylor"):
        out[f"B9-{mit}"] = _b9(g, mit, src)
    return out


def _records(rec: dict) -> dict[str | None, dict]:
    """The records a verdict is read from: the parts, else the record itself (key None)."""
    return dict(rec["parts"]) if rec.get("parts") else {None: rec}


def _checks(row: dict) -> dict[str | None, dict]:
    return dict(row["check"]["parts"]) if row["check"].get("parts") else {None: row["check"]}


def _reading(rec: dict) -> str:
    if rec.get("estimate") is None:
        return "no value"
    if rec.get("low") is None:
        return f"{rec['estimate']:+.4g} (n {rec['n']}, no interval)"
    return f"{rec['estimate']:+.4g} [{rec['low']:+.4g}, {rec['high']:+.4g}] (n {rec['n']})"


def _margin(check: dict, estimate: float) -> float:
    """How far the statistic may move before its check changes: the distance from the estimate at T to the check's
    nearest bound (the claim's margin for the change label)."""
    if check["kind"] == "between":
        return min(abs(estimate - b) for b in check["range"])
    return abs(estimate - check["threshold"])


def _change(at_T: dict, at_2T: dict, check: dict, level: float) -> dict | None:
    """The statistic's change from T to 2T, paired by seed: {estimate, low, high, n, label}; None when it cannot be
    paired (no value at a budget, fewer than 2 common seeds, or another comparison deciding)."""
    a, b = at_T.get(_SEEDS), at_2T.get(_SEEDS)
    if not a or not b or at_T.get("estimate") is None:
        return None
    if _deciding(at_T) != _deciding(at_2T):
        return {"label": f"another comparison decides at 2T ({_deciding(at_T)} at T, {_deciding(at_2T)} at 2T)"}
    common = sorted(set(a) & set(b))
    if len(common) < 2:
        return None
    # rounded: a statistic the same at both budgets up to float error is no change (not "rises" by 1e-16)
    d = mean_ci([round(b[s] - a[s], 12) for s in common], level)
    if d["low"] is None:
        return None
    label = drift_label(d["low"], d["high"], _margin(check, at_T["estimate"]))
    return {"estimate": d["estimate"], "low": d["low"], "high": d["high"], "n": d["n"], "label": label}


def _deciding(rec: dict) -> str:
    """The name of the comparison that decides a `weakest` record ('' for a record of one statistic)."""
    detail = rec.get("detail", "")
    return detail.split(";")[0].removeprefix(WEAKEST) if detail.startswith(WEAKEST) else ""


MOVES = "moves"  # why a claim is open under the budget rule (issue 57): its verdict moves with the budget, or
IMPRECISE = "imprecise at"  # the interval at a budget is too wide to decide, and nothing shows a move
_SIDES = {REPRODUCED, NOT_REPRODUCED}


def _part_verdict(check: dict, rec: dict, min_n: int) -> str:
    """One part's (or a one-statistic claim's) verdict by its check on its own interval, as verify reads it."""
    if rec.get("estimate") is None or rec.get("low") is None or rec.get("n", 0) < min_n \
            or any(not g["passed"] for g in rec.get("gates") or []):
        return NOT_MEASURED
    return interval_verdict(check, rec["low"], rec["high"])


@dataclass
class BudgetReading:
    """One claim under the budget rule (issue 47): its verdict at T and at 2T (each by its own check on its own
    interval), the change of each statistic between them, round 4's transient-gate verdict beside it, and (issue 57)
    why an open claim is open."""

    claim: str
    T: int
    verdict_T: str
    why_T: str
    verdict_2T: str
    why_2T: str
    verdict_old: str
    why_old: str
    parts: dict[str | None, tuple[str, str, dict | None]]  # part -> (reading at T, at 2T, change)
    part_verdicts: dict[str | None, tuple[str, str]] = field(default_factory=dict)  # part -> (verdict T, 2T)
    at_T: dict = field(default_factory=dict, repr=False)  # the claim's records at T and 2T (their comparisons)
    at_2T: dict = field(default_factory=dict, repr=False)
    at: str = ""  # " at d 64" where the claim reads a width of the ladder (T is then that width's budget)

    @property
    def decided(self) -> bool:
        return self.verdict_T == self.verdict_2T and self.verdict_T != NOT_MEASURED

    @property
    def why_open(self) -> str:
        """'' when decided (or not measured at T, whose own reason stands); else why the claim is open (issue 57):
        'moves' when a statistic that is open changes from T to 2T with an interval that excludes 0, or the two
        budgets' verdicts sit on opposite sides of the bound (more seeds would not decide it); 'imprecise at 2T'
        (or T) when neither holds: a budget's interval spans the bound and more seeds there could decide it;
        'not measured at 2T' when 2T has no verdict. Round 5 called every open claim 'moves'."""
        if self.decided or self.verdict_T == NOT_MEASURED:
            return ""
        if self.verdict_2T == NOT_MEASURED:
            return "not measured at 2T"
        if {self.verdict_T, self.verdict_2T} == _SIDES:
            return MOVES
        for part, (v_T, v_2T) in self.part_verdicts.items():
            ch = self.parts[part][2] if part in self.parts else None
            excludes_0 = bool(ch) and "estimate" in ch and (ch["low"] > 0 or ch["high"] < 0)
            if v_T != v_2T and ({v_T, v_2T} == _SIDES or excludes_0):
                return MOVES
        at = [b for b, v in (("T", self.verdict_T), ("2T", self.verdict_2T)) if v == INCONCLUSIVE]
        return f"{IMPRECISE} {' and '.join(at)}"

    def change_text(self) -> str:
        out = []
        for part, (at_T, at_2T, ch) in self.parts.items():
            name = f"{part}: " if part else ""
            moved = "" if ch is None else (
                f", change {ch['estimate']:+.4g} [{ch['low']:+.4g}, {ch['high']:+.4g}]: {ch['label']}"
                if "estimate" in ch else f", {ch['label']}")
            out.append(f"{name}T {at_T} -> 2T {at_2T}{moved}")
        return "; ".join(out)

    def gate(self) -> dict:
        def verdict(v, why):
            return f"{v}" + (f" ({why})" if v == NOT_MEASURED and why else "")
        head = (f"verdict at T = {self.T}{self.at}: {verdict(self.verdict_T, self.why_T)}; at 2T = {2 * self.T}: "
                f"{verdict(self.verdict_2T, self.why_2T)}")
        why = self.why_open
        if why == MOVES:
            head = f"the verdict moves with the budget: {head}"
        elif why.startswith(IMPRECISE):
            head = (f"{why}: no statistic's change from T to 2T excludes 0 and the verdicts do not sit on opposite "
                    f"sides of the bound, so more seeds could decide it (round 5 read 'the verdict moves with the "
                    f"budget'): {head}")
        return gate("budget", self.decided, f"{head}; {self.change_text()}")

    def labels(self) -> str:
        return "; ".join(f"{p + ': ' if p else ''}{ch['label']}" for p, (_, _, ch) in self.parts.items() if ch)

    def statistics(self) -> str:
        """What each reading is of, naming its arms (the deciding comparison of a part at T)."""
        out = []
        for part, rec in _records(self.at_T).items() if self.at_T else []:
            what = rec.get(_WHAT) or "no value"
            name = _deciding(rec)
            out.append(f"{part + ': ' if part else ''}{name + ' = ' if name else ''}{what}")
        return "; ".join(out)


# The paper's effect in each statistic's units where it converts (the power table's second effect), with the unit
# and where it comes from; None where the paper states no size.
_PAPER: dict[tuple[str, str | None], tuple[float | None, str, str]] = {
    ("B1", "difference"): (0.54, "f (the share of its budget the async run kept)",
                           "paper: AdamW loses > 60%, Muon about 6% of compute: f 0.94 - 0.40, at least"),
    ("B1", "ratio"): (0.73, "log compute multiplier log(1/f)", "paper: log(1/0.40) - 3 log(1/0.94)"),
    ("B1-abs", None): (None, "lost compute 1 - f", "the paper gives a bound (> 60%), not a value"),
    ("B2", None): (0.06, "lost compute 1 - f", "paper: 0.012 nats at 360M, about 6% of compute"),
    ("B3", None): (None, "f", "the paper gives an ordering, no size"),
    ("B4", None): (None, "Spearman correlation", "the paper gives a direction, no size"),
    ("B5-muon", None): (60.0, "% of the lost compute recovered", "paper: 50-70%, its midpoint"),
    ("B5-adamw", None): (87.5, "% of the lost compute recovered", "paper: 85-90%, its midpoint"),
    ("B6", None): (None, "lost compute 1 - f", "the paper gives a direction, no size"),
    ("B7", None): (0.0, "f", "paper: no growth from 50B to 200B tokens, a change of 0"),
}
_NO_SIZE = (None, "lost compute 1 - f", "the paper names the mitigation, no size")  # B9


def _bounds(check: dict) -> list[float]:
    return [float(x) for x in check["range"]] if check["kind"] == "between" else [float(check["threshold"])]


def _se_distance(values: list[float], check: dict) -> float:
    """How many standard errors the mean of per-seed values lies from the check's nearest bound."""
    x = np.asarray(values, dtype=float)
    m, se = float(x.mean()), float(x.std(ddof=1) / math.sqrt(len(x)))
    d = min(abs(m - b) for b in _bounds(check))
    return math.inf if se == 0 else d / se


def _power(cid: str, part: str | None, check: dict, rec_T: dict, rec_2T: dict | None, budgets: tuple[int, ...],
           wall: float | None, why_open: str = "") -> dict:
    """What the power table needs (claims.evidence.POWER_SCHEMA): the deciding statistic's per-seed values at T (every
    B statistic is the mean of per-seed values with a t interval, so these give the record's very interval), its
    bound, side and level, the cost of one more seed on 2 cores, the paper's effect. The budget rule also needs the
    same verdict at 2T: the note gives 2T's per-seed values and how far their mean lies from the bound, so that the
    plan can take the larger n where 2T binds (B9-sync_start: imprecise at 2T)."""
    effect, unit, source = _PAPER.get((cid, part), _PAPER.get((cid, None), _NO_SIZE))
    side = {"gt": "gt", "ge": "gt", "lt": "lt", "le": "lt", "between": "inside"}[check["kind"]]
    threshold = _bounds(check) if side == "inside" else _bounds(check)[0]
    what = rec_T.get(_WHAT) or (rec_2T or {}).get(_WHAT) or f"{cid} {part or ''}".strip()
    seeds_T = rec_T.get(_SEEDS) or {}
    if len(seeds_T) < 2 or rec_T.get("low") is None:
        return power_not_applicable(what, f"no interval at T = {budgets[0]} steps: "
                                          f"{rec_T.get('detail') or 'no per-seed values'}")
    values = [seeds_T[s] for s in sorted(seeds_T)]
    note = (f"the record's {level_for(cid):.0%} t interval is these per-seed values' (at {budgets[0]} steps; their "
            f"mean lies {_se_distance(values, check):.2f} standard errors from the nearest bound); paper effect: "
            f"{source}")
    if len(budgets) > 1:
        seeds_2T = (rec_2T or {}).get(_SEEDS) or {}
        if len(seeds_2T) >= 2:
            v2 = [seeds_2T[s] for s in sorted(seeds_2T)]
            note += (f"; the budget rule decides only where 2T = {budgets[1]} steps agrees: there the mean lies "
                     f"{_se_distance(v2, check):.2f} standard errors from the bound, per seed "
                     f"{', '.join(f'{v:.4g}' for v in v2)} (plan on the larger n of the two budgets)")
        else:
            note += f"; at 2T = {budgets[1]} steps there is no interval, so the budget rule cannot decide"
    if cid == "B4":
        note += "; each per-seed value is a Spearman correlation over three momenta (a few discrete values): a " \
                "normal-theory power is approximate"
    if why_open == MOVES:
        note += "; the verdict moves with the budget: more seeds decide each budget, not the claim"
    if wall is not None:
        note += f"; one more seed: {2 * wall:,.0f} s of single-run wall time, two runs at a time on 2 cores"
    return power_record(what, values, threshold, side, level_for(cid), wall_s_per_seed=wall, paper_effect=effect,
                        unit=unit, note=note)


def _host_note(g: Gaps, dirs: list[str], drift: pd.DataFrame | None, steps: int) -> str:
    """'' for runs of one host type; else each host type with its arms, and the drift measured between them."""
    by = runs_by_host(g, dirs)
    if len(by) < 2:
        return ""
    text = f"runs of {len(by)} host types, a contrast across them: " + "; ".join(f"{h}: {a}" for h, a in by.items())
    names = list(by)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            d = drift_between(drift, g.identity_of.get(a, {}), g.identity_of.get(b, {}))
            if d is None:
                text += f"; no drift measurement between {a.split(',')[0]} and {b.split(',')[0]} was given"
                continue
            text += (f"; drift measured between them ({', '.join(d['files'])}: {d['runs']} study-B runs rerun on "
                     f"the other): final validation loss at most {d['max_abs']:.2g} nats ({100 * d['max_rel']:.2g}%)")
            fall = _least_fall(g, dirs, steps)
            if fall:
                text += (f", which moves an f by about {100 * d['max_abs'] * math.log(2) / fall:.2g}% of itself on "
                         f"the flattest ladder read (falling {fall:.3g} nats a doubling into {steps} steps)")
    return text


def _least_fall(g: Gaps, dirs: list[str], steps: int) -> float | None:
    """The least mean fall per doubling into `steps` (sync(steps / 2) - sync(steps)) of the sync ladders read."""
    falls = []
    for key in {(c["optimizer"], c["momentum"], c["head"]) for c in (g.cell_of[d] for d in dirs if d in g.cell_of)
                if c["schedule"] == "sync"}:
        opt, mom, head = key
        p = g.paired({"half": Spec(opt, momentum=mom, steps=steps // 2, head=head, lr=TUNED),
                      "full": Spec(opt, momentum=mom, steps=steps, head=head, lr=TUNED)})
        if p.n:
            falls.append(float(np.mean(p["half"] - p["full"])))
    return min(falls) if falls and min(falls) > 0 else None


def _hosts_text(g: Gaps, by_budget: dict[int, list[str]], drift: pd.DataFrame | None) -> str:
    """The claim's host types per budget read, with the cross-host contrasts named (issue 57)."""
    out = []
    for steps, dirs in by_budget.items():
        kinds = hosts(g, dirs)
        note = _host_note(g, dirs, drift, steps)
        out.append(f"at {steps} steps: {note}" if note else f"at {steps} steps: one host type ({', '.join(kinds)})"
                   if kinds else f"at {steps} steps: no run")
    return "host types: " + "; ".join(out)


def _annotate(g: Gaps, cid: str, row: dict, rec_T: dict, rec_2T: dict | None, budgets: tuple[int, ...],
              drift: pd.DataFrame | None, src: list[str], why_open: str = "") -> dict:
    """The record with (issue 57) the runs of every budget it is decided on among its sources, its host types
    (`hosts`, per part too, with a cross-host part saying so in its detail), and `power` (per part too)."""
    dirs_T = run_dirs(rec_T.get("sources", []), g)
    dirs_2T = run_dirs((rec_2T or {}).get("sources", []), g)
    dirs = list(dict.fromkeys(dirs_T + dirs_2T))
    serial = wall_per_seed(g, dirs)
    wall = None if serial is None else serial / 2  # single-thread runs, two at a time on 2 cores
    by_budget = {budgets[0]: dirs_T} | ({budgets[1]: dirs_2T} if len(budgets) > 1 else {})
    out = dict(rec_T, sources=dirs + [s for s in rec_T.get("sources", []) if s not in g.host_of],
               hosts=hosts(g, dirs))
    out["detail"] = f"{rec_T.get('detail', '')}; {_hosts_text(g, by_budget, drift)}"
    checks = _checks(row)
    if rec_T.get("parts"):
        parts = {}
        for name, part in rec_T["parts"].items():
            part_2T = ((rec_2T or {}).get("parts") or {}).get(name)
            pdirs = {budgets[0]: run_dirs(part.get("sources", []), g)}
            if len(budgets) > 1:
                pdirs[budgets[1]] = run_dirs((part_2T or {}).get("sources", []), g)
            notes = [f"at {b} steps: {n}" for b, d in pdirs.items() if (n := _host_note(g, d, drift, b))]
            parts[name] = dict(part, hosts=hosts(g, [d for ds in pdirs.values() for d in ds]),
                               power=_power(cid, name, checks.get(name, row["check"]), part, part_2T, budgets, wall,
                                            why_open))
            if notes:
                parts[name]["detail"] = f"{part.get('detail', '')}; host types: {'; '.join(notes)}"
        out["parts"] = parts
        out["power"] = power_not_applicable(
            cid, "decided by its parts: every part must be decided, and each part's record carries its own power")
    else:
        out["power"] = _power(cid, None, row["check"], rec_T, rec_2T, budgets, wall, why_open)
    return out


def budget_readings(g: Gaps, scale: str, src: list[str] | None = None,
                    drift: pd.DataFrame | None = None) -> tuple[dict[str, dict], dict]:
    """(the records at T with their sync_falls gates, {claim: BudgetReading}) for every claim under the rule."""
    src = list(src or [])
    rows = {r["id"]: r for r in load_registry() if r["study"] == "async_pp"}
    T = g.steps
    at_T = _all(g.at(gate_mode="sync_falls"), src)
    at_2T = _all(g.at(steps=gate_steps(T), gate_mode="none"), src)
    old = _all(g.at(gate_mode="transient"), src)
    readings, budgets = {}, {}
    for cid, rec in at_T.items():
        row = rows[cid]
        # a claim of the width ladder (B1, B1-abs, B2) reads its width's T and 2T (issue 60): its labels say so
        width = rec.get(_WIDTH, 0)
        budgets[cid] = (g.steps_at(width), gate_steps(g.steps_at(width)))
        vT, wT = judge(row, _public(rec), True, scale)
        v2, w2 = judge(row, _public(at_2T[cid]), True, scale)
        vo, wo = judge(row, _public(old[cid]), True, scale)
        parts, verdicts = {}, {}
        for part, check in _checks(row).items():
            r1, r2 = _records(rec).get(part, rec), _records(at_2T[cid]).get(part, at_2T[cid])
            parts[part] = (_reading(r1), _reading(r2), _change(r1, r2, check, row["level"]))
            verdicts[part] = (_part_verdict(check, r1, row["min_n"]), _part_verdict(check, r2, row["min_n"]))
        readings[cid] = BudgetReading(cid, budgets[cid][0], vT, wT, v2, w2, vo, wo, parts, verdicts, rec, at_2T[cid],
                                      f" at {_width_name(g, width)}" if width else "")
    finals = {}
    for cid, rec in at_T.items():
        r = readings[cid]
        detail = f"{rec.get('detail', '')}; budget rule: {r.change_text()}"
        if cid in TOST_READING:
            tost = [x for x in old[cid]["gates"]]
            detail += "; round 4's transient gate (a reading since round 5): " + "; ".join(
                f"{'pass' if x['passed'] else 'FAIL'}: {x['reason']}" for x in tost)
        # The rule gates a verdict; where T has none (too few seeds, f off the ladder, a failed sync_falls), the
        # record's own reason stands and the rule's reading is only shown.
        gates = [*rec.get("gates", [])] + ([r.gate()] if r.verdict_T != NOT_MEASURED else [])
        finals[cid] = _annotate(g, cid, rows[cid], dict(rec, gates=gates, detail=detail), at_2T[cid],
                                budgets[cid], drift, src, r.why_open)
    return finals, readings


def budget_table(readings: dict) -> pd.DataFrame:
    """Per claim: round 4's transient-gate verdict beside the budget rule's (issue 47), on the same runs, and why an
    open claim is open (issue 57)."""
    return pd.DataFrame([{
        "claim": cid, "T": r.T, "old_verdict": r.verdict_old, "old_reason": r.why_old,
        "verdict_T": r.verdict_T, "verdict_2T": r.verdict_2T,
        "new_verdict": r.verdict_T if r.decided else NOT_MEASURED, "why_open": r.why_open,
        "changes": r.verdict_old != (r.verdict_T if r.decided else NOT_MEASURED),
        "change_labels": r.labels(), "statistics": r.statistics(), "readings": r.change_text()}
        for cid, r in readings.items()])


BUDGET_NOTE = (
    "T = the budget a claim is read at: the model's own T, or the T of the width it reads where it reads the width "
    "ladder (B1, B1-abs and B2 read the widest width with their min_n paired seeds, issue 60; T is 15 tokens a "
    "parameter at every width); old = round 4's rule (every optimizer read passes the transient gate: a paired TOST of"
    " f(2T) - f(T) within +-0.05 and the sync loss falls); new = the budget rule of round 5 (issue 47): a claim is "
    "decided at T only if its own verdict is the same at T and at 2T, and the sync loss of every optimizer read still "
    "falls from T to 2T; why_open (issue 57; round 5 called every open claim 'the verdict moves with the budget'): "
    "'moves' = a statistic that is open changes from T to 2T with an interval that excludes 0, or the two budgets' "
    "verdicts sit on opposite sides of the bound (more seeds would not decide it); 'imprecise at 2T' (or T) = neither:"
    " that budget's interval spans the bound, and more seeds there could decide it (the power table gives how many); "
    "changes: the two rules disagree on these runs; change_labels: the paired change of each statistic from T to 2T: "
    "'rises'/'falls with the budget' (its interval excludes 0), 'too few seeds' (it includes 0 and its half-width "
    "exceeds the distance from the T estimate to the check's bound), 'no clear change' (it includes 0 and is "
    "narrower); statistics: what each reading is of, naming its arms (a part's deciding comparison at T). B7 (itself a"
    " comparison across lengths) and B8 (paper only) are outside the rule"
)


def _public(rec: dict) -> dict:
    """The record without its private keys (per-seed values, the statistic's name; recursively through its parts):
    what the file holds."""
    out = {k: v for k, v in rec.items() if not k.startswith("_")}
    if "parts" in out:
        out["parts"] = {k: _public(v) for k, v in out["parts"].items()}
    return out


def near_tie_arms(cfg: StudyConfig, selection: pd.DataFrame) -> tuple[dict[tuple, str], list[str]]:
    """({(optimizer, momentum, schedule, depth): the lr label of its cells at the grid's best LR}, [the near-tie arms
    with no such cells]) for every arm whose LR choice was a near-tie (the LR-selection table's `near_tie`).

    An async arm reads its `sweeps.near_tie` cells (x<best multiplier>), or `lr~tuned` where the best multiplier is
    sync's choice for the same optimizer and momentum and the plan trains the tuned column there (Muon 0.95 at the
    cpu scale). A sync arm's near-tie would need a second ladder: listed as not trained. A `sweeps.near_tie` entry
    that is not a near-tie of the selection at that multiplier is refused: its cells would be read as what they are
    not."""
    from gradfidelity.studies.async_pp.plan import TUNED, default_momentum, lr_label, secondary_optimizers

    rows = _own_width(selection)
    key = lambda r: (r["optimizer"], round(float(r["momentum"]), 6), r["schedule"], int(r["depth"]))  # noqa: E731
    near = {key(r): float(r["best_multiplier"]) for r in rows if _true(r["near_tie"])}
    sync_choice = {key(r)[:2]: float(r["chosen_multiplier"]) for r in rows if r["schedule"] == "sync"}
    listed = {(a.optimizer, round(float(a.momentum), 6), a.schedule, int(a.depth)): float(a.multiplier)
              for a in cfg.sweeps.near_tie}
    for arm, m in listed.items():
        if near.get(arm) != m:
            raise UserError(f"bad config key 'async_pp.sweeps.near_tie': {arm} at x{m:g} is not a near-tie of the LR "
                            f"selection (its near-ties and best multipliers: {near})")
    arms, untrained = {}, []
    for arm, m in sorted(near.items()):
        opt, mom, schedule, _ = arm
        if arm in listed:
            arms[arm] = lr_label(m)
        elif (schedule == "2bw" and sync_choice.get(arm[:2]) == m and opt in secondary_optimizers(cfg)
              and mom == round(default_momentum(opt), 6)):
            arms[arm] = TUNED
        else:
            untrained.append(f"{_arm_text(arm)} (best x{m:g})")
    # the width ladder's near-ties: each width trains its chosen LR only (one LR per width at this scale)
    untrained += [f"{_arm_text(key(r))} at d {int(r['width'])} (best x{float(r['best_multiplier']):g})"
                  for r in _own_width(selection, other=True) if _true(r["near_tie"])]
    return arms, untrained


def _own_width(selection: pd.DataFrame, other: bool = False) -> list[dict]:
    """The selection's rows at the model's own width (width 0 or no width column), or with `other` the width
    ladder's: an arm's key (optimizer, momentum, schedule, depth) is the same at every width, so mixing them would
    read one width's choice as another's."""
    width = lambda r: int(r.get("width", 0) or 0)  # noqa: E731
    return [r for r in selection.to_dict("records") if bool(width(r)) == other]


def _true(value) -> bool:
    return value is True or str(value).strip().lower() == "true"


def _arm_text(arm: tuple, label: str = "", multiplier: float | None = None) -> str:
    """'muon 0.95 2bw at lr~tuned (x8)': the arm, its LR label and (where the label does not say it) the multiplier."""
    opt, mom, schedule, depth = arm
    at = f" at lr~{label}" if label else ""
    if label and multiplier is not None and label != f"x{multiplier:g}":
        at += f" (x{multiplier:g})"
    return f"{opt} {mom:g} {schedule}{f' P{depth}' if schedule.startswith('pipedream') else ''}{at}"


def _decided(r: BudgetReading) -> str:
    return r.verdict_T if r.decided else NOT_MEASURED


# The LR check of a near-tie arm on the evaluation seeds (issue 57): its other LR's final loss minus the chosen LR's,
# paired by seed at every budget the claims read. A near-tie on the selection seed that the evaluation seeds decide
# is no near-tie any more: a claim read there is read at a rejected LR, and no "hangs on a near-tie" follows from it.
REJECTED, KEPT, CHOSEN_REJECTED, LR_MOVES = ("other LR rejected", "near-tie kept", "chosen LR rejected",
                                            "the LR order moves with the budget")
AT_REJECTED = "reading at a rejected LR"  # a near-tie reading's label when it reads an arm at a rejected LR


@dataclass
class LrCheck:
    arm: tuple
    label: str
    multiplier: float | None
    by_budget: dict[int, dict]  # steps -> {estimate, low, high, n} of other - chosen final loss (nats)

    @property
    def status(self) -> str:
        worse = any(d["low"] is not None and d["low"] > 0 for d in self.by_budget.values())
        better = any(d["high"] is not None and d["high"] < 0 for d in self.by_budget.values())
        return LR_MOVES if worse and better else REJECTED if worse else CHOSEN_REJECTED if better else KEPT

    @property
    def rejected(self) -> bool:
        """Whether a reading at the other LR reads an LR the evaluation seeds reject at some budget it reads."""
        return self.status in (REJECTED, LR_MOVES)

    def text(self) -> str:
        parts = []
        for steps, d in self.by_budget.items():
            parts.append(f"{d['estimate']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}] at {steps}" if d["low"] is not None
                         else f"{d['estimate']:+.3f} (n {d['n']}) at {steps}" if d["n"] else f"no pair at {steps}")
        return (f"{_arm_text(self.arm, self.label, self.multiplier)}: other minus chosen LR, final loss on the "
                f"evaluation seeds {', '.join(parts)} nats: {self.status}")


def lr_checks(g: Gaps, arms: dict[tuple, str], best: dict[tuple, float]) -> dict[tuple, LrCheck]:
    """Each near-tie arm's other LR against its chosen LR on the evaluation seeds, at T and 2T (the paired t
    interval at the registry's level)."""
    from gradfidelity.claims.registry import interval_level

    out = {}
    for arm, label in arms.items():
        opt, mom, schedule, depth = arm
        by = {}
        for steps in (g.steps, gate_steps(g.steps)):
            p = g.paired({"other": Spec(opt, schedule, depth=depth, momentum=mom, steps=steps, lr=label),
                          "chosen": Spec(opt, schedule, depth=depth, momentum=mom, steps=steps)})
            d = mean_ci(p["other"] - p["chosen"], interval_level()) if p.n else None
            by[steps] = {k: (d or {}).get(k) for k in ("estimate", "low", "high")} | {"n": p.n}
        out[arm] = LrCheck(arm, label, best.get(arm), by)
    return out


def _best_multipliers(selection: pd.DataFrame | None) -> dict[tuple, float]:
    if selection is None:
        return {}
    key = lambda r: (r["optimizer"], round(float(r["momentum"]), 6), r["schedule"], int(r["depth"]))  # noqa: E731
    return {key(r): float(r["best_multiplier"]) for r in _own_width(selection) if _true(r["near_tie"])}


def _deciding_text(reading: BudgetReading | None, rec_T: dict, rec_2T: dict | None, arms: dict[tuple, str],
                   best: dict[tuple, float]) -> str:
    """Which comparison decides each part at T and 2T, and which near-tie arms (at their LR in this view) it reads:
    the attribution of a near-tie reading (issue 57: round 5's README named an arm the deciding comparison does not
    read)."""
    out = []
    for name, r1 in _records(rec_T).items():
        r2 = _records(rec_2T or {}).get(name) if rec_2T else None
        texts = []
        for r, b in ((r1, "T"), (r2, "2T")):
            if r is None:
                continue
            read = [_arm_text(a, lab, best.get(a)) for a, lab in arms.items() if _reads(r, a, lab)]
            v = (reading.part_verdicts.get(name) or ("", ""))[0 if b == "T" else 1] if reading else ""
            texts.append(f"{_deciding(r) or r.get(_WHAT) or 'no value'} at {b} (reads "
                         f"{'; '.join(read) or 'no near-tie arm'}{': ' + v if v else ''})")
        out.append(f"{name + ': ' if name else ''}{', '.join(texts)}")
    return " | ".join(out)


def near_tie_readings(g: Gaps, scale: str, src: list[str], arms: dict[tuple, str], own: dict[str, dict],
                      own_readings: dict[str, BudgetReading], best: dict[tuple, float] | None = None) -> list[dict]:
    """Every claim that reads a near-tie arm, under the budget rule at the arms' own LRs (the primary) and with
    every near-tie arm it reads at the grid's best LR instead (issue 47: "report the claim at both LRs"). Reported,
    not gated. Issue 57: each near-tie arm's two LRs are compared on the evaluation seeds (`lr_checks`); a reading
    that reads an arm at an LR they reject is labelled so (`lr_status`), and the reading with only the near-ties
    they keep stands beside it (`verdict_kept_lr`): only that one may say a claim hangs on a near-tie."""
    if not arms:
        return []
    best = best or {}
    rows = {r["id"]: r for r in load_registry() if r["study"] == "async_pp"}
    checks = lr_checks(g, arms, best)
    kept = {a: lab for a, lab in arms.items() if not checks[a].rejected}
    view = g.at(lr_for=arms)
    other, other_readings = budget_readings(view, scale, src)
    other["B7"], own_b7 = _b7(view, src), own.get("B7") or _b7(g, src)
    if kept and kept != arms:
        kept_view = g.at(lr_for=kept)
        kept_recs, kept_readings = budget_readings(kept_view, scale, src)
        kept_recs["B7"] = _b7(kept_view, src)
    else:
        kept_recs, kept_readings = (other, other_readings) if kept else ({}, {})
    out = []
    for cid in (*other_readings, "B7"):
        own_rec = own[cid] if cid in own else own_b7
        if not any(_reads(own_rec, a, "own") for a in arms) \
                and set(run_dirs(other[cid].get("sources", []), g)) == set(run_dirs(own_rec.get("sources", []), g)):
            continue  # reads no near-tie arm
        # the arms the claim reads: at their other LR where that reading has runs, else at the chosen LR (a record
        # with no value behind it, e.g. a failed gate, lists no run)
        read = [a for a in arms if _reads(other[cid], a, arms[a]) or _reads(own_rec, a, "own")]
        rejected = [a for a in read if checks[a].rejected]
        if cid == "B7":
            v_own = judge(rows[cid], _public(own_b7), True, scale)[0]
            v_other, why = judge(rows[cid], _public(other[cid]), True, scale)
            reading_own, reading_other = _reading(own_b7), _reading(other[cid])
            deciding = _deciding_text(None, other[cid], None, arms, best)
            v_kept = judge(rows[cid], _public(kept_recs[cid]), True, scale)[0] if cid in kept_recs else ""
        else:
            r_own, r_other = own_readings[cid], other_readings[cid]
            v_own, v_other = _decided(r_own), _decided(r_other)
            why = r_other.gate()["reason"]
            reading_own, reading_other = r_own.change_text(), r_other.change_text()
            deciding = _deciding_text(r_other, r_other.at_T, r_other.at_2T, arms, best)
            v_kept = _decided(kept_readings[cid]) if cid in kept_readings else ""
        kept_read = [a for a in read if not checks[a].rejected]
        arms_text = lambda xs: "; ".join(_arm_text(a, arms[a], best.get(a)) for a in xs)  # noqa: E731
        chosen_rejected = [a for a in read if checks[a].status == CHOSEN_REJECTED]
        if rejected:
            status = f"{AT_REJECTED} ({arms_text(rejected)})"
            if not kept_read:
                v_kept = "none: every near-tie arm it reads is at a rejected LR"
        elif chosen_rejected:  # the other LR wins on the evaluation seeds: the primary is the reading to doubt
            status, v_kept = f"the evaluation seeds reject the chosen LR ({arms_text(chosen_rejected)})", v_other
        else:
            status, v_kept = KEPT, v_other
        out.append({"claim": cid, "near_tie_arms": "; ".join(_arm_text(a, arms[a], best.get(a)) for a in read),
                    "lr_status": status, "verdict_own_lr": v_own, "verdict_near_tie_lr": v_other,
                    "same": v_own == v_other, "verdict_kept_lr": v_kept,
                    "kept_arms": "; ".join(_arm_text(a, arms[a], best.get(a)) for a in kept_read) or "none",
                    "deciding_near_tie_lr": deciding, "reading_own_lr": reading_own,
                    "reading_near_tie_lr": reading_other, "why_near_tie_lr": why,
                    "lr_checks": " | ".join(checks[a].text() for a in read)})
    return out


def _reads(rec: dict, arm: tuple, label: str) -> bool:
    """Whether a record's sources hold a run of `arm` at `label` (its run directories spell the cell)."""
    opt, mom, schedule, depth = arm
    # a near-tie arm is the model's own width's (sweeps.near_tie): a width-ladder run (under width~<d>/) is not it
    cell = (f"optimizer~{opt}/lr~{label}/", f"/schedule~{schedule}/mitigation~none/depth~{depth}/momentum~{mom:g}/")
    return any(all(c in s for c in cell) and "width~" not in s for s in rec.get("sources", []))


NEAR_TIE_NOTE = (
    "near-tie = an async arm whose LR choice was a near-tie on the selection seed (the next-smaller grid point, "
    "within the optimizer's seed sd, won); verdict_own_lr = the claim under the budget rule as the registry reads it "
    "(every arm at its chosen LR); verdict_near_tie_lr = the same rule with every near-tie arm the claim reads at "
    "the grid's best LR instead (its own cells on the same seeds, at T and 2T; lr~tuned where that LR is sync's "
    "choice, its multiplier in brackets); reported, not gated. Mitigated cells train at the chosen LR only: a claim "
    "reading one of a near-tie arm reads not measured there")
NEAR_TIE_CHECK_NOTE = (
    "lr_checks (issue 57): each near-tie arm's other LR minus its chosen LR, final validation loss paired over the "
    "evaluation seeds, with its t interval, at T and 2T; 'other LR rejected' where an interval lies above 0 (the "
    "evaluation seeds reject the other LR: it is no near-tie there), 'chosen LR rejected' where one lies below 0, "
    "'near-tie kept' where every interval includes 0. lr_status: 'reading at a rejected LR (arms)' when the near-tie "
    "reading reads an arm at a rejected LR: it is shown for the record, and no claim 'hangs on a near-tie' because of "
    "it; 'the evaluation seeds reject the chosen LR (arms)' when the other LR wins there (the primary reading is the "
    "one to doubt); verdict_kept_lr = the claim with only the near-tie arms the evaluation seeds keep at their other "
    "LR (the rejected ones at their chosen LR). deciding_near_tie_lr: which comparison decides each part at T and 2T "
    "in the near-tie reading, which near-tie arms it reads, and its verdict there")


def claims(g: Gaps, scale: str, sources: list[str] | None = None) -> dict:
    """The evidence file: one record per claim B1..B9 (see claims/evidence.py for the record's fields).

    `sources` (runs.csv, the tables) are added to every record after the run directories behind it.
    """
    return _evidence(g, scale, sources)[0]


def _evidence(g: Gaps, scale: str, sources: list[str] | None = None, selection: pd.DataFrame | None = None,
              drift: pd.DataFrame | None = None) -> tuple[dict, dict, list[dict], list[str]]:
    """(the evidence file, the budget rule's readings, the near-tie readings, the near-tie arms not trained): one
    pass over the runs serves every output. `selection`: the LR-selection table (its near-tie rows); `drift`: the
    drift measurements between host types (pairing.read_drift)."""
    src = [str(s) for s in sources or []]
    out, readings = budget_readings(g, scale, src, drift)
    rows = {r["id"]: r for r in load_registry() if r["study"] == "async_pp"}
    lengths = sorted(int(s) for s in g.cfg.sweeps.length.steps)
    b7 = _b7(g, src)
    out["B7"] = _annotate(g, "B7", rows["B7"], b7, None, (lengths[-1] if lengths else g.steps,), drift, src)
    near, untrained = [], []
    if selection is not None:
        arms, untrained = near_tie_arms(g.cfg, selection)
        best = _best_multipliers(selection)
        near = near_tie_readings(g, scale, src, arms, out, readings, best)
        for row in near:
            rejected = row["lr_status"].startswith(AT_REJECTED)
            label = (f"near-tie reading at a rejected LR ({row['lr_checks']}), shown for the record: "
                     f"{row['verdict_near_tie_lr']}; with only the near-ties the evaluation seeds keep "
                     f"({row['kept_arms']}): {row['verdict_kept_lr']}" if rejected else
                     f"near-tie reading ({row['lr_checks']}): {row['verdict_near_tie_lr']}")
            out[row["claim"]] = dict(out[row["claim"]], detail=(
                f"{out[row['claim']].get('detail', '')}; {label}, {row['reading_near_tie_lr']}; deciding there: "
                f"{row['deciding_near_tie_lr']}"))
    out["B8"] = not_measured("10B MoE at 200B tokens is paper-only and not built by this artifact (its shapes are "
                             "not public); it needs a GPU cluster", sources=src)
    out["B8"]["hosts"] = []
    out["B8"]["power"] = power_not_applicable("async - sync at 200B tokens (10B MoE)",
                                              "paper only: the model is not built by this artifact")
    return ({"study": "async_pp", "scale": scale, "evidence_version": EVIDENCE_VERSION,
             "values": {cid: _public(out[cid]) for cid in CLAIM_IDS}}, readings, near, untrained)


def write_claims(runs_csv: str, cfg: StudyConfig, scale: str, path: str, tables: list[str] | None = None,
                 budget_table_path: str | None = None, lr_selection_table: str | None = None,
                 near_tie_table_path: str | None = None) -> None:
    """`tables`: the paths listed among every record's sources; those named drift_*.csv (check-reference's drift
    measurements between host types) are also read, so that a contrast across two host types shows the drift
    measured between them."""
    from pathlib import Path

    selection = pd.read_csv(lr_selection_table) if lr_selection_table else None
    if selection is not None and "width" in selection.columns:  # the width ladder's choices have no near-tie cells
        selection = selection[selection["width"] == 0]
    given = [t for t in tables or [] if t]
    drift = read_drift([t for t in given if Path(t).name.startswith("drift_") and t.endswith(".csv")])
    doc, readings, near, untrained = _evidence(Gaps(read_runs(runs_csv, scale), cfg), scale, [runs_csv, *given],
                                               selection, drift)
    atomic_write_json(path, doc)
    if budget_table_path:
        write_table(budget_table(readings), budget_table_path,
                    title="Study B: round 4's transient gate against round 5's budget rule, per claim, on the same "
                          "runs, and why an open claim is open", notes=[BUDGET_NOTE])
    if near_tie_table_path:
        cols = ["claim", "near_tie_arms", "lr_status", "verdict_own_lr", "verdict_near_tie_lr", "same",
                "verdict_kept_lr", "kept_arms", "deciding_near_tie_lr", "lr_checks", "reading_own_lr",
                "reading_near_tie_lr", "why_near_tie_lr"]
        notes = [NEAR_TIE_NOTE, NEAR_TIE_CHECK_NOTE,
                 "near-tie arms without runs at their best LR: " + (", ".join(untrained) or "none")]
        write_table(pd.DataFrame(near, columns=cols), near_tie_table_path,
                    title="Study B: every claim that reads a near-tie LR choice, at both LRs, with the evaluation "
                          "seeds' check of the two LRs", notes=notes)
