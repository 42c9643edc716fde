"""The typed config of study B: schema and dataclasses agree, every committed config loads, cross-field checks name
their key, and a job's config holds only the sections it was given."""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from gradfidelity.config import schema_mismatches
from gradfidelity.errors import UserError
from gradfidelity.studies.async_pp.config import StudyConfig, load, load_job
from gradfidelity.studies.async_pp.rules import job_section
from tests.async_pp._cfg import REPO, SCHEMA_PATH, SMOKE, validated


def test_schema_and_dataclasses_agree():
    assert schema_mismatches(StudyConfig, yaml.safe_load(SCHEMA_PATH.read_text())) == []


@pytest.mark.parametrize("scale", ["smoke", "cpu", "paper"])
def test_every_committed_config_loads(scale):
    cfg = load(yaml.safe_load((REPO / "config" / scale / "async_pp.yaml").read_text()))
    assert cfg.model.rope_theta == 10000.0  # a schema default, filled: the dataclass has none
    assert all(isinstance(m, float) for m in cfg.lr_selection.multipliers)  # YAML's 1 for a float key


def _with(path: tuple[str, ...], value) -> dict:
    section = copy.deepcopy(SMOKE)
    node = section
    for k in path[:-1]:
        node = node.setdefault(k, {})
    node[path[-1]] = value
    return section


@pytest.mark.parametrize(("path", "value", "key"), [
    (("lr_selection", "seed"), 0, "async_pp.lr_selection.seed"),  # an evaluation seed (seeds: 1)
    (("sweeps", "depth", "depths"), [2, 64], "async_pp.sweeps.depth.depths"),  # > 2 * n_layers + 2 units
    (("model", "n_kv_heads"), 3, "async_pp.model.n_kv_heads"),  # 4 heads do not divide into 3 groups
    (("model", "n_heads"), 3, "async_pp.model.n_heads"),  # d_model 32 does not divide by 3
    (("model", "dropout"), 0.1, "async_pp.model"),  # unknown key (the schema's message)
    (("sweeps", "ladder", "steps"), [15, 30, 60], "async_pp.sweeps.ladder.steps"),  # no 2T = 120 for the gate
    (("sweeps", "ladder", "steps"), [30, 60, 120], "async_pp.sweeps.ladder.steps"),  # nothing below the 30 length
    (("sweeps", "ladder", "extend"), {"optimizers": ["muon"], "steps": [90]}, "async_pp.sweeps.ladder.extend.steps"),
    (("sweeps", "momentum"), {"optimizers": ["soap"], "momenta": [0.9, 0.98]},  # SOAP's fixed beta2 0.95
     "async_pp.sweeps.momentum.momenta"),
    (("data", "corpus"), "file", "async_pp.data.path"),  # a file corpus with FineWeb-Edu's hub id as its path
])
def test_cross_field_and_unknown_keys_fail_at_load_naming_the_key(path, value, key):
    with pytest.raises(UserError, match=f"'{key}"):
        load(_with(path, value))


def test_the_selection_seed_check_follows_the_number_of_seeds():
    load(_with(("lr_selection", "seed"), 3))  # seeds 0..0: seed 3 is free
    with pytest.raises(UserError, match="evaluation seeds 0..3"):
        load({**_with(("lr_selection", "seed"), 3), "seeds": 4})


def test_a_job_config_holds_only_its_sections():
    section = validated()
    cfg = load_job(json.loads(json.dumps(job_section(section, "train"))))
    assert cfg.model == load(SMOKE).model and cfg.train.steps == SMOKE["train"]["steps"]
    assert cfg.sweeps is None and cfg.delay is None and cfg.seeds is None
    cfg.need("model", "data", "train")
    with pytest.raises(UserError, match=r"needs the section\(s\) \['sweeps'\]"):
        cfg.need("model", "sweeps")
    with pytest.raises(UserError, match="async_pp.train.steps"):
        load_job({"train": {**section["train"], "steps": "many"}})


@pytest.mark.parametrize("scale", ["smoke", "cpu", "paper"])
def test_beta1_is_below_sqrt_beta2_at_every_momentum_point(scale):
    """Issue 25: round 2's AdamW at beta1 0.98 with beta2 0.95 broke beta1 < sqrt(beta2); the coupling keeps it at
    every point of every committed sweep, and at the default momentum it is nanoGPT's 0.95 exactly."""
    from gradfidelity.studies.async_pp.config import FIXED_BETA2, adam_beta2

    cfg = load(yaml.safe_load((REPO / "config" / scale / "async_pp.yaml").read_text()))
    for opt in cfg.sweeps.momentum.optimizers:
        for b1 in cfg.sweeps.momentum.momenta:
            b2 = adam_beta2(b1) if opt == "adamw" else FIXED_BETA2.get(opt)
            assert b2 is None or b1 < b2 ** 0.5, (opt, b1, b2)
    assert adam_beta2(0.9) == 0.95 and all(b < adam_beta2(b) ** 0.5 for b in (0.0, 0.5, 0.98, 0.999))
