"""Each run of this study against an earlier run of the same cell at a smaller RL budget (round 5, issue 46).

Why: a longer RL stage is read at the earlier budget off the same run (`rl.eval_steps`: constant LR, one RNG stream,
greedy evaluation), so its evaluation at that step is the earlier run redone. Where the cell kept its LR and the host
type is the same, the two must be equal bit for bit: the longer runs double as a check of the committed ones. On
another host type study A's runs are another draw (CONTRIBUTING.md), and the table measures how far a rerun
moves: each difference beside the earlier runs' seed-to-seed spread of the same cell.

The earlier records are read as the aggregate reads the live ones (aggregate.collect, at a config whose RL stage ends
at the earlier budget), so one cell means the same run on both sides (the truncated arm: the sft_then_rl run at the
earlier budget's truncation step). Config: `sft_rl.compare_with: {records: <folder of metrics.json>, rl_steps: k}`.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pandas as pd

from gradfidelity.errors import UserError
from gradfidelity.harness.provenance import describe_host, same_host_type
from gradfidelity.harness.results import load_run_records, read_provenance
from gradfidelity.studies.sft_rl.aggregate import ACC, NLL, at_budget, collect
from gradfidelity.studies.sft_rl.config import StudyConfig

COMPARED = (*ACC, *NLL, "flops", "gen_tokens", "demo_tokens")  # the numbers both records hold for every cell
SHOWN = ("acc_id", "nll_id")  # the table's columns: then, now, now - then


def earlier_config(cfg: StudyConfig, rl_steps: int) -> StudyConfig:
    """The live config with an RL stage that ends at `rl_steps` (the earlier records' budget; the config's own check
    has made sure it is one of the live budgets)."""
    return dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, steps=rl_steps, eval_steps=()),
                               compare_with=None)


def _reward(history) -> float:
    return float(np.mean(history)) if isinstance(history, list) and history else math.nan


def _hosts(machines: dict[str, dict], records) -> str:
    return "; ".join(sorted({describe_host(machines[r["run_dir"]]) for r in records}))


def compare(cfg: StudyConfig, live: pd.DataFrame, earlier_paths: list[str], rl_steps: int,
            scale: str) -> tuple[pd.DataFrame, dict]:
    """(one row per table cell and seed present on both sides, facts for the notes). `live`: the tidy CSV of this
    config (aggregate.read_aggregate); `earlier_paths`: the earlier records' metrics.json (every run, base included)."""
    records = load_run_records(earlier_paths, scale=scale)
    # the table cells' runs only, as the aggregate is given them: not the LR grid's, not the alignment run
    records = [r for r in records if "lr" not in r.get("cell", {})
               and r.get("cell", {}).get("stage") in ("pretrain", "base", "sft", "rl")]
    then = collect(earlier_config(cfg, rl_steps), records)
    now = at_budget(live, rl_steps)
    key = ["model", "variant", "method", "seed"]
    both = then.merge(now, on=key, suffixes=("_then", "_now"), how="inner")
    if both.empty:
        raise UserError(f"sft_rl.compare_with: no cell of the earlier records {Path(earlier_paths[0]).parent} "
                        "matches a live cell (model, variant, method, seed)")
    live_records = {r["run_dir"]: r for r in load_run_records(
        [f"{run}/metrics.json" for run in now.run.unique()], scale=scale)}
    # each run's host, read once (a shared run backs several cells)
    machines = {r["run_dir"]: read_provenance(r).get("machine", {}) for r in [*records, *live_records.values()]}
    spread = then[then.status == "ok"].groupby(["model", "variant", "method"]).acc_id.std(ddof=1)
    rows = []
    for r in both.itertuples(index=False):
        row = {"variant": r.variant, "method": r.method, "seed": int(r.seed), "run_then": r.run_then,
               "run_now": r.run_now}
        if r.status_then != "ok" or r.status_now != "ok":
            rows.append({**row, "status": f"{r.status_then} -> {r.status_now}"})
            continue
        lr_then, lr_now = float(r.lr_then), float(r.lr_now)
        no_rl = math.isnan(lr_then) and math.isnan(lr_now)  # SFT and base: no RL stage, the same config
        row.update(status="ok", lr_then=lr_then, lr_now=lr_now,
                   same_lr="-" if no_rl else "yes" if lr_then == lr_now else "no")
        for k in SHOWN:
            a, b = float(getattr(r, f"{k}_then")), float(getattr(r, f"{k}_now"))
            row.update({f"{k}_then": a, f"{k}_now": b, f"{k}_diff": b - a})
        row["reward_then"], row["reward_now"] = _reward(r.reward_history_then), _reward(r.reward_history_now)
        equal = all(getattr(r, f"{k}_then") == getattr(r, f"{k}_now") for k in COMPARED) and (
            r.reward_history_then == r.reward_history_now or r.reward_history_then is r.reward_history_now)
        row["identical"] = "yes" if equal else "no"
        sd = spread.get((r.model, r.variant, r.method), math.nan)
        row["acc_id_seed_sd_then"] = sd
        row["same_host_type"] = "yes" if same_host_type(machines[r.run_then], machines[r.run_now]) else "no"
        rows.append(row)
    table = pd.DataFrame(rows)
    facts = {"host_then": _hosts(machines, records), "host_now": _hosts(machines, live_records.values())}
    return table, facts


