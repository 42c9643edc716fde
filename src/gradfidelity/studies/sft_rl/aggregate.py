"""Run directories (the rule's {input}) -> one tidy CSV: one row per table cell (model, variant, method, seed) and
RL budget.

An aggregation reads the files it is given, never the path layout: each run's identity comes from its records
through the one harness loader (runs of another scale refused): its plan cell (`harness.results.cell_of`: the
rule's wildcards model, variant, method and seed, and the stage the runner ran, written into metrics.json by the
harness for ok and diverged runs alike), its status and metrics from metrics.json. `plan.cell_run` says which run a
table cell reads: the truncated SFT-then-RL reads the sft_then_rl run's `truncated` block, and a `both` cell none of
whose stages runs on buggy infrastructure reads the fixed run (`run_variant` says which).

RL budgets (round 5, issue 46): every budget of `StudyConfig.budgets` (rl.eval_steps and rl.steps, in RL steps) gets
its own rows, `budget` saying which. An RL-stage cell at a smaller budget reads its run's evaluation at that step
(`at_step`, made inside the run: the first k steps of the long run are the k-step run) and its histories cut to k
steps; the truncated SFT-then-RL at each budget reads the step `cfg.truncated_at(budget)`. SFT and base rows are
the same at every budget (they have no RL stage), repeated so that each budget's rows pair by seed on their own.

The seed's base model is a row too (method `base`, run_variant `shared`, one per table variant and seed, FLOPs 0;
`base_seed` names which base: plan.base_seed), and so is SFT-then-RL's start (method `sft_start`, the SFT run's
`start` block: the SFT run at the step sft.start_every chose, with the SFT cost up to it; the SFT run's end where the
run made no start): every arm's start is a row of the same CSV (plan.start_method), so a gain over the start is a
paired difference. An SFT-then-RL run must have started where its SFT record says (`start_step`), else a loud error.
`zero_adv_share`: an RL-stage row's mean share of GRPO groups with zero advantage (round 6, issue 59).

Diverged runs keep their rows (status "diverged", empty metric cells): the tables count them, the claims drop
their pairs and say so.

Round 6 (issue 57): each row names the host type its run was made on (`host`: harness.provenance.describe_host of
the run's provenance.json `machine`, the runs table's identity columns) and the run's own wall time (`wall_s`, from
its metrics.json `timing`): the claims list the host types behind each contrast and what one more seed costs.
`write_aggregate`, the rule's path, reads every run's provenance (a run without one is refused, naming it);
`collect` alone leaves `host` empty (a record set without provenance, as the earlier-record comparison reads).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from gradfidelity.errors import UserError
from gradfidelity.harness.io import atomic_write_csv
from gradfidelity.harness.provenance import describe_host
from gradfidelity.harness.results import cell_of, load_run_records, read_provenance
from gradfidelity.studies.sft_rl import plan
from gradfidelity.studies.sft_rl.config import StudyConfig
from gradfidelity.studies.sft_rl.task import EVAL_SETS

ACC = [f"acc_{s}" for s in EVAL_SETS] + ["acc_macro"]
NLL = ["nll_id", "nll_macro"]  # secondary endpoint: held-out teacher-forced NLL of the demonstrations (nats/token)
# lists, stored as JSON text in the CSV; zero_adv_history: per RL step, the fraction of GRPO groups whose rewards
# are all equal (TRL's frac_reward_zero_std): those groups have zero advantage and teach nothing
HISTORIES = ("reward_history", "loss_history", "zero_adv_history")
# demo_tokens: tokens of expert demonstrations trained on (SFT batches, mixed-policy demonstration forwards; the
# upstream SFT's for sft_then_rl); gen_tokens: tokens generated (prefill included); lr: the RL stage's learning rate
COUNTS = ("flops", "demo_tokens", "gen_tokens")
# host: the host type of the row's run (describe_host; empty where the aggregate was built without provenance);
# wall_s: the run's own wall time in seconds (its metrics.json timing; a shared run's on every row that reads it)
# base_seed: the base model the row's seed starts from; start_step: the SFT step an sft_start row (and the
# SFT-then-RL rows started from it) stands at
COLUMNS = ("model", "variant", "method", "seed", "budget", "run", "run_variant", "status", *ACC, *NLL, *COUNTS, "lr",
           "rl_steps", *HISTORIES, "zero_adv_share", "base_seed", "start_step", "host", "wall_s", "started")
BASE = "base"  # the method name of the shared base model's rows


def _is_base(rec: dict) -> bool:
    cell = cell_of(rec)
    return cell["study"] == "sft_rl" and cell.get("stage") in ("pretrain", "base")


def _identity(rec: dict) -> tuple[str, str, str, int]:
    """(model, variant, method, seed) of one run, from its plan cell."""
    cell = cell_of(rec)
    stage = cell.get("stage")
    need = {"model", "variant", "seed"} | ({"method"} if stage == "rl" else set())
    if cell["study"] != "sft_rl" or stage not in ("sft", "rl") or not need <= set(cell):
        raise UserError(f"{rec['path']}: cell {cell} is not an sft_rl training run's (stage sft or rl, with model, "
                        "variant, seed and, for rl, method)")
    return cell["model"], cell["variant"], "sft" if stage == "sft" else cell["method"], int(cell["seed"])


def _at(rec: dict, step: int) -> dict:
    """A run's evaluation at RL step `step` (its `at_step` block), or a loud error naming the run and the step."""
    found = (rec["metrics"].get("at_step") or {}).get(str(step))
    if found is None:
        raise UserError(f"{rec['path']}: no evaluation at RL step {step} (metrics.at_step); the config's budgets "
                        "need it: rerun the run with this rl.eval_steps")
    return found


