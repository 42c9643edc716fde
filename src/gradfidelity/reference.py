"""`gradfidelity check-reference`: rerun a stratified sample of the committed cpu runs and compare every training
metric with the committed runs tables (results/cpu/runs/<study>.csv).

Why it exists: the cpu scale of all studies takes hours on 2 cores; a reviewer needs a check that the committed
numbers come from this code in minutes, not a `git diff` after a full rerun.

The sample is chosen by a fixed rule, never by hand, from the committed tables and Snakemake's own plan:
1. Candidates: every finished (status ok) run of the first paired seed of each study.
2. One Snakemake dry run per study (`--forceall`, in a scratch copy with no results) gives each candidate's
   upstream jobs (the base model an RL run starts from, the LR-selection runs a tuned cell reads, ...).
3. A candidate's cost is the committed wall time of every training run in its closure (a training run that the
   runs table does not list, such as study B's LR-selection runs, counts as the study's median run), plus
   `OTHER_JOB_S` for each other job (data preparation, a selection).
4. Stratified by study: each study's cheapest candidate first (ties: the run id), then, round robin over the
   studies in a fixed order, each study's next candidate in the order of the SHA-256 of its run id (a fixed,
   content-free shuffle) whose extra cost still fits the budget.

The rerun happens in a scratch copy of the checkout's tracked files (`--workdir`, default a temporary folder), so
the user's own results/cpu is never touched. Each rerun run's row is made by the same `runs_table` function that
made the committed row, and every `metric_*` column is compared:
- exact (bit for bit) when this host's CPU model equals the one recorded in the committed row;
- otherwise within a tolerance derived from a committed drift measurement (`DRIFT`, see `cross_host_rules`): the
  same sample rerun with every kernel library of torch limited to AVX2 (ATEN_CPU_CAPABILITY=avx2,
  MKL_ENABLE_INSTRUCTIONS=AVX2, DNNL_MAX_CPU_ISA=AVX2), which changes the floating-point reductions as another CPU
  would. A metric that did not move there stays exact; one that moved gets twice its largest drift (at least
  `MIN_REL`); one that moved by more than `MAX_REL` (an RL trajectory's token count, a selection, a difference of
  two late losses) is "not comparable" across hosts: printed, counted, neither a pass nor a mismatch.
"""

from __future__ import annotations

import hashlib
import math
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from gradfidelity.errors import UserError
from gradfidelity.harness.io import atomic_write_csv
from gradfidelity.harness.provenance import cpu_model
from gradfidelity.harness.results import runs_table

SCALE = "cpu"
STUDY_ORDER = ("ds_audit", "sft_rl", "async_pp", "local")
OTHER_JOB_S = 10.0          # a job that is not a training run (data preparation, a selection, a table)
BUDGET_S = 1500.0           # the sample's summed committed job time: about 13 min wall, two jobs at a time
DRIFT = Path("results") / SCALE / "reference" / "drift_avx2.csv"  # (study, run, metric, ..., rel_difference)
MIN_REL = 0.005   # the smallest cross-host tolerance of a metric that drifted at all
MAX_REL = 0.25    # a metric whose tolerance would exceed this is not comparable across hosts


@dataclass
class Job:
    rule: str
    outputs: list[str]
    inputs: list[str] = field(default_factory=list)


def parse_dry_run(text: str) -> list[Job]:
    """The jobs of a `snakemake -n` listing: rule, outputs and inputs of each."""
    jobs, current = [], None
    for line in text.splitlines():
        m = re.match(r"^(?:local)?rule (\S+):$", line.strip())
        if m:
            current = Job(m[1], [])
            jobs.append(current)
        elif current is not None and line.startswith("    input: "):
            current.inputs = [s.strip() for s in line[len("    input: "):].split(",")]
        elif current is not None and line.startswith("    output: "):
            current.outputs = [s.strip() for s in line[len("    output: "):].split(",")]
    return jobs


def closures(jobs: list[Job], targets: list[str]) -> dict[str, set[int]]:
    """target path -> the indices of the jobs it needs (itself included)."""
    producer = {out: i for i, job in enumerate(jobs) for out in job.outputs}
    result = {}
    for target in targets:
        if target not in producer:
            raise UserError(f"Snakemake plans no job that writes {target}: the committed runs table lists a run the "
                            "workflow no longer makes")
        seen, stack = set(), [producer[target]]
        while stack:
            i = stack.pop()
            if i in seen:
                continue
            seen.add(i)
            stack.extend(producer[p] for p in jobs[i].inputs if p in producer)
        result[target] = seen
    return result


