"""Shared config fixtures of study B's tests (a helper module, not a test module): the smoke section as the
workflow sees it (schema-validated, defaults filled) and typed, and a small-model factory on top of it."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path

import yaml

from gradfidelity.config import validate_section
from gradfidelity.studies.async_pp.config import ModelConfig, StudyConfig, load

REPO = Path(__file__).resolve().parents[2]
SCHEMA_PATH = REPO / "workflow" / "schemas" / "async_pp.schema.yaml"
SMOKE = yaml.safe_load((REPO / "config" / "smoke" / "async_pp.yaml").read_text())  # the raw YAML section


def validated(section: dict = SMOKE) -> dict:
    """The section as the workflow holds it (schema defaults filled): what the rules cut each job's --cfg from."""
    return validate_section(copy.deepcopy(section), SCHEMA_PATH, "async_pp")


def study(section: dict = SMOKE, **top) -> StudyConfig:
    """The typed smoke config, with top-level keys replaced (e.g. seeds=3)."""
    return load({**copy.deepcopy(section), **top})


def model_config(**fields) -> ModelConfig:
    """The smoke model with some fields changed (the schema's defaults for the rest: RoPE base, eps, init std)."""
    return replace(study().model, **fields)
