"""What workflow/rules/ds_audit.smk asks of the study (torch-free): wildcard constraints, the config keys each job
reads, and the params functions of its rules, so that the rules file holds rules only.

Why per-job keys: Snakemake reruns a job whose params changed, and `--cfg` is a param. A job given the whole
section would rerun on an edit it cannot see (a loss-aggregation key rerunning every DeepSpeed group). A group job
is not given `matrix.versions` or `matrix.ranks` either: they decide which group jobs exist (the plan), and a
group gets its own version and rank count from its wildcards, so adding a version reruns no existing group.
"""

from __future__ import annotations

import json
import os
import shlex

WILDCARDS = {"version": r"\d+\.\d+\.\d+", "ranks": r"\d+"}

# job -> the keys of the ds_audit section it reads ("a.b": key b of sub-section a). The table, figure and claims
# jobs read no key: their inputs are the runs' files.
JOB_KEYS: dict[str, tuple[str, ...]] = {
    "matrix_group": tuple(f"matrix.{k}" for k in ("zero_stages", "offload", "ga", "dtypes", "micro_batch", "steps",
                                                   "case_timeout_s", "multi_backward", "clipping")),
    "loss_agg": ("loss_aggregation",),
    "tables": (),
    "figures": (),
    "claims": (),
}


def job_section(cfg: dict, job: str) -> dict:
    """The part of the (validated) ds_audit section that `job` reads, with the section's nesting."""
    out: dict = {}
    for path in JOB_KEYS[job]:
        *parents, key = path.split(".")
        src, dst = cfg, out
        for p in parents:
            src, dst = src[p], dst.setdefault(p, {})
        dst[key] = src[key]
    return out


def job_cfg(cfg: dict, job: str) -> str:
    """`job_section` as a shell-quoted JSON string for `--cfg {params.cfg}`."""
    return shlex.quote(json.dumps(job_section(cfg, job), sort_keys=True))


def deepspeed_env(ds0189_env: str):
    """params function: the command prefix selecting a group's DeepSpeed, the 0.18.9 overlay (DS0189_ENV) or
    nothing (the installed one). The job checks the version it got."""

    def env(wildcards) -> str:
        return ds0189_env if wildcards.version == "0.18.9" else ""

    return env


def group_threads(wildcards) -> int:
    """A group with r ranks runs r single-threaded processes."""
    return int(wildcards.ranks)


def run_dir(wildcards, output) -> str:
    """params function of a training rule: its run directory, the folder of its metrics.json (`--run-dir`)."""
    return shlex.quote(os.path.dirname(str(output[0])))
