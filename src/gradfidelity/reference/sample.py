"""check-reference's sample: which committed cpu runs are rerun, chosen by a fixed rule, never by hand.

1. Candidates: every finished (status ok) run of the first paired seed of each study.
2. One Snakemake dry run per study (`--forceall`, in a scratch copy with no results) gives each candidate's
   upstream jobs (the base model an RL run starts from, the SFT run it continues, ...). An LR-tuned cell reads the
   committed LR selection (`given_config`): its LR grid is not rerun.
3. A candidate's cost is the committed wall time of every training run in its closure (a training run that the
   runs table does not list counts as the study's median run), plus `OTHER_JOB_S` for each other job (data
   preparation), each scaled by its study's speed ratio on this host where one was measured.
4. Stratified by study: each study's cheapest candidate first (ties: the run id; it is also the study's speed
   probe), then, round robin over the studies in a fixed order, each study's next candidate in the order of the
   SHA-256 of its run id (a fixed, content-free shuffle) whose extra cost still fits the budget.
5. For a study whose metrics are chaotic across hosts, every claim gets a run it reads (the first-seed run of each
   of its first two arms): whatever the budget by default, within it under `--budget`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pandas as pd

from gradfidelity.errors import UserError
from gradfidelity.harness.record_compare import read_runs_table
from gradfidelity.reference.dag import Job, closures, is_training_output, parse_dry_run, snakemake
from gradfidelity.reference.rerun import metrics_path, scratch_copy
from gradfidelity.reference.seeds import arm_of, chaotic_metrics
from gradfidelity.studies import STUDIES

SCALE = "cpu"
STUDY_ORDER = STUDIES  # the one list of studies: a fifth study is sampled too
OTHER_JOB_S = 10.0          # a job that is not a training run (data preparation, a selection, a table)
SAMPLE_S = 1500.0           # the fixed sample's summed committed job time: about 13 min wall, two jobs at a time


def given_config(repo: Path) -> tuple[str, ...]:
    """`--config` items every Snakemake call of the check gets. The scratch copy has no venvs: the DeepSpeed 0.18.9
    overlay is the checkout's (as for the smoke DAG test). The LR-tuned cells read the committed LR selections
    (results/cpu/<study>/lr_selection.json, `lr_selection_from`): rerunning them would rerun the LR grids behind
    them, about 110 runs of studies A and B that no sampled run is compared on (an hour on 2 cores, not minutes).
    A wrong committed selection still shows: the cell then trains at another LR and every metric differs."""
    # the checkout's unpacked Python docs (make cpu-data), which a scratch copy of the tracked files does not have
    pydocs = repo / ".cache/python3.11-doc/3.11.2-6+deb12u9/usr/share/doc/python3.11/html/_sources"
    return (f"deepspeed_buggy_overlay={repo / '.venv-ds0189'}", f"lr_selection_from={repo / 'results' / SCALE}",
            f"pydocs_root={pydocs}")


def run_order(studies) -> list[str]:
    """The order the studies rerun in: those that only drift first, the chaotic ones (judged as one more seed, and
    slowest: study A) last, so that a check stopped early has compared the drift-only studies."""
    studies = list(studies)
    return [s for s in studies if not chaotic_metrics(s)] + [s for s in studies if chaotic_metrics(s)]


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


Costs = dict[str, tuple[set, dict]]  # run -> (its closure's job keys, job key -> committed seconds)


def candidates(tables: dict[str, pd.DataFrame], plans: dict[str, list[Job]]) -> tuple[dict[str, list[str]], Costs]:
    """(study -> its candidates, cheapest closure first then by SHA-256 of the run id; run -> its closure's costs).
    A job key is (study, index in the study's dry run)."""
    wall = {r.run_id: float(r.wall_s) for df in tables.values() for r in df.itertuples()}
    order, cost_of = {}, {}
    for study in STUDY_ORDER:
        if study not in tables:
            continue
        df = tables[study]
        ok = df[df["status"] == "ok"]
        runs = sorted(ok.loc[ok["seed"] == ok["seed"].min(), "run_id"])
        jobs = plans[study]
        closure = closures(jobs, [metrics_path(c) for c in runs])
        median = float(ok["wall_s"].median())

        def job_cost(i, jobs=jobs, median=median):
            outs = [o[: -len("/metrics.json")] for o in jobs[i].outputs if o.endswith("/metrics.json")]
            return sum(wall.get(run, median) for run in outs) if outs else OTHER_JOB_S

        for c in runs:
            keys = {(study, i) for i in closure[metrics_path(c)]}
            cost_of[c] = (keys, {key: job_cost(key[1]) for key in keys})
        cheapest = min(runs, key=lambda c: (sum(cost_of[c][1].values()), c))
        order[study] = [cheapest] + sorted((c for c in runs if c != cheapest), key=_sha)
    return order, cost_of


def extra_cost(cost_of: Costs, run: str, done: set, scale: dict[str, float] | None = None) -> float:
    """The cost `run` adds to jobs already `done`, each job scaled by its study's speed ratio (`scale`)."""
    scale = scale or {}
    return sum(cost * scale.get(key[0], 1.0) for key, cost in cost_of[run][1].items() if key not in done)


def select(tables: dict[str, pd.DataFrame], plans: dict[str, list[Job]], budget_s: float = SAMPLE_S,
           runs_of: dict[str, dict[str, list[str]]] | None = None, scale: dict[str, float] | None = None,
           strict: bool = False) -> list[str]:
    """The sample's run ids, by the rule in the module docstring. `plans[study]` is the dry run of its candidates;
    `budget_s` the summed job seconds (committed ones, or this host's with `scale`, study -> speed ratio).

    For a study whose metrics are chaotic across hosts (reference/seeds.py: a rerun elsewhere is one more seed, so
    its verdicts are the check that can fail), every claim gets a run it reads: the first-seed run of each of its
    first two arms (in its evidence's order: for A5 the fixed SFT and the buggy one). By default whatever the budget,
    after the round robin; `strict` (a --budget): before the round robin, and only within the budget."""
    order, cost_of = candidates(tables, plans)
    chosen, done, spent = [], set(), 0.0

    def take(c):
        nonlocal spent
        spent += extra_cost(cost_of, c, done, scale)
        chosen.append(c)
        done.update(cost_of[c][0])

    for study in order:  # each study's cheapest cell, whatever the budget: every study is checked
        take(order[study].pop(0))
    claim_cells = []
    for study, claims in (runs_of or {}).items():
        if study not in order or not chaotic_metrics(study):
            continue
        first = {arm_of(c): c for c in cost_of if c.startswith(f"results/{SCALE}/{study}/")}
        for runs in claims.values():
            for arm in _arms(runs)[:2]:
                if first.get(arm) is not None and first[arm] not in claim_cells:
                    claim_cells.append(first[arm])

    def add_claim_cells():
        for c in claim_cells:
            if c in chosen or any(arm_of(x) == arm_of(c) for x in chosen):
                continue
            if not strict or spent + extra_cost(cost_of, c, done, scale) <= budget_s:
                take(c)  # the round robin skips it

    if strict:
        add_claim_cells()
    progress = True
    while progress:
        progress = False
        for study in order:
            for c in list(order[study]):
                if c in chosen:
                    order[study].remove(c)
                    continue
                if spent + extra_cost(cost_of, c, done, scale) <= budget_s:
                    order[study].remove(c)
                    take(c)
                    progress = True
                    break
    if not strict:
        add_claim_cells()
    return chosen


def upstream_runs(plans: dict[str, list[Job]], sample: list[str], study_of: dict[str, str]) -> dict[str, list[str]]:
    """run -> the other training runs its closure holds (the base model an RL run starts from, ...)."""
    out = {}
    for run in sample:
        jobs = plans[study_of[run]]
        needed = closures(jobs, [metrics_path(run)])[metrics_path(run)]
        outs = [o for i in needed for o in jobs[i].outputs if is_training_output(o) and o != metrics_path(run)]
        out[run] = sorted(o[: -len("/metrics.json")] for o in outs)
    return out


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
            continue
        gone = _moved_runs(Path(repo), study)
        if gone:
            out[study] = (f"{len(gone)} runs its committed runs table lists are not in this checkout (e.g. {gone[0]}): "
                          "their records were moved aside (results/cpu/archive/) when the study's design changed, "
                          "and its new cpu run is not finished, so its committed runs table stands for no cell of "
                          "today's plan")
    return out


def _moved_runs(repo: Path, study: str) -> list[str]:
    """The run ids of `study`'s committed runs table whose metrics.json is not in the checkout."""
    from gradfidelity.harness.record_compare import read_runs_table
    from gradfidelity.reference.rerun import metrics_path

    path = repo / "results" / SCALE / "runs" / f"{study}.csv"
    if not path.is_file():
        return []
    table = read_runs_table(path)
    if "run_id" not in table.columns:
        return []
    return [r for r in table["run_id"] if not (repo / metrics_path(r)).is_file()]


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


def dry_run_plans(repo: Path, work: Path, tables: dict[str, pd.DataFrame],
                  extra_config: tuple[str, ...]) -> dict[str, list[Job]]:
    """study -> the dry run of its candidates, in the scratch copy `work` (made here)."""
    scratch_copy(repo, work)
    plans = {}
    for study, df in tables.items():
        ok = df[df["status"] == "ok"]
        targets = [metrics_path(r) for r in ok.loc[ok["seed"] == ok["seed"].min(), "run_id"]]
        res = snakemake(work, ["-n", "--forceall", *targets, "--config", f"scale={SCALE}", *extra_config])
        if res.returncode != 0:
            raise UserError(f"the dry run of {study}'s reference cells failed:\n{res.stderr[-2000:]}")
        plans[study] = parse_dry_run(res.stdout)
    return plans


def plan_sample(repo: Path, work: Path, tables: dict[str, pd.DataFrame], budget_s: float,
                extra_config: tuple[str, ...], runs_of: dict[str, dict[str, list[str]]] | None = None) -> list[str]:
    """The fixed sample's run ids (module docstring), from one dry run per study in the scratch copy `work`."""
    return select(tables, dry_run_plans(repo, work, tables, extra_config), budget_s, runs_of)
