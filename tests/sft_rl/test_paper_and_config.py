"""Paper-scale loading code on a small local fixture; config errors name their key before any work; the typed config
agrees with its schema; each job gets, and builds, only the sections it reads."""

import copy
import json
from pathlib import Path

import pytest
import yaml

from gradfidelity.config import schema_mismatches, validate_section
from gradfidelity.errors import UserError
from gradfidelity.studies.sft_rl import config, paper, plan
from gradfidelity.studies.sft_rl.rules import JOB_KEYS, job_cfg, job_section
from tests.sft_rl._config import make_cfg

REPO = Path(__file__).resolve().parents[2]
SCHEMA = yaml.safe_load((REPO / "workflow" / "schemas" / "sft_rl.schema.yaml").read_text())

FIELDS = {"prompt": "prompt", "solution": "target", "answer": "reward_model", "benchmark": "data_source"}
GROUPS = {"id": ["MATH-500"], "long": ["AIME24"], "ood": ["GPQA-diamond"]}


def _write_jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_luffy_style_loading_from_local_files(tmp_path):
    train = _write_jsonl(tmp_path / "train.jsonl", [
        {"prompt": [{"role": "user", "content": "What is 1+1?"}],
         "target": [{"role": "assistant", "content": "1+1 = 2, so \\boxed{2}"}],
         "reward_model": {"ground_truth": "2"}},
    ])
    evals = _write_jsonl(tmp_path / "valid.jsonl", [
        {"prompt": "p1", "reward_model": {"ground_truth": "4"}, "data_source": "MATH-500"},
        {"prompt": "p2", "reward_model": {"ground_truth": "\\frac{1}{2}"}, "data_source": "AIME24"},
        {"prompt": "p3", "reward_model": {"ground_truth": "B"}, "data_source": "GPQA-diamond"},
        {"prompt": "p4", "reward_model": {"ground_truth": "7"}, "data_source": "MATH-500"},
    ])
    cfg = make_cfg({"data": {"source": "luffy", "train": str(train), "eval": str(evals), "fields": FIELDS,
                             "groups": GROUPS}}).data
    (p,) = paper.train_problems(cfg)
    assert (p.prompt, p.answer) == ("What is 1+1?", "2") and "\\boxed{2}" in p.solution
    sets = paper.eval_problems(cfg)
    assert [q.prompt for q in sets["id"]] == ["p1", "p4"] and sets["long"][0].answer == "\\frac{1}{2}"
    bad = make_cfg({"data": {"source": "luffy", "train": str(train), "eval": str(evals), "fields": FIELDS,
                             "groups": {**GROUPS, "ood": ["MMLU-Pro"]}}}).data
    with pytest.raises(UserError, match="MMLU-Pro"):
        paper.eval_problems(bad)


def test_boxed_checker():
    assert paper.boxed_answer("so \\boxed{\\frac{1}{2}} done") == "\\frac{1}{2}"
    assert paper.is_correct_boxed("\\boxed{1} then \\boxed{ $2$ }", "2")
    assert not paper.is_correct_boxed("the answer is 2", "2")
    assert not paper.is_correct_boxed("\\boxed{2", "2")


BASE = {"models": [{"name": "m"}], "seeds": [0], "methods": ["sft"], "variants": ["fixed"]}


@pytest.mark.parametrize("patch,key", [
    ({"methods": ["sft", "lufy"]}, "sft_rl.methods"),
    ({"variants": ["fixd"]}, "sft_rl.variants"),
    ({"bug_stages": ["pretrain"]}, "sft_rl.bug_stages"),
    ({"rl": {"num_generations": 1}}, "num_generations"),
    ({"sft": {"stepz": 3}}, "sft_rl.sft"),
    ({"models": [{"name": "m", "arch": "gpt2"}]}, "arch"),
    ({"deepspeed": {"offload_optimizer": "gpu"}}, "offload_optimizer"),
    ({"data": {"source": "luffy"}}, "sft_rl.data"),
    ({"task": {"train_ops": [3, 2]}}, "sft_rl.task.train_ops"),
    ({"models": [{"name": "m", "hidden_size": 30, "num_heads": 4}]}, r"sft_rl.models\[m\]"),
    ({"models": [{"name": "m"}, {"name": "m"}]}, "names must be unique"),
    ({"data": {"groups": {"id": ["a"], "long": ["b"]}}}, "sft_rl.data.groups"),
])
def test_bad_config_names_the_key(patch, key):
    with pytest.raises(UserError, match=key):
        config.load({**BASE, **patch})


def test_schema_and_typed_config_agree():
    """Every schema key is a dataclass field and back, and no default sits in a dataclass (the schema has them)."""
    assert schema_mismatches(config.StudyConfig, SCHEMA) == []
    assert schema_mismatches(config.ModelConfig, SCHEMA["properties"]["models"]["items"], "models[]") == []