def _metrics_path(run_id: str) -> str:
    return f"{run_id}/metrics.json"


def _sha(run_id: str) -> str:
    return hashlib.sha256(run_id.encode()).hexdigest()


def select(tables: dict[str, pd.DataFrame], plans: dict[str, list[Job]], budget_s: float = BUDGET_S) -> list[str]:
    """The sample's run ids, by the rule in the module docstring. `plans[study]` is the dry run of its candidates."""
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
    return chosen


# ----------------------------------------------------------------------------------------------- compare
def read_runs_table(path: Path) -> pd.DataFrame:
    """A committed runs table, its floats read back exactly (pandas' default parser may differ in the last bit)."""
    return pd.read_csv(path, float_precision="round_trip")


def cross_host_rules(drift: pd.DataFrame) -> dict[tuple[str, str], float | None]:
    """(study, metric) -> relative tolerance across hosts (0: exact), or None: not comparable across hosts.

    From the drift measurement: twice the largest relative drift of the metric in its study, at least MIN_REL;
    above MAX_REL the metric is not comparable. A metric of a study the measurement did not see stays exact.
    """
    rules = {}
    worst = drift.assign(rel=pd.to_numeric(drift["rel_difference"], errors="coerce")).groupby(
        ["study", "metric"])["rel"].max()
    for (study, metric), rel in worst.items():
        if pd.isna(rel):
            raise UserError(f"{DRIFT}: no relative difference for {study}/{metric}")
        tol = 0.0 if rel == 0 else max(2 * float(rel), MIN_REL)
        rules[(study, metric)] = None if tol > MAX_REL else tol
    return rules


def compare(committed: pd.DataFrame, rerun: pd.DataFrame, host_cpu: str | None,
            rules: dict[tuple[str, str], float | None] | None = None) -> pd.DataFrame:
    """One row per (run, metric): committed, rerun, difference (absolute and relative), the rule applied and the
    verdict (ok, MISMATCH, or "not comparable" across hosts). `host_cpu=None` applies the cross-host rules to every
    run (to measure drift on one host); a metric without a cross-host rule is compared exactly."""
    rules = rules or {}
    rows = []
    rerun = rerun.set_index("run_id")
    for rec in committed.itertuples(index=False):
        rec = rec._asdict()
        run = rec["run_id"]
        exact = host_cpu is not None and rec["cpu_model"] == host_cpu
        metrics = sorted(k for k in rec if k.startswith("metric_") and not _missing(rec[k]))
        if run not in rerun.index:
            rows.append({"run": run, "metric": "(the run)", "committed": "ok", "rerun": "missing",
                         "difference": "", "rel_difference": "", "rule": "", "verdict": "MISMATCH"})
            continue
        new = rerun.loc[run]
        study = rec["study"]  # recorded by the harness in metrics.json (the drift table uses the same)
        if new["status"] != rec["status"]:
            rows.append({"run": run, "metric": "status", "committed": rec["status"], "rerun": new["status"],
                         "difference": "", "rel_difference": "", "rule": "exact", "verdict": "MISMATCH"})
        for key in metrics:
            a, b = rec[key], new.get(key)
            metric = key[len("metric_"):]
            tol = 0.0 if exact else rules.get((study, metric), 0.0)
            rule = "exact" if tol == 0 else ("not comparable" if tol is None else f"rel<={tol:.3g}")
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
                         "rel_difference": rel, "rule": rule, "verdict": verdict})
    return pd.DataFrame(rows, columns=["run", "metric", "committed", "rerun", "difference", "rel_difference", "rule",
                                       "verdict"])


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


