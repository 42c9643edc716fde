"""Runs -> tables, figures and claim evidence (A5-A9) for the sft_rl study.

Every number comes from the runs' metrics.json, read through the harness loader (`load_run_records`, which
refuses a run made at another scale) at the paths plan.py assigns to each table cell.

Diverged runs are never averaged away in silence: a table cell gives its mean over the seeds that finished and
says how many diverged ("diverged (3/3)" when none finished); a claim compares methods seed by seed (same seed =
same initialisation and data order = one pair), drops the pair of a seed whose run diverged, and records the
number of diverged runs (`diverged`) and which they were (`detail`).

Claim evidence follows the contract of gradfidelity.claims.evidence (an estimate with an interval over paired
seeds at the registry's level, n, gates, sources). Every claim carries the gate `reference_learned`: the fixed SFT
model must beat the best constant-answer predictor of the in-distribution eval set (always answering its most
frequent answer) by at least GATE_MARGIN points, otherwise the comparisons between methods are comparisons of
models that learned nothing and no claim is judged.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

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
from gradfidelity.errors import UserError
from gradfidelity.harness.io import atomic_write_json
from gradfidelity.harness.results import load_run_records
from gradfidelity.studies.sft_rl import plan
from gradfidelity.studies.sft_rl.config import StudyConfig
from gradfidelity.studies.sft_rl.task import EVAL_SETS, make_split
from gradfidelity.tables import write_table

ACC = [f"acc_{s}" for s in EVAL_SETS] + ["acc_macro"]
NLL = ["nll_id", "nll_macro"]  # secondary endpoint: held-out teacher-forced NLL of the demonstrations (nats/token)
ABLATION = [("both", "no (0.18.9)", "no (per-micro-batch)"), ("agg_bug", "yes (0.19.8)", "no (per-micro-batch)"),
            ("ds_bug", "no (0.18.9)", "yes (global token mean)"), ("fixed", "yes (0.19.8)", "yes (global token mean)")]
MAIN_TABLE, ABLATION_TABLE = "sft_rl_main.csv", "sft_rl_bug_ablation.csv"
GATE = "reference_learned"
GATE_MARGIN = 10.0  # points above the best constant answer the fixed SFT model must reach (in-distribution set)
CONSTANT = "constant_answer"


# ----------------------------------------------------------------------------- loading
def results_root(runs: list[str | Path]) -> Path:
    """results/sft_rl/<model>/<variant>/<method>/seed<k>/metrics.json -> results/sft_rl (one root for all)."""
    roots = {Path(r).parents[4] for r in runs}
    if len(roots) != 1:
        raise UserError(f"--runs must come from one results directory, got {sorted(map(str, roots))}")
    return roots.pop()


def _cell(rec: dict, method: str) -> dict:
    """One run's numbers for a table cell (the truncated method reads the sft_then_rl run's truncated block)."""
    if rec["status"] != "ok":
        return {"status": rec["status"]}
    m = rec["metrics"]
    try:
        if method == "sft_then_rl_truncated":
            t = m["truncated"]
            return {"status": "ok", **{k: float(t[k]) for k in ACC + NLL}, "flops": float(t["flops"]),
                    "rl_steps": t["rl_steps"]}
        return {"status": "ok", **{k: float(m[k]) for k in ACC + NLL}, "flops": float(m["flops"]),
                "reward_history": m.get("reward_history"), "loss_history": m.get("loss_history")}
    except KeyError as exc:
        raise UserError(f"{rec['path']}: metrics lack {exc} (needed by the {method} cell)") from None


def collect(cfg: StudyConfig, records: list[dict], root: str | Path) -> pd.DataFrame:
    """One row per (model, variant, method, seed) cell, for the table variants and, for SFT, every variant.

    `records` are the runs as `load_run_records` returns them; every cell must find its run among them."""
    by_path = {os.path.normpath(r["path"]): r for r in records}
    raw, rows = cfg.raw, []
    for model in (m.name for m in cfg.models):
        for seed in cfg.seeds:
            cells = [(v, m) for v in plan.table_variants(raw) for m in cfg.methods]
            cells += [(v, "sft") for v in cfg.variants if v not in plan.TABLE_VARIANTS and "sft" in cfg.methods]
            for variant, method in cells:
                d = plan.cell_dir(raw, str(root), model, variant, method, seed)
                path = os.path.normpath(f"{d}/metrics.json")
                rec = by_path.get(path)
                if rec is None:
                    raise UserError(f"{path}: missing run (not among the aggregated runs; rerun the sft_rl rules)")
                if rec.get("seed") is not None and int(rec["seed"]) != int(seed):
                    raise UserError(f"{path}: metrics.json says seed {rec['seed']}, its directory seed{seed}")
                rows.append({"model": model, "variant": variant, "method": method, "seed": seed,
                             "run": os.path.normpath(d), **_cell(rec, method)})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- constant-answer baseline
def constant_baseline(cfg: StudyConfig) -> dict:
    """Accuracy (points) of the best constant answer per eval set: always answering the set's most frequent
    answer. The reference a model must clearly beat before its scores say anything about training.

    {"sets": {set: {"answer", "acc", "n"}}, "acc_macro": float} or {"error": why} when the eval data cannot be
    read (paper-scale data absent here)."""
    try:
        if cfg.data.source == "arithmetic":
            problems = {s: make_split(cfg.task, s) for s in EVAL_SETS}
            norm = str
        else:
            from gradfidelity.studies.sft_rl import paper

            problems = paper.eval_problems(cfg.data)
            norm = lambda s: s.replace("$", "").replace(" ", "")  # noqa: E731  (the checker's normalisation)
    except (UserError, OSError, ValueError, ImportError) as exc:
        return {"error": f"eval data unavailable ({exc})"}
    sets = {}
    for s in EVAL_SETS:
        answers = Counter(norm(p.answer) for p in problems[s])
        answer, count = answers.most_common(1)[0]
        sets[s] = {"answer": answer, "acc": 100.0 * count / len(problems[s]), "n": len(problems[s])}
    return {"sets": sets, "acc_macro": float(np.mean([sets[s]["acc"] for s in EVAL_SETS]))}


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


# ----------------------------------------------------------------------------- tables
def _fmt(mean: float, sd: float, n: int, n_div: int, digits: int = 1) -> str:
    if n_div >= n:
        return f"diverged ({n_div}/{n})"
    s = f"{mean:.{digits}f}" + (f" ± {sd:.{digits}f}" if not math.isnan(sd) else "")
    return s + (f" ({n_div}/{n} diverged)" if n_div else "")


def summarise(df: pd.DataFrame) -> pd.DataFrame:
    """Mean and sd over the finished seeds per (model, variant, method), with the number of diverged seeds."""
    out = []
    for (model, variant, method), g in df.groupby(["model", "variant", "method"], sort=False):
        ok = g[g.status == "ok"]
        row = {"model": model, "variant": variant, "method": method, "n_seeds": len(g),
               "n_diverged": int((g.status != "ok").sum()), "run_variant": Path(g.run.iloc[0]).parts[-3]}
        for k in ACC + NLL + ["flops"]:
            vals = ok[k].astype(float).to_numpy() if len(ok) else np.array([])
            row[f"{k}_mean"] = float(vals.mean()) if len(vals) else math.nan
            row[f"{k}_sd"] = float(vals.std(ddof=1)) if len(vals) > 1 else math.nan
        out.append(row)
    return pd.DataFrame(out)


def main_table(summary: pd.DataFrame, cfg: StudyConfig, tables: Path, baseline: dict) -> pd.DataFrame:
    s = summary[summary.variant.isin(plan.TABLE_VARIANTS)].copy()
    order = {m: i for i, m in enumerate(cfg.methods)}
    s = s.sort_values(["model", "variant", "method"], key=lambda c: c.map(order) if c.name == "method" else c)
    md = s[["model", "variant", "method", "n_seeds", "n_diverged", "run_variant"]].copy()
    for k in ACC:
        md[k.replace("acc_", "")] = [_fmt(a, b, n, d) for a, b, n, d in
                                     zip(s[f"{k}_mean"], s[f"{k}_sd"], s.n_seeds, s.n_diverged, strict=True)]
    md["nll_id"] = [_fmt(a, b, n, d, 3) for a, b, n, d in
                    zip(s["nll_id_mean"], s["nll_id_sd"], s.n_seeds, s.n_diverged, strict=True)]
    md["PFLOPs"] = [f"diverged ({d}/{n})" if d >= n else f"{x / 1e15:.4g}"
                    for x, n, d in zip(s["flops_mean"], s.n_seeds, s.n_diverged, strict=True)]
    md = md.astype({"n_seeds": object, "n_diverged": object})
    if "error" in baseline:
        base_note = f"constant_answer: not computed ({baseline['error']})."
    else:
        const = [{"model": "(any)", "variant": "-", "method": CONSTANT, "n_seeds": "-", "n_diverged": "-",
                  "run_variant": "-", **{x: f"{baseline['sets'][x]['acc']:.1f}" for x in EVAL_SETS},
                  "macro": f"{baseline['acc_macro']:.1f}", "nll_id": "-", "PFLOPs": "0"}]
        md = pd.concat([md, pd.DataFrame(const)], ignore_index=True)
        answers = ", ".join(f"{x} '{baseline['sets'][x]['answer']}'" for x in EVAL_SETS)
        base_note = (f"constant_answer: always the most frequent answer of each eval set ({answers}), the best any "
                     f"constant predictor can score; every claim is gated on fixed SFT reaching the `id` value + "
                     f"{GATE_MARGIN:g} points (`{GATE}`).")
    notes = [
        "Accuracy in points (exact match, greedy decoding), mean ± sd over the seeds that finished; a cell with "
        "diverged seeds says how many ('diverged (k/n)' when none finished); macro = mean of id, long, ood.",
        "nll_id: the secondary endpoint, teacher-forced NLL (nats/token) of the held-out `id` demonstrations "
        "(solution + EOS given the prompt), mean ± sd over seeds: no sampling, so far less noisy than accuracy.",
        "`fixed`: deepspeed 0.19.8 + global token mean; `both`: deepspeed 0.18.9 (CPU-offload accumulation bug) + "
        "per-micro-batch token mean, applied to the stages in `bug_stages` "
        f"({', '.join(cfg.bug_stages)}); run_variant says which runs a cell reads (a cell whose stages all run "
        "fixed under `both` shares the fixed run).",
        "PFLOPs: post-training compute, training 6 x params x tokens + generation 2 x params x tokens, each "
        "sequence counted once per forward it really gets (a demonstration once per prompt, every generated rollout "
        "including LUFFY's replaced one), SFT included for SFT-then-RL; the shared pretraining is not counted.",
        f"sft_then_rl_truncated: the sft_then_rl run evaluated after {cfg.truncated_steps} of {cfg.rl.steps} RL "
        "steps (the paper's 50-step fraction).",
        base_note,
    ]
    write_table(md, tables / MAIN_TABLE, title="SFT-then-RL vs mixed-policy methods (sft_rl)", notes=notes)
    return s


def ablation_table(summary: pd.DataFrame, cfg: StudyConfig, tables: Path, baseline: dict) -> pd.DataFrame:
    rows = []
    for model in summary.model.unique():
        sft = summary[(summary.model == model) & (summary.method == "sft")].set_index("variant")
        fixed = sft.loc["fixed", "acc_macro_mean"] if "fixed" in sft.index else math.nan
        for variant, ds_fixed, agg_fixed in ABLATION:
            if variant not in sft.index:
                continue
            r = sft.loc[variant]
            diff = r.acc_macro_mean - fixed
            rows.append({"model": model, "variant": variant, "optimizer_bug_fixed": ds_fixed,
                         "aggregation_bug_fixed": agg_fixed, "n_seeds": int(r.n_seeds),
                         "n_diverged": int(r.n_diverged),
                         "sft_macro": _fmt(r.acc_macro_mean, r.acc_macro_sd, r.n_seeds, r.n_diverged),
                         "minus_fixed": "n/a (diverged)" if math.isnan(diff) else f"{diff:+.1f}",
                         **{k.replace("acc_", ""): _fmt(r[f"{k}_mean"], r[f"{k}_sd"], r.n_seeds, r.n_diverged)
                            for k in ACC[:-1]},
                         "nll_id": _fmt(r.nll_id_mean, r.nll_id_sd, r.n_seeds, r.n_diverged, 3)})
    if "error" not in baseline:
        rows.append({"model": "(any)", "variant": CONSTANT, "optimizer_bug_fixed": "-", "aggregation_bug_fixed": "-",
                     "n_seeds": "-", "n_diverged": "-", "sft_macro": f"{baseline['acc_macro']:.1f}",
                     "minus_fixed": "-", **{x: f"{baseline['sets'][x]['acc']:.1f}" for x in EVAL_SETS},
                     "nll_id": "-"})
    out = pd.DataFrame(rows)
    write_table(out, tables / ABLATION_TABLE, title="SFT score as each bug is fixed (sft_rl)", notes=[
        f"SFT with TRL SFTTrainer on DeepSpeed ZeRO-{cfg.deepspeed.zero_stage} + CPU optimizer offload, micro-batch "
        f"{cfg.sft.micro_batch_size}, GA {cfg.sft.grad_accum} (LUFFY's SFT recipe); macro accuracy in points, mean "
        "± sd over the seeds that finished (diverged seeds counted in n_diverged and in each cell); minus_fixed = "
        "variant mean - fixed mean (the claims pair seeds instead); nll_id: teacher-forced NLL of the held-out `id` "
        "demonstrations (nats/token); constant_answer: the best constant predictor of each eval set."])
    return out


# ----------------------------------------------------------------------------- claims
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


def _one_sided_p(rec: dict, n_pairs: int) -> float:
    """One-sided p-value of 'difference > 0' from a t record (its interval gives the standard error)."""
    from scipy import stats

    if rec["estimate"] is None or rec.get("low") is None or n_pairs < 2:
        return 1.0
    half = (rec["high"] - rec["low"]) / 2
    if half <= 0:
        return 0.0 if rec["estimate"] > 0 else 1.0
    se = half / stats.t.ppf(0.5 + rec["level"] / 2, n_pairs - 1)
    return float(stats.t.sf(rec["estimate"] / se, n_pairs - 1))


def _claims_for(df: pd.DataFrame, cfg: StudyConfig, model: str, baseline: dict, tables: Path) -> dict:
    g, gate_runs = reference_gate(df, model, baseline)
    gates = [g]
    main = [str(tables / MAIN_TABLE), str(tables / MAIN_TABLE.replace(".csv", ".md"))]
    abl = [str(tables / ABLATION_TABLE), str(tables / ABLATION_TABLE.replace(".csv", ".md"))]
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
            pv = _holm({m: _one_sided_p(r, r["n"]) for m, r in measured.items()})
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
        return "not measured"
    if rec.get("low") is None or rec.get("exact"):
        return f"{rec['estimate']:.4g} (n={rec['n']})"
    return f"{rec['estimate']:.4g} [{rec['low']:.4g}, {rec['high']:.4g}] (n={rec['n']})"


def claims(df: pd.DataFrame, cfg: StudyConfig, scale: str, baseline: dict, tables: Path) -> dict:
    """Evidence records on the first configured model (the paper's headline model); with several models the
    others' estimates are appended to each detail (they are not judged)."""
    out = _claims_for(df, cfg, cfg.models[0].name, baseline, tables)
    for m in cfg.models[1:]:
        for cid, v in _claims_for(df, cfg, m.name, baseline, tables).items():
            out[cid]["detail"] += f"; other model {m.name}: {_summary(v)}"
    return {"study": "sft_rl", "scale": scale, "values": out}


# ----------------------------------------------------------------------------- figures
def figures(df: pd.DataFrame, summary: pd.DataFrame, cfg: StudyConfig, figdir: Path) -> None:
    from gradfidelity.plots import new_figure, save_figure, style_axes

    model = cfg.models[0].name
    fig, ax = new_figure(width=5.0, height=3.6)
    ax = ax[0][0]
    s = summary[(summary.model == model) & summary.variant.isin(plan.TABLE_VARIANTS)]
    colors = {m: f"C{i}" for i, m in enumerate(cfg.methods)}
    for _, r in s.iterrows():
        if math.isnan(r.acc_macro_mean):
            continue
        filled = r.variant == "fixed"
        div = f", {r.n_diverged} diverged" if r.n_diverged else ""
        ax.errorbar(r.flops_mean, r.acc_macro_mean, yerr=0 if math.isnan(r.acc_macro_sd) else r.acc_macro_sd,
                    fmt="o" if filled else "s", color=colors[r.method], mfc=colors[r.method] if filled else "none",
                    label=f"{r.method} ({r.variant}{div})", capsize=2)
    ax.set_xscale("log")
    ax.legend(fontsize=6, ncol=2)
    style_axes(ax, f"score vs compute ({model})", "post-training FLOPs", "macro accuracy (points)")
    save_figure(fig, figdir / "sft_rl_score_vs_flops.png",
                caption="Filled: fixed infrastructure; hollow: both bugs. Mean ± sd over the seeds that finished "
                        "(the legend counts diverged seeds; a cell with none finished is not drawn).")

    fig, axes = new_figure(ncols=2, width=4.5, height=3.4)
    ax_r, ax_l = axes[0]
    for method in (m for m in cfg.methods if m in plan.RL_STAGE):
        for variant, ls in (("fixed", "-"), ("both", "--")):
            g = df[(df.model == model) & (df.variant == variant) & (df.method == method) & (df.status == "ok")]
            curves = [c for c in g.get("reward_history", []) if isinstance(c, list) and c]
            if not curves:
                continue
            n = min(len(c) for c in curves)
            ax_r.plot(np.arange(1, n + 1), np.mean([c[:n] for c in curves], axis=0), ls=ls, color=colors[method],
                      label=f"{method} ({variant})")
    ax_r.legend(fontsize=6)
    style_axes(ax_r, "RL training reward", "RL step", "mean reward of rollouts")
    for i, variant in enumerate(cfg.variants):
        g = df[(df.model == model) & (df.variant == variant) & (df.method == "sft") & (df.status == "ok")]
        curves = [c for c in g.get("loss_history", []) if isinstance(c, list) and c]
        if curves:
            n = min(len(c) for c in curves)
            ax_l.plot(np.arange(1, n + 1), np.mean([c[:n] for c in curves], axis=0), color=f"C{i}", label=variant)
    ax_l.legend(fontsize=7)
    style_axes(ax_l, "SFT training loss", "optimizer step", "logged loss")
    save_figure(fig, figdir / "sft_rl_reward_curves.png",
                caption="Left: training reward (fixed solid, both bugs dashed; runs shared between the two variants "
                        "overlap). Right: SFT loss per infrastructure variant (as logged, so the per-micro-batch "
                        "mean variants log a differently normalised loss). Diverged runs are left out.")


def aggregate(cfg: StudyConfig, runs: list[str | Path], scale: str, tables: Path, figdir: Path,
              evidence: Path) -> None:
    records = load_run_records(runs, scale=scale)
    df = collect(cfg, records, results_root(runs))
    summary = summarise(df)
    baseline = constant_baseline(cfg)
    tables.mkdir(parents=True, exist_ok=True)
    figdir.mkdir(parents=True, exist_ok=True)
    main_table(summary, cfg, tables, baseline)
    ablation_table(summary, cfg, tables, baseline)
    figures(df, summary, cfg, figdir)
    atomic_write_json(evidence, claims(df, cfg, scale, baseline, tables))