def _cell(rec: dict, method: str, budget: int | None = None, cfg: StudyConfig | None = None) -> dict:
    """One run's numbers for a table cell at RL budget `budget` (None or rl.steps: the run's end). The truncated
    method reads the sft_then_rl run at the budget's truncation step; an RL-stage cell at a smaller budget reads
    the run's evaluation at that step, with its histories cut there."""
    if rec["status"] != "ok":
        return {"status": rec["status"]}
    m = rec["metrics"]
    full = budget is None or cfg is None or budget == cfg.rl.steps
    try:
        if method == BASE:
            return {"status": "ok", **{k: float(m[k]) for k in ACC + NLL}, **{k: 0.0 for k in COUNTS}}
        if method == plan.SFT_START:  # the SFT run at its start step, or its end where it made no start
            start = m.get("start")
            t = start or m
            return {"status": "ok", **{k: float(t[k]) for k in ACC + NLL + list(COUNTS)},
                    "start_step": int(start["step"]) if start else None}
        if method == "sft_then_rl_truncated":  # the first k steps of the sft_then_rl run
            t = m["truncated"] if full else _at(rec, cfg.truncated_at(budget))
            steps = int(t["rl_steps"])
            return {"status": "ok", **{k: float(t[k]) for k in ACC + NLL + list(COUNTS)}, "lr": float(m["lr"]),
                    "rl_steps": steps, **{h: m[h][:steps] for h in HISTORIES}}
        if method != "sft" and not full:  # an RL-stage cell at a smaller budget: the run at that step
            t = _at(rec, budget)
            return {"status": "ok", **{k: float(t[k]) for k in ACC + NLL + list(COUNTS)}, "lr": float(m["lr"]),
                    "rl_steps": budget, **{h: (m.get(h) or [])[:budget] for h in HISTORIES}}
        rl = {"lr": float(m["lr"]), "zero_adv_history": m["zero_adv_history"]} if method != "sft" else {}
        return {"status": "ok", **{k: float(m[k]) for k in ACC + NLL + list(COUNTS)},
                **{k: m.get(k) for k in HISTORIES}, **rl}
    except KeyError as exc:
        raise UserError(f"{rec['path']}: metrics lack {exc} (needed by the {method} cell)") from None


def _zero_adv_share(cell: dict) -> dict:
    """The row's mean zero-advantage share over its RL steps (its history as cut to the row's budget)."""
    h = cell.get("zero_adv_history")
    return {"zero_adv_share": float(np.mean(h)) if isinstance(h, list) and h else None}


