"""The runs the plan does not repeat, checked against their twins (plan.rl_run_variant, plan.cell_run):

1. A mixed-policy arm starts from the base model and trains with GA 1, so neither bug can act on it: a table cell
   (both, luffy) reads the (fixed, luffy) run. Checked here the hard way: the arm run on the buggy infrastructure
   itself (bug_stages [sft, rl]: DeepSpeed 0.18.9 through the overlay, as the rule runs it, and the per-micro-batch
   loss) ends with bit-identical metrics to the fixed run.
2. The truncated SFT-then-RL is the sft_then_rl run evaluated at step k (constant LR, one RNG stream): its record
   equals a run of its own that stops at step k.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gradfidelity.studies.sft_rl import models
from gradfidelity.studies.sft_rl import train as training
from gradfidelity.studies.sft_rl.rules import JOB_KEYS
from tests.sft_rl._config import make_cfg

pytestmark = [pytest.mark.slow, pytest.mark.deepspeed]

REPO = Path(__file__).resolve().parents[2]
OVERLAY = REPO / ".venv-ds0189"
CFG = {
    "models": [{"name": "t", "arch": "qwen2", "hidden_size": 32, "num_layers": 1, "num_heads": 2,
                "num_kv_heads": 1, "intermediate_size": 64}],
    "seeds": [0], "methods": ["sft_then_rl", "sft_then_rl_truncated", "luffy"], "variants": ["fixed", "both"],
    "task": {"n_train": 32, "n_eval": 8, "n_rl": 16},
    "rl": {"steps": 4, "prompts_per_step": 2, "num_generations": 4, "max_completion_length": 8,
           "truncated_fraction": 0.5, "length_groups": 2},
    "checkpoint_every": 0, "eval_batch_size": 8,
}
COMPARED = ("reward_history", "loss_history", "zero_adv_history", "train_tokens", "gen_tokens", "demo_tokens",
            "flops", "acc_id", "acc_long", "acc_ood")


def _base(tmp_path: Path, cfg) -> Path:
    tok = models.build_tokenizer()
    base = tmp_path / "base"
    models.save_checkpoint(models.build_tiny_model(cfg.models[0], tok, seed=0), tok, base / "model")
    (base / "metrics.json").write_text(json.dumps({"status": "ok", "metrics": {"flops": 0.0}}))
    return base


def _rl_cli(cfg_raw: dict, variant: str, base: Path, out: Path, overlay: bool) -> dict:
    """One RL-stage job as the rule runs it: the CLI in a fresh process, the 0.18.9 overlay first when asked."""
    section = {k: v for k, v in make_cfg(cfg_raw).record().items() if k in JOB_KEYS["rl"]}
    # a fresh process group of its own: an earlier in-process run of this pytest session set MASTER_PORT & co.
    rendezvous = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    env = {**{k: v for k, v in os.environ.items() if k not in rendezvous}, "DS_ACCELERATOR": "cpu"}
    if overlay:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(OVERLAY), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "gradfidelity", "sft-rl-rl", "--cfg", json.dumps(section), "--model", "t",
           "--variant", variant, "--method", "luffy", "--seed", "0", "--init", str(base), "--run-dir", str(out),
           "--cell", json.dumps({"model": "t", "variant": variant, "method": "luffy", "seed": "0"})]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "metrics.json").read_text())["metrics"]


def test_mixed_arm_on_buggy_infrastructure_equals_the_fixed_run(tmp_path):
    raw = {**CFG, "bug_stages": ["sft", "rl"]}
    base = _base(tmp_path, make_cfg(raw))
    fixed = _rl_cli(raw, "fixed", base, tmp_path / "fixed", overlay=False)
    both = _rl_cli(raw, "both", base, tmp_path / "both", overlay=True)
    assert fixed["deepspeed_version"] != both["deepspeed_version"] == "0.18.9"
    assert both["infra"] == "both" and both["loss_type"] == "bnpo" and fixed["loss_type"] == "dapo"
    assert len(fixed["reward_history"]) == CFG["rl"]["steps"]
    assert len(set(fixed["loss_history"])) > 1  # the weights moved: a comparison that could fail
    for key in COMPARED:
        assert both[key] == fixed[key], key


def test_truncated_arm_equals_a_run_that_stops_at_its_step(tmp_path):
    cfg = make_cfg(CFG)
    base = _base(tmp_path, cfg)
    sft = tmp_path / "sft"  # SFT-then-RL's start: any finished run with the records run_rl reads
    models.save_checkpoint(models.load_checkpoint(base / "model")[0], models.build_tokenizer(), sft / "model")
    (sft / "metrics.json").write_text(json.dumps({"status": "ok", "metrics": {"flops": 5.0, "demo_tokens": 7}}))
    long = training.run_rl(cfg, "t", "fixed", "sft_then_rl", 0, sft, tmp_path / "long")
    k = cfg.truncated_steps
    assert k == 2 and long["truncated"]["rl_steps"] == k
    short_cfg = make_cfg({**CFG, "rl": {**CFG["rl"], "steps": k}})
    short = training.run_rl(short_cfg, "t", "fixed", "sft_then_rl", 0, sft, tmp_path / "short")
    assert short["reward_history"] == long["reward_history"][:k]
    for key in ("acc_id", "acc_long", "acc_ood", "flops", "gen_tokens", "demo_tokens"):
        assert long["truncated"][key] == short[key], key


def test_smaller_budget_equals_a_run_of_that_budget_and_leaves_the_long_run_unchanged(tmp_path):
    """rl.eval_steps: the 4-step run evaluated at step 2 is the 2-step run (a mixed arm, from the base model), and
    evaluating inside the run moves nothing after it (the same run without the evaluation ends with the same
    record), so a longer budget doubles as a check of the committed shorter one."""
    raw = {**CFG, "rl": {**CFG["rl"], "eval_steps": [2]}}
    cfg = make_cfg(raw)
    assert cfg.budgets == [2, 4] and cfg.eval_steps_of("luffy") == [2]
    assert cfg.eval_steps_of("sft_then_rl") == [1, 2]  # step 1: the truncated arm at budget 2
    base = _base(tmp_path, cfg)
    long = training.run_rl(cfg, "t", "fixed", "luffy", 0, base, tmp_path / "long")
    short = training.run_rl(make_cfg({**CFG, "rl": {**CFG["rl"], "steps": 2}}), "t", "fixed", "luffy", 0, base,
                            tmp_path / "short")
    plain = training.run_rl(make_cfg(CFG), "t", "fixed", "luffy", 0, base, tmp_path / "plain")
    assert long["rl_steps"] == 4 and list(long["at_step"]) == ["2"] and long["at_step"]["2"]["rl_steps"] == 2
    assert "at_step" not in plain and short["reward_history"] == long["reward_history"][:2]
    for key in ("acc_id", "acc_long", "acc_ood", "nll_id", "flops", "gen_tokens", "demo_tokens"):
        assert long["at_step"]["2"][key] == short[key], key
    assert len(set(long["loss_history"])) > 1  # the weights moved after step 2: the next check could fail
    for key in COMPARED:
        assert long[key] == plain[key], key


def test_eval_steps_outside_the_run_are_refused():
    from gradfidelity.errors import UserError

    for bad in ([4], [0], [2, 2]):
        with pytest.raises(UserError, match="rl.eval_steps"):
            make_cfg({**CFG, "rl": {**CFG["rl"], "eval_steps": bad}})
