"""runs.csv -> the claim evidence of study B (B1-B9): one record per registry row, built with
`gradfidelity.claims.evidence` at the registry's level.

Every statistic is computed per seed on the paired runs (pairing.py) and then summarised over seeds with an
interval. A seed on which a run a statistic needs diverged (or is missing) is dropped from that statistic, counted
in the record's `diverged` and named in its detail. A per-seed ratio whose denominator is <= 0 on some seed is
undefined: that record is then not measured, with the reason, rather than a number made of the other seeds. Every
claim on a gap is behind the sync plateau gate (pairing.plateau_gate).

Each record's `computed_by` names the function of this module that called the evidence builder (`_stat`, `_b1`,
...): the names are part of the evidence file.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import spearmanr

from gradfidelity.claims.evidence import (
    gate,
    level_for,
    mean_ci,
    not_measured,
    paired_difference,
    paired_ratio,
    weakest,
    with_parts,
)
from gradfidelity.harness.io import atomic_write_json
from gradfidelity.studies.async_pp.aggregate import read_runs
from gradfidelity.studies.async_pp.config import StudyConfig
from gradfidelity.studies.async_pp.pairing import Gaps, Paired, Spec, ef_recovery, plateau_gate

CLAIM_IDS = ("B1", "B1-abs", "B2", "B3", "B4", "B5-muon", "B5-adamw", "B6", "B7", "B8", "B9-sync_start",
             "B9-sync_cooldown", "B9-taylor")
B3_MIDDLE = ("soap", "adan", "lion")  # the registry's statement: these fall between Muon (smallest) and AdamW


def _stat(cid: str, p: Paired, values, what: str, sources: list[str], **kw) -> dict:
    """mean_ci over the per-seed `values` of paired seeds `p`, with the seeds, the dropped ones and the sources."""
    src = p.sources + sources
    if p.n == 0:
        return not_measured(f"{what}: no seed has every run finished{p.dropped_note()}", sources=src,
                            diverged=p.diverged)
    return mean_ci(values, level_for(cid), detail=f"{what}, per seed: {p.per_seed(values)}{p.dropped_note()}",
                   sources=src, diverged=p.diverged, **kw)


def _undefined(p: Paired, what: str, sources: list[str], why: str, gates=None) -> dict:
    return not_measured(f"{what} undefined: {why}{p.dropped_note()}", n=p.n, sources=p.sources + sources,
                        diverged=p.diverged, gates=gates)


def _gaps(p: Paired, opts) -> dict[str, np.ndarray]:
    return {o: p[f"{o}/2bw"] - p[f"{o}/sync"] for o in opts}


def _main_specs(opts, variants=(("2bw", "none"),)) -> dict[str, Spec]:
    out = {}
    for o in opts:
        out[f"{o}/sync"] = Spec(o)
        for s, m in variants:
            out[f"{o}/{s}" + ("" if m == "none" else f"+{m}")] = Spec(o, s, m)
    return out


def _gate_items(p: Paired, gaps: dict[str, np.ndarray]) -> list[tuple[str, str, np.ndarray]]:
    return [(o, f"{o}/sync", gaps[o]) for o in gaps]


def _b1(g: Gaps, src: list[str]) -> dict[str, dict]:
    p = g.paired(_main_specs(("adamw", "muon")))
    gaps = _gaps(p, ("adamw", "muon"))
    ga, gm = gaps["adamw"], gaps["muon"]
    gates = plateau_gate(p, _gate_items(p, gaps))
    out = {"B1-abs": _stat("B1-abs", p, ga, "AdamW gap (2bw - sync), nats", src, gates=gates)}
    seeds = f"; per seed adamw {p.per_seed(ga)}; muon {p.per_seed(gm)}{p.dropped_note()}" if p.n else ""
    kw = {"sources": p.sources + src, "diverged": p.diverged}
    if p.n == 0:
        rec = _stat("B1", p, [], "AdamW gap - Muon gap", src)
        return {**out, "B1": with_parts({"difference": rec, "ratio": rec}, detail=rec["detail"], sources=src)}
    diff = paired_difference(ga, gm, level_for("B1"), detail=f"AdamW gap - Muon gap, nats{seeds}", **kw)
    what = "AdamW gap / Muon gap (geometric mean over seeds, interval on the log ratios)"
    if not ((ga > 0).all() and (gm > 0).all()):
        ratio = _undefined(p, what, src, f"a gap is <= 0 on some seed (adamw {p.per_seed(ga)}; muon "
                                         f"{p.per_seed(gm)}); the difference part still stands")
    else:
        ratio = paired_ratio(ga, gm, level_for("B1"), detail=f"{what}{seeds}", **kw)
    rec = with_parts({"difference": diff, "ratio": ratio}, gates=gates, sources=p.sources + src,
                     detail="AdamW's gap larger than Muon's (difference > 0) and far larger (ratio > 5)")
    if p.diverged:
        rec["diverged"] = p.diverged
    out["B1"] = rec
    return out


def _b2(g: Gaps, src: list[str]) -> dict:
    p = g.paired(_main_specs(("muon",)))
    gap = p["muon/2bw"] - p["muon/sync"]
    rel = gap / p["muon/sync"]
    gates = plateau_gate(p, [("muon", "muon/sync", gap)])
    rec = _stat("B2", p, rel, "Muon signed gap / Muon sync loss", src, gates=gates)
    if rec["estimate"] is not None and rec["high"] is not None and rec["high"] < 0:
        rec["detail"] += "; the whole interval is negative: async ends below sync, i.e. no gap (not a small one)"
    elif rec["estimate"] is not None and rec["estimate"] < 0:
        rec["detail"] += "; the estimate is negative: no measurable gap"
    return rec


def _b3(g: Gaps, src: list[str]) -> dict:
    opts = ("adamw", "muon", *B3_MIDDLE)
    p = g.paired(_main_specs(opts))
    gaps = _gaps(p, opts)
    gates = plateau_gate(p, _gate_items(p, gaps))
    level, kw = level_for("B3"), {"sources": p.sources + src, "diverged": p.diverged}
    parts = {}
    for o in B3_MIDDLE:
        if p.n == 0:
            parts[o] = not_measured(f"no seed has every run finished{p.dropped_note()}", **kw)
            continue
        cmp = {f"{o} - muon": paired_difference(gaps[o], gaps["muon"], level, **kw,
                                               detail=f"{o} gap - Muon gap, per seed "
                                                      f"{p.per_seed(gaps[o] - gaps['muon'])}{p.dropped_note()}"),
               f"adamw - {o}": paired_difference(gaps["adamw"], gaps[o], level, **kw,
                                                 detail=f"AdamW gap - {o} gap, per seed "
                                                        f"{p.per_seed(gaps['adamw'] - gaps[o])}{p.dropped_note()}")}
        parts[o] = weakest(cmp)
    rec = with_parts(parts, gates=gates, sources=p.sources + src,
                     detail="Muon gap < gap < AdamW gap for each of SOAP, Adan, Lion (both paired differences > 0)")
    if p.diverged:
        rec["diverged"] = p.diverged
    return rec


def _b4(g: Gaps, src: list[str]) -> dict:
    sw = g.cfg.sweeps.momentum
    opts, moms = list(sw.optimizers), [float(m) for m in sw.momenta]
    specs = {f"{o}/{s}/{m}": Spec(o, s, momentum=m) for o in opts for m in moms for s in ("sync", "2bw")}
    p = g.paired(specs)
    what = f"mean over {', '.join(opts)} of Spearman(momentum, gap) over momenta {moms} at the tuned LR"
    gates = plateau_gate(p, [(f"{o} mom {m:g}", f"{o}/sync/{m}", p[f"{o}/2bw/{m}"] - p[f"{o}/sync/{m}"])
                             for o in opts for m in moms])
    rhos, constant = [], []
    for i in range(p.n):
        per_opt = []
        for o in opts:
            gaps = [p[f"{o}/2bw/{m}"][i] - p[f"{o}/sync/{m}"][i] for m in moms]
            if len(set(gaps)) == 1:  # Spearman's rho is undefined for a constant input
                constant.append(f"seed {p.seeds[i]} {o}")
                continue
            per_opt.append(float(spearmanr(moms, gaps).statistic))
        rhos.append(float(np.mean(per_opt)) if len(per_opt) == len(opts) else math.nan)
    if len(moms) < 2 or constant:
        return _undefined(p, what, src, "fewer than two momenta" if len(moms) < 2
                          else f"gap constant over momentum for {', '.join(constant)}", gates=gates)
    return _stat("B4", p, rhos, what, src, gates=gates)


def _b5(g: Gaps, opt: str, cid: str, src: list[str]) -> dict:
    p = g.paired({"sync": Spec(opt), "2bw": Spec(opt, "2bw"), "ef": Spec(opt, "2bw", "error_feedback")})
    what = f"{opt} EF recovery % = 100 (async - async_EF) / (async - sync)"
    gap = p["2bw"] - p["sync"]
    gates = plateau_gate(p, [(opt, "sync", gap)])
    if p.n and not (gap > 0).all():
        return _undefined(p, what, src, f"async <= sync on some seed (gap per seed {p.per_seed(gap)})", gates=gates)
    return _stat(cid, p, ef_recovery(p["sync"], p["2bw"], p["ef"]), what, src, gates=gates)


def _b6(g: Gaps, src: list[str]) -> dict:
    sw = g.cfg.sweeps.depth
    depths, level = sorted(int(P) for P in sw.depths), level_for("B6")
    if "pipedream" not in sw.schedules or not sw.optimizers:
        rec = not_measured("the depth sweep has no 'pipedream' schedule or no optimizer", sources=src)
        return with_parts({"growth": rec, "excess": rec}, detail=rec["detail"], sources=src)
    growth, excess, sources, dropped, gate_parts = {}, {}, list(src), set(), []
    for o in sw.optimizers:
        pd_specs = {f"P{P}": Spec(o, "pipedream", depth=P, head="untied") for P in depths}
        p = g.paired({"sync": Spec(o, head="untied"), "2bw": Spec(o, "2bw", head="untied"), **pd_specs})
        sources += p.sources
        dropped |= set(p.dropped)
        kw = {"sources": p.sources + src, "diverged": p.diverged}
        gap = {k: p[k] - p["sync"] for k in ("2bw", *pd_specs)}
        if p.n:
            biggest = max(gap.values(), key=lambda a: abs(float(np.mean(a))))
            gate_parts += plateau_gate(p, [(f"{o} (untied head)", "sync", biggest)])
        for P, Q in zip(depths, depths[1:], strict=False):
            growth[f"{o} P{Q}-P{P}"] = (
                paired_difference(gap[f"P{Q}"], gap[f"P{P}"], level, **kw,
                                  detail=f"PipeDream gap at P{Q} minus at P{P}, per seed: "
                                         f"{p.per_seed(gap[f'P{Q}'] - gap[f'P{P}'])}{p.dropped_note()}")
                if p.n else not_measured(f"no seed has every run finished{p.dropped_note()}", **kw))
        for P in (P for P in depths if P > 2):
            excess[f"{o} P{P}"] = (
                paired_difference(gap[f"P{P}"], gap["2bw"], level, **kw,
                                  detail=f"PipeDream gap at P{P} minus 2bw gap, per seed: "
                                         f"{p.per_seed(gap[f'P{P}'] - gap['2bw'])}{p.dropped_note()}")
                if p.n else not_measured(f"no seed has every run finished{p.dropped_note()}", **kw))
    parts = {"growth": weakest(growth) if growth else not_measured("the depth sweep has fewer than two depths",
                                                                   sources=src),
             "excess": weakest(excess) if excess else not_measured("the depth sweep has no depth P > 2",
                                                                   sources=src)}
    gates = [gate("sync_plateau", all(x["passed"] for x in gate_parts), "; ".join(x["reason"] for x in gate_parts))
             ] if gate_parts else []
    rec = with_parts(parts, sources=list(dict.fromkeys(sources)), gates=gates,
                     detail="untied LM head (the last stage is fresh); every comparison must hold; each part is "
                            "decided by its weakest comparison")
    if dropped:
        rec["diverged"] = len(dropped)
    return rec


def _b7(g: Gaps, src: list[str]) -> dict:
    lengths = sorted(int(s) for s in g.cfg.sweeps.length.steps)
    short, long = lengths[0], lengths[-1]
    what = f"Muon gap at {long} steps / gap at {short} steps"
    if "muon" not in g.cfg.sweeps.length.optimizers or short == long:
        return not_measured(f"{what}: the length sweep lacks Muon or a second length", sources=src)
    p = g.paired({"s_sync": Spec("muon", steps=short), "s_2bw": Spec("muon", "2bw", steps=short),
                  "l_sync": Spec("muon", steps=long), "l_2bw": Spec("muon", "2bw", steps=long)})
    gs, gl = p["s_2bw"] - p["s_sync"], p["l_2bw"] - p["l_sync"]
    gates = plateau_gate(p, [(f"muon {long} steps", "l_sync", gl)])
    if p.n and not (gs > 0).all():
        return _undefined(p, what, src, f"the gap at {short} steps is <= 0 on some seed ({p.per_seed(gs)})",
                          gates=gates)
    return _stat("B7", p, gl / gs if p.n else [], what, src, gates=gates)


def _b9(g: Gaps, mit: str, src: list[str]) -> dict:
    sw = g.cfg.sweeps.mitigation
    opts = list(sw.optimizers)
    what = f"mean over optimizers of gap(2bw+{mit}) / gap(2bw)"
    if mit not in sw.mitigations or not opts:
        return not_measured(f"{what}: the mitigation sweep does not run {mit}", sources=src)
    p = g.paired(_main_specs(opts, (("2bw", "none"), ("2bw", mit))))
    if p.n == 0:
        return _stat(f"B9-{mit}", p, [], what, src)
    base = {o: p[f"{o}/2bw"] - p[f"{o}/sync"] for o in opts}
    gates = plateau_gate(p, _gate_items(p, base))
    kept = [o for o in opts if (base[o] > 0).all()]
    excluded = [f"{o} (2bw gap {p.per_seed(base[o])})" for o in opts if o not in kept]
    note = f"; left out, 2bw gap <= 0 on some seed: {', '.join(excluded)}" if excluded else ""
    if not kept:
        return _undefined(p, what, src, "no optimizer has a positive 2bw gap on every seed" + note, gates=gates)
    ratios = np.mean([(p[f"{o}/2bw+{mit}"] - p[f"{o}/sync"]) / base[o] for o in kept], axis=0)
    return _stat(f"B9-{mit}", p, ratios, f"{what} over {', '.join(kept)}{note}; ratio", src, gates=gates)


def claims(g: Gaps, scale: str, sources: list[str] | None = None) -> dict:
    """The evidence file: one record per claim B1..B9 (see claims/evidence.py for the record's fields).

    `sources` (runs.csv, the tables) are added to every record after the run directories behind it.
    """
    src = [str(s) for s in sources or []]
    out: dict[str, dict] = {}
    out.update(_b1(g, src))
    out["B2"] = _b2(g, src)
    out["B3"] = _b3(g, src)
    out["B4"] = _b4(g, src)
    out["B5-muon"] = _b5(g, "muon", "B5-muon", src)
    out["B5-adamw"] = _b5(g, "adamw", "B5-adamw", src)
    out["B6"] = _b6(g, src)
    out["B7"] = _b7(g, src)
    out["B8"] = not_measured("10B MoE at 200B tokens is paper-only and not built by this artifact (its shapes are "
                             "not public); it needs a GPU cluster", sources=src)
    for mit in ("sync_start", "sync_cooldown", "taylor"):
        out[f"B9-{mit}"] = _b9(g, mit, src)
    return {"study": "async_pp", "scale": scale, "values": {cid: out[cid] for cid in CLAIM_IDS}}



def write_claims(runs_csv: str, cfg: StudyConfig, scale: str, path: str, tables: list[str] | None = None) -> None:
    atomic_write_json(path, claims(Gaps(read_runs(runs_csv, scale), cfg), scale,
                                   [runs_csv, *(t for t in tables or [] if t)]))
