"""A run killed after a checkpoint and rerun ends with exactly the metrics of an uninterrupted run.

SFT through the real path (TRL SFTTrainer on DeepSpeed ZeRO-2 + CPU offload, 0.19.8), checkpoint every 2 of 4
optimizer steps; the "kill" is an exception raised inside the training loop at step 3 (after the step-2
checkpoint, before the step-4 one), which leaves the run directory as SIGKILL would (no metrics.json).
"""

import json

import pytest

from gradfidelity.studies.sft_rl import models
from gradfidelity.studies.sft_rl import train as training
from gradfidelity.studies.sft_rl.callbacks import GF_STATE, HarnessCallback
from tests.sft_rl._config import make_cfg

pytestmark = [pytest.mark.slow, pytest.mark.deepspeed]

CFG = {
    "models": [{"name": "t", "arch": "llama", "hidden_size": 32, "num_layers": 1, "num_heads": 2,
                "num_kv_heads": 1, "intermediate_size": 64}],
    "seeds": [0], "methods": ["sft"], "variants": ["fixed"],
    "task": {"n_train": 32, "n_eval": 4},
    "sft": {"steps": 4, "micro_batch_size": 2, "grad_accum": 2, "lr": 0.01},
    "checkpoint_every": 2, "eval_batch_size": 4,
}


class SimulatedKill(Exception):
    pass


@pytest.mark.parametrize("damaged", [False, True], ids=["intact", "damaged-checkpoint"])
def test_kill_and_rerun_gives_identical_metrics(tmp_path, monkeypatch, damaged):
    """Intact: the rerun resumes from step 2. Damaged (one byte of the checkpoint's weights flipped): the checkpoint
    fails its manifest check, is moved aside with a log line, and the rerun starts from step 0, ending with the same
    metrics: never a silently different number."""
    cfg = make_cfg(CFG)
    tok = models.build_tokenizer()
    models.save_checkpoint(models.build_tiny_model(cfg.models[0], tok, seed=0), tok, tmp_path / "base" / "model")

    straight = training.run_sft(cfg, "t", "fixed", 0, tmp_path / "base", tmp_path / "straight")

    original = HarnessCallback.on_step_end

    def kill_at_3(self, args, state, control, **kw):
        if state.global_step == 3:
            raise SimulatedKill
        return original(self, args, state, control, **kw)

    monkeypatch.setattr(HarnessCallback, "on_step_end", kill_at_3)
    with pytest.raises(SimulatedKill):
        training.run_sft(cfg, "t", "fixed", 0, tmp_path / "base", tmp_path / "killed")
    assert not (tmp_path / "killed" / "metrics.json").exists()
    assert (tmp_path / "killed" / "trainer" / "checkpoint-2").is_dir()
    monkeypatch.setattr(HarnessCallback, "on_step_end", original)
    ckpt = tmp_path / "killed" / "trainer" / "checkpoint-2"
    if damaged:
        weights = next(p for p in sorted(ckpt.rglob("*")) if p.suffix in (".safetensors", ".bin", ".pt"))
        blob = bytearray(weights.read_bytes())
        blob[len(blob) // 2] ^= 0x01
        weights.write_bytes(bytes(blob))

    resumed = training.run_sft(cfg, "t", "fixed", 0, tmp_path / "base", tmp_path / "killed")
    prov = json.loads((tmp_path / "killed" / "provenance.json").read_text())
    if damaged:
        assert prov["resumed_from_step"] is None
        [discarded] = prov["checkpoints_discarded"]
        assert "damaged" in discarded["reason"]
        assert (ckpt.parent / discarded["moved_to"]).is_dir()
        assert "failed its check" in (tmp_path / "killed" / "log.txt").read_text()
    else:
        assert prov["resumed_from_step"] == 2 and prov["checkpoints_discarded"] == []
    assert len(straight["loss_history"]) == 4
    for key in ("loss_history", "grad_norm_history", "train_tokens", "flops", "acc_id", "acc_long", "acc_ood"):
        assert resumed[key] == straight[key], key


def test_grpo_mixed_policy_kill_and_rerun_identical(tmp_path, monkeypatch):
    """The same for the RL stage (ReLIFT: GRPOTrainer subclass whose buffer must survive the restart), with an
    evaluation at step 1 (rl.eval_steps), made before the checkpoint the rerun resumes from: it is restored."""
    raw = {**CFG, "methods": ["relift"], "rl": {"steps": 4, "prompts_per_step": 2, "num_generations": 2,
                                                "max_completion_length": 8, "eval_steps": [1]},
           "mixed": {"relift_buffer_size": 3}}
    cfg = make_cfg(raw)
    tok = models.build_tokenizer()
    base = tmp_path / "base"
    models.save_checkpoint(models.build_tiny_model(cfg.models[0], tok, seed=0), tok, base / "model")
    (base / "metrics.json").write_text(json.dumps({"status": "ok", "metrics": {"flops": 0.0}}))

    straight = training.run_rl(cfg, "t", "fixed", "relift", 0, base, tmp_path / "straight")

    original = HarnessCallback.on_step_end

    def kill_at_3(self, args, state, control, **kw):
        if state.global_step == 3:
            raise SimulatedKill
        return original(self, args, state, control, **kw)

    monkeypatch.setattr(HarnessCallback, "on_step_end", kill_at_3)
    with pytest.raises(SimulatedKill):
        training.run_rl(cfg, "t", "fixed", "relift", 0, base, tmp_path / "killed")
    monkeypatch.setattr(HarnessCallback, "on_step_end", original)
    state = json.loads((tmp_path / "killed" / "trainer" / "checkpoint-2" / GF_STATE).read_text())
    assert "buffer" in state and state["tokens"]["gen"] > 0
    assert list(state["extras"]["at_step"]) == ["1"]

    resumed = training.run_rl(cfg, "t", "fixed", "relift", 0, base, tmp_path / "killed")
    for key in ("reward_history", "loss_history", "train_tokens", "gen_tokens", "flops", "acc_id", "acc_long",
                "acc_ood", "at_step"):
        assert resumed[key] == straight[key], key
