"""What check-reference needs from Snakemake: a dry run's jobs (rule, outputs, inputs), the jobs a target needs,
and one way to call Snakemake in a scratch copy of the checkout."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from gradfidelity.errors import UserError


@dataclass
class Job:
    rule: str
    outputs: list[str]
    inputs: list[str] = field(default_factory=list)
    checkpoint: bool = False  # a checkpoint: Snakemake re-plans its downstream once it has run
    reason: str = ""  # why Snakemake plans it ("Params have changed since last execution", ...)


def parse_dry_run(text: str) -> list[Job]:
    """The jobs of a `snakemake -n` listing: rule, outputs, inputs and the reason of each."""
    jobs, current = [], None
    for line in text.splitlines():
        # a checkpoint is listed as "(local)checkpoint NAME:"; missed, its outputs would be read as the previous job's
        m = re.match(r"^(?:local)?(rule|checkpoint) (\S+):$", line.strip())
        if m:
            current = Job(m[2], [], checkpoint=m[1] == "checkpoint")
            jobs.append(current)
        elif current is not None and line.startswith("    input: "):
            current.inputs = [s.strip() for s in line[len("    input: "):].split(",")]
        elif current is not None and line.startswith("    output: "):
            current.outputs = [s.strip() for s in line[len("    output: "):].split(",")]
        elif current is not None and line.startswith("    reason: "):
            current.reason = line[len("    reason: "):].strip()
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


def is_training_output(path: str) -> bool:
    return path.endswith("/metrics.json")


def snakemake(work: Path, args: list[str], timeout: float | None = None,
              env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m snakemake ARGS` in `work`; `env` replaces the environment (jobs inherit it: an ISA limit set here
    reaches every training process). `timeout` (seconds; None: none) is a caller's budget, never a fixed limit: run
    past it, the call is a UserError naming it, not a traceback."""
    cmd = [sys.executable, "-m", "snakemake", *args]
    try:
        return subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ) if env is None else env)
    except subprocess.TimeoutExpired as exc:
        raise UserError(f"snakemake {' '.join(args[:6])} ... ran past its {timeout:.0f} s budget in {work}") from exc
