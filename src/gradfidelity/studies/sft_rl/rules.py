"""What workflow/rules/sft_rl.smk asks of the study: output patterns, wildcard constraints, input and params
functions, the launcher, and the config keys each job reads (so the rules file holds only rules). Torch-free."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from pathlib import Path

from gradfidelity.lr_grid import GridRounds
from gradfidelity.studies.sft_rl import plan
from gradfidelity.studies.sft_rl.config import StudyConfig

BUGGY = ("ds_bug", "both")

# The config keys each job reads; everything else is left out of its `--cfg`, so that editing it does not rerun the
# job (Snakemake reruns a job whose params changed). The base model depends on the model, task and pretraining only;
# an SFT job adds the SFT and DeepSpeed settings; an RL-stage job the RL and mixed-policy settings instead (its SFT
# input is a file, tracked as input). Never `seeds` or `methods`: they say which jobs exist, not what one computes.
_COMMON = ("models", "task", "data", "threads", "checkpoint_every", "eval_batch_size")
JOB_KEYS = {
    "pretrain": _COMMON + ("pretrain",),
    "sft": _COMMON + ("sft", "deepspeed", "bug_stages"),
    "rl": _COMMON + ("rl", "mixed", "deepspeed", "bug_stages", "lr_selection"),
    "alignment": _COMMON + ("sft", "alignment_windows"),
    "bench": _COMMON + ("sft", "rl", "deepspeed"),
    # The analysis jobs: which cells exist (aggregate), what the notes and the constant-answer row say (tables),
    # what is drawn (figures), the claims' models, methods and constant-answer gate (claims).
    # `rl`: the RL budgets each reads (rl.eval_steps and rl.steps, round 5)
    # base_seeds: which base model each seed's rows start from (round 6)
    "aggregate": ("models", "seeds", "base_seeds", "methods", "variants", "bug_stages", "rl"),
    "tables": ("methods", "bug_stages", "task", "data", "sft", "rl", "deepspeed"),
    "figures": ("models", "methods", "variants", "rl"),
    "claims": ("models", "methods", "task", "data", "rl"),
    "compare": ("models", "seeds", "base_seeds", "methods", "variants", "bug_stages", "rl", "compare_with"),
}

# Wildcard constraints of the training rules (a `base`, `alignment` or `lr_grid` directory never reads as a variant).
CONSTRAINTS = {"variant": "|".join(plan.VARIANTS), "method": "|".join(plan.RL_STAGE), "seed": r"\d+",
               "lr": r"[0-9][0-9.e+-]*", "round": r"\d+"}


def constraints(*names: str) -> dict[str, str]:
    """`wildcard_constraints: **constraints("variant", "seed")`."""
    return {n: CONSTRAINTS[n] for n in names}


def patterns(root: str) -> dict[str, str]:
    """The run directory of each training rule as a Snakemake pattern: the plan's layout with wildcards."""
    return {"base": plan.base_dir(root, "{model}", "{seed}"),
            "sft": plan.run_dir(root, "{model}", "{variant}", "sft", "{seed}"),
            "rl": plan.run_dir(root, "{model}", "{variant}", "{method}", "{seed}"),
            "alignment": plan.alignment_dir(root, "{model}"),
            "grid": plan.grid_dir(root, "{model}", "{method}", "{lr}", "{seed}")}


def job_section(section: dict, job: str) -> dict:
    """The sub-sections of the (validated) sft_rl section that a `job` depends on."""
    return {k: section[k] for k in JOB_KEYS[job] if k in section}


def start_identity(section: dict, job: str):
    """The data identity of a job (harness/identity.py), by its wildcards: the identity hash of the job it starts
    from, so that a record stands only while its start would be made as it was (a chain: base <- SFT <- RL). The
    base model starts from nothing; SFT and the alignment probe from the base; an RL-stage or grid run from the SFT
    run (SFT-then-RL) or the base (every mixed arm)."""
    from gradfidelity.harness.identity import job_identity

    base = job_identity("sft_rl", "pretrain", job_section(section, "pretrain"))["hash"]
    bases = section.get("base_seeds") or [0]

    def _base_seed(wildcards) -> int:  # plan.base_seed on the section: which base the job's seed starts from
        seed = int(wildcards.seed) if "seed" in wildcards.keys() else 0
        return bases[seed % len(bases)]

    def _data(wildcards) -> dict:
        if job == "pretrain":
            return {}
        start = {"start": base, "base_seed": _base_seed(wildcards)}
        if job in ("sft", "alignment") or wildcards.method != "sft_then_rl":
            return start
        sft = job_identity("sft_rl", "sft", job_section(section, "sft"), start)["hash"]
        return {"start": sft, "base_seed": start["base_seed"]}

    return _data


