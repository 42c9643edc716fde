"""`gradfidelity check-reference --measure-drift`: how far the training metrics move between two ISA levels of
torch's kernels on one host, the measurement the cross-host rules of check-reference derive from.

The fixed sample of check-reference (gradfidelity/reference/check.py) is rerun twice, in two scratch copies: once with
every kernel library limited to AVX2 (ATEN_CPU_CAPABILITY=avx2 for torch's own kernels, MKL_ENABLE_INSTRUCTIONS=AVX2,
DNNL_MAX_CPU_ISA=AVX2) and once at the host's own level (those variables removed). Each run records the level
torch really dispatched to, read in the process that trained (provenance `cpu_capability`); the measurement is
refused when the two levels read the same, since then nothing was measured (a host without AVX-512 or AMX).
The result, results/cpu/reference/drift_<level a>_vs_<level b>.csv, has one row per (run, metric) with both
values and their relative difference; `reference.cross_host_rules` reads it with every other drift_*.csv.
Where the studies' runs tables can rebuild their run records, the claims are recomputed with each level's values
in place of the committed ones for the sampled runs (gradfidelity/reference/verdicts.py), and
verdicts_<a>_vs_<b>.csv says per claim whether its verdict flips: the claims report shows it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pandas as pd

from gradfidelity.errors import UserError
from gradfidelity.harness.io import atomic_write_csv
from gradfidelity.harness.provenance import ISA_LIMITS
from gradfidelity.harness.record_compare import DRIFT_DIR, cross_host_rules, missing
from gradfidelity.reference.rerun import OK, Call, log_tail, rerun_rows, scratch_copy, snakemake_call
from gradfidelity.reference.sample import SAMPLE_S, STUDY_ORDER, committed_tables, given_config, plan_sample

LEVELS = {  # level name -> the environment that limits every kernel library to it ({}: the host's own level)
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "DNNL_MAX_CPU_ISA": "AVX2"},
    "native": {},
}
DRIFT_COLUMNS = ["study", "run", "metric", "capability_a", "value_a", "capability_b", "value_b", "difference",
                 "rel_difference"]


def level_env(level: str, environ: dict | None = None) -> dict:
    """The process environment of one level: every ISA limit of the caller removed, then the level's own set."""
    if level not in LEVELS:
        raise UserError(f"unknown ISA level {level!r} (known: {', '.join(LEVELS)})")
    env = {k: v for k, v in (os.environ if environ is None else environ).items() if k not in ISA_LIMITS}
    return {**env, **LEVELS[level]}


def capability_of(rerun: pd.DataFrame, level: str) -> str:
    """The one ISA level torch dispatched to in every run of a rerun (from their provenance), checked against the
    level asked for: a limit that did not reach a training process must not pass as a measurement."""
    caps = sorted({str(c) for c in rerun["cpu_capability"]})
    if len(caps) != 1:
        raise UserError(f"the {level} rerun's runs dispatched to different ISA levels {caps}: not one level")
    if level != "native" and caps[0].lower() != level.lower():
        raise UserError(f"the {level} rerun's runs dispatched to {caps[0]}, not {level}: the limit did not reach "
                        "the training processes")
    return caps[0]


def drift_table(a: pd.DataFrame, b: pd.DataFrame, cap_a: str, cap_b: str) -> pd.DataFrame:
    """One row per (run, metric) of two reruns of one sample: both values, b - a and |b - a| / |a|. A run or a
    metric present at one level only, or a status that differs, is an error: drift is measured on like pairs."""
    if cap_a == cap_b:
        raise UserError(f"both reruns dispatched to {cap_a}: this host has no second ISA level to measure (no "
                        "AVX-512 or AMX above AVX2); use a host that has one")
    other = b.set_index("run_id")
    rows = []
    for rec in a.to_dict("records"):
        run = rec["run_id"]
        if run not in other.index:
            raise UserError(f"{run} was rerun at {cap_a} only")
        new = other.loc[run].to_dict()
        if rec["status"] != new["status"]:
            raise UserError(f"{run}: status {rec['status']} at {cap_a}, {new['status']} at {cap_b}")
        keys = sorted(k for k in set(rec) | set(new) if k.startswith("metric_")
                      and not (missing(rec.get(k)) and missing(new.get(k))))
        for key in keys:
            va, vb = rec.get(key), new.get(key)
            if missing(va) or missing(vb):
                raise UserError(f"{run}: {key} at one level only ({cap_a}: {va}, {cap_b}: {vb})")
            diff = float(vb) - float(va)
            rows.append({"study": rec["study"], "run": run, "metric": key[len("metric_"):],
                         "capability_a": cap_a, "value_a": va, "capability_b": cap_b, "value_b": vb,
                         "difference": diff, "rel_difference": abs(diff) / max(abs(float(va)), 1e-12)})
    return pd.DataFrame(rows, columns=DRIFT_COLUMNS)


