"""The typed config (schema and dataclasses agree; what the schema cannot say is refused, naming the key), the plan
(the cells and run paths of every scale) and the rules (each job's --cfg holds only the keys it reads, so an edit
reruns only the jobs that read it)."""

from __future__ import annotations

import json
import shlex

import pytest
import yaml

from gradfidelity.config import SCHEMAS, schema_mismatches
from gradfidelity.errors import UserError
from gradfidelity.studies.local import config, plan, rules
from tests.local._config import REPO, section, study


def test_schema_and_dataclasses_agree():
    schema = yaml.safe_load((SCHEMAS / "local.schema.yaml").read_text())
    assert schema_mismatches(config.StudyConfig, schema) == []
    assert set(rules.JOB_KEYS["train"]) | {k for keys in rules.JOB_KEYS.values() for k in keys} <= \
        set(schema["properties"])


@pytest.mark.parametrize("scale", ["smoke", "cpu", "paper"])
def test_every_scale_loads(scale):
    cfg = config.load(yaml.safe_load((REPO / "config" / scale / "local.yaml").read_text()))
    assert cfg.train.n_layer % cfg.train.n_stages == 0 and cfg.bench is not None


@pytest.mark.parametrize("top,key", [
    ({"train": {"n_layer": 5, "n_stages": 2, "n_head": 2}}, "local.train.n_layer=5"),
    ({"widths": [32, 64], "main_width": 48}, "local.main_width=48"),
    ({"widths": [18], "main_width": 18, "train": {"n_layer": 2, "n_stages": 2, "n_head": 4}}, "local.widths: 18"),
    ({"methods": ["rgc_async"]}, "local.methods"),
    ({"corpora": {"enwik8": {"source": "file"}}}, "local.corpora.enwik8.path"),
])
def test_cross_field_checks_name_the_key(top, key):
    with pytest.raises(UserError, match=key.replace(".", r"\.")):
        study(**top)


def test_smoke_plan():
    cfg = config.load(yaml.safe_load((REPO / "config" / "smoke" / "local.yaml").read_text()))
    runs = plan.runs(cfg, "results/smoke")
    # enwik8 at widths 32 and 64, tinystories at 64; 2 seeds; 4 main methods; the mechanism cell: 3 methods x 2 seeds
    assert len(runs) == (2 + 1) * 2 * 4 + 2 * 3 and len(set(runs)) == len(runs)
    assert runs[0] == "results/smoke/local/enwik8/w32/bp/seed0/metrics.json"
    assert runs[-1] == "results/smoke/local/enwik8/w64/rgc_serial/seed1/metrics.json"
    assert plan.groups(cfg) == {"main": ["bp", "bp_tm", "broadcast_async", "rgc_async"],
                                "mechanism": ["live_local", "broadcast_serial", "rgc_serial"]}


def test_seeds_per_cell():
    """The corpus's own count, capped by side_seeds away from the main width; mechanism_seeds for the serial cell."""
    cfg = study(widths=[32, 64], main_width=64, seeds=5, side_seeds=3, mechanism_seeds=2, mechanism_widths=[64],
                corpora={"enwik8": {"source": "embedded"}, "tinystories": {"source": "embedded", "widths": [64],
                                                                         "seeds": 4}})
    assert {k: len(v) for k, v in plan.cell_seeds(cfg).items()} == {
        ("enwik8", 32): 3, ("enwik8", 64): 5, ("tinystories", 64): 4}
    assert len(plan.mechanism_seeds(cfg)) == 2
    assert plan.corpus_widths(cfg) == {"enwik8": (32, 64), "tinystories": (64,)}


def _cfgs(sec: dict) -> dict[str, str]:
    """The --cfg of every job as the rules make it (local_data's: only its corpus's entry)."""
    out = {job: rules.job_cfg(sec, job) for job in rules.JOB_KEYS if job != "data"}
    for corpus in config.CORPORA:
        out[f"data {corpus}"] = rules.data_cfg(sec)(type("W", (), {"corpus": corpus})())
    return out


def _changed(edit: dict) -> set[str]:
    base = section(corpora={"enwik8": {"source": "embedded"}, "tinystories": {"source": "embedded"}})
    before, after = _cfgs(base), _cfgs(section(**{**base, **edit}))
    return {job for job in before if before[job] != after[job]}


def test_an_edit_reruns_only_the_jobs_that_read_it():
    """Snakemake reruns a job whose params changed: the training jobs' --cfg must not move with an analysis key."""
    assert _changed({"margin_pct": 2.0}) == {"tables", "figures", "claims"}
    assert _changed({"equivalence_bpb": 0.01}) == {"tables", "claims"}
    assert _changed({"seeds": 3, "side_seeds": 2}) == set()  # the plan: more or fewer jobs, none rerun
    assert _changed({"train": {"n_layer": 2, "n_stages": 2, "n_head": 2, "steps": 7}}) == {"train", "tables", "bench"}
    assert _changed({"corpora": {"enwik8": {"source": "embedded"},
                                 "tinystories": {"source": "embedded", "embedded_bytes": 5}}}) == {"data tinystories"}
    assert _changed({"corpora": {"enwik8": {"source": "embedded"},
                                 "tinystories": {"source": "embedded", "seeds": 1, "widths": [16]}}}) == set()


def test_a_job_cfg_builds_its_typed_config_with_the_rest_none():
    cfg = config.load_job(json.loads(shlex.split(rules.job_cfg(section(), "train"))[0]), "train")
    assert cfg.train.n_layer == 2 and cfg.margin_pct is None and cfg.corpora is None
    with pytest.raises(UserError, match="local.train"):
        config.load_job({"margin_pct": 1.0}, "train")
    data = rules.data_cfg(section())(type("W", (), {"corpus": "enwik8"})())
    corpora = config.load_job(json.loads(shlex.split(data)[0]), "data").corpora
    assert corpora.tinystories is None and corpora.enwik8.source == "embedded" and corpora.enwik8.seeds is None


def test_threads_and_environment():
    cfg = study(train={"n_layer": 4, "n_stages": 4, "n_head": 2, "threads_per_stage": 3,
                       "omp_wait_policy": "PASSIVE"})
    assert rules.threads(cfg, 2) == 12 and rules.threads(cfg, 16) == 16
    assert rules.omp_env(cfg) == "OMP_WAIT_POLICY=PASSIVE " and rules.omp_env(study()) == ""
