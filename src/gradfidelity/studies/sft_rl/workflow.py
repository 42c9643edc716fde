"""Input and parameter functions for workflow/rules/sft_rl.smk (kept here so the rules file holds only rules)."""

from __future__ import annotations

from gradfidelity.studies.sft_rl import plan

BUGGY = ("ds_bug", "both")


def deepspeed_env(cfg: dict, overlay: str, stage: str):
    """params function: the 0.18.9 overlay prefix for jobs whose stage runs on the buggy DeepSpeed."""
    def env(wildcards) -> str:
        return overlay if plan.stage_variant(cfg, wildcards.variant, stage) in BUGGY else ""
    return env


def rl_init(cfg: dict, root: str):
    """input function: the metrics.json of the run an RL-stage job starts from (base or SFT)."""
    def init(wildcards) -> str:
        d = plan.init_dir(cfg, root, wildcards.model, wildcards.variant, wildcards.method, int(wildcards.seed))
        return f"{d}/metrics.json"
    return init
