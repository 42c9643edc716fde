"""What workflow/rules/async_pp.smk asks of study B (torch-free), so that the rules file holds rules only: the
config keys each job reads, the typed config the plan is made from, and the input/params functions of its rules.

Why per-job keys: Snakemake reruns a job whose params changed, and `--cfg` is a param. Each job's `--cfg` carries
only the sections it reads, so an edit reruns exactly the jobs it changes: a `bench` edit reruns no training, a
`delay` edit only the cells whose mitigation reads it, a `sweeps` edit only the tables, figures and claims (and the
cells it adds). Keys that decide which cells exist (`seeds`, `lr_selection`, `sweeps`) reach the training jobs
through their wildcards instead, so adding a seed or a sweep point reruns no existing cell.
"""

from __future__ import annotations

import json
import os
import shlex

from gradfidelity.studies.async_pp import plan
from gradfidelity.studies.async_pp.config import DELAY_READERS, StudyConfig

WILDCARDS = plan.WILDCARDS
EXPORTS: dict = {}  # no file of this study is read by another study's rules

# job -> the sections of the async_pp config its `--cfg` carries (the one place they are declared). Not in any
# `--cfg`: `threads_per_run` (the training rule's threads), `train.batch_size` x `train.seq_len` (the aggregation's
# --tokens-per-step), and the keys that decide which cells exist (above).
_REPORT = ("seeds", "model", "train", "sweeps")
JOB_KEYS: dict[str, tuple[str, ...]] = {
    "train": ("model", "data", "train"),
    "train_delay": ("model", "data", "train", "delay"),  # a cell whose mitigation is one of DELAY_READERS
    "select_lr": (),
    "aggregate": (),
    "tables": _REPORT,
    "figures": _REPORT,
    "claims": _REPORT,
    "bench": ("model", "data", "train", "bench"),
}


def job_section(cfg: dict, job: str) -> dict:
    """The sections of the (validated) async_pp section that `job` reads."""
    return {k: cfg[k] for k in JOB_KEYS[job]}


def job_cfg(cfg: dict, job: str) -> str:
    """`job_section` as one shell-quoted JSON string (`--cfg {params.cfg}`)."""
    return shlex.quote(json.dumps(job_section(cfg, job), sort_keys=True))


def train_job(mitigation: str) -> str:
    """The JOB_KEYS entry of a training cell: `delay` only for the mitigations that read it."""
    return "train_delay" if mitigation in DELAY_READERS else "train"


def train_cfg(cfg: dict):
    """params function of the training rule: the cell's `--cfg`."""

    def _cfg(wildcards):
        return job_cfg(cfg, train_job(wildcards.mitigation))

    return _cfg


def train_input(selection: str):
    """A tuned cell waits for the LR selection; a grid cell (lr~x<m>) needs nothing."""

    def _input(wildcards):
        return [selection] if wildcards.lr == plan.TUNED else []

    return _input


def lr_arg(wildcards, input) -> str:
    return f"--lr-selection {shlex.quote(str(input[0]))}" if wildcards.lr == plan.TUNED else ""


def run_dir(wildcards, output) -> str:
    """params function: the run directory of the training rule's metrics.json (`--run-dir`)."""
    return os.path.dirname(str(output[0]))


def tokens_per_step(cfg: StudyConfig) -> int:
    """The aggregation's `--tokens-per-step` (the tokens column of runs.csv)."""
    return cfg.train.tokens_per_step


def threads(cfg: StudyConfig) -> int:
    """Threads of one training job."""
    return cfg.threads_per_run
