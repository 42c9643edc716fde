"""The bench's two model-FLOP counts (bench.py): nanoGPT's 6N + 12 L T D (model.flops_per_token, the headline MFU)
and an independent one, torch's FlopCounterMode over one training step with attention added by hand.

Checked on a tiny model: (1) torch's counter does not count the CPU SDPA kernel (the finding the bench's docstring
states for this torch build); (2) the hand count of attention, 12 L T D per token, is exactly what the counter
finds when SDPA runs on its math backend (plain bmm's, which it does count), so the hand term is not just the
formula restated; (3) the counter-based count equals 6N + 12 L T D less 6 x the bias and LayerNorm parameters
(which nanoGPT's N includes and no matmul touches), exactly, so within 1% of nanoGPT's count from width 128 on;
(4) the bench JSON carries both counts, the MFU under each, and names the one its headline uses."""

from __future__ import annotations

import json

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from gradfidelity.studies.local import bench
from gradfidelity.studies.local.methods import Optimizers, bp_backward
from gradfidelity.studies.local.model import VOCAB, ModelConfig, build_model, flops_per_token
from tests.local._config import study

CFG = ModelConfig(n_layer=2, d_model=64, n_head=2, block_size=32)
B = 2


def _step(cfg: ModelConfig):
    """One whole BP training step of ours (zero_grad, forward, backward, clip, AdamW) on a fixed batch."""
    model = build_model(cfg, 0)
    opts = Optimizers([list(model.parameters())], study().train)
    x = torch.randint(0, 256, (B, cfg.block_size), generator=torch.Generator().manual_seed(0))

    def step():
        opts.zero_grad()
        bp_backward(model, x, x)
        opts.clip_and_step(1e-3)

    return model, step


def test_the_counter_misses_cpu_sdpa_and_counts_the_hand_attention_term_on_the_math_backend():
    _, step = _step(CFG)
    counted = bench.counted_flops_per_token(step, CFG, B, CFG.block_size)
    # torch 2.13 CPU: aten._scaled_dot_product_flash_attention_for_cpu has no FLOP formula (the docstring's finding)
    assert counted["counter_counts_cpu_sdpa"] is False and counted["counter_attention_per_token"] == 0
    assert set(counted["counter_by_op_per_token"]) == {"aten.addmm", "aten.mm"}
    hand = bench.attention_flops_per_token(CFG.n_layer, CFG.block_size, CFG.d_model)
    assert hand == 12 * CFG.n_layer * CFG.block_size * CFG.d_model == counted["attention_by_hand_per_token"]

    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        step()  # attention as Q K^T and A V bmm's (forward 2, backward 4), which the counter does count
    by_op = {str(op): n / (B * CFG.block_size) for op, n in counter.get_flop_counts()["Global"].items()}
    assert by_op["aten.bmm"] == hand
    assert counter.get_total_flops() / (B * CFG.block_size) == counted["per_token"]


@pytest.mark.parametrize("cfg", [CFG, ModelConfig(n_layer=3, d_model=96, n_head=4, block_size=48),
                                 ModelConfig(n_layer=2, d_model=128, n_head=2, block_size=32),
                                 ModelConfig(n_layer=2, d_model=384, n_head=4, block_size=128)])  # the bench's
def test_the_counter_count_is_nanogpt_less_the_parameters_no_matmul_touches(cfg):
    model, step = _step(cfg)
    counted = bench.counted_flops_per_token(step, cfg, B, cfg.block_size)["per_token"]
    n = sum(p.numel() for p in model.parameters())
    matmul_weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    embeddings = (VOCAB + cfg.block_size) * cfg.d_model
    nanogpt = flops_per_token(cfg, n)
    assert counted == nanogpt - 6 * (n - matmul_weights - embeddings)  # biases and LayerNorm gains/shifts
    # The gap, 6 x (13 L + 2) D of about 6 x 12 L D^2, falls as 1/D: 1.4% at width 64, within 1% from 128 on
    # (0.3% at the bench's 384); the stated tolerance is 1% at width >= 128.
    if cfg.d_model >= 128:
        assert abs(counted - nanogpt) / nanogpt < 0.01, (counted, nanogpt)


def test_the_bench_json_carries_both_counts_and_names_the_headline_one(tmp_path, monkeypatch):
    """run_bench on a tiny shape; the PSS probes (a spawned process each) and the 1024^3 matmul probe are replaced
    by stand-ins, and the process's thread settings are left as they are."""
    monkeypatch.setattr(bench, "_pss_of", lambda which, *a: {"idle": 0.5, "bp": 1.0, "rgc_async": 1.2}[which])
    monkeypatch.setattr(bench, "matmul_gflops", lambda: 10.0)
    monkeypatch.setattr(bench, "configure_threads", lambda n: None)
    cfg = study(train={"n_layer": 2, "n_stages": 2, "n_head": 2},
                bench={"width": 32, "n_layer": 2, "batch_size": 2, "block_size": 16, "threads": 1, "steps": 1,
                       "rounds": 1, "pss_steps": 1})
    threads = torch.get_num_threads()
    try:
        res = bench.run_bench(cfg, tmp_path / "local.json")
    finally:
        torch.set_num_threads(threads)
    assert json.loads((tmp_path / "local.json").read_text()) == json.loads(json.dumps(res))
    assert res["flop_count_used"] == bench.FLOP_COUNT_USED == "nanogpt"
    nano, counter = res["flop_counts"]["nanogpt"], res["flop_counts"]["flop_counter"]
    mcfg = ModelConfig(n_layer=2, d_model=32, n_head=2, block_size=16)
    assert nano["per_token"] == res["flops_per_token"] == flops_per_token(mcfg, res["n_params"])
    assert nano["attention_per_token"] == counter["attention_by_hand_per_token"] == 12 * 2 * 16 * 32
    assert "causal masking not discounted" in nano["note"] and "causal masking not discounted" in counter["note"]
    assert counter["counter_counts_cpu_sdpa"] is False
    n_norm_bias = (13 * mcfg.n_layer + 2) * mcfg.d_model  # per layer: 9 D of biases, 4 D of LayerNorm; ln_f: 2 D
    assert counter["per_token"] == nano["per_token"] - 6 * n_norm_bias
    for loop in ("bp", "plain"):
        assert res[f"{loop}_mfu_vs_matmul"] == nano[f"{loop}_mfu_vs_matmul"]
        assert counter[f"{loop}_mfu_vs_matmul"] == pytest.approx(
            nano[f"{loop}_mfu_vs_matmul"] * counter["per_token"] / nano["per_token"])
    assert res["bp_mfu_vs_matmul_flop_counter"] == counter["bp_mfu_vs_matmul"]
    assert res["pss_ratio_rgc_async_over_bp"] == 1.2