def _check_start(rec: dict, sft: dict | None) -> None:
    """An SFT-then-RL run started where its SFT record's start says (its `start_step`: None for the SFT run's end)."""
    if sft is None or sft["status"] != "ok" or rec["status"] != "ok":
        return
    want = (sft["metrics"].get("start") or {}).get("step")
    got = rec["metrics"].get("start_step")
    if want != got:
        raise UserError(f"{rec['path']}: started at SFT step {got}, but its SFT run {sft['path']} records its start "
                        f"at step {want}: the RL run was made from another SFT run; rerun it")


def _run_facts(rec: dict, hosts: dict[str, str] | None, started: dict[str, str] | None = None) -> dict:
    """The row's `host` (from `hosts`, keyed by run directory; None without), `wall_s` (None if not timed) and
    `started` (from `started`, the run's start time as its provenance.json records it; None without)."""
    return {"host": None if hosts is None else hosts[rec["run_dir"]],
            "wall_s": (rec.get("timing") or {}).get("wall_s"),
            "started": None if started is None else started.get(rec["run_dir"])}


def provenance_facts(records: list[dict]) -> tuple[dict[str, str], dict[str, str | None]]:
    """(run directory -> its host type (describe_host of its provenance.json's machine), run directory -> when it
    started), each provenance.json read once; a run without one is refused, naming it (harness.results.
    read_provenance). The start time lets a claim tell the runs made before its rule from those made after."""
    provs = {rec["run_dir"]: read_provenance(rec) for rec in records}
    return ({d: describe_host(p.get("machine") or {}) for d, p in provs.items()},
            {d: p.get("started") for d, p in provs.items()})


def host_types(records: list[dict]) -> dict[str, str]:
    """run directory -> its host type (`provenance_facts`)."""
    return provenance_facts(records)[0]


def collect(cfg: StudyConfig, records: list[dict], hosts: dict[str, str] | None = None,
            started: dict[str, str | None] | None = None) -> pd.DataFrame:
    """One row per (model, variant, method, seed) table cell; `records` as `load_run_records` returns them;
    `hosts`: run directory -> host type (`host_types`), None to leave the `host` column empty.

    Every cell must find its run among the records (a missing run is an error naming it), and no run may appear
    twice. The base models (stage pretrain or base) give the `base` rows."""
    runs: dict[tuple, dict] = {}
    bases: dict[tuple[str, int], dict] = {}
    for rec in records:
        if _is_base(rec):
            cell = cell_of(rec)
            key = (cell["model"], int(cell.get("seed", 0)))
            if key in bases:
                raise UserError(f"{rec['path']} and {bases[key]['path']}: two base models of {key[0]}, seed {key[1]}")
            bases[key] = rec
            continue
        key = _identity(rec)
        if key in runs:
            raise UserError(f"{rec['path']} and {runs[key]['path']}: two runs of {'/'.join(map(str, key))}")
        runs[key] = rec
    rows = []
    for model in (m.name for m in cfg.models):
        for b in plan.used_bases(cfg):
            if (model, b) not in bases:
                raise UserError(f"missing run: the {model} base model of seed {b} is not among the aggregated runs "
                                "(its seeds' start); rerun the sft_rl rules")
        for budget in cfg.budgets:
            for seed in cfg.seeds:
                b = plan.base_seed(cfg, seed)
                key = {"model": model, "seed": int(seed), "budget": budget, "base_seed": b}
                base = bases[(model, b)]
                for variant in plan.table_variants(cfg):
                    rows.append({**key, "variant": variant, "method": BASE, "run": base["run_dir"],
                                 "run_variant": "shared", **_cell(base, BASE), **_run_facts(base, hosts, started)})
                    if "sft_then_rl" in cfg.methods or "sft_then_rl_truncated" in cfg.methods:
                        sft_variant = plan.stage_variant(cfg, variant, "sft")
                        sft = runs.get((model, sft_variant, "sft", int(seed)))
                        if sft is None:
                            raise UserError(f"missing run: {model} {sft_variant}/sft seed {seed} (the {variant} "
                                            "SFT-then-RL start) is not among the aggregated runs; rerun the sft_rl "
                                            "rules")
                        rows.append({**key, "variant": variant, "method": plan.SFT_START, "run": sft["run_dir"],
                                     "run_variant": sft_variant, **_cell(sft, plan.SFT_START),
                                     **_run_facts(sft, hosts, started)})
                for variant, method in plan.table_cells(cfg):
                    run_variant, run_method = plan.cell_run(cfg, variant, method)
                    rec = runs.get((model, run_variant, run_method, int(seed)))
                    if rec is None:
                        raise UserError(f"missing run: {model} {run_variant}/{run_method} seed {seed} (the "
                                        f"{variant}/{method} cell) is not among the aggregated runs; rerun the "
                                        "sft_rl rules")
                    if run_method == "sft_then_rl":
                        _check_start(rec, runs.get((model, plan.stage_variant(cfg, variant, "sft"), "sft",
                                                    int(seed))))
                    cell = _cell(rec, method, budget, cfg)
                    if run_method == "sft_then_rl" and cell["status"] == "ok":
                        cell["start_step"] = rec["metrics"].get("start_step")
                    rows.append({**key, "variant": variant, "method": method, "run": rec["run_dir"],
                                 "run_variant": run_variant, **cell,
                                 **(_zero_adv_share(cell) if method != "sft" else {}),
                                 **_run_facts(rec, hosts, started)})
    return pd.DataFrame(rows).reindex(columns=list(COLUMNS))


