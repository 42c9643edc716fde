"""Tidy CSV -> claim evidence A5-A9 (the contract of gradfidelity.claims.evidence: an estimate with an interval
over paired seeds at the registry's level, n, gates, sources).

Methods are compared seed by seed (same seed = same initialisation and data order = one pair); the pair of a seed
whose run diverged is dropped and the record says which run it was (`detail`) and how many (`diverged`). Every claim
carries the gate `reference_learned` (baseline.py): the fixed SFT model must beat the best constant answer of the
in-distribution set by GATE_MARGIN points, otherwise no claim is judged.
- A5 paired difference fixed SFT - ds_bug SFT; A6 the per-seed |fixed - agg_bug| - |fixed - ds_bug| (a bug that
  helps is an effect too); A7 one paired part per mixed-policy method (intersection-union); A8 one paired
  difference per mixed method under `both` at the Holm level, the largest t deciding; A9 truncated SFT-then-RL
  against every mixed method (accuracy, paired) with fewer FLOPs than each (exact, counted).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from gradfidelity.claims.evidence import (
    exact,
    gate,
    level_for,
    mean_ci,
    not_measured,
    paired_difference,
    weakest,
    with_parts,
)
from gradfidelity.claims.verdict import Verdict
from gradfidelity.stats.intervals import one_sided_p
from gradfidelity.studies.sft_rl import plan
from gradfidelity.studies.sft_rl.baseline import GATE, GATE_MARGIN, constant_baseline
from gradfidelity.studies.sft_rl.config import StudyConfig


def reference_gate(df: pd.DataFrame, model: str, baseline: dict) -> tuple[dict, list[str]]:
    """The `reference_learned` gate on `model` and the runs it reads."""
    g = df[(df.model == model) & (df.variant == "fixed") & (df.method == "sft")]
    runs = list(dict.fromkeys(g.run))
    if "error" in baseline:
        return gate(GATE, False, f"no constant-answer baseline: {baseline['error']}"), runs
    base = baseline["sets"]["id"]
    ok = g[g.status == "ok"]
    if len(ok) == 0:
        why = "no fixed SFT run" if len(g) == 0 else f"all {len(g)} fixed SFT runs diverged"
        return gate(GATE, False, f"{why}: cannot show the reference model learned the task"), runs
    acc = float(ok["acc_id"].astype(float).mean())
    need = base["acc"] + GATE_MARGIN
    div = f", {len(g) - len(ok)} diverged" if len(ok) < len(g) else ""
    reason = (f"fixed SFT in-distribution accuracy {acc:.1f} (mean of {len(ok)} seeds{div}) vs constant answer "
              f"'{base['answer']}' {base['acc']:.1f} + {GATE_MARGIN:g} = {need:.1f}")
    return gate(GATE, acc >= need, reason), runs


@dataclass
class Arm:
    """One (variant, method) cell of one model across seeds: values of the finished runs by seed."""

    label: str
    values: dict[int, float] = field(default_factory=dict)
    runs: dict[int, str] = field(default_factory=dict)
    diverged: dict[int, str] = field(default_factory=dict)


def _arm(df: pd.DataFrame, model: str, variant: str, method: str, key: str = "acc_macro") -> Arm:
    g = df[(df.model == model) & (df.variant == variant) & (df.method == method)]
    arm = Arm(f"{variant}/{method}")
    for r in g.itertuples():
        arm.runs[int(r.seed)] = r.run
        if r.status == "ok":
            arm.values[int(r.seed)] = float(getattr(r, key))
        else:
            arm.diverged[int(r.seed)] = r.run
    return arm


@dataclass
class Paired:
    seeds: list[int]
    values: list[np.ndarray]
    diverged: int
    note: str
    sources: list[str]


def _pair(*arms: Arm) -> Paired:
    """The seeds every arm finished, the arms' values on them, and what diverged (never dropped silently)."""
    seeds = sorted(set.intersection(*(set(a.values) for a in arms)))
    bad = {}
    for a in arms:
        for s, run in a.diverged.items():
            bad.setdefault(run, f"{a.label} seed{s}")
    dropped = sorted(set().union(*(set(a.runs) for a in arms)) - set(seeds))
    note = ""
    if bad:
        note = (f"{len(bad)} diverged run(s) ({', '.join(bad.values())}): seed(s) "
                f"{', '.join(map(str, dropped))} dropped from the pairing")
    sources = list(dict.fromkeys(run for a in arms for run in a.runs.values()))
    return Paired(seeds, [np.array([a.values[s] for s in seeds]) for a in arms], len(bad), note, sources)


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def _missing(*arms: Arm) -> str:
    return _join(*(f"no {a.label} runs (method or variant not configured)" for a in arms if not a.runs))


