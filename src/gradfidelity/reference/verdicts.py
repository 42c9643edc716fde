"""Do the verdicts survive the rerun? check-reference recomputes a sampled study's claims with the rerun values in
place of the committed ones for the sampled runs, and compares each verdict with the committed evidence's.

How, without rerunning the study: every other run's record is rebuilt from the committed runs table (its
`metrics_json` column, `harness.results.records_from_runs_table`) next to the rerun's own records in the scratch
copy, and Snakemake runs only the jobs between the runs and the study's claim evidence (aggregate, tables,
claims: `allowed_rules`), never a training job (`--allowed-rules`). A committed benchmark is a measurement of its
own, not a function of the runs: it is kept as committed. Nothing is guessed: a runs table without
`metrics_json` (written before it existed), or a claim input that is not rebuilt, stops that study's recompute
with the reason, and the check says so instead of printing a verdict.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pandas as pd

from gradfidelity.claims.registry import load_registry
from gradfidelity.claims.report import value_text
from gradfidelity.claims.verify import load_evidence, verify
from gradfidelity.errors import UserError
from gradfidelity.harness.results import records_from_runs_table
from gradfidelity.reference.dag import Job, closures, is_training_output, parse_dry_run, snakemake

SCALE = "cpu"
COLUMNS = ["id", "study", "committed", "rerun", "unchanged", "committed_value", "rerun_value"]


def claims_target(study: str, scale: str = SCALE) -> str:
    return f"results/{scale}/claims/{study}.json"


def allowed_rules(jobs: list[Job], target: str) -> list[str]:
    """The rules of the jobs `target` needs that neither make a training run nor run before one: the study's
    aggregation, tables, figures and claims. Training, data preparation and LR selection stay out."""
    needed = closures(jobs, [target])[target]
    training = [out for i in needed for out in jobs[i].outputs if is_training_output(out)]
    upstream = set().union(*closures(jobs, training).values()) if training else set()
    return sorted({jobs[i].rule for i in needed - upstream})


def verdict_changes(before: pd.DataFrame, after: pd.DataFrame) -> pd.DataFrame:
    """Per claim of `before` (verify's rows from the committed evidence): its verdict and value there and in
    `after` (verify's rows recomputed), and whether the verdict is unchanged. A claim missing from `after` is an
    error, never an unchanged verdict."""
    new = after.set_index("id")
    rows = []
    for old in before.to_dict("records"):
        if old["id"] not in new.index:
            raise UserError(f"claim {old['id']} has no recomputed verdict")
        rec = new.loc[old["id"]].to_dict()
        rows.append({"id": old["id"], "study": old["study"], "committed": str(old["verdict"]),
                     "rerun": str(rec["verdict"]), "unchanged": str(old["verdict"]) == str(rec["verdict"]),
                     "committed_value": value_text(old), "rerun_value": value_text(rec)})
    return pd.DataFrame(rows, columns=COLUMNS)


def committed_verdicts(repo: Path, studies: list[str], scale: str = SCALE) -> pd.DataFrame:
    """verify's rows of `studies` from their committed evidence (results/<scale>/claims/<study>.json), judged by
    today's registry: what the recomputed verdicts are compared with."""
    paths = [Path(repo) / claims_target(s, scale) for s in studies]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise UserError(f"committed claim evidence missing: {', '.join(missing)}")
    df = verify(load_registry(), load_evidence(paths, scale), scale)
    return df[df["study"].isin(studies)].reset_index(drop=True)


def recompute_study(repo: Path, work: Path, study: str, table: pd.DataFrame, sample: list[str], cores: int,
                    extra_config: tuple[str, ...], scale: str = SCALE,
                    deadline: float | None = None) -> pd.DataFrame:
    """verify's rows of `study` from evidence recomputed in `work` (which holds the rerun's records of `sample`):
    every other run of the study's committed runs table rebuilt from its metrics_json, then only the jobs
    between runs and evidence. Raises UserError naming what is missing, or a Snakemake call that ran past
    `deadline` (time.monotonic(); None: no limit)."""
    records_from_runs_table(table[~table["run_id"].isin(sample)], work)
    committed_bench = Path(repo) / "results" / scale / "bench"
    if committed_bench.is_dir():
        shutil.copytree(committed_bench, work / "results" / scale / "bench", dirs_exist_ok=True)
    target = claims_target(study, scale)
    (work / target).unlink(missing_ok=True)
    config = ["--config", f"scale={scale}", *extra_config]
    res = snakemake(work, [target, "-n", "--forceall", *config], timeout=_left(deadline))
    if res.returncode != 0:
        raise UserError(f"the dry run of {target} failed:\n{res.stderr[-2000:]}")
    rules = allowed_rules(parse_dry_run(res.stdout), target)
    # the target first: --allowed-rules takes every word after it
    res = snakemake(work, [target, f"-c{cores}", *config, "--allowed-rules", *rules], timeout=_left(deadline))
    if res.returncode != 0:
        raise UserError(f"recomputing {target} from the rebuilt run records failed:\n{res.stderr[-2000:]}")
    df = verify(load_registry(), load_evidence([work / target], scale), scale)
    return df[df["study"] == study].reset_index(drop=True)


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(deadline - time.monotonic(), 1.0)


def recompute_all(repo: Path, work: Path, tables: dict[str, pd.DataFrame], sample: list[str], cores: int,
                  extra_config: tuple[str, ...], deadline: float | None = None
                  ) -> tuple[pd.DataFrame | None, dict[str, str]]:
    """(verdict changes of every sampled study that could be recomputed, {study: why not} for the others)."""
    frames, not_recomputed = [], {}
    for study, table in tables.items():
        if not table["run_id"].isin(sample).any():
            continue
        try:
            before = committed_verdicts(repo, [study])
            after = recompute_study(repo, work, study, table, sample, cores, extra_config, deadline=deadline)
            frames.append(verdict_changes(before, after))
        except UserError as exc:
            not_recomputed[study] = str(exc)
    return (pd.concat(frames, ignore_index=True) if frames else None), not_recomputed