def job_cfg(section: dict, job: str) -> str:
    """`job_section` as a shell-quoted JSON string for `--cfg {params.cfg}`."""
    return shlex.quote(json.dumps(job_section(section, job), sort_keys=True))


def deepspeed_env(cfg: StudyConfig, overlay: str, stage: str):
    """params function: the 0.18.9 overlay prefix for jobs whose stage runs on the buggy DeepSpeed."""
    def env(wildcards) -> str:
        return overlay if plan.stage_variant(cfg, wildcards.variant, stage) in BUGGY else ""
    return env


def launcher(gf_py: str, ranks: int) -> str:
    """The command that starts an SFT or RL job: the package in one process, or (ranks > 1) under torchrun with one
    process per rank on the job's node; each rank reads RANK / WORLD_SIZE from torchrun (harness.run.launch_rank)."""
    if ranks == 1:
        return f"{gf_py} -m gradfidelity"
    return f"{gf_py} -m torch.distributed.run --standalone --nproc_per_node {ranks} -m gradfidelity"


def gpus(cfg: StudyConfig, scale: str) -> int:
    """GPUs an SFT or RL job requests: one per rank at the paper scale, none on the CPU scales."""
    return cfg.ranks if scale == "paper" else 0


MODEL = "model"  # a run's checkpoint directory (models.save_checkpoint): never committed
REPLAY = "replay"  # <run>/replay/: a committed run redone for its model (rule sft_rl_replay_*), checked against it


def _nothing_committed(path: str) -> bool:
    return False


def start_of(run_dir: str, committed: Callable[[str], bool] = _nothing_committed) -> str:
    """metrics.json of the run a job starts from (a base model or an SFT run). Its model lives beside it. A
    committed record whose model is not here (a fresh clone commits records, never models) is started from its
    replay instead: <run>/replay/metrics.json, the same run redone there and checked against the committed record
    before anything trains on it (rules sft_rl_replay_base and sft_rl_replay_sft). `committed` is the workflow's
    is_committed."""
    if committed(f"{run_dir}/metrics.json") and not Path(run_dir, MODEL, "config.json").is_file():
        return f"{run_dir}/{REPLAY}/metrics.json"
    return f"{run_dir}/metrics.json"


def base_start(cfg: StudyConfig, root: str, committed: Callable[[str], bool] = _nothing_committed):
    """input function of the jobs that start from a base model (SFT and its replay: the base of their seed,
    plan.base_seed; the alignment probe, which has no seed wildcard: seed 0's)."""
    def start(wildcards) -> str:
        seed = wildcards.seed if "seed" in wildcards.keys() else 0
        return start_of(plan.seed_base_dir(cfg, root, wildcards.model, seed), committed)
    return start


def rl_init(cfg: StudyConfig, root: str, committed: Callable[[str], bool] = _nothing_committed):
    """input function: the metrics.json of the run an RL-stage job starts from (base or SFT; `start_of`)."""
    def init(wildcards) -> str:
        d = plan.init_dir(cfg, root, wildcards.model, wildcards.variant, wildcards.method, int(wildcards.seed))
        return start_of(d, committed)
    return init


def rl_inputs(cfg: StudyConfig, root: str, selection: str | None = None,
              committed: Callable[[str], bool] = _nothing_committed):
    """input function of a tuned RL-stage job: its start and, when the config selects LRs, the selection file
    (`selection`, default the selection rule's output; the workflow passes a given one with lr_selection_from)."""
    init = rl_init(cfg, root, committed)
    selection = selection or plan.selection_path(root)

    def _input(wildcards) -> dict[str, str]:
        extra = {"selection": selection} if cfg.lr_selection.enabled else {}
        return {"init": init(wildcards), **extra}

    return _input


