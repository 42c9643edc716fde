"""Input functions for workflow/rules/ds_audit.smk (kept here, torch-free, so the rules file holds rules only)."""

from __future__ import annotations


def deepspeed_env(ds0189_env: str):
    """Command prefix selecting a group's DeepSpeed: the 0.18.9 overlay (DS0189_ENV), or nothing (installed)."""

    def env(wildcards) -> str:
        return ds0189_env if wildcards.version == "0.18.9" else ""

    return env


def group_threads(wildcards) -> int:
    """A group with r ranks runs r single-threaded processes."""
    return int(wildcards.ranks)
