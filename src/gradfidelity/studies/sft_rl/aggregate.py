"""Runs -> tables, figures and claim evidence (A5-A9) for the sft_rl study.

Every number comes from the runs' metrics.json, read at the paths plan.py assigns to each table cell. A diverged
run keeps its row (status column) and makes every claim that needs it `null` with a detail: never a silent mean
over the survivors.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from gradfidelity.errors import UserError
from gradfidelity.harness.io import atomic_write_json, read_json
from gradfidelity.studies.sft_rl import plan
from gradfidelity.studies.sft_rl.config import StudyConfig
from gradfidelity.studies.sft_rl.task import EVAL_SETS
from gradfidelity.tables import write_table

ACC = [f"acc_{s}" for s in EVAL_SETS] + ["acc_macro"]
ABLATION = [("both", "no (0.18.9)", "no (per-micro-batch)"), ("agg_bug", "yes (0.19.8)", "no (per-micro-batch)"),
            ("ds_bug", "no (0.18.9)", "yes (global token mean)"), ("fixed", "yes (0.19.8)", "yes (global token mean)")]


def _cell(rec: dict, method: str) -> dict:
    """One run's numbers for a table cell (the truncated method reads the sft_then_rl run's truncated block)."""
    if rec["status"] != "ok":
        return {"status": rec["status"]}
    m = rec["metrics"]
    if method == "sft_then_rl_truncated":
        t = m["truncated"]
        return {"status": "ok", **{k: t[k] for k in ACC}, "flops": t["flops"], "rl_steps": t["rl_steps"]}
    return {"status": "ok", **{k: m[k] for k in ACC}, "flops": m["flops"],
            "reward_history": m.get("reward_history"), "loss_history": m.get("loss_history")}


def collect(cfg: StudyConfig, root: Path) -> pd.DataFrame:
    """One row per (model, variant, method, seed) cell, for the table variants and, for SFT, every variant."""
    raw, rows = cfg.raw, []
    for model in (m.name for m in cfg.models):
        for seed in cfg.seeds:
            cells = [(v, m) for v in plan.table_variants(raw) for m in cfg.methods]
            cells += [(v, "sft") for v in cfg.variants if v not in plan.TABLE_VARIANTS and "sft" in cfg.methods]
            for variant, method in cells:
                d = Path(plan.cell_dir(raw, str(root), model, variant, method, seed))
                path = d / "metrics.json"
                if not path.exists():
                    raise UserError(f"{path}: missing run (rerun the sft_rl rules)")
                rows.append({"model": model, "variant": variant, "method": method, "seed": seed,
                             "run": str(d), **_cell(read_json(path), method)})
    return pd.DataFrame(rows)


def _fmt(mean: float, sd: float) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "diverged"
    return f"{mean:.1f} ± {sd:.1f}" if not math.isnan(sd) else f"{mean:.1f}"


def summarise(df: pd.DataFrame) -> pd.DataFrame:
    """mean and sd over seeds per (model, variant, method); a cell with any diverged seed has no mean."""
    out = []
    for (model, variant, method), g in df.groupby(["model", "variant", "method"], sort=False):
        ok = g[g.status == "ok"]
        row = {"model": model, "variant": variant, "method": method, "n_seeds": len(g),
               "n_diverged": int((g.status != "ok").sum()), "run_variant": Path(g.run.iloc[0]).parts[-3]}
        for k in ACC + ["flops"]:
            vals = ok[k].astype(float).to_numpy() if len(ok) == len(g) else np.array([])
            row[f"{k}_mean"] = float(vals.mean()) if len(vals) else math.nan
            row[f"{k}_sd"] = float(vals.std(ddof=1)) if len(vals) > 1 else math.nan
        out.append(row)
    return pd.DataFrame(out)


def main_table(summary: pd.DataFrame, cfg: StudyConfig, tables: Path) -> pd.DataFrame:
    s = summary[summary.variant.isin(plan.TABLE_VARIANTS)].copy()
    order = {m: i for i, m in enumerate(cfg.methods)}
    s = s.sort_values(["model", "variant", "method"], key=lambda c: c.map(order) if c.name == "method" else c)
    md = s[["model", "variant", "method", "n_seeds", "n_diverged", "run_variant"]].copy()
    for k in ACC:
        md[k.replace("acc_", "")] = [_fmt(a, b) for a, b in zip(s[f"{k}_mean"], s[f"{k}_sd"], strict=True)]
    md["PFLOPs"] = [f"{x / 1e15:.4g}" for x in s["flops_mean"]]
    notes = [
        "Accuracy in points (exact match, greedy decoding), mean ± sd over seeds; macro = mean of id, long, ood.",
        "`fixed`: deepspeed 0.19.8 + global token mean; `both`: deepspeed 0.18.9 (CPU-offload accumulation bug) + "
        "per-micro-batch token mean, applied to the stages in `bug_stages` "
        f"({', '.join(cfg.bug_stages)}); run_variant says which runs a cell reads (a cell whose stages all run "
        "fixed under `both` shares the fixed run).",
        "PFLOPs: post-training compute, training 6 x params x tokens + generation 2 x params x tokens, SFT included "
        "for SFT-then-RL; the base model's pretraining is common to all methods and not counted.",
        f"sft_then_rl_truncated: the sft_then_rl run evaluated after {cfg.truncated_steps} of {cfg.rl.steps} RL "
        "steps (the paper's 50-step fraction).",
    ]
    write_table(md, tables / "sft_rl_main.csv", title="SFT-then-RL vs mixed-policy methods (sft_rl)", notes=notes)
    return s


def ablation_table(summary: pd.DataFrame, df: pd.DataFrame, cfg: StudyConfig, tables: Path) -> pd.DataFrame:
    rows = []
    for model in summary.model.unique():
        sft = summary[(summary.model == model) & (summary.method == "sft")].set_index("variant")
        fixed = sft.loc["fixed", "acc_macro_mean"] if "fixed" in sft.index else math.nan
        for variant, ds_fixed, agg_fixed in ABLATION:
            if variant not in sft.index:
                continue
            r = sft.loc[variant]
            rows.append({"model": model, "variant": variant, "optimizer_bug_fixed": ds_fixed,
                         "aggregation_bug_fixed": agg_fixed, "n_seeds": int(r.n_seeds),
                         "n_diverged": int(r.n_diverged),
                         "sft_macro": _fmt(r.acc_macro_mean, r.acc_macro_sd),
                         "minus_fixed": f"{r.acc_macro_mean - fixed:+.1f}",
                         **{k.replace("acc_", ""): _fmt(r[f"{k}_mean"], r[f"{k}_sd"]) for k in ACC[:-1]}})
    out = pd.DataFrame(rows)
    write_table(out, tables / "sft_rl_bug_ablation.csv", title="SFT score as each bug is fixed (sft_rl)", notes=[
        f"SFT with TRL SFTTrainer on DeepSpeed ZeRO-{cfg.deepspeed.zero_stage} + CPU optimizer offload, micro-batch "
        f"{cfg.sft.micro_batch_size}, GA {cfg.sft.grad_accum} (LUFFY's SFT recipe); macro accuracy in points, mean "
        "± sd over seeds; minus_fixed = variant mean - fixed mean."])
    return out


# ----------------------------------------------------------------------------- claims
def _mean(df, model, variant, method, key="acc_macro"):
    g = df[(df.model == model) & (df.variant == variant) & (df.method == method)]
    if len(g) == 0:
        return None, f"no {method}/{variant} runs"
    if (g.status != "ok").any():
        return None, f"{method}/{variant}: {int((g.status != 'ok').sum())} of {len(g)} seeds diverged"
    return float(g[key].astype(float).mean()), ""


def claims(df: pd.DataFrame, cfg: StudyConfig, scale: str) -> dict:
    """Measured values on the first configured model (the paper's headline model); with several models the
    others' values are appended to each detail."""
    out = _claims_for(df, cfg, cfg.models[0].name)
    for m in cfg.models[1:]:
        other = _claims_for(df, cfg, m.name)
        for cid, v in other.items():
            out[cid]["detail"] += f"; {m.name}: measured {v['measured']}"
    return {"study": "sft_rl", "scale": scale, "values": out}


def _claims_for(df: pd.DataFrame, cfg: StudyConfig, model: str) -> dict:
    n = len(cfg.seeds)
    vals: dict = {}

    def put(cid, measured, detail):
        vals[cid] = {"measured": measured, "detail": f"{model}: {detail}", "n": n}

    f, e1 = _mean(df, model, "fixed", "sft")
    d, e2 = _mean(df, model, "ds_bug", "sft")
    a, e3 = _mean(df, model, "agg_bug", "sft")
    if f is not None and d is not None:
        put("A5", f - d, f"SFT macro fixed {f:.2f} - ds_bug {d:.2f}")
    else:
        put("A5", None, e1 or e2)
    if None not in (f, d, a):
        put("A6", (f - a) - (f - d), f"(fixed - agg_bug) {f - a:+.2f} minus (fixed - ds_bug) {f - d:+.2f}")
    else:
        put("A6", None, e1 or e2 or e3)

    def best_mixed(variant):
        best, err = None, ""
        for m in (x for x in cfg.methods if x in plan.MIXED):
            v, e = _mean(df, model, variant, m)
            if v is None:
                return None, e
            if best is None or v > best[1]:
                best = (m, v)
        return best, err or ("" if best else "no mixed-policy method configured")

    for cid, variant in (("A7", "fixed"), ("A8", "both")):
        s, e = _mean(df, model, variant, "sft_then_rl")
        b, eb = best_mixed(variant)
        if s is None or b is None:
            put(cid, None, e or eb)
        elif cid == "A7":
            put(cid, s - b[1], f"fixed: sft_then_rl {s:.2f} - best mixed ({b[0]}) {b[1]:.2f}")
        else:
            put(cid, b[1] - s, f"both: best mixed ({b[0]}) {b[1]:.2f} - sft_then_rl {s:.2f}")
    t, et = _mean(df, model, "fixed", "sft_then_rl_truncated")
    tf, _ = _mean(df, model, "fixed", "sft_then_rl_truncated", "flops")
    b, eb = best_mixed("fixed")
    if t is None or b is None:
        put("A9", None, et or eb)
    else:
        bf, _ = _mean(df, model, "fixed", b[0], "flops")
        put("A9", bool(t > b[1] and tf < bf),
            f"truncated {t:.2f} at {tf:.3g} FLOPs vs best mixed ({b[0]}) {b[1]:.2f} at {bf:.3g} FLOPs")
    return vals


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
        ax.errorbar(r.flops_mean, r.acc_macro_mean, yerr=0 if math.isnan(r.acc_macro_sd) else r.acc_macro_sd,
                    fmt="o" if filled else "s", color=colors[r.method], mfc=colors[r.method] if filled else "none",
                    label=f"{r.method} ({r.variant})", capsize=2)
    ax.set_xscale("log")
    ax.legend(fontsize=6, ncol=2)
    style_axes(ax, f"score vs compute ({model})", "post-training FLOPs", "macro accuracy (points)")
    save_figure(fig, figdir / "sft_rl_score_vs_flops.png",
                caption="Filled: fixed infrastructure; hollow: both bugs. Mean ± sd over seeds.")

    fig, axes = new_figure(ncols=2, width=4.5, height=3.4)
    ax_r, ax_l = axes[0]
    for method in (m for m in cfg.methods if m in plan.RL_STAGE):
        for variant, ls in (("fixed", "-"), ("both", "--")):
            g = df[(df.model == model) & (df.variant == variant) & (df.method == method) & (df.status == "ok")]
            curves = [c for c in g.reward_history if isinstance(c, list) and c]
            if not curves:
                continue
            n = min(len(c) for c in curves)
            ax_r.plot(np.arange(1, n + 1), np.mean([c[:n] for c in curves], axis=0), ls=ls, color=colors[method],
                      label=f"{method} ({variant})")
    ax_r.legend(fontsize=6)
    style_axes(ax_r, "RL training reward", "RL step", "mean reward of rollouts")
    for i, variant in enumerate(cfg.variants):
        g = df[(df.model == model) & (df.variant == variant) & (df.method == "sft") & (df.status == "ok")]
        curves = [c for c in g.loss_history if isinstance(c, list) and c]
        if curves:
            n = min(len(c) for c in curves)
            ax_l.plot(np.arange(1, n + 1), np.mean([c[:n] for c in curves], axis=0), color=f"C{i}", label=variant)
    ax_l.legend(fontsize=7)
    style_axes(ax_l, "SFT training loss", "optimizer step", "logged loss")
    save_figure(fig, figdir / "sft_rl_reward_curves.png",
                caption="Left: training reward (fixed solid, both bugs dashed; runs shared between the two variants "
                        "overlap). Right: SFT loss per infrastructure variant (as logged, so the per-micro-batch "
                        "mean variants log a differently normalised loss).")


def aggregate(cfg: StudyConfig, root: Path, scale: str, tables: Path, figdir: Path, evidence: Path) -> None:
    df = collect(cfg, root)
    summary = summarise(df)
    tables.mkdir(parents=True, exist_ok=True)
    figdir.mkdir(parents=True, exist_ok=True)
    main_table(summary, cfg, tables)
    ablation_table(summary, df, cfg, tables)
    figures(df, summary, cfg, figdir)
    atomic_write_json(evidence, claims(df, cfg, scale))