def grid_init(cfg: StudyConfig, root: str, committed: Callable[[str], bool] = _nothing_committed):
    """input function of an LR-selection job: the metrics.json of the run it starts from (`start_of`)."""
    def init(wildcards) -> str:
        return start_of(plan.grid_init_dir(cfg, root, wildcards.model, wildcards.method), committed)
    return init


def selection_starts(cfg: StudyConfig, root: str) -> dict[str, str]:
    """{"<model>/<method>": metrics.json of the run that arm's grid starts from}: the selection table reads each
    arm's chosen val accuracy against its start's (a record: present whether committed or trained here)."""
    if not cfg.lr_selection.enabled:
        return {}
    return {f"{m.name}/{meth}": f"{plan.grid_init_dir(cfg, root, m.name, meth)}/metrics.json"
            for m in cfg.models for meth in plan.tuned_methods(cfg)}


def lr_option(wildcards, input) -> str:
    """params function: `--lr-selection <file>` for a tuned job when the config selects LRs."""
    return f"--lr-selection {input.selection}" if "selection" in input.keys() else ""


def _rounds(cfg: StudyConfig, root: str) -> GridRounds:
    """The LR grid's rounds (checkpoint sft_rl_lr_round): the configured grid, then each round's extension."""
    return GridRounds("sft_rl_lr_round", lambda points: plan.grid_runs(cfg, root, points),
                      cfg.lr_selection.max_extensions)


def lr_round_input(cfg: StudyConfig, root: str, checkpoints):
    """input function of the checkpoint sft_rl_lr_round: the grid runs of rounds 0..round."""
    return _rounds(cfg, root).round_input(checkpoints)


def lr_grid_input(cfg: StudyConfig, root: str, checkpoints):
    """input function of the selection: every grid run of every round."""
    return _rounds(cfg, root).grid_input(checkpoints)


def study_runs(cfg: StudyConfig, root: str, checkpoints, planned: list[str]):
    """input function of the runs table: the base models, every planned run and (with LR selection) every grid run
    of every round and the SFT runs the grid starts from."""
    if not cfg.lr_selection.enabled:
        return lambda wildcards: list(planned)
    grid = lr_grid_input(cfg, root, checkpoints)
    starts = sorted({f"{plan.grid_init_dir(cfg, root, m.name, 'sft_then_rl')}/metrics.json" for m in cfg.models}
                    ) if "sft_then_rl" in plan.tuned_methods(cfg) else []

    def _input(wildcards):
        return sorted(set(planned) | set(starts) | set(grid(wildcards)))
    return _input


# Metrics that are chaotic across host types (reference/seeds.py): every one. Measured, not assumed: the same runs
# rerun at AVX2 and AVX-512 on one host moved accuracies 9-61% and NLLs 4-14%
# (results/cpu/reference/drift_avx2_vs_avx512.csv), and on an Intel host against the AMD-made records 35 of 67 metrics
# moved beyond any cross-host rule (drift_hosts_amd_vs_intel.csv): small models on sampled generations leave their
# trajectory at the first rounding difference, so a rerun elsewhere is one more seed, judged as one.
CHAOTIC_ACROSS_HOSTS = ("*",)
# The metrics study A's claims read (claims.py): the score's eval sets (acc_counted averages acc_<set> over the counted
# sets; reference_learned and rl_learns read acc_id) and A9's FLOPs, each with its range. check-reference judges a
# rerun on another host type on these alone (reference/seeds.py); every other metric is a reading.
CLAIM_METRICS = {"acc_id": (0, 100), "acc_long": (0, 100), "acc_ood": (0, 100), "flops": (0, float("inf"))}

# Files other studies' rules read (workflow/rules/common.smk: cross_study_input): name -> f(typed config, results root).
# Study A's audit reads the gradient Gram matrices of real SFT micro-batches (its claim A3's "about 2/N").
EXPORTS = {
    "alignment": lambda cfg, results: plan.alignment_metrics(cfg, f"{results}/sft_rl"),
}
