"""Typed configs for the tests of study C, made the way the workflow makes them: a small section, validated by the
schema (which fills its defaults), then `config.load`; so no test spells out every key and none depends on a
default written anywhere but the schema."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from gradfidelity.config import SCHEMAS, validate_section
from gradfidelity.studies.local import config, rules

REPO = Path(__file__).resolve().parents[2]
BASE = {"widths": [16], "main_width": 16, "seeds": 1, "methods": list(config.METHODS),
        "corpora": {"enwik8": {"source": "embedded"}}, "train": {"n_layer": 2, "n_stages": 2, "n_head": 2}}


def section(**top) -> dict:
    """The validated `local` section: BASE with `top` replacing its top-level keys, the schema's defaults filled."""
    return validate_section({**copy.deepcopy(BASE), **copy.deepcopy(top)}, SCHEMAS / "local.schema.yaml", "local")


def study(**top) -> config.StudyConfig:
    return config.load(section(**top))


def train(**keys) -> config.TrainConfig:
    """local.train with `keys` set (the rest the schema's defaults)."""
    return study(train=keys).train


def corpus(**keys) -> config.CorpusConfig:
    """One entry of local.corpora with `keys` set."""
    return study(corpora={"enwik8": keys}).corpora.enwik8


def job_json(job: str, **top) -> str:
    """The `--cfg` the rules give `job` for this section."""
    return json.dumps(rules.job_section(section(**top), job), sort_keys=True)
