"""Input and params functions of workflow/rules/async_pp.smk (torch-free; kept out of the .smk so that it holds
rules only). Each returns what one rule's job depends on, and nothing else, so that Snakemake's params trigger
reruns exactly the jobs an edit changes: a `bench` edit reruns no training, a `delay` edit only the cells whose
mitigation reads it."""

from __future__ import annotations

import json
import shlex

from gradfidelity.studies.async_pp.plan import TUNED

DELAY_READERS = ("sync_start", "sync_cooldown", "taylor")  # the mitigations whose settings live in `delay`


def sections(cfg: dict, *keys: str) -> str:
    """The named sub-sections of the async_pp config as one shell-quoted JSON string (`--cfg`)."""
    return shlex.quote(json.dumps({k: cfg[k] for k in keys}, sort_keys=True))


def train_input(selection: str):
    """A tuned cell waits for the LR selection; a grid cell (lr~x<m>) needs nothing."""

    def _input(wildcards):
        return [selection] if wildcards.lr == TUNED else []

    return _input


def train_cfg(cfg: dict):
    """model, data, train; plus delay for the cells whose mitigation reads it."""

    def _cfg(wildcards):
        extra = ["delay"] if wildcards.mitigation in DELAY_READERS else []
        return sections(cfg, "model", "data", "train", *extra)

    return _cfg


def lr_arg(wildcards, input) -> str:
    return f"--lr-selection {shlex.quote(str(input[0]))}" if wildcards.lr == TUNED else ""
