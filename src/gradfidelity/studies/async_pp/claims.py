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

Every async run a claim reads trains at its own schedule's LR (`lr~own`, issue 37: the paper does not state its
practice, so each arm at its own best LR is the primary); the sync-tuned reading is the tables' secondary column.

Each record's `computed_by` names the function of this module that called the evidence builder (`_stat`, `_b1`,
...): the names are part of the evidence file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from gradfidelity.claims.evidence import (
    gate,
    level_for,
    mean_ci,
    not_measured,
    paired_difference,
    weakest,
    with_parts,
)
from gradfidelity.claims.registry import load_registry
from gradfidelity.claims.verdict import NOT_MEASURED
from gradfidelity.claims.verify import judge
from gradfidelity.errors import UserError
from gradfidelity.harness.io import atomic_write_json
from gradfidelity.studies.async_pp.aggregate import read_runs
from gradfidelity.studies.async_pp.compute_fraction import drift_label
from gradfidelity.studies.async_pp.config import StudyConfig
from gradfidelity.studies.async_pp.pairing import Fractions, Gaps, Spec, fractions, sync_falls, transient
from gradfidelity.studies.async_pp.plan import gate_steps
from gradfidelity.tables import write_table

CLAIM_IDS = ("B1", "B1-abs", "B2", "B3", "B4", "B5-muon", "B5-adamw", "B6", "B7", "B8", "B9-sync_start",
             "B9-sync_cooldown", "B9-taylor")
B3_MIDDLE = ("soap", "adan", "lion")  # the registry's statement: these fall between Muon (largest f) and AdamW
# B1's ratio part: AdamW's log compute multiplier log(1/f) at least 3x Muon's (issue 37: on lost compute, bounded by 1,
# "3x" became impossible once Muon lost more than 0.29; the multiplier 1/f is unbounded; the paper's > 60% against
# about 6% lost are log multipliers of 0.92 and 0.062, a factor of 15).
B1_FACTOR = 3.0
# The registry rows' `evidence_version` this module computes (3: each arm at its own LR, the equivalence gate and
# per-part gates, B1's ratio on the log compute multiplier, issue 37; 2: lost compute and the transient gate, issue
# 25); raised together with the rows whenever a metric changes, so that evidence of the old metric is never judged
# by the new check.
EVIDENCE_VERSION = 4
# The absolute-threshold claims whose records also show round 4's TOST reading beside the budget rule's (issue 47).
TOST_READING = ("B1-abs", "B2")
WEAKEST = "deciding comparison: "  # how claims.evidence.weakest names the comparison that decides
_SEEDS = "_per_seed"  # the private key of a record's per-seed values (never written to the evidence file)


def _gates(g: Gaps, cid: str, keys, steps: int | None = None) -> list[dict]:
    """The gate of each (optimizer, momentum, head) the claim reads, at its budget, by the view's gate mode: round
    4's transient gate (the old reading), the budget rule's sync_falls at T, or none (the rule's reading at 2T)."""
    if g.gate_mode == "none":
        return []
    check = transient if g.gate_mode == "transient" else sync_falls
    out = [check(g, o, momentum=m, head=h, steps=steps, level=level_for(cid)) for o, m, h in keys]
    return [x[0] if isinstance(x, tuple) else x for x in out]


def _key(opt: str, momentum: float | None = None, head: str | None = None) -> tuple:
    return opt, momentum, head


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


def _stat(cid: str, fr: Fractions, values, what: str, src: list[str], gates) -> dict:
    rec = mean_ci(values, level_for(cid), detail=f"{what}, per seed: {fr.p.per_seed(values)}{fr.p.dropped_note()}",
                  gates=gates, **_kw(fr, src))
    return _with_seeds(rec, fr, values)


def _diff(cid: str, fr: Fractions, a, b, what: str, src: list[str], gates=None) -> dict:
    d = np.asarray(a) - np.asarray(b)
    rec = paired_difference(a, b, level_for(cid), gates=gates, **_kw(fr, src),
                            detail=f"{what}, per seed: {fr.p.per_seed(d)}{fr.p.dropped_note()}")
    return _with_seeds(rec, fr, d)


def _with_seeds(rec: dict, fr: Fractions, values) -> dict:
    """The per-seed values behind a record, kept (under a private key, stripped before the file is written) so that
    the budget rule can pair a statistic's change from T to 2T by seed."""
    rec[_SEEDS] = {int(s): float(v) for s, v in zip(fr.p.seeds, values, strict=True)}
    return rec


