"""`gradfidelity check-reference`: rerun a stratified sample of the committed cpu runs and compare every training
metric with the committed runs tables (results/cpu/runs/<study>.csv).

Why it exists: the cpu scale of all studies takes hours on 2 cores; a reviewer needs a check that the committed
numbers come from this code in minutes, not a `git diff` after a full rerun.

The sample is chosen by a fixed rule, never by hand, from the committed tables and Snakemake's own plan:
1. Candidates: every finished (status ok) run of the first paired seed of each study.
2. One Snakemake dry run per study (`--forceall`, in a scratch copy with no results) gives each candidate's
   upstream jobs (the base model an RL run starts from, the SFT run it continues, ...). An LR-tuned cell reads the
   committed LR selection (`given_config`): its LR grid is not rerun.
3. A candidate's cost is the committed wall time of every training run in its closure (a training run that the
   runs table does not list counts as the study's median run), plus `OTHER_JOB_S` for each other job (data
   preparation).
4. Stratified by study: each study's cheapest candidate first (ties: the run id), then, round robin over the
   studies in a fixed order, each study's next candidate in the order of the SHA-256 of its run id (a fixed,
   content-free shuffle) whose extra cost still fits the budget.

The rerun happens in a scratch copy of the checkout's tracked files (`--workdir`, default a temporary folder), so
the user's own results/cpu is never touched. Each rerun run's row is made by the same `runs_table` function that
made the committed row, and every `metric_*` column is compared:
- exact (bit for bit) when the rerun ran on the same host type as the committed run: the same CPU identity
  (vendor, family/model/stepping, torch's dispatched ISA level, ISA flags and limits; `harness.provenance`). A
  committed run recorded before provenance had it ("unknown ISA") counts as another host;
- otherwise within a tolerance derived from the committed drift measurements (`DRIFT_DIR`/drift_*.csv, see
  `cross_host_rules`): the sample rerun at two ISA levels (`check-reference --measure-drift`,
  gradfidelity/reference/drift.py) or on two hosts whose ISA differs. A metric that did not move there stays
  exact; one that moved gets twice its largest drift (at least `MIN_REL`); one that moved by more than `MAX_REL`
  (an RL trajectory's token count, a selection, a difference of two late losses) is "not comparable" across
  hosts: printed, counted, neither a pass nor a mismatch.

Then the sampled studies' claims are recomputed with the rerun values in place of the committed ones for the
sampled runs (gradfidelity/reference/verdicts.py), and each verdict is compared with the committed one. Exit code:
0 every metric within its rule and no verdict flipped; 1 a metric outside its rule; 3 only verdicts flipped. The
last line is one summary a reviewer can act on; `--out` gets the full table.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pandas as pd

from gradfidelity.errors import UserError
from gradfidelity.harness.io import atomic_write_csv
from gradfidelity.harness.provenance import describe_host, host_type, same_host_type
from gradfidelity.harness.results import runs_table
from gradfidelity.reference.dag import Job, closures, parse_dry_run, snakemake
from gradfidelity.reference.seeds import (
    FAMILY_ALPHA,
    MIN_SEEDS,
    ONE_MORE_SEED,
    arm_of,
    arm_values,
    chaotic_metrics,
    is_chaotic,
    judge,
)
from gradfidelity.studies import STUDIES

__all__ = ["DRIFT_DIR", "MAX_REL", "MIN_REL", "Job", "check_reference", "closures", "compare", "cross_host_rules",
           "exit_code", "given_config", "parse_dry_run", "read_drift", "record_digest", "select", "summary_line"]

SCALE = "cpu"
STUDY_ORDER = STUDIES  # the one list of studies: a fifth study is sampled too
OTHER_JOB_S = 10.0          # a job that is not a training run (data preparation, a selection, a table)
BUDGET_S = 1500.0           # the sample's summed committed job time: about 13 min wall, two jobs at a time
DRIFT_DIR = Path("results") / SCALE / "reference"  # drift_*.csv: (study, run, metric, ..., rel_difference)
MIN_REL = 0.005   # the smallest cross-host tolerance of a metric that drifted at all
MAX_REL = 0.25    # a metric whose tolerance would exceed this is not comparable across hosts


def given_config(repo: Path) -> tuple[str, ...]:
    """`--config` items every Snakemake call of the check gets. The scratch copy has no venvs: the DeepSpeed 0.18.9
    overlay is the checkout's (as for the smoke DAG test). The LR-tuned cells read the committed LR selections
    (results/cpu/<study>/lr_selection.json, `lr_selection_from`): rerunning them would rerun the LR grids behind
    them, about 110 runs of studies A and B that no sampled run is compared on (an hour on 2 cores, not minutes).
    A wrong committed selection still shows: the cell then trains at another LR and every metric differs."""
    return (f"deepspeed_buggy_overlay={repo / '.venv-ds0189'}", f"lr_selection_from={repo / 'results' / SCALE}")


def _metrics_path(run_id: str) -> str:
    return f"{run_id}/metrics.json"


def _sha(run_id: str) -> str:
    return hashlib.sha256(run_id.encode()).hexdigest()


def claim_runs(repo: Path, tables: dict[str, pd.DataFrame]) -> dict[str, dict[str, list[str]]]:
    """study -> claim -> the committed runs the claim's value reads: its evidence's `sources` that are runs of a
    sampled study's table, in the order the evidence lists them. An arm of one run beside arms of several seeds is
    left out: a value paired over seeds cannot read it, so it is a gate or a start (study A's base model)."""
    from gradfidelity.harness.io import read_json

    known = {r for df in tables.values() for r in df["run_id"]}
    out = {}
    for study in tables:
        path = Path(repo) / "results" / SCALE / "claims" / f"{study}.json"
        values = read_json(path).get("values", {}) if path.is_file() else {}
        out[study] = {cid: _paired_runs([s for s in (v.get("sources") or []) if s in known])
                      for cid, v in values.items()}
    return out


def _paired_runs(runs: list[str]) -> list[str]:
    counts = pd.Series([arm_of(r) for r in runs], dtype=object).value_counts()
    if counts.empty or counts.max() == 1:
        return runs
    return [r for r in runs if counts[arm_of(r)] > 1]


def coverage(runs_of: dict[str, dict[str, list[str]]], sample: list[str]) -> dict[str, tuple[int, int]]:
    """study -> (claims with at least one sampled run among those they read, claims that read any run)."""
    chosen = set(sample)
    return {study: (sum(1 for runs in claims.values() if chosen & set(runs)), sum(1 for r in claims.values() if r))
            for study, claims in runs_of.items()}


def sampled_runs_per_claim(runs_of: dict[str, dict[str, list[str]]], sample: list[str]) -> dict[str, int]:
    chosen = set(sample)
    return {cid: len(chosen & set(runs)) for claims in runs_of.values() for cid, runs in claims.items()}


def _arms(runs: list[str]) -> list[str]:
    seen = []
    for run in runs:
        if arm_of(run) not in seen:
            seen.append(arm_of(run))
    return seen


def select(tables: dict[str, pd.DataFrame], plans: dict[str, list[Job]], budget_s: float = BUDGET_S,
           runs_of: dict[str, dict[str, list[str]]] | None = None) -> list[str]:
    """The sample's run ids, by the rule in the module docstring. `plans[study]` is the dry run of its candidates.

    Then, for a study whose metrics are chaotic across hosts (reference/seeds.py: a rerun elsewhere is one more
    seed, so its verdicts are the check that can fail), every claim gets a run it reads: the first-seed run of each
    of its first two arms (in its evidence's order: for A5 the fixed SFT and the buggy one), whatever the budget."""
    wall = {r.run_id: float(r.wall_s) for df in tables.values() for r in df.itertuples()}
    order, cost_of = {}, {}
    for study in STUDY_ORDER:
        if study not in tables:
            continue
        df = tables[study]
        ok = df[df["status"] == "ok"]
        first_seed = ok["seed"].min()
        candidates = sorted(ok.loc[ok["seed"] == first_seed, "run_id"])
        jobs = plans[study]
        closure = closures(jobs, [_metrics_path(c) for c in candidates])

        median = float(ok["wall_s"].median())

        def job_cost(i, jobs=jobs, median=median):
            runs = [o[: -len("/metrics.json")] for o in jobs[i].outputs if o.endswith("/metrics.json")]
            return sum(wall.get(run, median) for run in runs) if runs else OTHER_JOB_S

        for c in candidates:
            cost_of[c] = ({(study, i) for i in closure[_metrics_path(c)]},
                          {(study, i): job_cost(i) for i in closure[_metrics_path(c)]})
        cheapest = min(candidates, key=lambda c: (sum(cost_of[c][1].values()), c))
        order[study] = [cheapest] + sorted((c for c in candidates if c != cheapest), key=_sha)

    chosen, done, spent = [], set(), 0.0
    for study in order:  # each study's cheapest cell, whatever the budget: every study is checked
        c = order[study].pop(0)
        chosen.append(c)
        spent += sum(cost for key, cost in cost_of[c][1].items() if key not in done)
        done |= cost_of[c][0]
    progress = True
    while progress:
        progress = False
        for study in order:
            for c in list(order[study]):
                extra = sum(cost for key, cost in cost_of[c][1].items() if key not in done)
                if spent + extra <= budget_s:
                    order[study].remove(c)
                    chosen.append(c)
                    spent += extra
                    done |= cost_of[c][0]
                    progress = True
                    break
    for study, claims in (runs_of or {}).items():
        if study not in order or not chaotic_metrics(study):
            continue
        first = {arm_of(c): c for c in cost_of if c.startswith(f"results/{SCALE}/{study}/")}
        for runs in claims.values():
            for arm in _arms(runs)[:2]:
                c = first.get(arm)
                if c is None or c in chosen or any(arm_of(x) == arm for x in chosen):
                    continue
                chosen.append(c)
                done |= cost_of[c][0]
    return chosen


# ----------------------------------------------------------------------------------------------- compare
def read_runs_table(path: Path) -> pd.DataFrame:
    """A committed runs table, its floats read back exactly (pandas' default parser may differ in the last bit)."""
    return pd.read_csv(path, float_precision="round_trip")


def read_drift(repo: Path) -> pd.DataFrame:
    """Every committed drift measurement (results/cpu/reference/drift_*.csv) in one table, each row with its file."""
    paths = sorted((Path(repo) / DRIFT_DIR).glob("drift_*.csv"))
    if not paths:
        raise UserError(f"{Path(repo) / DRIFT_DIR} has no drift_*.csv: the committed drift measurements behind the "
                        "cross-host rules are missing")
    frames = []
    for path in paths:
        df = pd.read_csv(path)
        missing = {"study", "metric", "rel_difference"} - set(df.columns)
        if missing:
            raise UserError(f"{path}: no column(s) {sorted(missing)}")
        frames.append(df.assign(source=path.name))
    return pd.concat(frames, ignore_index=True)


def cross_host_rules(drift: pd.DataFrame) -> dict[tuple[str, str], float | None]:
    """(study, metric) -> relative tolerance across hosts (0: exact), or None: not comparable across hosts.

    From the drift measurements: twice the largest relative drift of the metric in its study over every
    measurement, at least MIN_REL; above MAX_REL the metric is not comparable. A metric of a study no measurement
    saw stays exact.
    """
    rules = {}
    worst = drift.assign(rel=pd.to_numeric(drift["rel_difference"], errors="coerce")).groupby(
        ["study", "metric"])["rel"].max()
    for (study, metric), rel in worst.items():
        if pd.isna(rel):
            raise UserError(f"{DRIFT_DIR}: no relative difference for {study}/{metric}")
        tol = 0.0 if rel == 0 else max(2 * float(rel), MIN_REL)
        rules[(study, metric)] = None if tol > MAX_REL else tol
    return rules


COLUMNS = ["run", "metric", "committed", "rerun", "difference", "rel_difference", "rule", "verdict", "hosts"]
RECORD = "(record)"  # the metric name of a run's whole record in the comparison
WALL_CLOCK_KEYS = frozenset({"timing", "seconds"})  # wall-clock values inside a record: they never repeat


def record_digest(metrics_json) -> str | None:
    """The first 16 hex digits of the SHA-256 of a run's metrics.json (a runs table's `metrics_json`) without its
    wall-clock values (`WALL_CLOCK_KEYS` at any depth); None for a row without one (written before round 4).

    Why: a runs table's scalar `metric_*` columns are not all a run records. Study A's audit runs keep their
    evidence (contribution vectors, loss-aggregation rows) nested, with no scalar metric at all, and the training
    runs keep curves and histories. One digest compares all of it on the same host type."""
    if _missing(metrics_json):
        return None

    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in WALL_CLOCK_KEYS}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    canonical = json.dumps(strip(json.loads(metrics_json)), sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def compare(committed: pd.DataFrame, rerun: pd.DataFrame, rules: dict[tuple[str, str], float | None] | None = None,
            force_cross_host: bool = False, seeds: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (run, metric): committed, rerun, difference (absolute and relative), the rule applied, the
    verdict (ok, MISMATCH, or "not comparable" across hosts) and whether the two runs ran on one host type.

    A run is compared bit for bit only when its committed row and its rerun row carry the same CPU identity
    (`harness.provenance.same_host_type`: vendor, family/model/stepping, torch's ISA level, ISA flags and limits);
    a committed row without one ("unknown ISA", made before provenance recorded it) is another host. Across hosts
    the measured rules apply (`cross_host_rules`; a metric without a rule is compared exactly), except for a metric
    its study declares chaotic across hosts: with `seeds` (every committed run of the sampled studies), that one is
    judged as one more seed of its arm (reference/seeds.py). `force_cross_host` applies the cross-host rules on one
    host type too (to measure drift)."""
    rules = rules or {}
    rows, as_seed = [], []  # as_seed: (row index, rerun value, the arm's committed values)
    rerun = rerun.set_index("run_id")
    for rec in committed.itertuples(index=False):
        rec = rec._asdict()
        run = rec["run_id"]
        metrics = sorted(k for k in rec if k.startswith("metric_") and not _missing(rec[k]))
        if run not in rerun.index:
            rows.append({"run": run, "metric": "(the run)", "committed": "ok", "rerun": "missing",
                         "difference": "", "rel_difference": "", "rule": "", "verdict": "MISMATCH", "hosts": ""})
            continue
        new = rerun.loc[run]
        same = same_host_type(rec, new.to_dict())
        hosts = "same" if same else "cross"
        exact = same and not force_cross_host
        study = rec["study"]  # recorded by the harness in metrics.json (the drift table uses the same)
        if new["status"] != rec["status"]:
            rows.append({"run": run, "metric": "status", "committed": rec["status"], "rerun": new["status"],
                         "difference": "", "rel_difference": "", "rule": "exact", "verdict": "MISMATCH",
                         "hosts": hosts})
        for key in metrics:
            a, b = rec[key], new.get(key)
            metric = key[len("metric_"):]
            tol = 0.0 if exact else rules.get((study, metric), 0.0)
            rule = "exact" if tol == 0 else ("not comparable" if tol is None else f"rel<={tol:.3g}")
            values = arm_values(seeds, run, metric) if not exact and seeds is not None and is_chaotic(
                study, metric) else []
            if len(values) >= MIN_SEEDS and not _missing(b):  # else: no seed distribution, the drift rule below
                diff = float(b) - float(a)
                rel = abs(diff) / max(abs(float(a)), 1e-12)
                as_seed.append((len(rows), b, values))
                rows.append({"run": run, "metric": metric, "committed": a, "rerun": b, "difference": diff,
                             "rel_difference": rel, "rule": "", "verdict": "", "hosts": hosts})
                continue
            if _missing(b):
                verdict, diff, rel = "MISMATCH", "", ""
            else:
                diff = float(b) - float(a)
                rel = abs(diff) / max(abs(float(a)), 1e-12)
                if tol is None:
                    verdict = "not comparable"
                else:
                    verdict = "ok" if (diff == 0 if tol == 0 else rel <= tol) else "MISMATCH"
            rows.append({"run": run, "metric": metric, "committed": a, "rerun": b, "difference": diff,
                         "rel_difference": rel, "rule": rule, "verdict": verdict, "hosts": hosts})
        digest_a, digest_b = record_digest(rec.get("metrics_json")), record_digest(new.get("metrics_json"))
        if digest_a is not None:  # across hosts the curves drift like the scalars: no rule covers a digest
            verdict = ("not comparable" if not exact else "ok" if digest_a == digest_b else "MISMATCH")
            rows.append({"run": run, "metric": RECORD, "committed": digest_a, "rerun": digest_b,
                         "difference": 0.0 if digest_a == digest_b else "", "rel_difference": "",
                         "rule": "exact" if exact else "not comparable", "verdict": verdict, "hosts": hosts})
    alpha = FAMILY_ALPHA / max(len(as_seed), 1)
    for i, value, values in as_seed:
        rows[i]["rule"], rows[i]["verdict"] = judge(rows[i]["committed"], value, values, alpha)
    return pd.DataFrame(rows, columns=COLUMNS)


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def exit_code(table: pd.DataFrame, verdicts: pd.DataFrame | None) -> int:
    """0: every metric within its rule and no verdict flipped; 1: a metric outside its rule (whatever the verdicts);
    3: every metric within its rule, yet a recomputed verdict differs from the committed one."""
    if (table["verdict"] == "MISMATCH").any():
        return 1
    if verdicts is not None and len(verdicts) and not verdicts["unchanged"].astype(bool).all():
        return 3
    return 0


def summary_line(table: pd.DataFrame, verdicts: pd.DataFrame | None, not_recomputed: dict[str, str],
                 hosts: str = "", coverage: dict[str, tuple[int, int]] | None = None) -> str:
    """The one line a reviewer acts on, e.g. 'committed on AuthenticAMD 25/17 AVX512, rerun on GenuineIntel 6/167
    AVX512; 20 runs, 177 metrics: 91 bit for bit, 37 within cross-host drift (largest 0.51%), 33 as one more seed
    (inside their arm's prediction interval), 0 outside their rule, 16 not comparable across hosts; verdicts
    unchanged: 26 of 26; claims with a sampled run: ds_audit 7 of 7, sft_rl 6 of 6, ...'."""
    diff = pd.to_numeric(table["difference"], errors="coerce")
    rel = pd.to_numeric(table["rel_difference"], errors="coerce")
    ok = table["verdict"] == "ok"
    seed = table["rule"].astype(str).str.startswith(ONE_MORE_SEED)
    same = ok & (diff == 0) & ~seed
    drifted = ok & (diff != 0) & ~seed
    outside = table["verdict"] == "MISMATCH"
    largest = f" (largest {100 * rel[drifted].max():.2g}%)" if drifted.any() else ""
    head = f"{hosts}; " if hosts else ""
    parts = [f"{head}{table['run'].nunique()} runs, {len(table)} metrics: {int(same.sum())} bit for bit, "
             f"{int(drifted.sum())} within cross-host drift{largest}"]
    if (ok & seed).any():
        parts[0] += f", {int((ok & seed).sum())} as one more seed (inside their arm's prediction interval)"
    parts[0] += f", {int(outside.sum())} outside their rule"
    skipped = int((table["verdict"] == "not comparable").sum())
    if skipped:
        parts[0] += f", {skipped} not comparable across hosts"
    if verdicts is not None and len(verdicts):
        flipped = verdicts[~verdicts["unchanged"].astype(bool)]
        parts.append(f"verdicts unchanged: {len(verdicts) - len(flipped)} of {len(verdicts)}"
                     + (f" (flipped: {', '.join(flipped['id'])})" if len(flipped) else ""))
    if not_recomputed:
        parts.append(f"verdicts not recomputed for {', '.join(sorted(not_recomputed))} (reason above)")
    if coverage:
        parts.append("claims with a sampled run: " + ", ".join(f"{s} {k} of {n}" for s, (k, n) in coverage.items()))
    return "; ".join(parts)


# ----------------------------------------------------------------------------------------------- run it
def _is_run_record(rel: str) -> bool:
    """A committed run's record (results/cpu/<study>/.../{metrics,provenance}.json, benchmark*.tsv): left out of the
    scratch copy, so that the sample reruns instead of standing as committed. The LR selections and rounds stay."""
    parts = rel.split("/")
    return (len(parts) > 3 and parts[:2] == ["results", SCALE] and parts[2] not in ("runs", "claims", "bench",
                                                                                       "reference")
            and parts[-1] != "lr_selection.json" and "lr_rounds" not in parts)


def _scratch_copy(repo: Path, work: Path) -> None:
    """The checkout's tracked files (as they are in the working tree), without results and run records, into
    `work`."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=repo, capture_output=True, check=True).stdout
    for rel in filter(None, files.decode().split("\0")):
        if _is_run_record(rel):
            continue
        src = repo / rel
        if src.is_file():
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, work / rel)
    for sub in ("results/cpu/runs", "results/cpu/claims", "results/cpu/bench"):
        shutil.rmtree(work / sub, ignore_errors=True)  # the committed outputs are what we compare against


def stale_studies(repo: Path, studies: tuple[str, ...]) -> dict[str, str]:
    """study -> why it is not sampled: its committed claim evidence is at a lower `evidence_version` than its
    registry rows, i.e. its committed runs come from an earlier design of the study (their metrics changed), which
    today's code does not rerun to the same cells; the study's own cpu run replaces them."""
    from gradfidelity.claims.registry import load_registry
    from gradfidelity.harness.io import read_json

    want: dict[str, int] = {}
    for row in load_registry():
        want[row["study"]] = max(want.get(row["study"], 1), row["evidence_version"])
    out = {}
    for study in studies:
        path = Path(repo) / "results" / SCALE / "claims" / f"{study}.json"
        have = read_json(path).get("evidence_version", 1) if path.is_file() else 1
        if have < want.get(study, 1):
            out[study] = (f"its committed evidence ({path.relative_to(repo)}) is at evidence version {have} and its "
                          f"registry rows at {want[study]}: the committed runs come from an earlier design, which "
                          "this code does not rerun to the same cells (the study's next cpu run replaces them)")
    return out


def committed_tables(repo: Path, studies: tuple[str, ...]) -> dict[str, pd.DataFrame]:
    """study -> its committed runs table, for the studies whose committed runs today's code reruns."""
    stale = stale_studies(repo, studies)
    for study, why in stale.items():
        print(f"check-reference: {study} is not sampled: {why}", flush=True)
    tables = {}
    for study in (s for s in studies if s not in stale):
        path = repo / "results" / SCALE / "runs" / f"{study}.csv"
        if not path.is_file():
            raise UserError(f"{path} is missing: the committed reference results are not in this checkout")
        tables[study] = read_runs_table(path)
    return tables


def plan_sample(repo: Path, work: Path, tables: dict[str, pd.DataFrame], budget_s: float,
                extra_config: tuple[str, ...], runs_of: dict[str, dict[str, list[str]]] | None = None) -> list[str]:
    """The fixed sample's run ids (module docstring), from one dry run per study in the scratch copy `work`."""
    _scratch_copy(repo, work)
    plans = {}
    for study, df in tables.items():
        ok = df[df["status"] == "ok"]
        targets = [_metrics_path(r) for r in ok.loc[ok["seed"] == ok["seed"].min(), "run_id"]]
        res = snakemake(work, ["-n", "--forceall", *targets, "--config", f"scale={SCALE}", *extra_config],
                        timeout=600)
        if res.returncode != 0:
            raise UserError(f"the dry run of {study}'s reference cells failed:\n{res.stderr[-2000:]}")
        plans[study] = parse_dry_run(res.stdout)
    return select(tables, plans, budget_s, runs_of)


def rerun_sample(work: Path, sample: list[str], cores: int, extra_config: tuple[str, ...],
                 env: dict | None = None) -> pd.DataFrame:
    """Rerun the sample's runs (and their upstream jobs) in the scratch copy `work`; their runs table, each row
    made by the same `runs_table` that made the committed rows (the CPU identity read in the training process)."""
    t0 = time.time()
    res = snakemake(work, [f"-c{cores}", *[_metrics_path(r) for r in sample], "--config", f"scale={SCALE}",
                           *extra_config], timeout=3600, env=env)
    if res.returncode != 0:
        raise UserError(f"the rerun failed; the scratch copy is kept in {work} (job logs under "
                        f"results/cpu/*/logs):\n{res.stderr[-3000:]}")
    stale = [r for r in sample if (work / _metrics_path(r)).stat().st_mtime < t0]
    if stale:  # a record that stood instead of rerunning would compare the committed run with itself
        raise UserError(f"check-reference: {len(stale)} sampled runs were not rerun in {work} (e.g. {stale[0]})")
    rerun = runs_table([work / _metrics_path(r) for r in sample], SCALE)
    rerun["run_id"] = list(sample)  # the committed tables name runs relative to the checkout
    return rerun


def hosts_line(committed: pd.DataFrame, rerun: pd.DataFrame) -> str:
    """'rerun on: ...; committed on: ...' with every distinct CPU identity (an old row: 'unknown ISA (AMD EPYC)')."""
    def names(df):
        out = set()
        for row in df.to_dict("records"):
            name = describe_host(row)
            out.add(name if host_type(row) else f"{name} ({row.get('cpu_model')})")
        return "; ".join(sorted(out))
    return f"rerun on: {names(rerun)}. committed on: {names(committed)}"


def _short_host(row: dict) -> str:
    key = host_type(row)
    return "unknown ISA" if key is None else f"{key[0]} {key[1]}/{key[2]} {key[4]}"


def host_types(committed: pd.DataFrame, rerun: pd.DataFrame) -> str:
    """'committed on AuthenticAMD 25/17 AVX512, rerun on GenuineIntel 6/167 AVX512' (every distinct host type)."""
    def names(df):
        return " + ".join(sorted({_short_host(r) for r in df.to_dict("records")}))
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


def check_reference(repo: Path, workdir: Path | None = None, cores: int = 2, budget_s: float | None = None,
                    studies: tuple[str, ...] = STUDY_ORDER, extra_config: tuple[str, ...] = (),
                    cross_host: bool = False, out: Path | None = None, recompute_verdicts: bool = True) -> int:
    """Rerun the fixed sample, compare every metric, recompute the sampled studies' verdicts; print the tables and
    the summary line; exit code per `exit_code`. With `out`: the full comparison there, the verdicts beside it."""
    from gradfidelity.reference.verdicts import recompute_all

    repo = Path(repo).resolve()
    budget_s = BUDGET_S if budget_s is None else budget_s
    tables = committed_tables(repo, studies)
    rules = cross_host_rules(read_drift(repo))
    own = workdir is None
    work = Path(tempfile.mkdtemp(prefix="gf-check-reference-")) if own else Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    extra_config = (*given_config(repo), *extra_config)
    code = None
    try:
        t0 = time.monotonic()
        runs_of = claim_runs(repo, tables)
        sample = plan_sample(repo, work, tables, budget_s, extra_config, runs_of)
        committed = pd.concat([df[df["run_id"].isin(sample)] for df in tables.values()], ignore_index=True)
        print(f"check-reference: {len(sample)} committed cpu runs (of {sum(len(t) for t in tables.values())}), "
              f"chosen by the fixed rule in gradfidelity/reference/check.py; their own committed wall time "
              f"{committed['wall_s'].sum():.0f} s; rerunning in {work}", flush=True)
        for run in sample:
            print(f"  {run}", flush=True)
        rerun = rerun_sample(work, sample, cores, extra_config)
        seeds = pd.concat(list(tables.values()), ignore_index=True)
        table = compare(committed, rerun, rules, force_cross_host=cross_host, seeds=seeds)
        verdicts, not_recomputed = (recompute_all(repo, work, tables, sample, cores, extra_config)
                                    if recompute_verdicts else (None, {}))
        if verdicts is not None:
            per_claim = sampled_runs_per_claim(runs_of, sample)
            verdicts = verdicts.assign(sampled_runs=[per_claim.get(c, 0) for c in verdicts["id"]])
        for study, why in not_recomputed.items():
            print(f"check-reference: {study}'s verdicts are not recomputed: {why}", flush=True)
        if out is not None:
            atomic_write_csv(table, out)
            if verdicts is not None:
                atomic_write_csv(verdicts, Path(out).with_suffix(".verdicts.csv"))
        _print_tables(table, verdicts, full=out is None)
        print(f"{hosts_line(committed, rerun)}. Cross-host rules from {DRIFT_DIR}/drift_*.csv; "
              f"{time.monotonic() - t0:.0f} s" + (f"; full table: {out}" if out is not None else ""))
        line = summary_line(table, verdicts, not_recomputed, host_types(committed, rerun), coverage(runs_of, sample))
        print(f"check-reference: {line}")
        code = exit_code(table, verdicts)
        if code:
            print(f"the scratch copy is kept for inspection: {work}")
        return code
    finally:
        if own and code == 0:
            shutil.rmtree(work, ignore_errors=True)
