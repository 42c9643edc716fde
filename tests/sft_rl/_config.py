"""Typed configs for the sft_rl tests: a partial section completed by the schema's defaults (the one place they live),
through the study's own loader, so a test config is checked as the workflow's is."""

from gradfidelity.studies.sft_rl.config import StudyConfig, TaskConfig, load

METHODS = ["sft", "rl", "sft_then_rl", "sft_then_rl_truncated", "luffy", "srft", "relift", "hpt"]
VARIANTS = ["fixed", "ds_bug", "agg_bug", "both"]


def make_cfg(section: dict) -> StudyConfig:
    """`section` over the schema's required keys (one model `m`, seed 0, every method and variant)."""
    return load({"models": [{"name": "m"}], "seeds": [0], "methods": METHODS, "variants": VARIANTS, **section})


def task_cfg(**task) -> TaskConfig:
    """A TaskConfig with the schema's defaults for every key not given."""
    return make_cfg({"task": task}).task
