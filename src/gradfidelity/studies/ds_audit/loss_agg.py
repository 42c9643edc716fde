"""Loss-aggregation audit: how much does a per-micro-batch token mean bend the gradient? (claim A4)

Why: OpenRLHF took a token mean inside each micro-batch and DeepSpeed then averaged micro-batches (1/GA) and ranks.
The objective becomes a mean of means, so a token in a short micro-batch weighs more than one in a long one. The
correct objective over an accumulation window is the global token mean: loss_sum / tokens_in_window.

For one window of M micro-batches x b sequences (lengths n_s), every method is a weighted token sum
sum_t w_t * loss_t with effective per-token weights:
  (a) global token mean      w_t = 1 / T                        (T = tokens in the window; the reference)
  (b) per-micro-batch mean   w_t = 1 / (M * n_m)                 (n_m = tokens of t's micro-batch; OpenRLHF pre-fix)
  (c) per-sequence mean      w_t = 1 / (S * n_s)                 (S = sequences in the window)
With equal lengths all three coincide. We measure, on a tiny Llama built from a config (transformers), the relative
error ||g_x - g_a|| / ||g_a|| and the cosine of each gradient to (a), as the spread of sequence lengths grows.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from gradfidelity.studies.ds_audit.config import LossAggConfig

METHODS = ("global_token_mean", "per_microbatch_mean", "per_sequence_mean")


def build_model(cfg: LossAggConfig, seed: int):
    """A tiny Llama from a config (no download): realistic, heterogeneous per-token gradients."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    conf = LlamaConfig(
        vocab_size=cfg.vocab, hidden_size=cfg.hidden, intermediate_size=2 * cfg.hidden, num_hidden_layers=cfg.layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4 * cfg.mean_len,
    )
    return LlamaForCausalLM(conf).float()


def sample_lengths(cfg: LossAggConfig, spread: float, gen: np.random.Generator) -> np.ndarray:
    """Sequence lengths (M, b) >= 2, uniform around mean_len with relative half-width `spread`."""
    lo, hi = cfg.mean_len * (1 - spread), cfg.mean_len * (1 + spread)
    n = gen.uniform(lo, hi, size=(cfg.micro_batches, cfg.seqs_per_micro))
    return np.maximum(np.rint(n), 2).astype(int)


def token_weights(lengths: np.ndarray) -> dict[str, list[np.ndarray]]:
    """Effective weight of every predicted token, per method: {method: [per-sequence arrays of shape (n_s - 1,)]}.

    A sequence of n tokens has n - 1 next-token predictions; `lengths` is (M, b)."""
    tok = lengths - 1  # (M, b) predicted tokens per sequence
    T, M, S = tok.sum(), tok.shape[0], tok.size
    out: dict[str, list[np.ndarray]] = {m: [] for m in METHODS}
    for m in range(M):
        for j in range(tok.shape[1]):
            n = tok[m, j]
            out["global_token_mean"].append(np.full(n, 1.0 / T))
            out["per_microbatch_mean"].append(np.full(n, 1.0 / (M * tok[m].sum())))
            out["per_sequence_mean"].append(np.full(n, 1.0 / (S * n)))
    return out


def per_token_losses(model, lengths: np.ndarray, cfg: LossAggConfig, seed: int) -> list[torch.Tensor]:
    """Next-token cross-entropy of every sequence, unreduced: list of (n_s - 1,) tensors, graph kept."""
    gen = torch.Generator().manual_seed(10_007 * seed + 1)
    losses = []
    for n in lengths.reshape(-1):
        ids = torch.randint(0, cfg.vocab, (1, int(n)), generator=gen)  # (1, n)
        logits = model(input_ids=ids).logits  # (1, n, V)
        losses.append(F.cross_entropy(logits[0, :-1], ids[0, 1:], reduction="none"))  # (n - 1,)
    return losses


def gradients(model, losses: list[torch.Tensor], weights: dict[str, list[np.ndarray]]) -> dict[str, torch.Tensor]:
    """Flat gradient (P,) of sum_t w_t loss_t for every method (autograd, one backward each)."""
    params = [p for p in model.parameters() if p.requires_grad]
    out = {}
    for i, m in enumerate(METHODS):
        pairs = zip(losses, weights[m], strict=True)
        total = sum((loss * torch.as_tensor(w, dtype=loss.dtype)).sum() for loss, w in pairs)
        grads = torch.autograd.grad(total, params, retain_graph=i < len(METHODS) - 1)
        out[m] = torch.cat([g.reshape(-1) for g in grads]).double()
    return out


def audit(cfg: LossAggConfig) -> list[dict]:
    """One row per (spread, seed, method): length statistics, weight spread, relative error and cosine to (a)."""
    torch.set_num_threads(cfg.threads)
    rows = []
    for spread in cfg.spreads:
        for seed in range(cfg.seeds):
            gen = np.random.default_rng([seed, int(round(spread * 1000))])
            lengths = sample_lengths(cfg, spread, gen)
            model = build_model(cfg, seed)
            weights = token_weights(lengths)
            grads = gradients(model, per_token_losses(model, lengths, cfg, seed), weights)
            ref = grads["global_token_mean"]
            T = int((lengths - 1).sum())
            for m in METHODS:
                w = np.concatenate(weights[m]) * T  # 1.0 = the weight the global token mean gives
                rows.append({
                    "spread": spread,
                    "seed": seed,
                    "method": m,
                    "length_cv": float(lengths.std() / lengths.mean()),
                    "micro_tokens_cv": float((lengths - 1).sum(1).std() / (lengths - 1).sum(1).mean()),
                    "tokens": T,
                    "weight_min": float(w.min()),
                    "weight_max": float(w.max()),
                    "rel_error": float((grads[m] - ref).norm() / ref.norm()),
                    "cosine": float(F.cosine_similarity(grads[m], ref, dim=0)),
                })
    return rows
