"""Paper-scale loading code on a small local fixture; config errors name their key before any work."""

import json

import pytest

from gradfidelity.errors import UserError
from gradfidelity.studies.sft_rl import paper, plan
from gradfidelity.studies.sft_rl.config import StudyConfig

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
    cfg = paper.DataConfig.from_dict({"source": "luffy", "train": str(train), "eval": str(evals),
                                      "fields": FIELDS, "groups": GROUPS})
    (p,) = paper.train_problems(cfg)
    assert (p.prompt, p.answer) == ("What is 1+1?", "2") and "\\boxed{2}" in p.solution
    sets = paper.eval_problems(cfg)
    assert [q.prompt for q in sets["id"]] == ["p1", "p4"] and sets["long"][0].answer == "\\frac{1}{2}"
    bad = paper.DataConfig.from_dict({"source": "luffy", "train": str(train), "eval": str(evals), "fields": FIELDS,
                                      "groups": {**GROUPS, "ood": ["MMLU-Pro"]}})
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
])
def test_bad_config_names_the_key(patch, key):
    with pytest.raises(UserError, match=key):
        StudyConfig.from_dict({**BASE, **patch})


def test_plan_shares_fixed_runs_and_routes_sft_then_rl():
    raw = {**BASE, "methods": ["sft", "sft_then_rl", "sft_then_rl_truncated", "luffy"],
           "variants": ["fixed", "ds_bug", "agg_bug", "both"], "bug_stages": ["sft"]}
    runs = plan.planned_runs(raw, "R")
    assert "R/m/both/luffy/seed0/metrics.json" not in runs          # luffy never touches the buggy stage
    assert "R/m/fixed/luffy/seed0/metrics.json" in runs
    assert "R/m/both/sft_then_rl/seed0/metrics.json" in runs        # its SFT stage is buggy
    assert plan.init_dir(raw, "R", "m", "both", "sft_then_rl", 0) == "R/m/both/sft/seed0"
    assert plan.cell_dir(raw, "R", "m", "both", "sft_then_rl_truncated", 0) == "R/m/both/sft_then_rl/seed0"
    assert sum("/sft/" in r for r in runs) == 4                     # the ablation: SFT on every variant
    raw_rl = {**raw, "bug_stages": ["sft", "rl"]}
    assert "R/m/both/luffy/seed0/metrics.json" in plan.planned_runs(raw_rl, "R")


def test_jobs_get_only_the_sections_they_depend_on():
    """An RL-only edit (rl.steps, seeds, methods) leaves the base and SFT jobs' --cfg unchanged, so Snakemake
    reruns only the jobs it changes; each job's section still builds a StudyConfig."""
    import copy

    import yaml

    from gradfidelity.studies.sft_rl.config import StudyConfig
    from gradfidelity.studies.sft_rl.workflow import job_cfg, job_section

    root = __import__("pathlib").Path(__file__).resolve().parents[2]
    cfg = yaml.safe_load((root / "config" / "smoke" / "sft_rl.yaml").read_text())
    edited = copy.deepcopy(cfg)
    edited["rl"]["steps"] += 5
    edited["seeds"] = [0, 1, 2]
    edited["methods"] = ["sft", "rl"]
    for job in ("pretrain", "sft"):
        assert job_cfg(edited, job) == job_cfg(cfg, job), job
    assert job_cfg(edited, "rl") != job_cfg(cfg, "rl")
    edited = copy.deepcopy(cfg)
    edited["sft"]["steps"] += 1
    assert job_cfg(edited, "pretrain") == job_cfg(cfg, "pretrain") and job_cfg(edited, "sft") != job_cfg(cfg, "sft")
    for job in ("pretrain", "sft", "rl"):
        sec = job_section(cfg, job)
        assert "seeds" not in sec and "methods" not in sec
        StudyConfig.from_dict(sec)
