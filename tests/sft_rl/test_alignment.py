"""sft_rl.alignment: the Gram matrices of real SFT micro-batch gradients, against plain torch on the same batches.

The reference recomputes each micro-batch's gradient of the SFT loss (shifted next-token cross entropy on the label
tokens, divided by the window's label-token count: the fixed variant's global token mean) from the micro-batches the
Trainer fed (recorded in order) and builds <g_i, g_j> itself."""

import json

import pytest
import torch
import torch.nn.functional as F

from gradfidelity.errors import UserError
from gradfidelity.studies.sft_rl import models
from gradfidelity.studies.sft_rl.alignment import run_alignment, sft_trainer, window_grams
from tests.sft_rl._config import make_cfg

GA = 4
CFG = {
    "models": [{"name": "t", "arch": "qwen2", "hidden_size": 32, "num_layers": 1, "num_heads": 2,
                "num_kv_heads": 1, "intermediate_size": 64}],
    "task": {"n_train": 24, "n_eval": 4, "train_ops": [1, 6]},
    "sft": {"steps": 1, "micro_batch_size": 2, "grad_accum": GA, "lr": 1e-3},
    "alignment_windows": 2,
}


@pytest.fixture()
def base(tmp_path):
    cfg = make_cfg(CFG)
    tok = models.build_tokenizer()
    models.save_checkpoint(models.build_tiny_model(cfg.models[0], tok, seed=0), tok, tmp_path / "base" / "model")
    return cfg, tmp_path / "base"


def _reference_gram(model, batches) -> torch.Tensor:
    count = sum(int((b["labels"][:, 1:] != -100).sum()) for b in batches)
    grads = []
    for b in batches:
        model.zero_grad(set_to_none=True)
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits[:, :-1]
        nll = F.cross_entropy(logits.reshape(-1, logits.size(-1)), b["labels"][:, 1:].reshape(-1),
                              ignore_index=-100, reduction="sum")
        (nll / count).backward()
        grads.append(torch.cat([p.grad.flatten().double() for p in model.parameters()]))
    g = torch.stack(grads)
    return g @ g.T


def test_gram_matches_plain_torch_on_the_recorded_micro_batches(base, tmp_path):
    cfg, base_dir = base
    trainer = sft_trainer(cfg, base_dir, tmp_path / "trainer")
    trainer.recorded_inputs = []
    grams = window_grams(trainer, 2, GA)
    batches = trainer.recorded_inputs
    assert len(grams) == 2 and len(batches) == 2 * GA
    model, _ = models.load_checkpoint(base_dir / "model")
    for w in range(2):
        ref = _reference_gram(model, batches[w * GA:(w + 1) * GA])
        assert torch.allclose(grams[w], ref, rtol=1e-4, atol=1e-10), (grams[w], ref)
    assert not torch.allclose(grams[0], grams[1])  # two different windows, not one repeated


def test_run_writes_grams_and_refuses_more_windows_than_the_data_holds(base, tmp_path):
    cfg, base_dir = base
    metrics = run_alignment(cfg, "t", base_dir, tmp_path / "run")
    rec = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert rec["status"] == "ok" and rec["metrics"]["grad_accum"] == GA
    assert len(metrics["grams"]) == 2 and len(metrics["grams"][0]) == GA
    too_many = make_cfg({**CFG, "alignment_windows": 4})  # 24 problems / 2 = 12 micro-batches = 3 windows
    with pytest.raises(UserError, match="only 3 full windows"):
        run_alignment(too_many, "t", base_dir, tmp_path / "run2")
    assert not (tmp_path / "run2" / "metrics.json").exists()
