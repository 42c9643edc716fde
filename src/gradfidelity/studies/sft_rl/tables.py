"""Tidy CSV -> the study's paper tables, at the paths the rule passes: the main table (every method under the fixed
and the buggy infrastructure) and the bug ablation (SFT as each bug is fixed), each with the constant-answer row.

A cell gives the mean ± sd over the seeds that finished and says how many diverged ("diverged (k/n)" when none
finished): diverged runs are never averaged away in silence. The main table adds the t interval of the mean macro
accuracy over those seeds (`macro_ci95`), the interval a reader compares cells by: the project's one interval
(`stats.intervals.t_interval`) at the registry's level of the claim the macro accuracy feeds (A7: 0.95), over the
per-seed values of the tidy CSV, so the table and the claim show one interval for one number.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from gradfidelity.claims.evidence import level_for
from gradfidelity.stats.intervals import t_interval
from gradfidelity.studies.sft_rl import plan
from gradfidelity.studies.sft_rl.aggregate import ACC, summarise
from gradfidelity.studies.sft_rl.baseline import CONSTANT, GATE, GATE_MARGIN, constant_baseline
from gradfidelity.studies.sft_rl.config import StudyConfig
from gradfidelity.studies.sft_rl.task import EVAL_SETS
from gradfidelity.tables import write_table

ABLATION = [("both", "no (0.18.9)", "no (per-micro-batch)"), ("agg_bug", "yes (0.19.8)", "no (per-micro-batch)"),
            ("ds_bug", "no (0.18.9)", "yes (global token mean)"), ("fixed", "yes (0.19.8)", "yes (global token mean)")]


def _fmt(mean: float, sd: float, n: int, n_div: int, digits: int = 1) -> str:
    if n_div >= n:
        return f"diverged ({n_div}/{n})"
    s = f"{mean:.{digits}f}" + (f" ± {sd:.{digits}f}" if not math.isnan(sd) else "")
    return s + (f" ({n_div}/{n} diverged)" if n_div else "")


def macro_intervals(df: pd.DataFrame, level: float) -> dict[tuple[str, str, str], str]:
    """The t interval (at `level`) of the mean macro accuracy over the finished seeds of each (model, variant,
    method) cell of the tidy CSV, formatted ("n/a" with fewer than two)."""
    out = {}
    for key, g in df.groupby(["model", "variant", "method"], sort=False):
        ok = g[g.status == "ok"]
        out[key] = t_interval(ok["acc_macro"].astype(float), level).fmt(1) if len(ok) else "n/a"
    return out


def main_table(summary: pd.DataFrame, cfg: StudyConfig, baseline: dict, csv: Path, md: Path,
               intervals: dict[tuple[str, str, str], str], level: float) -> pd.DataFrame:
    """`intervals`: `macro_intervals` of the tidy CSV at `level`."""
    s = summary[summary.variant.isin(plan.TABLE_VARIANTS)].copy()
    order = {m: i for i, m in enumerate(cfg.methods)}
    s = s.sort_values(["model", "variant", "method"], key=lambda c: c.map(order) if c.name == "method" else c)
    out = s[["model", "variant", "method", "n_seeds", "n_diverged", "run_variant"]].copy()
    for k in ACC:
        out[k.replace("acc_", "")] = [_fmt(a, b, n, d) for a, b, n, d in
                                     zip(s[f"{k}_mean"], s[f"{k}_sd"], s.n_seeds, s.n_diverged, strict=True)]
    out["macro_ci95"] = [intervals[key] for key in zip(s.model, s.variant, s.method, strict=True)]
    out["nll_id"] = [_fmt(a, b, n, d, 3) for a, b, n, d in
                    zip(s["nll_id_mean"], s["nll_id_sd"], s.n_seeds, s.n_diverged, strict=True)]
    out["PFLOPs"] = [f"diverged ({d}/{n})" if d >= n else f"{x / 1e15:.4g}"
                    for x, n, d in zip(s["flops_mean"], s.n_seeds, s.n_diverged, strict=True)]
    out = out.astype({"n_seeds": object, "n_diverged": object})
    if "error" in baseline:
        base_note = f"constant_answer: not computed ({baseline['error']})."
    else:
        const = [{"model": "(any)", "variant": "-", "method": CONSTANT, "n_seeds": "-", "n_diverged": "-",
                  "run_variant": "-", **{x: f"{baseline['sets'][x]['acc']:.1f}" for x in EVAL_SETS},
                  "macro": f"{baseline['acc_macro']:.1f}", "macro_ci95": "-", "nll_id": "-", "PFLOPs": "0"}]
        out = pd.concat([out, pd.DataFrame(const)], ignore_index=True)
        answers = ", ".join(f"{x} '{baseline['sets'][x]['answer']}'" for x in EVAL_SETS)
        base_note = (f"constant_answer: always the most frequent answer of each eval set ({answers}), the best any "
                     f"constant predictor can score; every claim is gated on fixed SFT reaching the `id` value + "
                     f"{GATE_MARGIN:g} points (`{GATE}`).")
    notes = [
        "Accuracy in points (exact match, greedy decoding), mean ± sd over the seeds that finished; a cell with "
        "diverged seeds says how many ('diverged (k/n)' when none finished); macro = mean of id, long, ood; "
        f"macro_ci95: the {level * 100:g}% t interval of the mean macro accuracy over the finished seeds (the "
        "claims pair seeds across cells, so their intervals are narrower than two of these side by side suggest).",
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
    write_table(out, csv, md, title="SFT-then-RL vs mixed-policy methods (sft_rl)", notes=notes)
    return s


def ablation_table(summary: pd.DataFrame, cfg: StudyConfig, baseline: dict, csv: Path, md: Path) -> pd.DataFrame:
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
    write_table(out, csv, md, title="SFT score as each bug is fixed (sft_rl)", notes=[
        f"SFT with TRL SFTTrainer on DeepSpeed ZeRO-{cfg.deepspeed.zero_stage} + CPU optimizer offload, micro-batch "
        f"{cfg.sft.micro_batch_size}, GA {cfg.sft.grad_accum} (LUFFY's SFT recipe); macro accuracy in points, mean "
        "± sd over the seeds that finished (diverged seeds counted in n_diverged and in each cell); minus_fixed = "
        "variant mean - fixed mean (the claims pair seeds instead); nll_id: teacher-forced NLL of the held-out `id` "
        "demonstrations (nats/token); constant_answer: the best constant predictor of each eval set."])
    return out


def write_tables(df: pd.DataFrame, cfg: StudyConfig, main_csv: Path, main_md: Path, abl_csv: Path,
                 abl_md: Path) -> None:
    summary, baseline = summarise(df), constant_baseline(cfg)
    level = level_for("A7")  # the claim the macro accuracy feeds: its interval is the table's
    main_table(summary, cfg, baseline, main_csv, main_md, macro_intervals(df, level), level)
    ablation_table(summary, cfg, baseline, abl_csv, abl_md)