def _b1(g: Gaps, src: list[str]) -> dict[str, dict]:
    fr = fractions(g, {"adamw": Spec("adamw", "2bw"), "muon": Spec("muon", "2bw")})
    gates = _gates(g, "B1", [_key("adamw"), _key("muon")])
    what = "f(Muon) - f(AdamW) and lost(AdamW) - 3 lost(Muon)"
    blocked = _blocked(fr, what, src, gates, "adamw", "muon")
    if blocked:
        b1 = with_parts({"difference": blocked, "ratio": blocked}, detail=blocked["detail"], gates=gates,
                        sources=blocked["sources"])
        return {"B1": b1, "B1-abs": dict(blocked)}
    lost_a, lost_m = fr.lost("adamw"), fr.lost("muon")
    mult_a, mult_m = -np.log(fr.f["adamw"]), -np.log(fr.f["muon"])  # log compute multipliers log(1/f)
    parts = {"difference": _diff("B1", fr, fr.f["muon"], fr.f["adamw"], "f(Muon) - f(AdamW)", src),
             "ratio": _diff("B1", fr, mult_a, B1_FACTOR * mult_m,
                            f"log(1/f(AdamW)) - {B1_FACTOR:g} log(1/f(Muon)) (> 0: AdamW's log compute multiplier "
                            f"is at least {B1_FACTOR:g}x Muon's)", src)}
    rec = with_parts(parts, gates=gates, sources=fr.p.sources + src,
                     detail=f"Muon keeps more of its compute than AdamW (difference > 0) and AdamW's log compute "
                            f"multiplier log(1/f) is at least {B1_FACTOR:g}x Muon's (ratio part > 0); lost per seed "
                            f"adamw {fr.p.per_seed(lost_a)}, muon {fr.p.per_seed(lost_m)}; log(1/f) per seed adamw "
                            f"{fr.p.per_seed(mult_a)}, muon {fr.p.per_seed(mult_m)}")
    if fr.p.diverged:
        rec["diverged"] = fr.p.diverged
    return {"B1": rec, "B1-abs": _stat("B1-abs", fr, lost_a, "AdamW lost compute 1 - f", src, gates[:1])}


def _b2(g: Gaps, src: list[str]) -> dict:
    fr = fractions(g, {"muon": Spec("muon", "2bw")})
    gates = _gates(g, "B2", [_key("muon")])
    what = "Muon lost compute 1 - f"
    return _blocked(fr, what, src, gates, "muon") or _stat("B2", fr, fr.lost("muon"), what, src, gates)


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
            f"muon - {o}": _diff("B3", fr, f["muon"], f[o], f"f(Muon) - f({o})", src),
            f"{o} - adamw": _diff("B3", fr, f[o], f["adamw"], f"f({o}) - f(AdamW)", src)}), gates=gate_o)
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
        for P, Q in zip(depths, depths[1:], strict=False):
            growth[f"{o} P{Q}-P{P}"] = blocked or _diff(
                "B6", fr, fr.lost(f"P{Q}"), fr.lost(f"P{P}"), f"PipeDream lost compute at P{Q} minus at P{P}", src)
        for P in (P for P in depths if P > 2):
            excess[f"{o} P{P}"] = blocked or _diff(
                "B6", fr, fr.lost(f"P{P}"), fr.lost("2bw"), f"PipeDream lost compute at P{P} minus 2bw's", src)
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


@dataclass
class BudgetReading:
    """One claim under the budget rule (issue 47): its verdict at T and at 2T (each by its own check on its own
    interval), the change of each statistic between them, and round 4's transient-gate verdict beside it."""

    claim: str
    T: int
    verdict_T: str
    why_T: str
    verdict_2T: str
    why_2T: str
    verdict_old: str
    why_old: str
    parts: dict[str | None, tuple[str, str, dict | None]]  # part -> (reading at T, at 2T, change)

    @property
    def decided(self) -> bool:
        return self.verdict_T == self.verdict_2T and self.verdict_T != NOT_MEASURED

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
        head = (f"verdict at T = {self.T}: {verdict(self.verdict_T, self.why_T)}; at 2T = {2 * self.T}: "
                f"{verdict(self.verdict_2T, self.why_2T)}")
        if not self.decided and self.verdict_T != NOT_MEASURED and self.verdict_2T != NOT_MEASURED:
            head = f"the verdict moves with the budget: {head}"
        return gate("budget", self.decided, f"{head}; {self.change_text()}")

    def labels(self) -> str:
        return "; ".join(f"{p + ': ' if p else ''}{ch['label']}" for p, (_, _, ch) in self.parts.items() if ch)


