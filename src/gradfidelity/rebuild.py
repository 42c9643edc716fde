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


def is_record_or_data(path: str, scale: str) -> bool:
    """A run's record, a bench, a replay or prepared data: what a rebuild never reruns."""
    return ((path.startswith(f"results/{scale}/") and path.endswith("/metrics.json")) or "/bench/" in path
            or "/data/" in path or "/corpus/" in path)


def forced_outputs(repo: Path, scale: str, skip: set[str]) -> list[str]:
    """The outputs of every analysis job of the workflow (a dry run with --forceall), those of the `skip` studies
    left out: forcing them reruns them and everything downstream, and nothing upstream."""
    done = snakemake(repo, ["-n", "--forceall", "--config", f"scale={scale}"], 900.0)
    if done.returncode != 0:
        raise SystemExit(f"check-rebuild: the dry run failed:\n{done.stderr[-3000:]}")
    out = []
    for job in parse_dry_run(done.stdout):
        if not job.outputs or any(is_record_or_data(o, scale) for o in job.outputs):
            continue
        if any(f"/{s}/" in o or f"/{s}." in o or f"/{s}_" in o for o in job.outputs for s in skip):
            continue
        out.append(job.outputs[0])
    return sorted(set(out))


def check_rebuild(repo: Path, scale: str = "cpu", cores: int = 2) -> int:
    skip = {s for s in STUDIES if missing_runs(repo, scale, s)}
    for s in sorted(skip):
        print(f"check-rebuild: {s} left out: some of its planned runs have no committed record")
    targets = forced_outputs(repo, scale, skip)
    start = time.monotonic()
    cmd = [sys.executable, "-m", "snakemake", f"-c{cores}", "--config", f"scale={scale}", "--forcerun", *targets,
           "--", "all"]
    rc = subprocess.run(cmd, cwd=repo).returncode
    if rc != 0:
        return rc
    roots = [r.format(scale=scale) for r in OUTPUT_ROOTS]
    changed = subprocess.run(["git", "status", "--porcelain", "--", *roots], cwd=repo, capture_output=True,
                             text=True, check=True).stdout.splitlines()
    print(f"check-rebuild: {len(targets)} analysis jobs forced, {time.monotonic() - start:.0f} s; "
          f"{len(changed)} committed or new files differ" + (":" if changed else ""))
    for line in changed:
        print("  " + line)
    return 1 if changed else 0
