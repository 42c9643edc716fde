"""What workflow/rules/async_pp.smk asks of study B (torch-free), so that the rules file holds rules only: the
config keys each job reads, the typed config the plan is made from, and the input/params functions of its rules.

Why per-job keys: Snakemake reruns a job whose params changed, and `--cfg` is a param. Each job's `--cfg` carries
only the sections it reads, so an edit reruns exactly the jobs it changes: a `bench` edit reruns no training, a
`delay` edit only the cells whose mitigation reads it, a `sweeps` edit only the tables, figures and claims (and the
cells it adds). Keys that decide which cells exist (`seeds`, `claim_seeds`, `lr_selection`, `sweeps`) reach the
training jobs through their wildcards instead, so adding a seed or a sweep point reruns no existing cell.
"""

from __future__ import annotations

import json
import os
import shlex

from gradfidelity.lr_grid import GridRounds
from gradfidelity.studies.async_pp import plan
from gradfidelity.studies.async_pp.config import DELAY_READERS, StudyConfig

WILDCARDS = plan.WILDCARDS
EXPORTS: dict = {}  # no file of this study is read by another study's rules

# job -> the sections of the async_pp config its `--cfg` carries (the one place they are declared; the reports read
# `lr_selection` for the grid's budget, which the length table names). Not in any
# `--cfg`: `threads_per_run` (the training rule's threads), `train.batch_size` x `train.seq_len` (the aggregation's
# --tokens-per-step), and the keys that decide which cells exist (above).
_REPORT = ("seeds", "claim_seeds", "lr_selection", "model", "train", "sweeps")
JOB_KEYS: dict[str, tuple[str, ...]] = {
    "train": ("model", "data", "train"),
    "train_delay": ("model", "data", "train", "delay"),  # a cell whose mitigation is one of DELAY_READERS
    "data": ("data",),
    "select_lr": (),
    "aggregate": (),
    "tables": _REPORT,
    "figures": _REPORT,
    "claims": _REPORT,
    "bench": ("model", "data", "train", "bench"),
    "host_drift": (),  # two runs tables only
}
# rules that only a scale with an archived round creates (results/<scale>/archive/async_pp_round5: the cpu scale)
POSSIBLE_RULES = ("async_pp_archive_runs", "async_pp_host_drift")


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


def train_identity(cfg: StudyConfig, section: dict, text_md5: str | None):
    """The data identity of a training cell (harness/identity.py), by its wildcards: the text's MD5 for a `file`
    corpus (the prepared splits follow from it and the `data` section, which the cell's config holds), and for a
    tuned or own-LR cell the selection settings its LR is chosen by (the grid it is chosen from is cells of this
    same config)."""

    def _data(wildcards) -> dict:
        out = {"text_md5": text_md5} if cfg.data.corpus == "file" else {}
        if wildcards.lr in (plan.TUNED, plan.OWN):
            out["lr_selection"] = section.get("lr_selection")
        return out

    return _data


LR_ROUND = "lr_rounds/round{round}.json"  # the LR grid's rounds (checkpoint async_pp_lr_round), in the results root


def _rounds(cfg: StudyConfig, root: str) -> GridRounds:
    """The LR grid's rounds (checkpoint async_pp_lr_round): the configured grid, then each round's extension."""
    from gradfidelity.studies.async_pp.lr_select import check_round

    def runs(points):
        cells = plan.grid_cells(cfg) if points is None else plan.grid_cells(cfg, points)
        return [c.metrics(root) for c in cells]

    budgets = {0: plan.grid_budget(cfg), **{w.d_model: w.steps for w in cfg.sweeps.width.widths}}
    return GridRounds("async_pp_lr_round", runs, cfg.lr_selection.max_extensions,
                      check=lambda doc, path: check_round(doc, path, budgets))