def write_aggregate(cfg: StudyConfig, paths: list[str], scale: str, out: Path) -> pd.DataFrame:
    records = load_run_records(paths, scale=scale)
    df = collect(cfg, records, *provenance_facts(records))
    csv = df.copy()
    for k in HISTORIES:
        csv[k] = [json.dumps(v) if isinstance(v, list) else "" for v in csv[k]]
    atomic_write_csv(csv, out)
    return df


def read_aggregate(path: str | Path) -> pd.DataFrame:
    """The tidy CSV back, histories as lists (None where a run has none)."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path} does not exist (build it with the sft_rl_aggregate rule)")
    df = pd.read_csv(path, keep_default_na=True, dtype={"rl_steps": "float"})
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise UserError(f"{path}: columns {missing} missing (an aggregate of another version? rebuild it)")
    for k in HISTORIES:
        df[k] = [json.loads(v) if isinstance(v, str) and v else None for v in df[k]]
    return df


def fifths(history: list[float] | None) -> tuple[float, float] | None:
    """(mean of the first fifth, mean of the last fifth) of a per-step history; None without 5 steps."""
    if not isinstance(history, list) or len(history) < 5:
        return None
    k = len(history) // 5
    return float(np.mean(history[:k])), float(np.mean(history[-k:]))


def fifth_rise(history: list[float] | None) -> float:
    """The last fifth's mean minus the first fifth's (nan without 5 steps): did the training reward rise?"""
    f = fifths(history)
    return math.nan if f is None else f[1] - f[0]


def at_budget(df: pd.DataFrame, budget: int) -> pd.DataFrame:
    """The tidy CSV's rows at one RL budget (RL steps), or a loud error naming the budgets it has."""
    rows = df[df.budget.astype(int) == int(budget)]
    if rows.empty:
        raise UserError(f"the sft_rl aggregate has no rows at an RL budget of {budget} steps (it has "
                        f"{sorted(set(df.budget.astype(int)))}): rebuild it with this config")
    return rows


def summarise(df: pd.DataFrame) -> pd.DataFrame:
    """Mean and sd over the finished seeds per (model, variant, method), with the number of diverged seeds."""
    out = []
    for (model, variant, method), g in df.groupby(["model", "variant", "method"], sort=False):
        ok = g[g.status == "ok"]
        row = {"model": model, "variant": variant, "method": method, "n_seeds": len(g),
               "n_diverged": int((g.status != "ok").sum()), "run_variant": g.run_variant.iloc[0]}
        for k in ACC + NLL + list(COUNTS):
            vals = ok[k].astype(float).to_numpy() if len(ok) else np.array([])
            row[f"{k}_mean"] = float(vals.mean()) if len(vals) else math.nan
            row[f"{k}_sd"] = float(vals.std(ddof=1)) if len(vals) > 1 else math.nan
        out.append(row)
    return pd.DataFrame(out)
