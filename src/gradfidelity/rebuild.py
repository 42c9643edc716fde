"""`make check-rebuild`: every committed analysis output rebuilt from the committed run records, then compared.

Why: the committed tables, figures, claims and runs tables must follow from the committed records alone, or a
reviewer extending a study would get numbers that differ from the committed ones for no reason of theirs. This reruns
every job that reads records (aggregates, LR rounds and selections, runs tables, the audit's tables) and everything
downstream of them, and no training job, then lists every committed file that changed.

A study with a planned run that has no record yet (`parts.missing_runs`) is left out and named: rebuilding it would
train.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from gradfidelity.parts import missing_runs
from gradfidelity.reference.dag import parse_dry_run, snakemake
from gradfidelity.studies import STUDIES

OUTPUT_ROOTS = ("paper_tables/{scale}", "figures/{scale}", "results/{scale}")
MAX_PASSES = 4  # a checkpoint pass and the analysis passes it re-plans (check_rebuild)


def is_record_or_data(path: str, scale: str) -> bool:
    """A run's record, a bench, a replay or prepared data: what a rebuild never reruns."""
    return ((path.startswith(f"results/{scale}/") and path.endswith("/metrics.json")) or "/bench/" in path
            or "/data/" in path or "/corpus/" in path)


def _skipped(path: str, skip: set[str]) -> bool:
    return any(f"/{s}/" in path or f"/{s}." in path or f"/{s}_" in path for s in skip)


def forced_outputs(repo: Path, scale: str, skip: set[str]) -> tuple[list[str], list[str]]:
    """(the checkpoints' outputs, every other analysis output) of the workflow, those of the `skip` studies left
    out: forcing them reruns them and everything downstream, and nothing upstream.

    The checkpoints (the LR rounds) come from a dry run with --forceall. The other outputs come from `snakemake
    --summary`, which resolves the DAG through the checkpoints' existing outputs: a --forceall dry run cannot list
    what lies downstream of a forced checkpoint (study A's aggregate, tables and claims), so round 4's rebuild never
    forced those. A rule with any record or data output (a training job, a bench) is never forced."""
    done = snakemake(repo, ["-n", "--forceall", "--config", f"scale={scale}"], 900.0)
    if done.returncode != 0:
        raise SystemExit(f"check-rebuild: the dry run failed:\n{done.stderr[-3000:]}")
    checkpoints = sorted({job.outputs[0] for job in parse_dry_run(done.stdout)
                          if job.checkpoint and job.outputs and not _skipped(job.outputs[0], skip)})
    done = snakemake(repo, ["--summary", "--config", f"scale={scale}"], 900.0)
    if done.returncode != 0:
        raise SystemExit(f"check-rebuild: snakemake --summary failed:\n{done.stderr[-3000:]}")
    rows = [line.split("\t") for line in done.stdout.splitlines()]
    rows = [(r[0], r[2]) for r in rows if len(r) >= 6 and r[0] != "output_file"]
    if not rows:
        raise SystemExit("check-rebuild: snakemake --summary listed no output")
    training = {rule for out, rule in rows if is_record_or_data(out, scale)}
    others = sorted({out for out, rule in rows if rule not in training and not _skipped(out, skip)})
    return checkpoints, others


def check_rebuild(repo: Path, scale: str = "cpu", cores: int = 2) -> int:
    skip = {s for s in STUDIES if missing_runs(repo, scale, s)}
    for s in sorted(skip):
        print(f"check-rebuild: {s} left out: some of its planned runs have no committed record")
    checkpoints, others = forced_outputs(repo, scale, skip)
    targets = checkpoints + others
    start, started = time.monotonic(), time.time()
    # Passes until every forced output is rewritten: a forced job that feeds a checkpoint-dependent input function
    # (the LR rounds, the LR selection) makes Snakemake re-plan its downstream after it runs, and the re-planned DAG
    # drops forced jobs whose outputs look up to date (round 5 found study A's aggregate, tables and claims and study
    # B's left unbuilt that way). So the checkpoints first, then whatever is still older than this rebuild.
    forced, passes = checkpoints or others, 0
    while forced:
        passes += 1
        cmd = [sys.executable, "-m", "snakemake", f"-c{cores}", "--config", f"scale={scale}", "--forcerun", *forced,
               "--", "all"]
        rc = subprocess.run(cmd, cwd=repo).returncode
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