def lr_round_input(cfg: StudyConfig, root: str, checkpoints):
    """input function of the checkpoint async_pp_lr_round: the grid runs of rounds 0..round."""
    return _rounds(cfg, root).round_input(checkpoints)


def lr_grid_input(cfg: StudyConfig, root: str, checkpoints):
    """input function of the selection: every grid run of every round."""
    return _rounds(cfg, root).grid_input(checkpoints)


def lr_check_input(cfg: StudyConfig, root: str, checkpoints):
    """input function of the LR table: the LR check's runs (plan.check_cells), planned from the last LR round's
    choices (lr_select.round_choices); none when `lr_selection.check_steps` is null."""
    from gradfidelity.studies.async_pp.lr_select import round_choices

    def _input(wildcards):
        if cfg.lr_selection.check_steps is None:
            return []
        choices = round_choices(_rounds(cfg, root).final(checkpoints), dict(cfg.lr_selection.near_tie_sd))
        return [c.metrics(root) for c in plan.check_cells(cfg, choices)]

    return _input


def study_runs(cfg: StudyConfig, root: str, checkpoints):
    """input function of the runs table and the aggregation: every cell of the plan, every grid run added by
    an extension round, and the LR check's runs."""
    planned = plan.metrics(cfg, root)
    grid = lr_grid_input(cfg, root, checkpoints)
    check = lr_check_input(cfg, root, checkpoints)

    def _input(wildcards):
        return sorted(set(planned) | set(grid(wildcards)) | set(check(wildcards)))

    return _input


DATA_FILES = ("train.bin", "val.bin", "tokenizer.json", "meta.json")  # the async_pp_data rule's outputs


def data_files(cfg: StudyConfig, root: str, always: bool = False) -> dict[str, str]:
    """The prepared corpus a `file` corpus trains on ({name: path} under <root>/data), else nothing (the embedded
    and FineWeb-Edu streams are built inside the run); `always`: the paths whatever the corpus (the data rule's
    outputs)."""
    if cfg.data.corpus != "file" and not always:
        return {}
    return {name.split(".")[0]: f"{root}/data/{name}" for name in DATA_FILES}


def train_input(selection: str, data: dict[str, str]):
    """Named inputs of a training cell: the LR selection (a tuned or own cell only; a grid cell lr~x<m> needs none) and
    the prepared corpus's meta.json (a `file` corpus; the run checks every split against it)."""

    def _input(wildcards):
        out = {"selection": selection} if wildcards.lr in (plan.TUNED, plan.OWN) else {}
        return {**out, **({"data": data["meta"]} if data else {})}

    return _input


def lr_arg(wildcards, input) -> str:
    return f"--lr-selection {shlex.quote(str(input.selection))}" if wildcards.lr in (plan.TUNED, plan.OWN) else ""


def claim_sources(paths: list[str]) -> str:
    """`--claim-source <path>` for each path (the claims job reads and cites them)."""
    return " ".join(f"--claim-source {shlex.quote(p)}" for p in paths)


def near_tie_arg(cfg: StudyConfig) -> str:
    """The selection's `--near-tie-sd` (lr_selection.near_tie_sd as one shell-quoted JSON object)."""
    return shlex.quote(json.dumps(dict(cfg.lr_selection.near_tie_sd), sort_keys=True))


def data_arg(wildcards, input) -> str:
    """`--data <folder>` when the cell reads a prepared corpus."""
    meta = getattr(input, "data", None)
    return f"--data {shlex.quote(os.path.dirname(str(meta)))}" if meta else ""


def run_dir(wildcards, output) -> str:
    """params function: the run directory of the training rule's metrics.json (`--run-dir`)."""
    return os.path.dirname(str(output[0]))


def tokens_per_step(cfg: StudyConfig) -> int:
    """The aggregation's `--tokens-per-step` (the tokens column of runs.csv)."""
    return cfg.train.tokens_per_step


def threads(cfg: StudyConfig) -> int:
    """Threads of one training job."""
    return cfg.threads_per_run
