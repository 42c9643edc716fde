"""Tidy CSV -> the study's paper tables, at the paths the rule passes: the main table (every method under the fixed
and the buggy infrastructure, with the base model every arm but SFT-then-RL starts from) and the bug ablation (SFT
as each bug is fixed), each with the constant-answer row.

A cell gives the mean ± sd over the seeds that finished and says how many diverged ("diverged (k/n)" when none
finished): diverged runs are never averaged away in silence. The main table adds the t interval of the mean macro
accuracy over those seeds (`macro_ci95`), the interval a reader compares cells by: the project's one interval
(`stats.intervals.t_interval`) at the registry's level of the claims the accuracies feed (A7: 0.95), over the
per-seed values of the tidy CSV, so the table and the claim show one interval for one number. Round 3 (issue 24)
adds what says whether an arm learned at all: its start, its paired gain over that start on `id`, its RL learning
rate, the demonstration and generated tokens it trained on, and the share of GRPO groups with zero advantage.
All eval sets are shown, also those the claims do not count (claims.counted_sets). Round 5 (issue 46): one block of
rows per RL budget (`rollouts`: RL steps x prompts x rollouts per prompt), each read off the same runs
(aggregate.py), with the t intervals of the mean `id` accuracy and `id` NLL beside the macro's. Round 6 (issue 57):
each table names the host types its runs were made on (a host type shifts study A's runs), with the arms of each.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from gradfidelity.claims.evidence import level_for
from gradfidelity.stats.intervals import t_interval
from gradfidelity.studies.sft_rl import plan
from gradfidelity.studies.sft_rl.aggregate import ACC, BASE, at_budget, fifths, summarise
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


def macro_intervals(df: pd.DataFrame, level: float, key: str = "acc_macro",
                    digits: int = 1) -> dict[tuple[str, str, str], str]:
    """The t interval (at `level`) of the mean `key` (default the macro accuracy) over the finished seeds of each
    (model, variant, method) cell of the tidy CSV at one budget, formatted ("n/a" with fewer than two)."""
    out = {}
    for cell, g in df.groupby(["model", "variant", "method"], sort=False):
        ok = g[g.status == "ok"]
        out[cell] = t_interval(ok[key].astype(float), level).fmt(digits) if len(ok) else "n/a"
    return out


def arm_columns(df: pd.DataFrame, level: float) -> dict[tuple[str, str, str], dict[str, str]]:
    """Per (model, variant, method) cell of the tidy CSV: its start (plan.start_method), the t interval at `level`
    of its paired gain over the start on `id` (arm minus start, same variant and seed, the finished pairs), its RL
    learning rate, mean demonstration and generated tokens, and the zero-advantage share from the first to the
    last fifth of its RL steps (mean over seeds), formatted."""
    out = {}
    for (model, variant, method), g in df.groupby(["model", "variant", "method"], sort=False):
        ok = g[g.status == "ok"]
        row = {"start": "-", "gain_id_ci95": "-", "lr": "-", "zero_adv": "-"}
        if method != BASE:
            start = plan.start_method(method)
            s = df[(df.model == model) & (df.variant == variant) & (df.method == start) & (df.status == "ok")]
            pairs = ok.set_index("seed").acc_id.astype(float).sub(s.set_index("seed").acc_id.astype(float)).dropna()
            iv = t_interval(pairs, level) if len(pairs) else None
            row["start"] = start
            row["gain_id_ci95"] = "n/a" if iv is None or iv.low is None else f"{iv.estimate:+.1f} {iv.fmt(1)}"
        lrs = ok.lr.astype(float).dropna()
        row["lr"] = f"{lrs.mean():.3g}" if len(lrs) else "-"
        firsts_lasts = [f for f in map(fifths, ok.zero_adv_history) if f is not None]
        if firsts_lasts:
            first, last = np.mean(firsts_lasts, axis=0)
            row["zero_adv"] = f"{first:.2f} -> {last:.2f}"
        for k in ("demo_tokens", "gen_tokens"):
            x = ok[k].astype(float).dropna()
            row[k] = f"{x.mean():,.0f}" if len(x) else f"diverged ({len(g) - len(ok)}/{len(g)})"
        out[(model, variant, method)] = row
    return out


def hosts_note(df: pd.DataFrame) -> str:
    """The host types the tidy CSV's runs were made on (its `host` column), and which (variant, method) cells ran on
    each where there is more than one."""
    if "host" not in df.columns or df.host.isna().all():
        return "host types: not recorded (an aggregate built without the runs' provenance)."
    cells = df.assign(host=df.host.fillna("not recorded")).groupby("host", sort=True)
    if cells.ngroups == 1:
        return f"every run was made on one host type: {next(iter(cells.groups))}."
    per = [f"{host}: " + ", ".join(sorted(set(g.variant + "/" + g.method))) for host, g in cells]
    return (f"the runs come from {cells.ngroups} host types (a host type shifts study A's runs, so a cell compared "
            "across them measures the host too): " + "; ".join(per) + ".")


def main_rows(summary: pd.DataFrame, cfg: StudyConfig, intervals: dict[str, dict], arms: dict) -> pd.DataFrame:
    """The main table's rows at one budget: `summary` (aggregate.summarise) of that budget's rows, `intervals`
    {"macro", "id", "nll_id"}: `macro_intervals` of them, `arms`: their `arm_columns`."""
    s = summary[summary.variant.isin(plan.TABLE_VARIANTS)].copy()
    order = {BASE: -2, plan.SFT_START: -1, **{m: i for i, m in enumerate(cfg.methods)}}
    s = s.sort_values(["model", "variant", "method"], key=lambda c: c.map(order) if c.name == "method" else c)
    out = s[["model", "variant", "method", "n_seeds", "n_diverged", "run_variant"]].copy()
    keys = list(zip(s.model, s.variant, s.method, strict=True))
    out.insert(3, "start", [arms[k]["start"] for k in keys])
    for k in ACC:
        out[k.replace("acc_", "")] = [_fmt(a, b, n, d) for a, b, n, d in
                                     zip(s[f"{k}_mean"], s[f"{k}_sd"], s.n_seeds, s.n_diverged, strict=True)]
    out["macro_ci95"] = [intervals["macro"][key] for key in keys]
    out["id_ci95"] = [intervals["id"][key] for key in keys]
    for col in ("gain_id_ci95", "lr"):
        out[col] = [arms[k][col] for k in keys]
    out["nll_id"] = [_fmt(a, b, n, d, 3) for a, b, n, d in
                    zip(s["nll_id_mean"], s["nll_id_sd"], s.n_seeds, s.n_diverged, strict=True)]
    out["nll_id_ci95"] = [intervals["nll_id"][key] for key in keys]
    out["PFLOPs"] = [f"diverged ({d}/{n})" if d >= n else f"{x / 1e15:.4g}"
                    for x, n, d in zip(s["flops_mean"], s.n_seeds, s.n_diverged, strict=True)]
    for col in ("demo_tokens", "gen_tokens", "zero_adv"):
        out[col] = [arms[k][col] for k in keys]
    return out


def main_table(df: pd.DataFrame, cfg: StudyConfig, baseline: dict, csv: Path, md: Path, level: float) -> None:
    """The main table: every arm at every RL budget (`rollouts`), from the tidy CSV `df`."""
    blocks = []
    for budget in cfg.budgets:
        d = at_budget(df, budget)
        intervals = {"macro": macro_intervals(d, level), "id": macro_intervals(d, level, "acc_id"),
                     "nll_id": macro_intervals(d, level, "nll_id", 3)}
        block = main_rows(summarise(d), cfg, intervals, arm_columns(d, level))
        block.insert(3, "rollouts", f"{budget * cfg.rl.prompts_per_step * cfg.rl.num_generations:,}")
        blocks.append(block)
    out = pd.concat(blocks, ignore_index=True)
    out = out.astype({"n_seeds": object, "n_diverged": object})
    if "error" in baseline:
        base_note = f"constant_answer: not computed ({baseline['error']})."
    else:
        const = [{"model": "(any)", "variant": "-", "method": CONSTANT, "rollouts": "-", "start": "-",
                  "n_seeds": "-", "n_diverged": "-", "run_variant": "-",
                  **{x: f"{baseline['sets'][x]['acc']:.1f}" for x in EVAL_SETS},
                  "macro": f"{baseline['acc_macro']:.1f}", "macro_ci95": "-", "id_ci95": "-", "gain_id_ci95": "-",
                  "lr": "-", "nll_id": "-", "nll_id_ci95": "-", "PFLOPs": "0", "demo_tokens": "-",
                  "gen_tokens": "-", "zero_adv": "-"}]
        out = pd.concat([out, pd.DataFrame(const)], ignore_index=True)
        answers = ", ".join(f"{x} '{baseline['sets'][x]['answer']}'" for x in EVAL_SETS)
        base_note = (f"constant_answer: always the most frequent answer of each eval set ({answers}), the best any "
                     "constant predictor can score; the claims count an eval set only where fixed SFT beats this "
                     "value (all sets are shown here).")
    notes = [
        "Accuracy in points (exact match, greedy decoding), mean ± sd over the seeds that finished; a cell with "
        "diverged seeds says how many ('diverged (k/n)' when none finished); macro = mean of id, long, ood; "
        f"macro_ci95, id_ci95: the {level * 100:g}% t intervals of the mean macro and `id` accuracy over the finished "
        "seeds (the claims pair seeds across cells, so their intervals are narrower than two of these side by side "
        "suggest).",
        f"rollouts: the RL budget, RL steps x {cfg.rl.prompts_per_step} prompts x {cfg.rl.num_generations} rollouts "
        f"(budgets {', '.join(map(str, cfg.budgets))} steps); a budget below {cfg.rl.steps} steps is the same runs "
        "evaluated at that step (constant LR, one RNG stream: the first k steps of the long run are the k-step run), "
        "SFT and base rows are the same at every budget. The claims read the largest budget.",
        f"base: the shared base model every arm but SFT-then-RL starts from (one run, repeated per variant and seed "
        f"so that gains pair by seed; FLOPs and tokens 0); every claim is gated on fixed SFT reaching the base "
        f"model's `id` accuracy + {GATE_MARGIN:g} points (`{GATE}`).",
        "start: the row an arm starts from (same variant and seed): sft for SFT-then-RL and its truncation, base for "
        f"every other arm. gain_id_ci95: the arm's `id` accuracy minus its start's, paired over the seeds both "
        f"finished, mean and {level * 100:g}% t interval ('n/a' with fewer than two pairs): did the arm learn at "
        "all? (The claims gate on it: SFT-then-RL must beat its SFT, each mixed arm its base.)",
        "lr: the RL stage's learning rate (mean over the finished seeds; '-' for SFT and base).",
        "nll_id: the secondary endpoint, teacher-forced NLL (nats/token) of the held-out `id` demonstrations "
        "(solution + EOS given the prompt), mean ± sd over seeds: no sampling, so far less noisy than accuracy; "
        f"nll_id_ci95: the {level * 100:g}% t interval of its mean.",
        "`fixed`: deepspeed 0.19.8 + global token mean; `both`: deepspeed 0.18.9 (CPU-offload accumulation bug) + "
        "per-micro-batch token mean, applied to the stages in `bug_stages` "
        f"({', '.join(cfg.bug_stages)}); run_variant says which runs a cell reads (a cell whose stages all run "
        "fixed under `both` shares the fixed run; `shared`: the one base model).",
        "PFLOPs: post-training compute, training 6 x params x tokens + generation 2 x params x tokens, each "
        "sequence counted once per forward it really gets (a demonstration once per prompt, every generated rollout "
        "including LUFFY's replaced one), SFT included for SFT-then-RL; the shared pretraining is not counted.",
        "demo_tokens: tokens of expert demonstrations trained on (SFT batches, the mixed methods' demonstration "
        "forwards; SFT-then-RL counts its SFT stage's); gen_tokens: tokens generated in rollouts (prefill "
        "included); both means over the finished seeds. Their ratio is the budget's recipe (the paper's is about "
        "1:4, A9).",
        "zero_adv: the share of GRPO groups whose rollouts all got the same reward (zero advantage: they teach "
        "nothing), mean of the first fifth of the RL steps -> mean of the last fifth, averaged over seeds; '-' "
        "with fewer than 5 RL steps.",
        "sft_then_rl_truncated: the sft_then_rl run evaluated after "
        + ", ".join(f"{cfg.truncated_at(b)} of {b}" for b in cfg.budgets)
        + " RL steps (the paper's 50-of-500-step fraction of each budget).",
        base_note,
        hosts_note(df),
    ]
    write_table(out, csv, md, title="SFT-then-RL vs mixed-policy methods (sft_rl)", notes=notes)


def ablation_table(summary: pd.DataFrame, cfg: StudyConfig, baseline: dict, csv: Path, md: Path,
                   hosts: str = "") -> pd.DataFrame:
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
        "demonstrations (nats/token); constant_answer: the best constant predictor of each eval set.",
        *([hosts] if hosts else [])])
    return out


def write_tables(df: pd.DataFrame, cfg: StudyConfig, main_csv: Path, main_md: Path, abl_csv: Path,
                 abl_md: Path) -> None:
    baseline = constant_baseline(cfg)
    level = level_for("A7")  # the claim the accuracies feed: its interval is the table's
    main_table(df, cfg, baseline, main_csv, main_md, level)
    # SFT has no RL stage: its rows are the same at every budget, read at the largest
    sft = at_budget(df, cfg.rl.steps)
    ablation_table(summarise(sft), cfg, baseline, abl_csv, abl_md, hosts_note(sft[sft.method == "sft"]))


HEADROOM = 20.0  # id points below the ceiling every SFT-then-RL start must have (issue 59's must-show)


def starts_table(df: pd.DataFrame, cfg: StudyConfig, csv: Path, md: Path) -> pd.DataFrame:
    """Per table variant and seed, SFT-then-RL's start (the `sft_start` row: the SFT run at the step the start rule
    chose) beside the SFT run's end and what the RL stage made of it: the base it came from, the step, val and id
    accuracy there, the headroom (100 - id), the RL stage's gain on id and its zero-advantage share. The note says
    whether every seed starts at least HEADROOM id points below the ceiling, naming any that does not."""
    end = at_budget(df, cfg.rl.steps)
    rows, short = [], []
    for (model, variant), g in end.groupby(["model", "variant"], sort=False):
        by = {m: x.set_index("seed") for m, x in g.groupby("method")}
        if plan.SFT_START not in by:
            continue
        for seed, s in by[plan.SFT_START].sort_values("seed").iterrows():
            rl = by.get("sft_then_rl", pd.DataFrame()).reindex([seed]).iloc[0] if "sft_then_rl" in by else None
            sft_end = by["sft"].loc[seed] if "sft" in by and seed in by["sft"].index else None
            ok = s.status == "ok"
            acc = float(s.acc_id) if ok else math.nan
            room = 100.0 - acc
            if ok and room < HEADROOM:
                short.append(f"{variant} seed {seed} ({room:.1f})")
            gain = float(rl.acc_id) - acc if rl is not None and rl.status == "ok" and ok else math.nan
            rows.append({
                "model": model, "variant": variant, "seed": int(seed), "base_seed": int(s.base_seed),
                "start_step": "end" if pd.isna(s.start_step) else int(s.start_step),
                "start_acc_id": f"{acc:.1f}" if ok else s.status,
                "headroom_id": f"{room:.1f}" if ok else "-",
                "sft_end_acc_id": f"{float(sft_end.acc_id):.1f}" if sft_end is not None and sft_end.status == "ok"
                else "-",
                "sft_then_rl_acc_id": f"{float(rl.acc_id):.1f}" if rl is not None and rl.status == "ok" else "-",
                "rl_gain_id": "-" if math.isnan(gain) else f"{gain:+.1f}",
                "zero_adv_share": ("-" if rl is None or pd.isna(rl.zero_adv_share)
                                   else f"{float(rl.zero_adv_share):.2f}"),
            })
    out = pd.DataFrame(rows)
    s = cfg.sft
    rule = (f"the start rule (sft.start_every {s.start_every}, sft.start_max_val {s.start_max_val:g}): SFT-then-RL "
            f"starts from the last of SFT steps 0, {s.start_every}, {2 * s.start_every}, ... before val accuracy first "
            f"exceeds {s.start_max_val:g}" if s.start_every else
            "sft.start_every 0: SFT-then-RL starts from the SFT run's end (start_step 'end')")
    verdict = (f"every start is at least {HEADROOM:g} id points below the ceiling ({len(out)} starts)" if not short
               else f"{len(short)} of {len(out)} starts are fewer than {HEADROOM:g} id points below the ceiling: "
               + ", ".join(short))
    write_table(out, csv, md, title="SFT-then-RL's start per seed (sft_rl)", notes=[
        f"{rule}. start_acc_id: the start model's accuracy on `id` (points); headroom_id = 100 - start_acc_id; "
        "sft_end_acc_id: the same SFT run at its end (what the SFT arm, A5 and A6 read); rl_gain_id: SFT-then-RL at "
        "the largest RL budget minus its start; zero_adv_share: the mean share of its GRPO groups whose rollouts all "
        "got one reward (no signal); base_seed: the committed base model the seed started from.", verdict])
    return out