def rules_text(drift: pd.DataFrame) -> str:
    """study/metric: largest drift and the cross-host rule it gives, one line each (metrics that moved only)."""
    rules = cross_host_rules(drift)
    worst = drift.groupby(["study", "metric"])["rel_difference"].max()
    lines = [f"  {study}/{metric}: largest {100 * rel:.3g}% -> "
             + ("not comparable" if rules[(study, metric)] is None else f"rel<={rules[(study, metric)]:.3g}")
             for (study, metric), rel in worst.items() if rel > 0]
    return "\n".join(lines) or "  (no metric moved)"


def rerun_sample(work: Path, sample: list[str], cores: int, extra_config: tuple[str, ...],
                 env: dict | None = None) -> pd.DataFrame:
    """Rerun every run of `sample` in `work` in one Snakemake call, no time limit; their runs table. A measurement
    needs every run: a failed or stopped call is an error naming its log."""
    call = snakemake_call(work, Call("measure-drift", list(sample)), cores, extra_config, env=env)
    if call.status != OK or len(call.finished) < len(sample):
        raise UserError(f"the rerun {call.status} ({len(call.finished)} of {len(sample)} runs finished); the scratch "
                        f"copy is kept in {work}, its log in {call.log}:\n{log_tail(call)}")
    return rerun_rows(work, list(sample))


def measure_drift(repo: Path, workdir: Path | None = None, cores: int = 2, extra_config: tuple[str, ...] = (),
                  levels: tuple[str, str] = ("avx2", "native")) -> int:
    """Rerun the fixed sample at two ISA levels, write results/cpu/reference/drift_<a>_vs_<b>.csv (and
    verdicts_<a>_vs_<b>.csv where the claims can be recomputed); 0 on success."""
    repo = Path(repo).resolve()
    tables = committed_tables(repo, STUDY_ORDER)
    work = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="gf-measure-drift-"))
    extra_config = (*given_config(repo), *extra_config)
    _measure(repo, work, tables, cores, SAMPLE_S, extra_config, levels)
    if workdir is None:  # kept when it failed (an exception skips this), for inspection
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _measure(repo: Path, work: Path, tables: dict[str, pd.DataFrame], cores: int, budget_s: float,
             extra_config: tuple[str, ...], levels: tuple[str, str]) -> None:
    from gradfidelity.reference.verdicts import committed_verdicts, recompute_study, verdict_changes

    sample = plan_sample(repo, work / levels[0], tables, budget_s, extra_config)
    print(f"measure-drift: {len(sample)} runs at ISA levels {' and '.join(levels)}, in {work}", flush=True)
    reruns, caps = {}, {}
    for level in levels:
        if level != levels[0]:
            scratch_copy(repo, work / level)
        reruns[level] = rerun_sample(work / level, sample, cores, extra_config, env=level_env(level))
        caps[level] = capability_of(reruns[level], level)
        print(f"measure-drift: {level}: torch dispatched to {caps[level]} in every run", flush=True)
    a, b = levels
    drift = drift_table(reruns[a], reruns[b], caps[a], caps[b])
    tag = f"{caps[a].lower()}_vs_{caps[b].lower()}"
    path = repo / DRIFT_DIR / f"drift_{tag}.csv"
    atomic_write_csv(drift, path)
    print(f"measure-drift: {len(drift)} metrics of {len(sample)} runs -> {path.relative_to(repo)}; rules from this "
          f"measurement alone:\n{rules_text(drift)}")
    frames = []
    for study, table in tables.items():
        if not table["run_id"].isin(sample).any():
            continue
        for level in levels:
            try:
                changes = verdict_changes(committed_verdicts(repo, [study]), recompute_study(
                    repo, work / level, study, table, sample, cores, extra_config))
            except UserError as exc:
                print(f"measure-drift: {study}'s verdicts at {caps[level]} are not recomputed: {exc}", flush=True)
                continue
            frames.append(changes.assign(values=f"rerun at {caps[level]}", source=path.name))
    if frames:
        verdicts = pd.concat(frames, ignore_index=True)
        vpath = repo / DRIFT_DIR / f"verdicts_{tag}.csv"
        atomic_write_csv(verdicts, vpath)
        flips = verdicts[~verdicts["unchanged"]]
        print(f"measure-drift: {len(flips)} verdict flip(s) of {len(verdicts)} -> {vpath.relative_to(repo)}")
