"""The paper tables of study C (main, mechanism, memory): the statistics of `stats.py`, formatted; nothing is
computed here. The CSV keeps every column; the Markdown view joins each estimate with its interval, labelled with
the registry's interval level (the level `stats.py` computes the ratio intervals at)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from gradfidelity.claims.registry import interval_level
from gradfidelity.harness.io import atomic_write_csv, atomic_write_text
from gradfidelity.studies.local.aggregate import LABEL
from gradfidelity.studies.local.config import StudyConfig
from gradfidelity.studies.local.stats import CONTROL, POOLED, main_table, mechanism_table, memory_table
from gradfidelity.tables import markdown


def _fmt(df: pd.DataFrame) -> pd.DataFrame:
    out = df.copy()
    if len(out):
        out["method"] = out.method.map(LABEL)
    return out


def _ci(r, mid: str, lo: str, hi: str) -> str:
    if mid not in r or not np.isfinite(r[mid]):
        return ""
    return f"{r[mid]:.3f} ({r[lo]:.3f}-{r[hi]:.3f})" if np.isfinite(r[lo]) else f"{r[mid]:.3f}"


def _readable_main(main: pd.DataFrame) -> pd.DataFrame:
    """The Markdown view: CIs as one cell, the decomposition as one cell; the CSV keeps every column."""
    ci = f"{interval_level():.0%} CI"
    rows = []
    for _, r in main.iterrows():
        dec = (f"{r['work_ratio']:.2f} x {r['parallelism']:.2f} x {r['orchestration_eff']:.2f} "
               f"(imb. {r['imbalance']:.2f})") if np.isfinite(r.get("work_ratio", math.nan)) else ""
        best = ""
        if isinstance(r.get("best_bp"), str):
            best = f"{LABEL[r['best_bp']]}, {r['best_bp_threads']:g} thr"
        label = LABEL[r.method] + (": zero-gap control" if r.method == CONTROL else "")
        rows.append({
            "corpus": f"{r.corpus} ({r.source})", "width": r.width, "method": label, "n": r.n,
            "diverged": r.diverged_seeds,
            "threads (BP/method)": f"{r.threads_bp:g}/{r.threads_method:g}",
            f"x BP ({ci})": _ci(r, "ratio_vs_bp", "ratio_low", "ratio_high"),
            "best BP in budget": best,
            f"x best BP ({ci})": _ci(r, "ratio_vs_best", "best_low", "best_high"),
            "work x parallel x orch.": dec,
            "PSS GiB (idle/BP/method)": f"{r.idle_pss_gib:.3f}/{r.pss_bp_gib:.3f}/{r.pss_method_gib:.3f}",
            "bpb (BP/method)": (f"{r['bpb_bp']:.3f}/{r['bpb_method']:.3f}"
                                if np.isfinite(r.get("bpb_bp", math.nan)) else ""),
            "mean gap %": r.get("mean_gap_pct"), "upper %": r.get("upper_pct"),
            "gap % (90% CI)": (f"{r['mean_gap_pct']:.3f} [{r['lower_pct']:.3f}, {r['upper_pct']:.3f}]"
                               if np.isfinite(r.get("lower_pct", math.nan)) else ""),
            "seeds 80%": r.get("seeds_80pct"), "fails at gap 0": r.get("fails_at_zero_gap"),
            "verdict": r.verdict, "joint": r.joint if r.method != CONTROL else "",
        })
    return pd.DataFrame(rows)


def _write(df_csv: pd.DataFrame, df_md: pd.DataFrame, csv: Path, md: Path, title: str, notes: list[str]) -> None:
    atomic_write_csv(df_csv, csv)  # every column, once
    parts = [f"# {title}", "", markdown(df_md, floatfmt=".4g"), ""] + [f"- {n}" for n in notes]
    atomic_write_text(md, "\n".join(parts) + "\n")


def source_note(df: pd.DataFrame) -> str:
    """What each corpus source in the table is (only the sources it has, so no corpus is named that is not there)."""
    sources = set(df.corpus_source.dropna().astype(str))
    parts = []
    if "embedded" in sources:
        parts.append("`embedded` = the deterministic built-in stand-in of the named corpus (no download possible on "
                     "this machine), not real text of it")
    if any(x.startswith("file:") for x in sources):
        parts.append("`file:<name>` = a byte file given in the config (its MD5 is in the data folder's meta.json; "
                     "`python_docs` is the Python 3.11 documentation's reStructuredText sources, docs/sources.md)")
    if any(x == "download" or x.startswith("path:") for x in sources):
        parts.append("`download` / `path:<file>` = the paper's real corpus, its MD5 checked (docs/sources.md)")
    return "corpus source: " + "; ".join(parts) if parts else "corpus source: none recorded"


def _readable_memory(mem: pd.DataFrame) -> pd.DataFrame:
    ci = f"{interval_level():.0%} CI"
    rows = []
    for _, r in mem.iterrows():
        if r["row"] in LABEL:
            rows.append({"": LABEL[r["row"]], "n": r.n, "shape": f"w{r.width:g}, {r.n_layer:g} layers",
                         "peak PSS GiB": r.pss_gib, "own baseline GiB": r.baseline_gib,
                         "model GiB (peak - baseline)": r.model_gib, "params+grads+AdamW GiB": r.state_gib,
                         "model share of peak": r.model_share, f"RGC / BP ({ci})": ""})
        else:
            what = {"ratio_raw": "RGC / BP, raw peaks",
                    "ratio_minus_baselines": "RGC / BP, each minus its baseline (C3)"}[r["row"]]
            rows.append({"": what, "n": r.n, f"RGC / BP ({ci})": _ci(r, "ratio", "ratio_low", "ratio_high")})
    return pd.DataFrame(rows)


def write_tables(df: pd.DataFrame, s: StudyConfig, out: dict[str, Path], mem: pd.DataFrame | None = None) -> None:
    """Reads train, margin_pct, equivalence_bpb and memory of the config; `mem` is the memory probes' tidy CSV
    (written to out["mem_csv"] / out["mem_md"] when given)."""
    main = main_table(df, s)
    mech = mechanism_table(df, s)
    t = s.train
    _write(_fmt(main), _readable_main(main), out["main_csv"], out["main_md"],
           "Study C: async local training vs BP",
           [source_note(df),
            f"{t.n_layer} layers, {t.n_stages} stages, {t.steps} steps of {t.batch_size}x{t.block_size} bytes; BP "
            f"{t.bp_threads} thread(s), async {t.n_stages} processes x {t.threads_per_stage} thread(s), "
            f"thread-matched BP {t.async_threads} threads",
            "n = paired seeds in the statistics; diverged = paired seeds dropped because BP or the method diverged "
            "(the CSV column diverged_which names them); a diverged seed fails the method's verdict",
            f"ratio = geometric mean of per-seed throughput ratios, (low-high) = paired {interval_level():.0%} CI; "
            "best BP in budget = the faster of BP and thread-matched BP in this cell (both measured on every seed; "
            "their rates are in the CSV column bp_rates); upper = one-sided 95% upper bound of the mean gap (the "
            "paper's test: non-inferior iff upper <= margin); gap % (90% CI) = the mean gap with its two-sided 90% "
            "interval, whose upper end is that bound (C4 is decided on this interval against the margin: registry); "
            f"margin {s.margin_pct}%; joint = non-inferior and CI low (x BP) > 1 and no diverged seed",
            "work x parallel x orch. = T_BP / sum(stage busy) x sum(busy) / max(busy) x max(busy) / wall = the "
            "speed-up over BP; imb. = max/mean stage busy time (definitions: stats.py)",
            f"zero-gap control = thread-matched BP against BP: the same arithmetic on {t.async_threads} threads, so "
            "its true gap is 0; its row shows what the margin test says when nothing differs. fails at gap 0 = how "
            "often the margin test fails for a method exactly as good as BP at this row's sd and n (noncentral t)",
            "PSS = peak process-tree PSS of each method in a fresh process of its own; idle = that process "
            "before anything was built (interpreter + torch), the floor every method pays",
            "serial methods are not time-paired with the async ones: their throughput is only indicative; runs of "
            "the quality cells (one-thread jobs two at a time) have no throughput here at all",
            f"{LABEL[POOLED]} = C4's arm: async Broadcast where it ran, serial Broadcast on the seeds that have only "
            "it, pooled only when the two are bit-identical on every seed that has both (the CSV column `pooled` "
            "says how)"])
    _write(_fmt(mech), _fmt(mech), out["mech_csv"], out["mech_md"], "Study C mechanism: serial local methods",
           [source_note(df), "n = finished runs of the method, diverged = its diverged runs (kept out of every mean "
            "and interval)",
            "minus_live_local_bpb and its 90% CI (TOST) against Live Local; equivalence bound "
            f"+-{s.equivalence_bpb} bits per byte",
            f"readout snapshot lag {t.readout_lag} steps, refreshed every {t.snapshot_every}"])
    if mem is not None:
        memory = memory_table(mem)
        _write(memory, _readable_memory(memory), out["mem_csv"], out["mem_md"],
               "Study C memory (C3): each method beside its own bare process tree",
               [f"peak PSS = peak process-tree PSS over {s.memory.steps} training step(s) of the probe "
                "(local.memory.steps), in a fresh process per measurement; own "
                "baseline = the same process tree started without the model (BP: one interpreter; async RGC: the "
                f"training process, the forkserver and {t.n_stages} stage processes), so the interpreters cancel out "
                "of the difference", "model GiB = peak - own baseline: parameters, gradients, AdamW state, "
                "activations and (async) the shared-memory rings; params+grads+AdamW = 16 bytes per parameter",
                "C3 is decided on the baseline-subtracted ratio; the raw ratio counts interpreters (async RGC runs "
                f"{t.n_stages + 2} of them, BP one)"])
