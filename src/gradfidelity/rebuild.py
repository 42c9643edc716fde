"""`make check-rebuild`: every committed analysis output rebuilt from the committed run records, then compared.

Why: the committed tables, figures, claims and runs tables must follow from the committed records alone, or a
reviewer extending a study would get numbers that differ from the committed ones for no reason of theirs. This reruns
every job that reads records (aggregates, LR rounds and selections, runs tables, the audit's tables) and everything
downstream of them, and no training job, then lists every committed file that changed.

A study with a planned run that has no record yet (`parts.missing_runs`) is left out and named: rebuilding it would
train. So is every output downstream of such a run in any study, the cross-study ones included (the power table,
`verify`'s claims, the report summary read every study's evidence): each Snakemake call gets `--omit-from` with the
missing records, Snakemake's own way to drop a file and everything downstream of it from the DAG, and the outputs
that drops are named. Round 6 met this with study B's grid not yet run: its own outputs were left out, but the
shared targets still asked for B's claims, so the rebuild's dry run planned B's 130 training jobs and it refused.

A rebuild never trains (issue 56): before each forcing pass the same Snakemake command is dry-run, and if it plans any
training job (a job of a rule that writes a run record, a bench or prepared data: `is_record_or_data`, or with such an
output) the rebuild stops before forcing anything, naming each job with Snakemake's reason. Round 5 met this in a
clone whose venv path differed: Snakemake found "Params have changed" on a forced cell and retrained it.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from gradfidelity.errors import UserError
from gradfidelity.parts import missing_runs
from gradfidelity.reference.dag import Job, parse_dry_run, snakemake
from gradfidelity.studies import STUDIES

OUTPUT_ROOTS = ("paper_tables/{scale}", "figures/{scale}", "results/{scale}")
MAX_PASSES = 4  # a checkpoint pass and the analysis passes it re-plans (check_rebuild)


def is_record_or_data(path: str, scale: str) -> bool:
    """A run's record, a bench, a replay or prepared data: what a rebuild never reruns."""
    return ((path.startswith(f"results/{scale}/") and path.endswith("/metrics.json")) or "/bench/" in path
            or "/data/" in path or "/corpus/" in path)


def _skipped(path: str, skip: set[str]) -> bool:
    return any(f"/{s}/" in path or f"/{s}." in path or f"/{s}_" in path for s in skip)


def _omit(omit: list[str]) -> list[str]:
    return ["--omit-from", *omit] if omit else []


def summary_rows(repo: Path, scale: str, omit: list[str] = ()) -> list[tuple[str, str]]:
    """(output, rule) of every output `snakemake --summary` lists, those downstream of `omit` dropped."""
    done = snakemake(repo, ["--summary", "--config", f"scale={scale}", *_omit(list(omit))], 900.0)
    if done.returncode != 0:
        raise SystemExit(f"check-rebuild: snakemake --summary failed:\n{done.stderr[-3000:]}")
    rows = [line.split("\t") for line in done.stdout.splitlines()]
    rows = [(r[0], r[2]) for r in rows if len(r) >= 6 and r[0] != "output_file"]
    if not rows:
        raise SystemExit("check-rebuild: snakemake --summary listed no output")
    return rows


def forced_outputs(repo: Path, scale: str, skip: set[str], omit: list[str] = ()
                   ) -> tuple[list[str], list[str], set[str]]:
    """(the checkpoints' outputs, every other analysis output, the training rules) of the workflow, those of the
    `skip` studies and those downstream of the `omit` records left out: forcing them reruns them and everything
    downstream, and nothing upstream.

    The checkpoints (the LR rounds) come from a dry run with --forceall. The other outputs come from `snakemake
    --summary`, which resolves the DAG through the checkpoints' existing outputs: a --forceall dry run cannot list
    what lies downstream of a forced checkpoint (study A's aggregate, tables and claims), so round 4's rebuild never
    forced those. A rule with any record or data output (a training job, a bench) is never forced."""
    done = snakemake(repo, ["-n", "--forceall", "--config", f"scale={scale}", *_omit(list(omit))], 900.0)
    if done.returncode != 0:
        raise SystemExit(f"check-rebuild: the dry run failed:\n{done.stderr[-3000:]}")
    checkpoints = sorted({job.outputs[0] for job in parse_dry_run(done.stdout)
                          if job.checkpoint and job.outputs and not _skipped(job.outputs[0], skip)})
    rows = summary_rows(repo, scale, omit)
    training = {rule for out, rule in rows if is_record_or_data(out, scale)}
    others = sorted({out for out, rule in rows if rule not in training and not _skipped(out, skip)})
    return checkpoints, others, training


