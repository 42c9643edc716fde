"""Causal pre-norm byte transformer, cut into pipeline stages.

Why this shape: the paper of study C (docs/sources.md, "Study C") trains byte-level (vocab 256) pre-norm decoders
of 24 layers at widths 128/256/384 and splits them into S stages of H layers (S * H = n_layer). Local methods
attach a loss to every stage, so the pieces a stage needs are separate modules:

    embed   (tokens + learned positions)        -> owned by stage 0
    blocks  (H pre-norm blocks per stage)       -> stage s owns blocks[s*H:(s+1)*H]
    readout (final LayerNorm + unembedding)     -> owned by the last stage; upstream stages use it (live, as
                                                   a frozen snapshot, or as a snapshot they differentiate)

The code follows nanoGPT's model.py (Karpathy): GPT-2 initialisation, SDPA attention, 4x GELU MLP, no dropout
(short CPU runs are far from overfitting), no weight tying (the readout must be a module the last stage owns).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 256  # bytes


@dataclass(frozen=True)
class ModelConfig:
    n_layer: int = 24
    d_model: int = 256
    n_head: int = 4
    block_size: int = 256  # context length T in bytes

    def __post_init__(self) -> None:
        if self.d_model % self.n_head:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_head={self.n_head}")


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=2)  # 3 x (B, T, D)
        # (B, T, D) -> (B, nh, T, hd)
        q, k, v = (t.view(B, T, self.n_head, D // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hd)
        return self.proj(y.transpose(1, 2).reshape(B, T, D))  # (B, T, D)


class Block(nn.Module):
    """Pre-norm residual block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.proj = nn.Linear(4 * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, D) -> (B, T, D)
        x = x + self.attn(self.ln1(x))
        return x + self.proj(F.gelu(self.fc(self.ln2(x))))


class Embed(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, cfg.d_model)
        self.pos = nn.Embedding(cfg.block_size, cfg.d_model)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:  # (B, T) int64 -> (B, T, D)
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.tok(idx) + self.pos(pos)


class Readout(nn.Module):
    """Final LayerNorm + unembedding: the shared head every local loss goes through."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, VOCAB, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # (B, T, D) -> (B, T, 256) logits
        return self.head(self.ln_f(h))


class ByteTransformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = Embed(cfg)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.readout = Readout(cfg)
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2: scale residual projections by depth
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, 256)
        h = self.embed(idx)
        for blk in self.blocks:
            h = blk(h)
        return self.readout(h)


class Stage(nn.Module):
    """H consecutive blocks; stage 0 also owns the embedding. The readout is NOT part of a stage module
    (the last stage owns it through its optimizer), so that methods can decide how each stage reaches it."""

    def __init__(self, embed: Embed | None, blocks: list[Block]):
        super().__init__()
        self.embed = embed
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # stage 0: (B, T) bytes; else (B, T, D) -> (B, T, D)
        h = self.embed(x) if self.embed is not None else x
        for blk in self.blocks:
            h = blk(h)
        return h


def partition(model: ByteTransformer, n_stages: int) -> list[Stage]:
    """Split the blocks into n_stages stages of H = n_layer / n_stages layers (sharing the parameters)."""
    L = model.cfg.n_layer
    if n_stages < 1 or L % n_stages:
        raise ValueError(f"n_layer={L} is not divisible into stages={n_stages}")
    H = L // n_stages
    return [
        Stage(model.embed if s == 0 else None, list(model.blocks[s * H : (s + 1) * H]))
        for s in range(n_stages)
    ]


def build_model(cfg: ModelConfig, seed: int) -> ByteTransformer:
    """Same seed -> same initial weights, whatever the method (the pairing of BP and each method)."""
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    model = ByteTransformer(cfg)
    torch.random.set_rng_state(gen_state)
    return model


def flops_per_token(cfg: ModelConfig, n_params: int) -> float:
    """Training FLOPs per token, nanoGPT's estimate (PaLM appendix B): 6N + 12 L T D (attention), where N
    excludes the token and position embeddings (lookups, not matmuls; our unembedding is untied and counted)."""
    n_matmul = n_params - (VOCAB + cfg.block_size) * cfg.d_model
    return 6.0 * n_matmul + 12.0 * cfg.n_layer * cfg.block_size * cfg.d_model
