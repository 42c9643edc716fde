"""Input and parameter functions for workflow/rules/sft_rl.smk (kept here so the rules file holds only rules)."""

from __future__ import annotations

import json
import shlex

from gradfidelity.studies.sft_rl import plan

BUGGY = ("ds_bug", "both")


def deepspeed_env(cfg: dict, overlay: str, stage: str):
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


def gpus(cfg: dict, scale: str) -> int:
    """GPUs an SFT or RL job requests: one per rank at the paper scale, none on the CPU scales."""
    return cfg.get("ranks", 1) if scale == "paper" else 0


def rl_init(cfg: dict, root: str):
    """input function: the metrics.json of the run an RL-stage job starts from (base or SFT)."""
    def init(wildcards) -> str:
        d = plan.init_dir(cfg, root, wildcards.model, wildcards.variant, wildcards.method, int(wildcards.seed))
        return f"{d}/metrics.json"
    return init


# The config keys each job reads (everything else is left out of its command, so that editing it does not rerun
# the job): the base model depends on the model, task and pretraining only; an SFT job adds the SFT and DeepSpeed
# settings; an RL-stage job the RL and mixed-policy settings instead (its SFT input is a file, tracked as input).
_COMMON = ("models", "task", "data", "threads", "checkpoint_every", "eval_batch_size")
JOB_KEYS = {
    "pretrain": _COMMON + ("pretrain",),
    "sft": _COMMON + ("sft", "deepspeed", "bug_stages"),
    "rl": _COMMON + ("rl", "mixed", "deepspeed", "bug_stages"),
    "alignment": _COMMON + ("sft", "alignment_windows"),
}


def job_section(cfg: dict, job: str) -> dict:
    """The sub-sections of the sft_rl config that a `job` (pretrain, sft, rl, alignment) depends on."""
    return {k: cfg[k] for k in JOB_KEYS[job] if k in cfg}


def job_cfg(cfg: dict, job: str) -> str:
    """`job_section` as a shell-quoted JSON string for `--cfg {params.cfg}`."""
    return shlex.quote(json.dumps(job_section(cfg, job), sort_keys=True))