def test_cross_field_checks_are_the_schemas_complement():
    """What the schema cannot say is checked when the section is built: a range whose bounds cross, a head count that
    does not divide the width (a tiny model only: a paper model's sizes are its hub config's), two models of one
    name, luffy data without its files."""
    assert config.load({**BASE, "models": [{"name": "p", "hub_id": "x/y", "hidden_size": 30}]}).models[0].hub_id
    assert config.load({**BASE, "task": {"train_ops": [3, 3]}}).task.train_ops == (3, 3)
    for bad in ({"task": {"long_ops": [0, 2]}}, {"data": {"source": "luffy", "train": "t.jsonl"}}):
        with pytest.raises(UserError):
            config.load({**BASE, **bad})


def test_plan_shares_fixed_runs_and_routes_sft_then_rl():
    raw = {**BASE, "methods": ["sft", "sft_then_rl", "sft_then_rl_truncated", "luffy"],
           "variants": ["fixed", "ds_bug", "agg_bug", "both"], "bug_stages": ["sft"]}
    cfg = config.load(raw)
    runs = plan.planned_runs(cfg, "R")
    assert "R/m/both/luffy/seed0/metrics.json" not in runs          # luffy never touches the buggy stage
    assert "R/m/fixed/luffy/seed0/metrics.json" in runs
    assert "R/m/both/sft_then_rl/seed0/metrics.json" in runs        # its SFT stage is buggy
    assert plan.init_dir(cfg, "R", "m", "both", "sft_then_rl", 0) == "R/m/both/sft/seed0"
    assert plan.cell_dir(cfg, "R", "m", "both", "sft_then_rl_truncated", 0) == "R/m/both/sft_then_rl/seed0"
    assert sum("/sft/" in r for r in runs) == 4                     # the ablation: SFT on every variant
    cfg_rl = config.load({**raw, "bug_stages": ["sft", "rl"]})
    assert "R/m/both/luffy/seed0/metrics.json" in plan.planned_runs(cfg_rl, "R")
    assert plan.alignment_metrics(cfg, "R") == "R/m/alignment/seed0/metrics.json"  # what ds_audit's A3 reads


def _smoke_section() -> dict:
    """config/smoke/sft_rl.yaml as the workflow holds it: validated, the schema's defaults filled."""
    return validate_section(yaml.safe_load((REPO / "config" / "smoke" / "sft_rl.yaml").read_text()),
                            REPO / "workflow" / "schemas" / "sft_rl.schema.yaml", "sft_rl")


def test_jobs_get_only_the_sections_they_depend_on():
    """An RL-only edit (rl.steps, seeds, methods) leaves the base and SFT jobs' --cfg unchanged, so Snakemake
    reruns only the jobs it changes; an edit of what only the analysis reads (methods) reruns no training job."""
    cfg = _smoke_section()
    edited = copy.deepcopy(cfg)
    edited["rl"]["steps"] += 5
    edited["seeds"] = [0, 1, 2]
    edited["methods"] = ["sft", "rl"]
    for job in ("pretrain", "sft", "alignment"):
        assert job_cfg(edited, job) == job_cfg(cfg, job), job
    assert job_cfg(edited, "rl") != job_cfg(cfg, "rl")
    edited = copy.deepcopy(cfg)
    edited["sft"]["steps"] += 1
    assert job_cfg(edited, "pretrain") == job_cfg(cfg, "pretrain") and job_cfg(edited, "sft") != job_cfg(cfg, "sft")
    assert job_cfg(edited, "rl") == job_cfg(cfg, "rl") and job_cfg(edited, "aggregate") == job_cfg(cfg, "aggregate")
    edited = copy.deepcopy(cfg)
    edited["methods"] = ["sft", "sft_then_rl"]
    changed = {job for job in JOB_KEYS if job_cfg(edited, job) != job_cfg(cfg, job)}
    assert changed == {"aggregate", "tables", "figures", "claims", "compare"}
    for job in ("pretrain", "sft", "rl", "alignment"):
        assert {"seeds", "methods", "variants", "ranks"}.isdisjoint(job_section(cfg, job)), job


@pytest.mark.parametrize("job", sorted(JOB_KEYS))
def test_each_job_builds_exactly_its_sections(job):
    """A job's --cfg builds a typed config in which the sections it was not given are None (never a default), and
    what the run records is exactly what the rule passed."""
    section = job_section(_smoke_section(), job)
    cfg = config.load_job(section, JOB_KEYS[job])
    given = set(JOB_KEYS[job])
    for name in config.StudyConfig.__dataclass_fields__:
        assert (getattr(cfg, name) is None) == (name not in given), name
    assert json.dumps(cfg.record(), sort_keys=True) == json.dumps(section, sort_keys=True)
    with pytest.raises(UserError, match="missing"):
        config.load_job({k: v for k, v in section.items() if k != JOB_KEYS[job][0]}, JOB_KEYS[job])
    other = next(k for k in config.StudyConfig.__dataclass_fields__ if k not in given)
    with pytest.raises(UserError, match="not read"):
        config.load_job({**section, other: _smoke_section()[other]}, JOB_KEYS[job])
