"""The decoder against transformers' LlamaForCausalLM (an independent implementation of the SmolLM recipe)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from gradfidelity.errors import UserError
from gradfidelity.studies.async_pp.model import (
    Decoder,
    ModelConfig,
    build_model,
    n_params,
    stage_bounds,
    stage_of_params,
)
from tests.async_pp._cfg import model_config


def _hf(cfg: ModelConfig) -> LlamaForCausalLM:
    hc = LlamaConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.d_ff,
                     num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                     num_key_value_heads=cfg.n_kv_heads, max_position_embeddings=cfg.max_seq_len,
                     rms_norm_eps=cfg.norm_eps, rope_theta=cfg.rope_theta, tie_word_embeddings=cfg.tie_embeddings,
                     attention_bias=False, mlp_bias=False)
    hc._attn_implementation = "eager"
    return LlamaForCausalLM(hc).double().eval()


@pytest.mark.parametrize("tie", [True, False])
def test_logits_match_transformers_llama(tie):
    cfg = model_config(vocab_size=50, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=16,
                       tie_embeddings=tie)
    ours = build_model(cfg, seed=3, dtype=torch.float64)
    hf = _hf(cfg)
    sd = {("model." + k if not k.startswith("lm_head") else k): v for k, v in ours.state_dict().items()}
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    assert not unexpected and all("rotary" in m or (tie and m == "lm_head.weight") for m in missing)
    idx = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf(idx).logits
        got = ours(idx)
    # HF runs RMSNorm and RoPE tables in float32 even in a float64 model, hence 1e-5 rather than 1e-12
    assert float((got - ref).abs().max()) < 1e-5
    assert float((got - ref).abs().max()) < 1e-3 * float(ref.abs().max())


def test_stage_slices_compose_to_the_full_model():
    cfg = model_config(vocab_size=20, d_model=16, n_layers=3, n_heads=2, n_kv_heads=1, d_ff=32, max_seq_len=8)
    m = build_model(cfg, seed=0, dtype=torch.float64)
    idx = torch.randint(0, 20, (2, 8))
    for P in (2, 4, 8):
        x = idx
        for lo, hi in stage_bounds(cfg.n_units, P):
            x = m(x, lo, hi)
        assert torch.equal(x, m(idx))
    owner = stage_of_params(m, 8)
    assert owner["embed_tokens.weight"] == 0 and owner["norm.weight"] == 7
    with pytest.raises(UserError, match="depth 9"):
        stage_bounds(cfg.n_units, 9)


def test_smollm_135m_and_360m_shapes_have_the_published_sizes():
    def count(V, d, L, h, kv, ff):  # embedding (tied) + per layer q,k,v,o + SwiGLU + 2 norms + final norm
        hd = d // h
        return V * d + L * (2 * d * d + 2 * d * hd * kv + 3 * d * ff + 2 * d) + d

    for shape in ((49152, 576, 30, 9, 3, 1536), (49152, 960, 32, 15, 5, 2560)):
        V, d, L, h, kv, ff = shape
        cfg = model_config(vocab_size=V, d_model=d, n_layers=L, n_heads=h, n_kv_heads=kv, d_ff=ff, max_seq_len=2048,
                           tie_embeddings=True)  # SmolLM ties them (the smoke config unties them)
        with torch.device("meta"):
            m = Decoder(cfg)
        assert n_params(m) == count(*shape)
    assert count(49152, 576, 30, 9, 3, 1536) == 134_515_008  # SmolLM-135M's published parameter count


def test_bad_shapes_are_user_errors():
    with pytest.raises(UserError, match="n_kv_heads"):
        model_config(vocab_size=10, d_model=16, n_layers=1, n_heads=4, n_kv_heads=3, d_ff=8, max_seq_len=8)
    with pytest.raises(UserError, match="even"):
        model_config(d_model=12, n_heads=4, n_kv_heads=2)  # head dim 3: RoPE rotates pairs
    # unknown keys and the cross-field checks at config load: test_config.py