def _difference(cid: str, a: Arm, b: Arm, what: str, *, gates, sources) -> dict:
    """Paired difference a - b over seeds (points) at the registry's level for `cid`."""
    if _missing(a, b):
        return not_measured(_missing(a, b), gates=gates, sources=sources)
    p = _pair(a, b)
    detail = _join(f"{what}, paired over seeds {p.seeds}: {a.label} mean "
                   f"{p.values[0].mean() if p.seeds else math.nan:.2f} - {b.label} mean "
                   f"{p.values[1].mean() if p.seeds else math.nan:.2f}", p.note)
    if not p.seeds:
        return not_measured(_join("no seed with both runs finished", detail), gates=gates,
                            sources=p.sources + sources, diverged=p.diverged)
    return paired_difference(p.values[0], p.values[1], level_for(cid), detail=detail, gates=gates,
                             sources=p.sources + sources, diverged=p.diverged)


def _t_stat(rec: dict) -> float:
    """mean / standard error of a paired-difference record, from its interval (inf for a zero-width one)."""
    if rec["estimate"] is None:
        return -math.inf
    if rec.get("low") is None:
        return -math.inf  # one pair: no interval, cannot be the deciding comparison
    half = (rec["high"] - rec["low"]) / 2
    if half <= 0:
        return math.copysign(math.inf, rec["estimate"]) if rec["estimate"] else 0.0
    return rec["estimate"] / half  # proportional to mean / se (same n and level for every method)


def _holm(pvalues: dict[str, float]) -> dict[str, float]:
    """Holm-adjusted p-values (step-down, monotone), keyed like the input."""
    order = sorted(pvalues, key=pvalues.get)
    k, out, running = len(order), {}, 0.0
    for i, name in enumerate(order):
        running = max(running, min(1.0, (k - i) * pvalues[name]))
        out[name] = running
    return out


def _one_sided_p(rec: dict, diffs: np.ndarray) -> float:
    """One-sided p-value of 'difference > 0': the one-sample t test of the paired differences behind `rec`.

    Where the record has no interval (one pair) the test cannot speak (p = 1); where the interval has zero width
    (identical differences) the test degenerates and the sign decides, as the interval does."""
    if rec["estimate"] is None or rec.get("low") is None or len(diffs) < 2:
        return 1.0
    if rec["high"] - rec["low"] <= 0:
        return 0.0 if rec["estimate"] > 0 else 1.0
    return one_sided_p(diffs, "greater")


