"""The model-FLOP estimate behind the MFU benchmark, against torch's own FLOP counter (forward + backward).

torch's counter sees the matmuls (addmm/mm) but not the CPU SDPA kernel, so the attention term 12 L T D is
taken off the estimate before comparing; biases and norms (6 x their count, < 1% here) are within tolerance.
Counting the embedding tables as matmul parameters would be off by ~9% and fail."""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from gradfidelity.studies.local.methods import bp_backward
from gradfidelity.studies.local.model import ModelConfig, build_model, flops_per_token


def test_flops_per_token_matches_torch_flop_counter():
    cfg = ModelConfig(n_layer=2, d_model=128, n_head=2, block_size=32)
    model = build_model(cfg, 0)
    x = torch.randint(0, 256, (2, cfg.block_size))
    with FlopCounterMode(display=False) as counter:
        bp_backward(model, x, x)
    counted = counter.get_total_flops() / x.numel()
    attention = 3 * cfg.n_layer * 4 * cfg.block_size * cfg.d_model  # QK^T and AV, forward + 2x backward
    est = flops_per_token(cfg, sum(p.numel() for p in model.parameters())) - attention
    assert abs(est - counted) / counted < 0.01, (est, counted)
