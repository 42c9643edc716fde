"""`gradfidelity check-reference`: rerun a stratified sample of the committed cpu runs and compare every training
metric with the committed runs tables (results/cpu/runs/<study>.csv).

Why it exists: the cpu scale of all studies takes hours on 2 cores; a reviewer needs a check that the committed
numbers come from this code in the time they have, not a `git diff` after a full rerun.

The sample follows a fixed rule (reference/sample.py). The rerun happens in a scratch copy of the checkout's tracked
files (`--workdir`, default a temporary folder), so the user's own results/cpu is never touched, in one Snakemake
call per study, the drift-only studies first (reference/schedule.py). Before the sample runs, one short run of each
study measures this host's speed and the expected time is printed. `--budget SECONDS` sizes the sample to the time
given and stops there; without it the check runs to its end. Whatever stops it (a failed job, the budget, Ctrl-C),
the runs that finished are compared, their table written, and the summary line says "incomplete: k of n runs".

Each rerun run's row is made by the same `runs_table` function that made the committed row, and every `metric_*`
column is compared (harness/record_compare.py):
- exact (bit for bit) on the same host type: the same CPU identity (vendor, family/model/stepping, torch's
  dispatched ISA level, ISA flags and limits; `harness.provenance`). A committed run recorded before provenance had
  it ("unknown ISA") counts as another host;
- otherwise within a tolerance derived from the committed drift measurements (results/cpu/reference/drift_*.csv):
  a metric that did not move there stays exact; one that moved gets twice its largest drift (at least `MIN_REL`);
  one that moved by more than `MAX_REL` is "not comparable" across hosts: printed, counted, neither a pass nor a
  mismatch. An identical value is ok on any host type (a selected LR, a record digest);
- a metric its study declares chaotic across hosts (study A) is judged as one more seed of its arm where a claim
  reads it, at one family level over those metrics; an interval that holds the metric's whole range "cannot fail";
  other chaotic metrics are readings; a run whose upstream record (its base model) differs from the committed one
  is "another base" (reference/seeds.py).

Then the sampled studies' claims are recomputed with the rerun values in place of the committed ones for the
sampled runs (reference/verdicts.py), and each verdict is compared with the committed one.

Exit codes: 0 every metric within its rule and no verdict flipped; 1 a metric outside its rule (incomplete or not);
2 a bad input (gradfidelity's UserError); 3 only verdicts flipped; 4 incomplete: a rerun job failed, the budget ran
out or the check was interrupted (Ctrl-C), and none of the runs that finished is outside its rule. The last line is
one summary a reviewer can act on; `--out` gets the full table of the compared runs.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import pandas as pd

from gradfidelity.errors import UserError
from gradfidelity.harness.io import atomic_write_csv
from gradfidelity.harness.provenance import describe_host, host_type
from gradfidelity.harness.record_compare import (
    COLUMNS,
    DRIFT_DIR,
    EQUAL,
    MAX_REL,
    MIN_REL,
    RECORD,
    cross_host_rules,
    missing,
    read_drift,
    read_runs_table,
    record_digest,
)
from gradfidelity.harness.record_compare import compare as compare_records
from gradfidelity.reference.dag import Job, closures, parse_dry_run
from gradfidelity.reference.rerun import INTERRUPTED, metrics_path, rerun_rows, sigterm_as_ctrl_c
from gradfidelity.reference.sample import (
    SAMPLE_S,
    STUDY_ORDER,
    claim_runs,
    committed_tables,
    coverage,
    dry_run_plans,
    given_config,
    sampled_runs_per_claim,
    select,
    stale_studies,
    upstream_runs,
)
from gradfidelity.reference.schedule import Schedule, rerun_in_calls
from gradfidelity.reference.seeds import (
    ANOTHER_BASE,
    CANNOT_FAIL,
    FAMILY_ALPHA,
    MIN_SEEDS,
    ONE_MORE_SEED,
    READING,
    arm_values,
    claim_metrics,
    is_chaotic,
    judge,
    reading,
)

# Re-exported: their home is harness/record_compare.py (claims/ and harness/ import them from there).
__all__ = ["COLUMNS", "DRIFT_DIR", "INCOMPLETE", "MAX_REL", "MIN_REL", "RECORD", "SAMPLE_S", "Job",
           "check_reference", "closures", "compare", "coverage", "cross_host_rules", "exit_code", "given_config",
           "parse_dry_run", "read_drift", "read_runs_table", "record_digest", "select", "stale_studies",
           "summary_line"]

SCALE = "cpu"
INCOMPLETE = 4  # the exit code of a check that did not rerun its whole sample (module docstring)
_NOT_SCALAR = {RECORD, "status", "(the run)"}
_STOPPED = "every study"  # the not-recomputed key of a recompute that was stopped


# ----------------------------------------------------------------------------------------------- compare
def compare(committed: pd.DataFrame, rerun: pd.DataFrame, rules: dict[tuple[str, str], float | None] | None = None,
            force_cross_host: bool = False, seeds: pd.DataFrame | None = None,
            other_base: dict[str, str] | None = None,
            claims: dict[str, dict[str, tuple[float, float]]] | None = None) -> pd.DataFrame:
    """harness.record_compare.compare (bit for bit on one host type, the measured rules across, equal is equal),
    then, with `seeds` (every committed run of the sampled studies), each metric its study declares chaotic that was
    not compared exactly and is not identical: "another base" for a run in `other_base` (run -> why), judged as one
    more seed of its arm where a claim reads it (`claims`: study -> metric -> range; default the study's own
    rules.CLAIM_METRICS) at the level FAMILY_ALPHA / m over the m such comparisons, a reading otherwise. A metric whose
    arm has fewer than MIN_SEEDS committed seeds keeps its drift rule."""
    table = compare_records(committed, rerun, rules, force_cross_host)
    if seeds is None or table.empty:
        return table
    study_of = dict(zip(committed["run_id"], committed["study"], strict=True))
    other_base = other_base or {}
    claims = dict(claims) if claims is not None else {}
    judged = []  # (row index, the arm's committed values, the metric's range)
    for i, row in table.iterrows():
        study = study_of.get(row["run"])
        if (row["metric"] in _NOT_SCALAR or row["rule"] == EQUAL or (row["rule"] == "exact" and not force_cross_host
                                                                      and row["hosts"] == "same")
                or missing(row["rerun"]) or row["difference"] == 0 or not is_chaotic(study, row["metric"])):
            continue
        values = arm_values(seeds, row["run"], row["metric"])
        if row["run"] in other_base:
            table.loc[i, ["rule", "verdict"]] = f"{ANOTHER_BASE}: {other_base[row['run']]}", ANOTHER_BASE
            continue
        if len(values) < MIN_SEEDS:
            continue  # no seed distribution: the drift rule stands
        if study not in claims:
            claims[study] = claim_metrics(study)
        if row["metric"] in claims[study]:
            judged.append((i, values, claims[study][row["metric"]]))
        else:
            table.loc[i, ["rule", "verdict"]] = reading(row["rerun"], values), READING
    alpha = FAMILY_ALPHA / max(len(judged), 1)
    for i, values, value_range in judged:
        table.loc[i, ["rule", "verdict"]] = judge(table.loc[i, "committed"], table.loc[i, "rerun"], values, alpha,
                                                  value_range)
    return table


def another_base(upstream: dict[str, list[str]], committed_json: dict[str, str], work: Path) -> dict[str, str]:
    """run -> why it started from another base: an upstream run (its closure's other training runs) whose rerun
    record in `work` differs from the committed one (record digests, wall clock aside). An upstream run the committed
    tables do not hold, or that has no rerun record, says nothing."""
    out = {}
    for run, ups in upstream.items():
        for up in ups:
            then, path = committed_json.get(up), work / metrics_path(up)
            if missing(then) or not path.is_file():
                continue
            now = record_digest(path.read_text())
            if now != record_digest(then):
                out[run] = f"{up.removeprefix(f'results/{SCALE}/')}'s record {record_digest(then)} -> {now}"
                break
    return out


def exit_code(table: pd.DataFrame, verdicts: pd.DataFrame | None, incomplete: str = "") -> int:
    """0: every metric within its rule and no verdict flipped; 1: a metric outside its rule (whatever the verdicts,
    complete or not); 4: incomplete (`incomplete` says why), nothing outside its rule; 3: complete, every metric
    within its rule, yet a recomputed verdict differs from the committed one."""
    if len(table) and (table["verdict"] == "MISMATCH").any():
        return 1
    if incomplete:
        return INCOMPLETE
    if verdicts is not None and len(verdicts) and not verdicts["unchanged"].astype(bool).all():
        return 3
    return 0


def _family(table: pd.DataFrame) -> str:
    judged = table["rule"].astype(str).str.match(rf"{ONE_MORE_SEED}: [\d.]+% PI")
    return f" at family level {FAMILY_ALPHA:g} over {int(judged.sum())} claim metrics" if judged.any() else ""


def summary_line(table: pd.DataFrame, verdicts: pd.DataFrame | None, not_recomputed: dict[str, str],
                 hosts: str = "", coverage: dict[str, tuple[int, int]] | None = None, incomplete: str = "",
                 sampled: int | None = None) -> str:
    """The one line a reviewer acts on, e.g. 'incomplete: 17 of 26 runs (the budget of 3600 s ran out); committed
    on AuthenticAMD 25/17 AVX512, rerun on GenuineIntel 6/167 AVX512; 17 runs, 177 metrics: 91 bit for bit, 37
    within cross-host drift (largest 0.51%), 20 as one more seed (inside their arm's prediction interval at family
    level 0.05 over 24 claim metrics), 4 cannot fail (interval wider than the metric's range), 30 readings, 0 outside
    their rule, 16 not comparable across hosts; verdicts unchanged: 26 of 26; claims with a sampled run: ...'."""
    diff = pd.to_numeric(table["difference"], errors="coerce")
    rel = pd.to_numeric(table["rel_difference"], errors="coerce")
    verdict = table["verdict"]
    ok = verdict == "ok"
    seed = table["rule"].astype(str).str.startswith(ONE_MORE_SEED)
    same = ok & (diff == 0) & ~seed
    drifted = ok & (diff != 0) & ~seed
    largest = f" (largest {100 * rel[drifted].max():.2g}%)" if drifted.any() else ""
    head = f"incomplete: {table['run'].nunique()} of {sampled} runs ({incomplete}); " if incomplete else ""
    head += f"{hosts}; " if hosts else ""
    first = (f"{head}{table['run'].nunique()} runs, {len(table)} metrics: {int(same.sum())} bit for bit, "
             f"{int(drifted.sum())} within cross-host drift{largest}")
    if (ok & seed).any():
        first += f", {int((ok & seed).sum())} as one more seed (inside their arm's prediction interval{_family(table)})"
    counts = {CANNOT_FAIL: " cannot fail (interval wider than the metric's range)", READING: " readings",
              ANOTHER_BASE: " another base (judged by the verdicts only)"}
    for name, words in counts.items():
        if (verdict == name).any():
            first += f", {int((verdict == name).sum())}{words}"
    first += f", {int((verdict == 'MISMATCH').sum())} outside their rule"
    skipped = int((verdict == "not comparable").sum())
    if skipped:
        first += f", {skipped} not comparable across hosts"
    parts = [first]
    if verdicts is not None and len(verdicts):
        flipped = verdicts[~verdicts["unchanged"].astype(bool)]
        parts.append(f"verdicts unchanged: {len(verdicts) - len(flipped)} of {len(verdicts)}"
                     + (f" (flipped: {', '.join(flipped['id'])})" if len(flipped) else ""))
    if not_recomputed:
        parts.append(f"verdicts not recomputed for {', '.join(sorted(not_recomputed))} (reason above)")
    if coverage:
        parts.append("claims with a sampled run: " + ", ".join(f"{s} {k} of {n}" for s, (k, n) in coverage.items()))
    return "; ".join(parts)


# ----------------------------------------------------------------------------------------------- report
def hosts_line(committed: pd.DataFrame, rerun: pd.DataFrame) -> str:
    """'rerun on: ...; committed on: ...' with every distinct CPU identity (an old row: 'unknown ISA (AMD EPYC)')."""
    def names(df):
        out = set()
        for row in df.to_dict("records"):
            name = describe_host(row)
            out.add(name if host_type(row) else f"{name} ({row.get('cpu_model')})")
        return "; ".join(sorted(out)) or "(no run finished)"
    return f"rerun on: {names(rerun)}. committed on: {names(committed)}"


def _short_host(row: dict) -> str:
    key = host_type(row)
    return "unknown ISA" if key is None else f"{key[0]} {key[1]}/{key[2]} {key[4]}"


def host_types(committed: pd.DataFrame, rerun: pd.DataFrame) -> str:
    """'committed on AuthenticAMD 25/17 AVX512, rerun on GenuineIntel 6/167 AVX512' (every distinct host type)."""
    def names(df):
        return " + ".join(sorted({_short_host(r) for r in df.to_dict("records")})) or "(nothing)"
    return f"committed on {names(committed)}, rerun on {names(rerun)}"


def _print_tables(table: pd.DataFrame, verdicts: pd.DataFrame | None, full: bool) -> None:
    shown = table.assign(run=table["run"].str.removeprefix(f"results/{SCALE}/"))
    if not full:  # the full table went to --out: here only what is not bit for bit
        diff = pd.to_numeric(shown["difference"], errors="coerce")
        shown = shown[(shown["verdict"] != "ok") | (diff != 0)]
    with pd.option_context("display.max_rows", None, "display.width", 250, "display.max_colwidth", 120):
        which = "every metric" if full else "the metrics that are not bit for bit"
        print(f"(run ids below are relative to results/{SCALE}/; {which})")
        print(shown.to_string(index=False) if len(shown) else "(none)")
        if verdicts is not None and len(verdicts):
            print("claims recomputed with the rerun values in place of the committed ones for the sampled runs:")
            print(verdicts.to_string(index=False))


# ----------------------------------------------------------------------------------------------- run it
def check_reference(repo: Path, workdir: Path | None = None, cores: int = 2, budget_s: float | None = None,
                    studies: tuple[str, ...] = STUDY_ORDER, extra_config: tuple[str, ...] = (),
                    cross_host: bool = False, out: Path | None = None, recompute_verdicts: bool = True) -> int:
    """Rerun the sample (fixed, or sized to `budget_s` seconds on this host and stopped there), compare the runs
    that finished, recompute the sampled studies' verdicts when the rerun is complete; print the tables and the
    summary line; exit code per `exit_code`. With `out`: the compared runs' full table there, the verdicts beside."""
    start = time.monotonic()
    repo = Path(repo).resolve()
    own = workdir is None
    work = Path(tempfile.mkdtemp(prefix="gf-check-reference-")) if own else Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    extra_config = (*given_config(repo), *extra_config)
    schedule = None
    with sigterm_as_ctrl_c():
        try:
            tables = committed_tables(repo, studies)
            if not tables:
                raise UserError("no study can be sampled (reasons above)")
            rules = cross_host_rules(read_drift(repo))
            runs_of = claim_runs(repo, tables)
            plans = dry_run_plans(repo, work, tables, extra_config)
            schedule = Schedule(work, tables, plans, cores, extra_config, budget_s, start)
            print(f"check-reference: planned in {time.monotonic() - start:.0f} s; rerunning in {work}", flush=True)
            rerun_in_calls(schedule, runs_of)
        except KeyboardInterrupt:  # outside a Snakemake call (each call stops its own): planning, a probe's reading
            if schedule is None:
                print("check-reference: incomplete: no run rerun (interrupted while planning)", flush=True)
                return INCOMPLETE
            schedule.progress.stopped = INTERRUPTED
    progress = schedule.progress
    sample, finished = progress.sample or progress.finished, progress.finished
    incomplete = progress.incomplete()
    committed = pd.concat([df[df["run_id"].isin(finished)] for df in tables.values()], ignore_index=True)
    committed = committed.set_index("run_id").loc[finished].reset_index() if finished else committed
    rerun = rerun_rows(work, finished)
    seeds = pd.concat(list(tables.values()), ignore_index=True)
    committed_json = dict(zip(seeds["run_id"], seeds.get("metrics_json", pd.Series(index=seeds.index)),
                              strict=True))
    other = another_base(upstream_runs(schedule.plans, finished, schedule.study_of), committed_json, work)
    table = compare(committed, rerun, rules, force_cross_host=cross_host, seeds=seeds, other_base=other)
    verdicts, not_recomputed = None, {}
    if recompute_verdicts and not incomplete:
        with sigterm_as_ctrl_c():
            verdicts, not_recomputed = _recompute(repo, work, tables, sample, cores, extra_config, runs_of,
                                                  schedule.deadline)
        if verdicts is None and _STOPPED in not_recomputed:
            incomplete = not_recomputed[_STOPPED]
    elif recompute_verdicts:
        not_recomputed = {_STOPPED: f"the rerun is incomplete ({incomplete})"}
    for study, why in not_recomputed.items():
        print(f"check-reference: {study}'s verdicts are not recomputed: {why}", flush=True)
    if out is not None:
        atomic_write_csv(table, out)
        if verdicts is not None:
            atomic_write_csv(verdicts, Path(out).with_suffix(".verdicts.csv"))
    _print_tables(table, verdicts, full=out is None)
    print(f"{hosts_line(committed, rerun)}. Cross-host rules from {DRIFT_DIR}/drift_*.csv; "
          f"{time.monotonic() - start:.0f} s" + (f"; table of the compared runs: {out}" if out is not None else ""))
    line = summary_line(table, verdicts, not_recomputed, host_types(committed, rerun), coverage(runs_of, finished),
                        incomplete, len(sample))
    print(f"check-reference: {line}")
    code = exit_code(table, verdicts, incomplete)
    if code:
        print(f"the scratch copy is kept for inspection: {work}")
    elif own:
        shutil.rmtree(work, ignore_errors=True)
    return code


def _recompute(repo, work, tables, sample, cores, extra_config, runs_of, deadline):
    """The verdict changes of the sampled studies (reference/verdicts.py) and why some were not recomputed; a
    Ctrl-C here leaves every verdict not recomputed, said so."""
    from gradfidelity.reference.verdicts import recompute_all

    try:
        verdicts, not_recomputed = recompute_all(repo, work, tables, sample, cores, extra_config, deadline)
    except KeyboardInterrupt:
        return None, {_STOPPED: "interrupted (Ctrl-C) while recomputing the claims"}
    if verdicts is not None:
        per_claim = sampled_runs_per_claim(runs_of, sample)
        verdicts = verdicts.assign(sampled_runs=[per_claim.get(c, 0) for c in verdicts["id"]])
    return verdicts, not_recomputed