def _claims_for(df: pd.DataFrame, cfg: StudyConfig, model: str, baseline: dict, tables: dict) -> dict:
    g, gate_runs = reference_gate(df, model, baseline)
    gates = [g]
    main, abl = [str(p) for p in tables["main"]], [str(p) for p in tables["ablation"]]
    src_main, src_abl = gate_runs + main, gate_runs + abl
    vals: dict = {}

    fixed, ds_bug, agg_bug = (_arm(df, model, v, "sft") for v in ("fixed", "ds_bug", "agg_bug"))
    vals["A5"] = _difference("A5", fixed, ds_bug, "SFT macro accuracy, fixed minus ds_bug", gates=gates,
                             sources=src_abl)

    # A6: absolute effects, per seed |fixed - agg_bug| - |fixed - ds_bug| (a bug that helps is an effect too)
    if _missing(fixed, ds_bug, agg_bug):
        vals["A6"] = not_measured(_missing(fixed, ds_bug, agg_bug), gates=gates, sources=src_abl)
    else:
        p = _pair(fixed, ds_bug, agg_bug)
        f, d, a = p.values
        detail = _join(f"per seed |fixed - agg_bug| - |fixed - ds_bug|, paired over seeds {p.seeds}: "
                       f"mean (fixed - agg_bug) {np.mean(f - a) if p.seeds else math.nan:+.2f}, "
                       f"mean (fixed - ds_bug) {np.mean(f - d) if p.seeds else math.nan:+.2f}", p.note)
        vals["A6"] = mean_ci(np.abs(f - a) - np.abs(f - d), level_for("A6"), detail=detail, gates=gates,
                             sources=p.sources + src_abl, diverged=p.diverged)

    mixed = [m for m in plan.MIXED if m in cfg.methods]
    # A7: SFT-then-RL against every mixed-policy method, one paired part each (the registry's parts)
    s_fixed = _arm(df, model, "fixed", "sft_then_rl")
    parts = {}
    for m in plan.MIXED:
        if m not in cfg.methods:
            parts[f"vs_{m}"] = not_measured(f"{m} not in sft_rl.methods", sources=main)
        else:
            parts[f"vs_{m}"] = _difference("A7", s_fixed, _arm(df, model, "fixed", m),
                                           f"fixed: sft_then_rl minus {m}", gates=[], sources=main)
    mixed_fixed = [_arm(df, model, "fixed", m) for m in mixed]
    vals["A7"] = _with_parts(parts, weakest(parts)["detail"], gates, src_main, s_fixed, *mixed_fixed)

    # A8: under both bugs, some mixed-policy method ahead of SFT-then-RL: one paired difference per method at
    # the registry's Holm level (its first step, alpha / 4, the four mixed methods); the method with the largest
    # t statistic decides (some method's interval above 0 <=> its interval is; all below 0 <=> its is).
    s_both = _arm(df, model, "both", "sft_then_rl")
    mixed_both = {m: _arm(df, model, "both", m) for m in mixed}
    if not mixed_both:
        vals["A8"] = not_measured("no mixed-policy method configured", gates=gates, sources=src_main)
    else:
        recs = {m: _difference("A8", a, s_both, f"both: {m} minus sft_then_rl", gates=gates, sources=src_main)
                for m, a in mixed_both.items()}
        measured = {m: r for m, r in recs.items() if r["estimate"] is not None}
        if not measured:
            vals["A8"] = dict(weakest(recs), gates=gates)
        else:
            diffs = {m: np.subtract(*_pair(mixed_both[m], s_both).values) for m in measured}
            pv = _holm({m: _one_sided_p(r, diffs[m]) for m, r in measured.items()})
            best = max(measured, key=lambda m: _t_stat(measured[m]))
            def show(m, r):
                if r["estimate"] is None:
                    return f"{m} not measured ({r['detail']})"
                ci = f" [{r['low']:.2f}, {r['high']:.2f}]" if r.get("low") is not None else ""
                return f"{m} {r['estimate']:+.2f}{ci} Holm p {pv[m]:.3g}"
            others = "; ".join(show(m, r) for m, r in recs.items())
            rec = recs[best]
            div = len({run for a in [s_both, *mixed_both.values()] for run in a.diverged.values()})
            vals["A8"] = dict(rec, detail=_join(f"deciding method: {best} (largest t)", rec["detail"],
                                                f"all methods at level {level_for('A8')}: {others}"))
            if div:
                vals["A8"]["diverged"] = div

    # A9: truncated SFT-then-RL beats every mixed-policy method (intersection-union over methods, paired) with
    # fewer FLOPs than each (exact: FLOPs are counted, not sampled; the largest per-seed ratio over methods)
    trunc = _arm(df, model, "fixed", "sft_then_rl_truncated")
    if not mixed or _missing(trunc):
        miss = "no mixed-policy method configured" if not mixed else _missing(trunc)
        parts = {"accuracy": not_measured(miss, sources=main), "flops": not_measured(miss, sources=main)}
    else:
        accs = {f"vs_{m}": _difference("A9", trunc, _arm(df, model, "fixed", m),
                                       f"fixed: truncated sft_then_rl minus {m}", gates=[], sources=main)
                for m in mixed}
        acc = weakest(accs)
        tf = _arm(df, model, "fixed", "sft_then_rl_truncated", "flops")
        ratios, lines, srcs, div, missing = [], [], [], 0, []
        for m in mixed:
            p = _pair(tf, _arm(df, model, "fixed", m, "flops"))
            srcs += p.sources
            div = max(div, p.diverged)
            if not p.seeds:
                missing.append(_join(f"{m}: no seed with both runs finished", p.note))
                continue
            r = p.values[0] / p.values[1]
            ratios += list(r)
            lines.append(f"{m} " + ", ".join(f"{x:.4g}" for x in r) + (f" ({p.note})" if p.note else ""))
        if missing:
            flops = not_measured(_join(*missing), sources=srcs + main, diverged=div)
        elif min(min(ratios), 1.0) <= 0 or not np.isfinite(ratios).all():
            flops = not_measured("non-positive FLOPs recorded", sources=srcs + main)
        else:
            flops = exact(float(max(ratios)), n=min(len(_pair(tf, _arm(df, model, "fixed", m, "flops")).seeds)
                                                   for m in mixed), sources=srcs + main,
                          detail="largest per-seed ratio truncated sft_then_rl FLOPs / mixed method FLOPs over "
                                 "every mixed method (FLOPs are counted, not sampled; every run must hold): "
                                 + "; ".join(lines))
            if div:
                flops["diverged"] = div
        parts = {"accuracy": acc, "flops": flops}
    arms = [trunc] + [_arm(df, model, "fixed", m) for m in mixed]
    vals["A9"] = _with_parts(parts, _join(*(f"{k}: {v['detail']}" for k, v in parts.items())), gates, src_main,
                             *arms)

    for v in vals.values():
        v["detail"] = f"{model}: {v['detail']}"
        v["sources"] = list(dict.fromkeys(v["sources"]))
    return vals