def training_jobs(dry_run: str, training: set[str], scale: str) -> list[Job]:
    """The jobs of a dry run that would train: of a training rule, or with a record or data output."""
    return [job for job in parse_dry_run(dry_run)
            if job.rule in training or any(is_record_or_data(o, scale) for o in job.outputs)]


def refuse_training(repo: Path, args: list[str], training: set[str], scale: str, passes: int = 0) -> None:
    """Dry-run the Snakemake call `args` and raise UserError naming every training job it would run (with
    Snakemake's reason) before the call forces anything. `passes`: the forcing passes already run."""
    done = snakemake(repo, ["-n", *args])
    if done.returncode != 0:
        raise UserError(f"check-rebuild: the dry run of the rebuild failed:\n{done.stderr[-3000:]}")
    jobs = training_jobs(done.stdout, training, scale)
    if not jobs:
        return
    named = [f"  rule {j.rule}: {', '.join(j.outputs[:2])}" + (f" (reason: {j.reason})" if j.reason else "")
             for j in jobs[:20]] + (["  ..."] if len(jobs) > 20 else [])
    done_so_far = ("nothing was forced" if not passes else
                   f"stopped before pass {passes + 1}; the {passes} pass(es) before it reran analysis jobs only")
    raise UserError(f"check-rebuild would run {len(jobs)} training job(s); {done_so_far}:\n" + "\n".join(named)
                    + f"\nA rebuild reruns analysis jobs only. Make these records current first (`snakemake -n "
                    f"--config scale={scale}` says why each is planned), or rebuild from a checkout whose records "
                    "stand.")


def check_rebuild(repo: Path, scale: str = "cpu", cores: int = 2) -> int:
    missing = {s: missing_runs(repo, scale, s) for s in STUDIES}
    skip = {s for s, runs in missing.items() if runs}
    omit = sorted(run for runs in missing.values() for run in runs)
    for s in sorted(skip):
        print(f"check-rebuild: {s} left out: {len(missing[s])} of its planned runs have no committed record")
    checkpoints, others, training = forced_outputs(repo, scale, skip, omit)
    if omit:  # the outputs of other studies and the shared ones that read a left-out study: named, not rebuilt
        kept = set(others)
        dropped = sorted({out for out, rule in summary_rows(repo, scale) if out not in kept and rule not in training
                          and not _skipped(out, skip)})
        print(f"check-rebuild: {len(dropped)} more outputs left out, downstream of those runs"
              + (": " + ", ".join(dropped) if dropped else ""))
    targets = checkpoints + others
    start, started = time.monotonic(), time.time()
    # Passes until every forced output is rewritten: a forced job that feeds a checkpoint-dependent input function
    # (the LR rounds, the LR selection) makes Snakemake re-plan its downstream after it runs, and the re-planned DAG
    # drops forced jobs whose outputs look up to date (round 5 found study A's aggregate, tables and claims and study
    # B's left unbuilt that way). So the checkpoints first, then whatever is still older than this rebuild.
    forced, passes = checkpoints or others, 0
    while forced:
        passes += 1
        args = ["--config", f"scale={scale}", *_omit(omit), "--forcerun", *forced, "--", "all"]
        refuse_training(repo, args, training, scale, passes - 1)  # each pass: it re-plans what the last one left
        rc = subprocess.run([sys.executable, "-m", "snakemake", f"-c{cores}", *args], cwd=repo).returncode
        if rc != 0:
            return rc
        stale = [t for t in others if not (repo / t).is_file() or (repo / t).stat().st_mtime < started]
        if stale and (passes >= MAX_PASSES or stale == forced):
            print(f"check-rebuild: {len(stale)} forced outputs were not rebuilt after {passes} passes: "
                  + ", ".join(stale))
            return 1
        forced = stale
    roots = [r.format(scale=scale) for r in OUTPUT_ROOTS]
    changed = subprocess.run(["git", "status", "--porcelain", "--", *roots], cwd=repo, capture_output=True,
                             text=True, check=True).stdout.splitlines()
    print(f"check-rebuild: {len(targets)} analysis jobs forced, {time.monotonic() - start:.0f} s; "
          f"{len(changed)} committed or new files differ" + (":" if changed else ""))
    for line in changed:
        print("  " + line)
    return 1 if changed else 0