def budget_readings(g: Gaps, scale: str, src: list[str] | None = None) -> tuple[dict[str, dict], dict]:
    """(the records at T with their sync_falls gates, {claim: BudgetReading}) for every claim under the rule."""
    src = list(src or [])
    rows = {r["id"]: r for r in load_registry() if r["study"] == "async_pp"}
    T = g.steps
    at_T = _all(g.at(gate_mode="sync_falls"), src)
    at_2T = _all(g.at(steps=gate_steps(T), gate_mode="none"), src)
    old = _all(g.at(gate_mode="transient"), src)
    readings = {}
    for cid, rec in at_T.items():
        row = rows[cid]
        vT, wT = judge(row, _public(rec), True, scale)
        v2, w2 = judge(row, _public(at_2T[cid]), True, scale)
        vo, wo = judge(row, _public(old[cid]), True, scale)
        parts = {}
        for part, check in _checks(row).items():
            r1, r2 = _records(rec).get(part, rec), _records(at_2T[cid]).get(part, at_2T[cid])
            parts[part] = (_reading(r1), _reading(r2), _change(r1, r2, check, row["level"]))
        readings[cid] = BudgetReading(cid, T, vT, wT, v2, w2, vo, wo, parts)
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
        finals[cid] = dict(rec, gates=gates, detail=detail)
    return finals, readings


def budget_table(readings: dict) -> pd.DataFrame:
    """Per claim: round 4's transient-gate verdict beside the budget rule's (issue 47), on the same runs."""
    return pd.DataFrame([{
        "claim": cid, "T": r.T, "old_verdict": r.verdict_old, "old_reason": r.why_old,
        "verdict_T": r.verdict_T, "verdict_2T": r.verdict_2T,
        "new_verdict": r.verdict_T if r.decided else NOT_MEASURED,
        "changes": r.verdict_old != (r.verdict_T if r.decided else NOT_MEASURED),
        "change_labels": r.labels(), "readings": r.change_text()} for cid, r in readings.items()])


BUDGET_NOTE = (
    "old = round 4's rule (every optimizer read passes the transient gate: a paired TOST of f(2T) - f(T) within "
    "+-0.05 and the sync loss falls); new = the budget rule of round 5 (issue 47): a claim is decided at T only if "
    "its own verdict is the same at T and at 2T, and the sync loss of every optimizer read still falls from T to "
    "2T; changes: the two rules disagree on these runs; change_labels: the paired change of each statistic from T "
    "to 2T: 'rises'/'falls with the budget' (its interval excludes 0), 'too few seeds' (it includes 0 and its "
    "half-width exceeds the distance from the T estimate to the check's bound), 'no clear change' (it includes 0 "
    "and is narrower). B7 (itself a comparison across lengths) and B8 (paper only) are outside the rule")


def _public(rec: dict) -> dict:
    """The record without the private per-seed key (recursively through its parts): what the file holds."""
    out = {k: v for k, v in rec.items() if k != _SEEDS}
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

    rows = selection.to_dict("records")
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
    return arms, untrained


def _true(value) -> bool:
    return value is True or str(value).strip().lower() == "true"


def _arm_text(arm: tuple, label: str = "") -> str:
    opt, mom, schedule, depth = arm
    at = f" at lr~{label}" if label else ""
    return f"{opt} {mom:g} {schedule}{f' P{depth}' if schedule.startswith('pipedream') else ''}{at}"


def _decided(r: BudgetReading) -> str:
    return r.verdict_T if r.decided else NOT_MEASURED


def near_tie_readings(g: Gaps, scale: str, src: list[str], arms: dict[tuple, str], own: dict[str, dict],
                      own_readings: dict[str, BudgetReading]) -> list[dict]:
    """Every claim that reads a near-tie arm, under the budget rule at the arms' own LRs (the primary) and with
    every near-tie arm it reads at the grid's best LR instead (issue 47: "report the claim at both LRs"). Reported,
    not gated: which of two LRs within the selection's noise wins is a coin the claim should not hang on unseen."""
    if not arms:
        return []
    rows = {r["id"]: r for r in load_registry() if r["study"] == "async_pp"}
    view = g.at(lr_for=arms)
    other, other_readings = budget_readings(view, scale, src)
    other["B7"], own_b7 = _b7(view, src), own.get("B7") or _b7(g, src)
    out = []
    for cid in (*other_readings, "B7"):
        if not any(_reads(own[cid] if cid in own else own_b7, a, "own") for a in arms) \
                and other[cid].get("sources") == (own[cid] if cid in own else own_b7).get("sources"):
            continue  # reads no near-tie arm
        own_rec = own[cid] if cid in own else own_b7
        # the arms the claim reads: at their other LR where that reading has runs, else at the chosen LR (a record
        # with no value behind it, e.g. a failed gate, lists no run)
        read = [_arm_text(a, lab) for a, lab in arms.items()
                if _reads(other[cid], a, lab) or _reads(own_rec, a, "own")]
        if cid == "B7":
            v_own = judge(rows[cid], _public(own_b7), True, scale)[0]
            v_other, why = judge(rows[cid], _public(other[cid]), True, scale)
            reading_own, reading_other = _reading(own_b7), _reading(other[cid])
        else:
            r_own, r_other = own_readings[cid], other_readings[cid]
            v_own, v_other = _decided(r_own), _decided(r_other)
            why = r_other.gate()["reason"]
            reading_own, reading_other = r_own.change_text(), r_other.change_text()
        out.append({"claim": cid, "near_tie_arms": "; ".join(read),
                    "verdict_own_lr": v_own, "verdict_near_tie_lr": v_other, "same": v_own == v_other,
                    "reading_own_lr": reading_own, "reading_near_tie_lr": reading_other,
                    "why_near_tie_lr": why})
    return out