def _with_parts(parts: dict, detail: str, gates: list, sources: list[str], *arms: Arm) -> dict:
    """A record decided by its parts; `diverged` counts each diverged run behind any part once."""
    rec = with_parts(parts, detail=detail, gates=gates,
                     sources=[s for p in parts.values() for s in p["sources"]] + sources)
    div = len({run for a in arms for run in a.diverged.values()})
    if div:
        rec["diverged"] = div
    return rec


def _summary(rec: dict) -> str:
    if rec.get("parts"):
        return ", ".join(f"{k} {_summary(v)}" for k, v in rec["parts"].items())
    if rec["estimate"] is None:
        return Verdict.NOT_MEASURED
    if rec.get("low") is None or rec.get("exact"):
        return f"{rec['estimate']:.4g} (n={rec['n']})"
    return f"{rec['estimate']:.4g} [{rec['low']:.4g}, {rec['high']:.4g}] (n={rec['n']})"


def claims(df: pd.DataFrame, cfg: StudyConfig, scale: str, tables: dict, baseline: dict | None = None) -> dict:
    """Evidence records on the first configured model (the paper's headline model); with several models the
    others' estimates are appended to each detail (they are not judged).

    `tables`: {"main": [paths], "ablation": [paths]}, the tables each claim cites as its sources."""
    baseline = constant_baseline(cfg) if baseline is None else baseline
    out = _claims_for(df, cfg, cfg.models[0].name, baseline, tables)
    for m in cfg.models[1:]:
        for cid, v in _claims_for(df, cfg, m.name, baseline, tables).items():
            out[cid]["detail"] += f"; other model {m.name}: {_summary(v)}"
    return {"study": "sft_rl", "scale": scale, "values": out}
