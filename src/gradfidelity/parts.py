"""A study's run in parts: the training runs a plan still needs, split by seed into parts that each fit a session.

Why: a cpu run used to be all or nothing, so what did not fit in about two hours on 2 cores never ran. Each run's
records are committed (harness/records.py), so a part that trains some of the missing runs and commits their records
is kept; the next part plans only what is still missing, and the study's aggregate runs once nothing is.

`k/n` splits the runs missing *now*. Once part 1's records are committed, what is left is split again, so the next
part is `1/(n-1)`, not `2/n` (which would be the second half of the rest, skipping its first half: not silent, since
the aggregate refuses while a run is missing, but a session lost). `k > 1` is for machines that all start from one
commit. Every call prints the seeds of every part, so the choice is visible before anything trains.

    gradfidelity cpu-part --study local --part 1/3          # run the first third of the missing runs (by seed)
    gradfidelity cpu-part --study local --part 1/3 --list   # only list them
    gradfidelity cpu-part --study local --status            # what is still missing; exit 1 if anything

The missing runs are read from Snakemake's own dry run of the study's runs table (so an extension given as
`--config` is planned exactly as the full run would plan it), not rebuilt from the plan here.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from gradfidelity.errors import UserError
from gradfidelity.reference.dag import parse_dry_run, snakemake
from gradfidelity.studies import STUDIES

_SEED = re.compile(r"/seed(\d+)(?:/|$)")
DRY_RUN_S = 900.0


def missing_runs(repo: Path, scale: str, study: str, config: tuple[str, ...] = ()) -> list[str]:
    """The metrics.json of every training run of `study`'s plan that has no record in `repo`, sorted.

    Snakemake's own dry run of the study's runs table with that one job forced: a forced job asks for each of its
    inputs, so every planned run without a record is listed (and what it needs upstream), while a committed record
    stands. A plain dry run would list nothing below a runs table that is already there. Runs behind an LR-grid round
    that has not run yet appear once it has."""
    if study not in STUDIES:
        raise UserError(f"unknown study {study!r} (one of {', '.join(STUDIES)})")
    target = f"results/{scale}/runs/{study}.csv"
    done = snakemake(repo, ["-n", target, "--forcerun", target, "--config", f"scale={scale}", *config],
                     DRY_RUN_S)
    if done.returncode != 0:
        raise UserError(f"snakemake's dry run of {target} failed:\n{done.stderr[-3000:]}")
    root = f"results/{scale}/{study}/"
    return sorted({out for job in parse_dry_run(done.stdout) for out in job.outputs
                   if out.startswith(root) and out.endswith("/metrics.json") and "/replay/" not in out})


def seed_of(path: str) -> int:
    """The run's seed from its path (seed<k>), -1 for a run without one."""
    found = _SEED.findall(path)
    return int(found[-1]) if found else -1


def split(paths: list[str], part: int, parts: int) -> list[str]:
    """Part `part` (1-based) of `parts`: the runs of a contiguous range of seeds, the seeds shared out as evenly as
    their runs allow (every run of one seed lands in one part, so a part's records are whole seeds)."""
    if not 1 <= part <= parts:
        raise UserError(f"part {part}/{parts}: the part must be between 1 and {parts}")
    seeds = sorted({seed_of(p) for p in paths})
    chunk = [seeds[i * len(seeds) // parts:(i + 1) * len(seeds) // parts] for i in range(parts)][part - 1]
    return [p for p in paths if seed_of(p) in set(chunk)]


def part_seeds(paths: list[str], parts: int) -> list[list[int]]:
    """The seeds of each of `parts` parts of `paths` (split's cut, every part's)."""
    return [sorted({seed_of(p) for p in split(paths, k, parts)}) for k in range(1, parts + 1)]


def parse_part(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)/(\d+)", text or "")
    if not m or int(m[2]) < 1:
        raise UserError(f"--part {text!r}: expected k/n, e.g. 1/3")
    return int(m[1]), int(m[2])


def cpu_part(repo: Path, study: str, scale: str = "cpu", part: str | None = None, list_only: bool = False,
             status: bool = False, cores: int = 2, config: tuple[str, ...] = ()) -> int:
    missing = missing_runs(repo, scale, study, config)
    if status:
        if missing:
            shown = "\n  ".join(missing[:30]) + (f"\n  ... and {len(missing) - 30} more" if len(missing) > 30 else "")
            seeds = sorted({seed_of(p) for p in missing})
            print(f"{study}: {len(missing)} planned runs have no record yet (seeds {seeds}); its aggregate would read "
                  f"fewer runs than the config plans, so it waits:\n  {shown}\nRun the missing parts first: "
                  f"make cpu-part STUDY={study} PART=k/n", file=sys.stderr)
            return 1
        print(f"{study}: every planned run has its record; the aggregate, tables and claims can be built")
        return 0
    k, n = parse_part(part or "1/1")
    chosen = split(missing, k, n)
    print(f"{study} part {k}/{n}: {len(chosen)} of {len(missing)} missing runs (seeds "
          f"{sorted({seed_of(p) for p in chosen})})")
    if n > 1:
        cut = "; ".join(f"{i}/{n} seeds {s}" for i, s in enumerate(part_seeds(missing, n), start=1))
        not_next = f", not {k + 1}/{n}" if k < n else ""
        print(f"the {n} parts of the runs missing now: {cut}. Once this part's records are committed, the rest is "
              f"split again: the next part is 1/{n - 1}{not_next}", file=sys.stderr)
    if list_only or not chosen:
        print("\n".join(chosen))
        return 0
    # Snakemake's own output streams to the terminal: a part runs for up to two hours
    cmd = [sys.executable, "-m", "snakemake", f"-c{cores}", *chosen, "--config", f"scale={scale}", *config]
    return subprocess.run(cmd, cwd=repo).returncode
