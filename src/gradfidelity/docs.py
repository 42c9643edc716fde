"""The README's claims-to-targets table, generated from the claims registry and Snakemake's own dry runs, so it
cannot drift from the code: `make docs` rewrites the block between the markers, and a test fails when the committed
README differs from what this module generates.

For every group of claims the table gives the command that builds just that evidence, the tables and figures it
produces, and per scale the number of jobs Snakemake plans and the sum of their declared `runtime` limits (an upper
bound in job-minutes, not a measurement; the measured times are in each job's benchmark.tsv).
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from gradfidelity.claims.verify import describe_check, load_registry
from gradfidelity.errors import UserError
from gradfidelity.harness.io import atomic_write_text

BEGIN = "<!-- BEGIN GENERATED: claims-to-targets (make docs) -->"
END = "<!-- END GENERATED: claims-to-targets -->"
BUDGET_SCALES = ("smoke", "cpu")
# study -> (what it measures, named Snakemake target); the target rules live in workflow/rules/<study>.smk.
GROUPS = {
    "ds_audit": ("which DeepSpeed configurations drop micro-batches; loss-aggregation weighting", "ds_audit"),
    "sft_rl": ("SFT-then-RL vs LUFFY/SRFT/ReLIFT/HPT on fixed and buggy infrastructure", "sft_rl"),
    "async_pp": ("one-step delay across six optimizers; mitigations; PipeDream depth; training length", "async_pp"),
    "local": ("local-training methods: throughput, PSS, non-inferiority, thread-matched baseline", "local"),
    "stats": ("the paper's own statistics, recomputed (arithmetic, not a reproduction)", "stats_check"),
}


@dataclass(frozen=True)
class Plan:
    jobs: int
    runtime_min: int
    outputs: tuple[str, ...]


def _is_replay(rule: str) -> bool:
    # a replay runs only where a committed start's model is not on disk (a fresh clone), so whether it is planned
    # depends on what this tree holds beside its records; counting it would make the table differ between a
    # fresh clone and a tree that trained the runs (CI's clone planned 9 replays more than the tree that wrote it)
    return "_replay_" in rule


def dry_run(target: str, scale: str, cwd: Path) -> Plan:
    """Jobs, summed runtime limits and outputs of `snakemake -n --forceall TARGET` at `scale`, replays of
    committed starts left out (`_is_replay`)."""
    cmd = [sys.executable, "-m", "snakemake", "-n", "--forceall", target, "--config", f"scale={scale}"]
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise UserError(f"dry run of {target} at scale {scale} failed:\n{res.stderr[-2000:]}")
    jobs, runtime, outputs, rule = 0, 0, [], None
    for line in res.stdout.splitlines():
        m = re.match(r"^(?:local)?(?:rule|checkpoint) (\S+):$", line.strip())
        if m:
            rule = m[1]
            jobs += not _is_replay(rule)
        elif rule is None or _is_replay(rule):
            continue
        elif line.startswith("    output: "):
            outputs += [o.strip() for o in line[len("    output: "):].split(",")]
        elif line.startswith("    resources: "):
            found = re.search(r"\bruntime=(\d+)", line)
            runtime += int(found[1]) if found else 0
    return Plan(jobs=jobs, runtime_min=runtime, outputs=tuple(outputs))


def _shown_outputs(plan: Plan, scale: str) -> list[str]:
    keep = [o for o in plan.outputs if o.startswith((f"paper_tables/{scale}/", f"figures/{scale}/"))
            and o.endswith((".md", ".png"))]
    return sorted(set(keep))


def claims_table(cwd: Path) -> str:
    registry = load_registry()
    lines = ["| claims | what | build just that (smoke; add `--config scale=cpu` for the cpu scale) | main outputs "
             "(smoke paths) | " + " | ".join(f"{s}: jobs, runtime limits" for s in BUDGET_SCALES) + " |",
             "|---|---|---|---|" + "---|" * len(BUDGET_SCALES)]
    for study, (what, target) in GROUPS.items():
        ids = [row["id"] for row in registry if row["study"] == study]
        plans = {s: dry_run(target, s, cwd) for s in BUDGET_SCALES}
        outputs = ", ".join(f"`{o}`" for o in _shown_outputs(plans["smoke"], "smoke"))
        budgets = " | ".join(f"{p.jobs} jobs, {p.runtime_min} min" for p in plans.values())
        lines.append(f"| {', '.join(ids)} | {what} | `.venv/bin/snakemake -c2 {target}` | {outputs} | {budgets} |")
    return "\n".join(lines)


def claim_rows() -> str:
    """One row per registry claim: what it says, how it is checked, where it is measurable, its evidence file."""
    lines = ["| id | claim | check | min_n | scales | evidence file (`gradfidelity claim ID`: its rebuild command) |",
             "|---|---|---|---|---|---|"]
    for row in load_registry():
        kind = " (arithmetic)" if row["evidence"] == "arithmetic" else ""
        statement = row["statement"].replace("|", "/")
        lines.append(f"| {row['id']} | {statement} | {describe_check(row['check'])}{kind} | {row['min_n']} | "
                     f"{', '.join(row['scales'])} | `results/smoke/claims/{row['study']}.json` |")
    return "\n".join(lines)


COUNTS_BEGIN = "<!-- BEGIN GENERATED: cpu-verdicts (make docs) -->"
COUNTS_END = "<!-- END GENERATED: cpu-verdicts -->"
# the paper each study's claims belong to (study A has two packages; C5 is study C's arithmetic)
PAPER_OF = {"ds_audit": "A", "sft_rl": "A", "async_pp": "B", "local": "C", "stats": "C"}


def verdict_counts(cwd: Path) -> str:
    """The committed cpu claims report's verdicts, counted per paper: the README's first table."""
    import pandas as pd

    path = Path(cwd) / "paper_tables" / "cpu" / "claims.csv"
    if not path.is_file():
        raise UserError(f"{path} is missing: the committed cpu claims report")
    claims = pd.read_csv(path)
    unknown = set(claims["study"]) - set(PAPER_OF)
    if unknown:
        raise UserError(f"{path}: studies {sorted(unknown)} belong to no paper in gradfidelity.docs.PAPER_OF")
    claims["paper"] = claims["study"].map(PAPER_OF)
    papers = sorted(set(PAPER_OF.values()))
    lines = ["| verdict (cpu scale) | " + " | ".join(f"study {p}" for p in papers) + " | all |",
             "|---|" + "---:|" * (len(papers) + 1)]
    counts = claims.groupby(["verdict", "paper"]).size()
    for verdict, total in claims["verdict"].value_counts().items():
        cells = [str(counts.get((verdict, p), 0)) for p in papers]
        lines.append(f"| *{verdict}* | " + " | ".join(cells) + f" | {total} |")
    return "\n".join(lines)


def _replace_block(text: str, begin: str, end: str, body: str) -> str:
    if begin not in text or end not in text:
        raise UserError(f"README lacks the generated-block markers {begin!r} ... {end!r}")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}\n{end}{tail}"


def render(readme: str, cwd: Path) -> str:
    text = _replace_block(readme, COUNTS_BEGIN, COUNTS_END, verdict_counts(cwd))
    return _replace_block(text, BEGIN, END, f"{claims_table(cwd)}\n\nEvery claim:\n\n{claim_rows()}")


def write_or_check(readme_path: Path, check: bool) -> int:
    text = readme_path.read_text()
    new = render(text, readme_path.parent)
    if check:
        if new != text:
            print(f"{readme_path} is out of date: run `make docs` and commit it", file=sys.stderr)
            return 1
        return 0
    if new != text:
        atomic_write_text(readme_path, new)
    print(f"{readme_path}: generated tables {'rewritten' if new != text else 'already up to date'}")
    return 0
