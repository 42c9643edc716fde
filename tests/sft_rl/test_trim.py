"""The RL stage's trimmed log-prob forward (trainers.GFGRPOTrainer, rl.length_groups) against TRL's own padded
forward: the same per-token log-probs, entropies, loss and gradient to float tolerance, on a batch laid out as TRL
lays it out (prompts left-padded, completions right-padded, rows of different lengths)."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch
from trl import GRPOTrainer
from trl.trainer.utils import add_fused_lm_head

from gradfidelity.studies.sft_rl import models
from gradfidelity.studies.sft_rl.trainers import GFGRPOTrainer, length_groups
from tests.sft_rl._config import make_cfg

P_LEN = [3, 7, 5, 9, 4, 9, 6, 2]    # real prompt tokens per row (P = 9 columns)
C_LEN = [5, 12, 1, 8, 12, 3, 7, 10]  # real completion tokens per row (C = 12 columns)


def _model():
    cfg = make_cfg({"models": [{"name": "m", "hidden_size": 32, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
                                "intermediate_size": 64}]})
    tok = models.build_tokenizer()
    model = models.build_tiny_model(cfg.models[0], tok, seed=0)
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    return model.train()


def _batch(seed: int = 0):
    """input_ids / attention_mask of TRL's layout: [left-padded prompt | right-padded completion]."""
    g = torch.Generator().manual_seed(seed)
    p_width, c_width = max(P_LEN), max(C_LEN)
    ids = torch.randint(3, 20, (len(P_LEN), p_width + c_width), generator=g)
    mask = torch.zeros_like(ids)
    for i, (p, c) in enumerate(zip(P_LEN, C_LEN, strict=True)):
        mask[i, p_width - p:p_width + c] = 1
    ids = ids.masked_fill(mask == 0, 0)  # pad id 0
    return ids, mask, c_width


def _stub(groups: int):
    """The two attributes the log-prob forwards read of a trainer."""
    return SimpleNamespace(length_groups=groups, accelerator=SimpleNamespace(autocast=contextlib.nullcontext,
                                                                            is_main_process=True))


def _padded(model, ids, mask, c_width):
    return GRPOTrainer._get_per_token_logps_and_entropies(_stub(0), model, ids, mask, c_width, compute_entropy=True)


def _trimmed(model, ids, mask, c_width, groups):
    return GFGRPOTrainer._trimmed_logps(_stub(groups), model, ids, mask, c_width, True)


def _loss_and_grad(model, logps, c_mask):
    """TRL's dapo loss at num_iterations 1 (ratio exp(logp - logp.detach()) = 1, gradient A * grad logp), one
    normaliser over the whole batch: the trim must keep it global."""
    adv = torch.linspace(-1.0, 1.0, logps.size(0)).unsqueeze(1)
    per_token = -torch.exp(logps - logps.detach()) * adv
    loss = (per_token * c_mask).sum() / c_mask.sum()
    model.zero_grad()
    loss.backward()
    return loss.detach(), {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("groups", [1, 3, 8])
def test_trimmed_forward_equals_padded(groups):
    torch.manual_seed(0)
    model = _model()
    ids, mask, c_width = _batch()
    c_mask = mask[:, -c_width:].float()
    ref_logps, ref_ent, _ = _padded(model, ids, mask, c_width)
    ref_loss, ref_grad = _loss_and_grad(model, ref_logps, c_mask)
    logps, ent, _ = _trimmed(model, ids, mask, c_width, groups)
    loss, grad = _loss_and_grad(model, logps, c_mask)
    assert logps.shape == ref_logps.shape
    real = c_mask.bool()
    torch.testing.assert_close(logps[real], ref_logps[real], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent[real], ref_ent[real], rtol=1e-5, atol=1e-5)
    assert torch.all(logps[~real] == 0)  # no token there: every loss masks it out
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-7)
    assert grad.keys() == ref_grad.keys()
    for k in ref_grad:
        torch.testing.assert_close(grad[k], ref_grad[k], rtol=1e-4, atol=1e-6, msg=k)


def test_length_groups_cover_each_row_once():
    lengths = torch.tensor([5, 1, 9, 1, 3, 7, 2])
    groups = length_groups(lengths, 3)
    assert sorted(torch.cat(groups).tolist()) == list(range(7))
    assert [lengths[g].tolist() for g in groups] == [[1, 1, 2], [3, 5], [7, 9]]
    assert len(length_groups(lengths, 50)) == 7  # never an empty micro-batch


def test_a_batch_in_another_layout_is_refused():
    """A right-padded prompt would be cut wrongly: refused with the key that turns the trim off."""
    model = _model()
    ids, mask, c_width = _batch()
    mask[0, :3], mask[0, 6:9] = 1, 0  # row 0's prompt moved to the left edge
    with pytest.raises(ValueError, match="length_groups"):
        _trimmed(model, ids, mask, c_width, 2)