def _reads(rec: dict, arm: tuple, label: str) -> bool:
    """Whether a record's sources hold a run of `arm` at `label` (its run directories spell the cell)."""
    opt, mom, schedule, depth = arm
    cell = (f"optimizer~{opt}/lr~{label}/", f"/schedule~{schedule}/mitigation~none/depth~{depth}/momentum~{mom:g}/")
    return any(all(c in s for c in cell) for s in rec.get("sources", []))


NEAR_TIE_NOTE = (
    "near-tie = an async arm whose LR choice was a near-tie on the selection seed (the next-smaller grid point, "
    "within the optimizer's seed sd, won); verdict_own_lr = the claim under the budget rule as the registry reads it "
    "(every arm at its chosen LR); verdict_near_tie_lr = the same rule with every near-tie arm the claim reads at "
    "the grid's best LR instead (its own cells on the same seeds, at T and 2T; lr~tuned where that LR is sync's "
    "choice); reported, not gated. Mitigated cells train at the chosen LR only: a claim reading one of a near-tie "
    "arm reads not measured there")


def claims(g: Gaps, scale: str, sources: list[str] | None = None) -> dict:
    """The evidence file: one record per claim B1..B9 (see claims/evidence.py for the record's fields).

    `sources` (runs.csv, the tables) are added to every record after the run directories behind it.
    """
    return _evidence(g, scale, sources)[0]


def _evidence(g: Gaps, scale: str, sources: list[str] | None = None,
              selection: pd.DataFrame | None = None) -> tuple[dict, dict, list[dict], list[str]]:
    """(the evidence file, the budget rule's readings, the near-tie readings, the near-tie arms not trained): one
    pass over the runs serves every output. `selection`: the LR-selection table (its near-tie rows)."""
    src = [str(s) for s in sources or []]
    out, readings = budget_readings(g, scale, src)
    out["B7"] = _b7(g, src)
    near, untrained = [], []
    if selection is not None:
        arms, untrained = near_tie_arms(g.cfg, selection)
        near = near_tie_readings(g, scale, src, arms, out, readings)
        for row in near:
            out[row["claim"]] = dict(out[row["claim"]], detail=(
                f"{out[row['claim']].get('detail', '')}; near-tie reading ({row['near_tie_arms']}): "
                f"{row['verdict_near_tie_lr']}, {row['reading_near_tie_lr']}"))
    out["B8"] = not_measured("10B MoE at 200B tokens is paper-only and not built by this artifact (its shapes are "
                             "not public); it needs a GPU cluster", sources=src)
    return ({"study": "async_pp", "scale": scale, "evidence_version": EVIDENCE_VERSION,
             "values": {cid: _public(out[cid]) for cid in CLAIM_IDS}}, readings, near, untrained)


def write_claims(runs_csv: str, cfg: StudyConfig, scale: str, path: str, tables: list[str] | None = None,
                 budget_table_path: str | None = None, lr_selection_table: str | None = None,
                 near_tie_table_path: str | None = None) -> None:
    selection = pd.read_csv(lr_selection_table) if lr_selection_table else None
    doc, readings, near, untrained = _evidence(Gaps(read_runs(runs_csv, scale), cfg), scale,
                                               [runs_csv, *(t for t in tables or [] if t)], selection)
    atomic_write_json(path, doc)
    if budget_table_path:
        write_table(budget_table(readings), budget_table_path,
                    title="Study B: round 4's transient gate against round 5's budget rule, per claim, on the same "
                          "runs", notes=[BUDGET_NOTE])
    if near_tie_table_path:
        cols = ["claim", "near_tie_arms", "verdict_own_lr", "verdict_near_tie_lr", "same", "reading_own_lr",
                "reading_near_tie_lr", "why_near_tie_lr"]
        notes = [NEAR_TIE_NOTE, "near-tie arms without runs at their best LR: " + (", ".join(untrained) or "none")]
        write_table(pd.DataFrame(near, columns=cols), near_tie_table_path,
                    title="Study B: every claim that reads a near-tie LR choice, at both LRs", notes=notes)