def summary_lines(table: pd.DataFrame) -> list[str]:
    """Per method, over the distinct runs that kept their LR: how many are identical, the median |change| of acc_id and
    nll_id, and the share of acc_id changes within the earlier seed spread of the cell."""
    if "same_lr" not in table:  # no pair finished on both sides
        return ["no cell finished on both sides"]
    ok = table[(table.status == "ok") & table.same_lr.isin(["yes", "-"])]
    ok = ok.drop_duplicates(["method", "run_now"])  # a run two cells share (the mixed arms under both) counts once
    lines = []
    for method, g in ok.groupby("method", sort=False):
        within = (g.acc_id_diff.abs() <= g.acc_id_seed_sd_then).mean()
        lines.append(f"{method}: {len(g)} runs, {int((g.identical == 'yes').sum())} identical; median |change| "
                     f"acc_id {g.acc_id_diff.abs().median():.1f} points, nll_id {g.nll_id_diff.abs().median():.3f} "
                     f"nats; {within:.0%} of the acc_id changes within the earlier seed sd of the cell")
    return lines


def write_comparison(cfg: StudyConfig, live: pd.DataFrame, folder: str, earlier_paths: list[str], rl_steps: int,
                     scale: str, csv: Path, md: Path) -> pd.DataFrame:
    """The comparison table of `compare` at `csv` and `md`; `folder`: where the earlier records live (named in the
    notes)."""
    from gradfidelity.tables import write_table

    table, facts = compare(cfg, live, earlier_paths, rl_steps, scale)
    rollouts = rl_steps * cfg.rl.prompts_per_step * cfg.rl.num_generations
    kept = table[(table.status == "ok") & table.same_lr.isin(["yes", "-"])] if "same_lr" in table else table[:0]
    same_host = bool(len(kept)) and (kept.same_host_type == "yes").all()
    if same_host and (kept.identical != "yes").any():
        bad = kept[kept.identical != "yes"].drop_duplicates("run_now")
        raise UserError(f"on the same host type, {len(bad)} runs at {rl_steps} RL steps differ from their earlier "
                        f"records with the same config and LR: {', '.join(bad.run_now.head(5))}"
                        f"{' ...' if len(bad) > 5 else ''} (against {', '.join(bad.run_then.head(5))}). The code or "
                        "the packages differ from the earlier runs' (their provenance.json names them)")
    how = ("the same host type: every kept-LR run is identical" if same_host else
           "another host type: study A's runs are another draw there, so a difference is the cross-host "
           "measurement, read against the earlier seed-to-seed spread of the cell")
    write_table(table, csv, md, title=f"Study A: each run at {rl_steps} RL steps against its earlier record", notes=[
        f"then: the earlier records ({folder}), RL stage of {rl_steps} steps ({rollouts:,} rollouts), made on "
        f"{facts['host_then']}; now: this config's "
        f"runs evaluated at step {rl_steps} (rl.eval_steps; SFT and base: the same runs redone), made on "
        f"{facts['host_now']}: {how}.",
        "same_lr: the RL stage trained at the same LR (the earlier and the current LR selection chose alike; "
        "'-' for SFT and base, whose config is the same); a run whose LR changed is another run and is left out of "
        "the summary below.",
        "identical: every accuracy, NLL, FLOP and token count and the reward history equal bit for bit; "
        "acc_id_seed_sd_then: the standard deviation of acc_id over the earlier seeds of the same cell.",
        *summary_lines(table)])
    return table
