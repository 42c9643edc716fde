"""A SmolLM-style decoder (the Llama recipe): RMSNorm, SwiGLU, RoPE, grouped-query attention, tied or untied
embeddings.

Why our own ~150 lines instead of transformers' LlamaForCausalLM: the delay simulator evaluates the gradient at
stashed weight versions with `torch.func.functional_call`, and the real pipeline cuts the model into contiguous
*units* (embedding, one unit per block, final norm + head) that live in different processes. Module names follow
the Hugging Face Llama names (q_proj, gate_proj, input_layernorm, lm_head, ...) so that a test can load the same
weights into transformers' LlamaForCausalLM and compare logits (an independent reference for the architecture).

Sizes: `tiny` configs for smoke, a few million parameters for `cpu`, and the exact public SmolLM shapes for
`paper` (135M: 30 layers, d 576, 9/3 heads, SwiGLU 1536, vocab 49152, tied; 360M: 32 layers, d 960, 15/5 heads,
SwiGLU 2560). The 10B MoE of the paper is listed in the paper config as paper-only and is not built here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gradfidelity.errors import UserError
from gradfidelity.studies.async_pp.config import DTYPE_NAMES, ModelConfig  # the shape: one typed config section

DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}  # config `train.dtype` -> torch dtype


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):  # (..., d)
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.eps))


def rope_tables(seq_len: int, head_dim: int, theta: float, dtype, device=None):
    """cos/sin tables (S, head_dim) in the Hugging Face 'rotate_half' layout."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim))
    freqs = torch.outer(torch.arange(seq_len, dtype=torch.float64, device=device), inv)  # (S, hd/2)
    emb = torch.cat([freqs, freqs], dim=-1)  # (S, hd)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.h, self.kv = cfg.n_heads, cfg.n_kv_heads
        self.hd = cfg.d_model // cfg.n_heads
        self.q_proj = nn.Linear(cfg.d_model, self.h * self.hd, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, self.kv * self.hd, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, self.kv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.h * self.hd, cfg.d_model, bias=False)

    def forward(self, x, cos, sin):  # x (B, S, d); cos/sin (S, hd)
        B, S, _ = x.shape
        q = self.q_proj(x).view(B, S, self.h, self.hd).transpose(1, 2)  # (B, h, S, hd)
        k = self.k_proj(x).view(B, S, self.kv, self.hd).transpose(1, 2)  # (B, kv, S, hd)
        v = self.v_proj(x).view(B, S, self.kv, self.hd).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.h != self.kv)  # (B, h, S, hd)
        return self.o_proj(y.transpose(1, 2).reshape(B, S, self.h * self.hd))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.down_proj = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def attn_half(self, x, cos, sin):  # (B, S, d) -> (B, S, d), pre-norm residual
        return x + self.self_attn(self.input_layernorm(x), cos, sin)

    def mlp_half(self, x):
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward(self, x, cos, sin):
        return self.mlp_half(self.attn_half(x, cos, sin))


class Decoder(nn.Module):
    """Units: 0 = embed_tokens, 2i+1 / 2i+2 = attention / MLP half of layers[i], 2L+1 = norm + lm_head."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(self._init)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def _init(self, m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=self.cfg.init_std)

    def run_units(self, x, lo: int, hi: int):
        """Apply units [lo, hi). x: token ids (B, S) if lo == 0, else hidden states (B, S, d).
        Returns hidden (B, S, d), or logits (B, S, V) if hi == n_units."""
        L = self.cfg.n_layers
        S = x.shape[1]
        dtype = self.embed_tokens.weight.dtype
        cos, sin = rope_tables(S, self.cfg.d_model // self.cfg.n_heads, self.cfg.rope_theta, dtype, x.device)
        for u in range(lo, hi):
            if u == 0:
                x = self.embed_tokens(x)
            elif u <= 2 * L:
                block = self.layers[(u - 1) // 2]
                x = block.attn_half(x, cos, sin) if u % 2 else block.mlp_half(x)
            else:
                x = self.lm_head(self.norm(x))
        return x

    def forward(self, x, lo: int = 0, hi: int | None = None):  # (B, S) ids -> logits (B, S, V) by default
        return self.run_units(x, lo, self.cfg.n_units if hi is None else hi)


def unit_of(name: str, n_layers: int) -> int:
    """The pipeline unit that owns parameter `name` (a tied lm_head belongs to the embedding, unit 0)."""
    if name.startswith("embed_tokens."):
        return 0
    if name.startswith("layers."):
        _, i, part = name.split(".", 2)
        return 2 * int(i) + (1 if part.startswith(("input_layernorm", "self_attn")) else 2)
    if name.startswith(("norm.", "lm_head.")):
        return 2 * n_layers + 1
    raise ValueError(f"parameter {name!r} belongs to no unit")


def stage_bounds(n_units: int, n_stages: int) -> list[tuple[int, int]]:
    """Contiguous split of the units over `n_stages` stages (earlier stages get the remainder)."""
    if n_stages > n_units:
        raise UserError(f"async_pp: pipeline depth {n_stages} exceeds the model's {n_units} units "
                        f"(2 n_layers + 2); use more layers or a smaller depth")
    base, extra = divmod(n_units, n_stages)
    bounds, lo = [], 0
    for k in range(n_stages):
        hi = lo + base + (1 if k < extra else 0)
        bounds.append((lo, hi))
        lo = hi
    return bounds


def stage_of_params(model: Decoder, n_stages: int) -> dict[str, int]:
    """Parameter name -> pipeline stage (0 holds the embedding)."""
    bounds = stage_bounds(model.cfg.n_units, n_stages)
    out = {}
    for name, _ in model.named_parameters():
        u = unit_of(name, model.cfg.n_layers)
        out[name] = next(k for k, (lo, hi) in enumerate(bounds) if lo <= u < hi)
    return out


def build_model(cfg: ModelConfig, seed: int, dtype=torch.float32) -> Decoder:
    """Deterministic init: the same seed gives the same weights in every process (the pipeline relies on it)."""
    gen_state = torch.get_rng_state()
    torch.manual_seed(seed)
    model = Decoder(cfg).to(dtype)
    torch.set_rng_state(gen_state)
    return model


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def lm_loss(logits, targets):  # (B, S, V), (B, S) -> mean token cross-entropy
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


__all__ = ["DTYPES", "Decoder", "ModelConfig", "build_model", "lm_loss", "n_params",
           "stage_bounds", "stage_of_params", "unit_of"]