# ----------------------------------------------------------------------------------------------- run it
def _scratch_copy(repo: Path, work: Path) -> None:
    """The checkout's tracked files (as they are in the working tree), without results, into `work`."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=repo, capture_output=True, check=True).stdout
    for rel in filter(None, files.decode().split("\0")):
        src = repo / rel
        if src.is_file():
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, work / rel)
    for sub in ("results/cpu/runs", "results/cpu/claims", "results/cpu/bench"):
        shutil.rmtree(work / sub, ignore_errors=True)  # the committed outputs are what we compare against


def _snakemake(work: Path, args: list[str], timeout: float) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "snakemake", *args]
    return subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=timeout)


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


def check_reference(repo: Path, workdir: Path | None = None, cores: int = 2, budget_s: float | None = None,
                    studies: tuple[str, ...] = STUDY_ORDER, extra_config: tuple[str, ...] = (),
                    cross_host: bool = False, out: Path | None = None) -> int:
    repo = Path(repo).resolve()
    budget_s = BUDGET_S if budget_s is None else budget_s
    stale = stale_studies(repo, studies)
    for study, why in stale.items():
        print(f"check-reference: {study} is not sampled: {why}", flush=True)
    studies = tuple(s for s in studies if s not in stale)
    tables = {}
    for study in studies:
        path = repo / "results" / SCALE / "runs" / f"{study}.csv"
        if not path.is_file():
            raise UserError(f"{path} is missing: the committed reference results are not in this checkout")
        tables[study] = read_runs_table(path)
    own = workdir is None
    work = Path(tempfile.mkdtemp(prefix="gf-check-reference-")) if own else Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    # the copy has no venvs: the DeepSpeed 0.18.9 overlay is the checkout's (as for the smoke DAG test)
    extra_config = (f"deepspeed_buggy_overlay={repo / '.venv-ds0189'}", *extra_config)
    passed = False
    try:
        _scratch_copy(repo, work)
        t0 = time.monotonic()
        plans = {}
        for study, df in tables.items():
            ok = df[df["status"] == "ok"]
            targets = [_metrics_path(r) for r in ok.loc[ok["seed"] == ok["seed"].min(), "run_id"]]
            res = _snakemake(work, ["-n", "--forceall", *targets, "--config", f"scale={SCALE}", *extra_config],
                             timeout=600)
            if res.returncode != 0:
                raise UserError(f"the dry run of {study}'s reference cells failed:\n{res.stderr[-2000:]}")
            plans[study] = parse_dry_run(res.stdout)
        sample = select(tables, plans, budget_s)
        committed = pd.concat([df[df["run_id"].isin(sample)] for df in tables.values()], ignore_index=True)
        est = committed["wall_s"].sum()
        print(f"check-reference: {len(sample)} committed cpu runs (of {sum(len(t) for t in tables.values())}), "
              f"chosen by the fixed rule in gradfidelity/reference.py; their own committed wall time {est:.0f} s; "
              f"rerunning in {work}", flush=True)
        for run in sample:
            print(f"  {run}", flush=True)
        res = _snakemake(work, [f"-c{cores}", *[_metrics_path(r) for r in sample], "--config", f"scale={SCALE}",
                                *extra_config], timeout=3600)
        if res.returncode != 0:
            raise UserError(f"the rerun failed; the scratch copy is kept in {work} (job logs under "
                            f"results/cpu/*/logs):\n{res.stderr[-3000:]}")
        rerun = runs_table([work / _metrics_path(r) for r in sample], SCALE)
        rerun["run_id"] = list(sample)  # the committed tables name runs relative to the checkout
        host = cpu_model()
        drift_path = repo / DRIFT
        if not drift_path.is_file():
            raise UserError(f"{drift_path} is missing: the committed drift measurement behind the cross-host rules")
        table = compare(committed, rerun, None if cross_host else host, cross_host_rules(pd.read_csv(drift_path)))
        recorded = sorted(set(committed["cpu_model"]))
        mode = ("exact (bit for bit)" if recorded == [host] and not cross_host
                else f"cross-host rules from {DRIFT}")
        shown = table.assign(run=table["run"].str.removeprefix(f"results/{SCALE}/"))
        with pd.option_context("display.max_rows", None, "display.width", 250, "display.max_colwidth", 120):
            print(f"(run ids below are relative to results/{SCALE}/)")
            print(shown.to_string(index=False))
        bad = table[table["verdict"] == "MISMATCH"]
        skipped = table[table["verdict"] == "not comparable"]
        if out is not None:
            atomic_write_csv(table, out)
        rel = pd.to_numeric(table["rel_difference"], errors="coerce")
        print(f"largest relative difference: {rel.max():.3g}")
        print(f"host CPU: {host!r}; recorded: {', '.join(map(repr, recorded))}; comparison: {mode}; "
              f"{len(table)} metrics of {len(sample)} runs, {len(bad)} mismatched, {len(skipped)} not comparable "
              "across hosts; "
              f"{time.monotonic() - t0:.0f} s")
        passed = not len(bad)
        if not passed:
            print(f"the scratch copy is kept for inspection: {work}")
        return 0 if passed else 1
    finally:
        if own and passed:
            shutil.rmtree(work, ignore_errors=True)
