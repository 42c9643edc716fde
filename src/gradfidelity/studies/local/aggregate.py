"""Run directories -> one tidy CSV (one row per run, diverged runs included) and the per-seed alignment of arms.

An aggregation reads the files it is given, never the path layout: corpus, width and method come from the run's
cell (`harness.results.cell_of`: the plan's cell the harness wrote into metrics.json, for ok and diverged runs
alike), the status, seed and scale from metrics.json through the one harness loader (runs of another scale
refused).

Pairing is by seed: the same seed gives BP and every method the same initial weights and the same batch order.
`align` returns, for several arms (corpus, width, method), the per-seed values of one column on the seeds where
every arm finished ok, and names the seeds it left out (a diverged run, a missing run).

Each row also carries where its run ran, from the run's provenance.json (the harness writes it beside metrics.json;
a run without it is refused, `harness.results.read_provenance`): the CPU identity columns of the runs table
(`harness.provenance.IDENTITY_KEYS`, so a claim can name the host types of its runs: `hosts_of`), the machine's
core count and the run's wall time (what one more seed costs: `seed_wall_s`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from gradfidelity.errors import UserError
from gradfidelity.harness.provenance import IDENTITY_KEYS, UNKNOWN_ISA, describe_host
from gradfidelity.harness.results import cell_of, load_run_records, read_provenance

LABEL = {"bp": "BP", "bp_tm": "BP (thread-matched)", "live_local": "Live Local (serial)",
         "broadcast_serial": "Broadcast (serial)", "rgc_serial": "RGC (serial)",
         "broadcast_async": "Broadcast (async)", "rgc_async": "RGC (async)",
         "broadcast": "Broadcast (async, + serial on the quality seeds)"}
_KEYS = ("path", "run_dir", "status", "seed", "scale", "corpus", "width", "method")
_METRICS = ("val_bpb", "corpus_source", "n_params", "n_stages", "steps")
_TIMING = ("tokens_per_s", "train_s", "peak_pss_gib", "idle_pss_gib", "compute_threads", "model_tflops_per_s")
# A quality job runs beside another (plan.Group.shares_machine): its clock measured a shared machine, so its rates
# are left empty here (its metrics.json keeps them) and no table or claim can pair them with a timed run.
_RATES = ("tokens_per_s", "train_s", "model_tflops_per_s")
_DIVERGED = ("diverged_at_step", "diverged_what")
# Where the run ran (its provenance's machine) and its wall time: kept for every run, a job that shared the machine
# included (its wall time is what its seed cost, even where its rate is not read).
_MACHINE = (*IDENTITY_KEYS, "cpu_count", "wall_s")
COLUMNS = (*_KEYS, *_METRICS, "corpus_md5", *_TIMING, "shares_machine", "stage_busy_s", *_DIVERGED, *_MACHINE)


def _machine(rec: dict, prov: dict) -> dict:
    """The run's CPU identity and core count (provenance.json) and its wall time (metrics.json's timing)."""
    machine = prov.get("machine") or {}
    return {**{k: machine.get(k, UNKNOWN_ISA) for k in IDENTITY_KEYS}, "cpu_count": machine.get("cpu_count"),
            "wall_s": (rec.get("timing") or {}).get("wall_s")}


def _text_md5(prov: dict) -> str | None:
    """The MD5 of the text the run trained on, as its record's identity names it (harness/identity.py: a `source:
    file` corpus, a user's text included); None for an embedded or downloaded corpus, whose identity is its
    settings."""
    corpus = (((prov.get("identity") or {}).get("data") or {}).get("corpus")) or {}
    return corpus.get("text_md5")


def _cell(rec: dict) -> dict:
    cell = cell_of(rec)
    if cell["study"] != "local" or not {"corpus", "width", "method"} <= set(cell):
        raise UserError(f"{rec['path']}: its cell {cell} is not a study C run's (corpus, width, method)")
    return cell


def aggregate(paths: list[str], scale: str | None = None) -> pd.DataFrame:
    """One row per run (diverged runs included, with empty metric cells)."""
    rows = []
    for rec in load_run_records(paths, scale=scale):
        cell = _cell(rec)
        row = {"path": rec["path"], "run_dir": rec["run_dir"], "status": rec["status"], "seed": int(rec["seed"]),
               "scale": rec.get("scale"), "corpus": cell["corpus"], "width": int(cell["width"]),
               "method": cell["method"]}
        m, t = rec["metrics"], rec.get("timing") or {}
        if rec["status"] == "ok":
            row.update({k: m.get(k) for k in _METRICS})
            row.update({k: t.get(k) for k in _TIMING})
            row["shares_machine"] = bool(t.get("shares_machine", False))
            if row["shares_machine"]:
                row.update({k: None for k in _RATES})
            row["stage_busy_s"] = json.dumps(t["stage_busy_s"]) if "stage_busy_s" in t else ""
        else:
            row.update({k: m.get(k) for k in _DIVERGED})
        prov = read_provenance(rec)
        rows.append({**row, "corpus_md5": _text_md5(prov), **_machine(rec, prov)})
    df = pd.DataFrame(rows).reindex(columns=list(COLUMNS))
    return df.sort_values(["corpus", "width", "method", "seed"]).reset_index(drop=True)


def read_aggregate(path: str | Path) -> pd.DataFrame:
    """The tidy CSV back, with the types the statistics expect."""
    df = pd.read_csv(path, keep_default_na=True)
    df["stage_busy_s"] = df["stage_busy_s"].fillna("")
    df["shares_machine"] = df["shares_machine"].fillna(False).astype(bool)
    return df


@dataclass(frozen=True)
class Aligned:
    """Per-seed values of one column for several arms (corpus, width, method), on the seeds where all finished ok."""
    arms: list[tuple[str, int, str]]
    seeds: list[int]
    values: list[np.ndarray]  # one array per arm, in the order of `seeds`
    diverged: dict[int, list[str]] = field(default_factory=dict)  # dropped seed -> the arms that diverged on it
    missing: list[int] = field(default_factory=list)  # seeds without a run of some arm
    absent: dict[str, list[int]] = field(default_factory=dict)  # "arm label: why" -> the seeds it lacks a value on
    sources: list[str] = field(default_factory=list)  # run directories of every arm on every seed considered

    @property
    def n(self) -> int:
        return len(self.seeds)


def arm_label(arm: tuple[str, int, str]) -> str:
    return f"{LABEL.get(arm[2], arm[2])} ({arm[0]}, w{arm[1]})"


def align(df: pd.DataFrame, arms: list[tuple[str, int, str]], col: str) -> Aligned:
    per_arm = []
    for corpus, width, method in arms:
        a = df[(df.corpus == corpus) & (df.width == width) & (df.method == method)].set_index("seed")
        if not a.index.is_unique:
            raise UserError(f"{arm_label((corpus, width, method))}: more than one run per seed")
        per_arm.append(a)
    kept, diverged, missing, sources, absent = [], {}, [], [], {}
    for seed in sorted(set().union(*(set(a.index) for a in per_arm))):
        # an ok run without a value of `col` (a rate of a job that shared the machine) is no run of this comparison
        rows = [a.loc[seed] if seed in a.index and (a.loc[seed].status != "ok" or pd.notna(a.loc[seed][col]))
                else None for a in per_arm]
        sources += [str(r.run_dir) for r in rows if r is not None]
        bad = [arm_label(arm) for arm, r in zip(arms, rows, strict=True) if r is not None and r.status != "ok"]
        if bad:
            diverged[int(seed)] = bad
        elif any(r is None for r in rows):
            missing.append(int(seed))
            for arm, a, r in zip(arms, per_arm, rows, strict=True):
                if r is None:
                    why = f"ran beside another job (no {col})" if seed in a.index else "no run"
                    absent.setdefault(f"{arm_label(arm)}: {why}", []).append(int(seed))
        else:
            kept.append(int(seed))
    return Aligned(list(arms), kept, [a.loc[kept, col].to_numpy(float) for a in per_arm], diverged=diverged,
                   missing=missing, sources=sources, absent=absent)


def paired(cell: pd.DataFrame, method: str, base: str, col: str) -> Aligned:
    """`col` of method and base on the seeds of one (corpus, width) cell where both finished ok."""
    if cell.empty:
        return Aligned([], [], [np.array([]), np.array([])])
    corpus, width = cell.corpus.iloc[0], int(cell.width.iloc[0])
    return align(cell, [(corpus, width, method), (corpus, width, base)], col)


def hosts_of(df: pd.DataFrame, run_dirs) -> list[str]:
    """The host types (`describe_host`, one line each, sorted) of the runs of `df` among `run_dirs`."""
    rows = df[df.run_dir.astype(str).isin({str(r) for r in run_dirs})]
    return sorted({describe_host(row) for row in rows.to_dict("records")})


def seed_wall_s(df: pd.DataFrame, arms: list[tuple[str, int, str]], seeds: list[int]) -> tuple[float | None, str]:
    """Wall seconds that one more seed of `arms` costs, from the committed runs on `seeds`, and how it was read.

    Per seed: the sum over the arms of each run's wall time (a job runs its methods back to back), each divided by
    the number of such jobs the machine runs at once: its cores / the run's threads for a run that shared the
    machine (a quality job: one thread, two at a time on 2 cores), else 1 (the job owns the machine). The median
    over `seeds` that have a run of every arm; None without one."""
    per_seed = []
    for seed in seeds:
        total = 0.0
        for corpus, width, method in arms:
            r = df[(df.corpus == corpus) & (df.width == width) & (df.method == method) & (df.seed == seed)]
            if len(r) != 1 or pd.isna(r.wall_s.iloc[0]):
                break
            row = r.iloc[0]
            at_once = 1
            if bool(row.shares_machine) and pd.notna(row.cpu_count) and pd.notna(row.compute_threads):
                at_once = max(1, int(row.cpu_count) // max(1, int(row.compute_threads)))
            total += float(row.wall_s) / at_once
        else:
            per_seed.append(total)
    if not per_seed:
        return None, "no seed has a timed run of every arm"
    value = float(np.median(per_seed))
    arms_text = ", ".join(LABEL.get(m, m) for _, _, m in arms)
    return value, (f"{value:.0f} s of wall a seed ({arms_text}; median over {len(per_seed)} seed(s) of the runs' "
                   "wall times, a job that shared the machine counted at its share)")


def source_of(cell: pd.DataFrame) -> str:
    s = cell.corpus_source.dropna()
    return str(s.iloc[0]) if len(s) else "?"


def corpus_label(cell: pd.DataFrame, corpus: str) -> str:
    """How a claim's detail names the text its runs trained on: the corpus, its source (`file:<name>` for a file)
    and the text's MD5 (`corpus_md5`), so that a user's own text is named in the claims it decides. Runs of one
    corpus on two texts are refused, naming both: a paired gap between them would compare two texts."""
    md5s = sorted(set(cell["corpus_md5"].dropna().astype(str))) if "corpus_md5" in cell else []
    if len(md5s) > 1:
        raise UserError(f"local: the runs of corpus {corpus!r} trained on {len(md5s)} texts (MD5 "
                        f"{', '.join(md5s)}); a claim pairs runs on one text: plan them again on one "
                        f"(local.corpora.{corpus})")
    return f"{corpus} ({source_of(cell)}" + (f", MD5 {md5s[0]})" if md5s else ")")


MEMORY_COLUMNS = ("path", "run_dir", "status", "seed", "scale", "width", "n_layer", "method", "pss_gib",
                  "baseline_gib", "model_gib", "state_gib", "n_params", *_MACHINE)


def memory_aggregate(paths: list[str], scale: str | None = None) -> pd.DataFrame:
    """One row per (memory probe, method): the method's peak PSS with its model, its own bare tree's (baseline),
    their difference (the memory the model costs) and the analytic size of parameters, gradients and AdamW state."""
    from gradfidelity.studies.local.memory import METHODS

    rows = []
    for rec in load_run_records(paths, scale=scale):
        cell = cell_of(rec)
        if cell["study"] != "local" or "width" not in cell or "corpus" in cell:
            raise UserError(f"{rec['path']}: its cell {cell} is not a study C memory probe's (width, seed)")
        m, t = rec["metrics"], rec.get("timing") or {}
        if rec["status"] != "ok":
            raise UserError(f"{rec['path']}: a memory probe with status {rec['status']!r} (it trains a few steps "
                            "and cannot diverge meaningfully): rerun it")
        for method in METHODS:
            pss, base = t[f"pss_{method}_gib"], t[f"pss_{method}_baseline_gib"]
            rows.append({"path": rec["path"], "run_dir": rec["run_dir"], "status": rec["status"],
                         "seed": int(rec["seed"]), "scale": rec.get("scale"), "width": int(m["width"]),
                         "n_layer": int(m["n_layer"]), "method": method, "pss_gib": pss, "baseline_gib": base,
                         "model_gib": pss - base, "state_gib": m["state_gib"], "n_params": m["n_params"],
                         **_machine(rec, read_provenance(rec))})
    df = pd.DataFrame(rows).reindex(columns=list(MEMORY_COLUMNS))
    return df.sort_values(["method", "seed"]).reset_index(drop=True)


def read_memory(path: str | Path) -> pd.DataFrame:
    return pd.read_csv(path)


def write_memory_aggregate(paths: list[str], scale: str, out: Path) -> pd.DataFrame:
    from gradfidelity.harness.io import atomic_write_csv

    df = memory_aggregate(paths, scale=scale)
    atomic_write_csv(df, out)
    return df


def write_aggregate(paths: list[str], scale: str, out: Path) -> pd.DataFrame:
    from gradfidelity.harness.io import atomic_write_csv

    df = aggregate(paths, scale=scale)
    atomic_write_csv(df, out)
    return df
