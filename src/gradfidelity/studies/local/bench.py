"""Benchmarks of study C, every ratio taken against a reference measured in the same process and minutes.

1. Model FLOP utilisation: BP training at the bench width reaches what fraction of this machine's fp32 matmul
   rate (square sgemm at the same thread count, measured between the training rounds)? The model FLOPs of a step
   are counted two ways, both written to the JSON (`flop_counts`), with the MFU under each:
   - `nanogpt` (the headline `bp_mfu_vs_matmul`, named by `flop_count_used`): nanoGPT's estimate 6N + 12 L T D per
     token (model.flops_per_token, the count the training metrics use). 6N: forward (2N) and backward (4N) of every
     weight, N = all parameters but the two embedding tables (biases and LayerNorm gains included). 12 L T D:
     attention's two activation-by-activation matmuls, Q K^T and A V, 2 T D FLOPs each per token and layer
     forward (each query against all T keys), x3 for forward + backward. The causal mask is not discounted (a
     kernel that skips the masked blocks does about half of that), and softmax, norms, GELU and the optimizer
     (elementwise) are not counted.
   - `flop_counter`: an independent count, torch.utils.flop_counter.FlopCounterMode over one whole training step
     (zero_grad, forward, backward, clip, AdamW) at the bench shape, plus attention by hand where the counter does
     not see it. Finding on this build (torch 2.13.0+cpu; checked again on every run, `counter_counts_cpu_sdpa`):
     CPU SDPA dispatches to aten._scaled_dot_product_flash_attention_for_cpu (and its _backward), which has no
     entry in the counter's registry (only the CUDA flash/efficient/cudnn kernels do), so the counter reports 0
     FLOPs for attention and sees only the addmm/mm of the linear layers. So the count is the counter's
     non-attention FLOPs plus attention by hand: 4 B T^2 D per layer forward (Q K^T and A V, 2 B T^2 D each, as
     the counter's own sdpa_flop_count), x3 for forward + backward (8 B T^2 D: the gradients of both operands of
     both matmuls), i.e. the same 12 L T D per token. With the math SDPA backend (plain bmm's, which the counter
     does count) the counter finds exactly this (tests/local/test_bench_flops.py). Attention is taken by hand
     even where a counter does see the kernel (its FLOPs are then recorded apart): the counter's rule for the
     CUDA flash kernels also charges the backward's recomputation of Q K^T (14 B T^2 D in all), which model
     FLOPs leave out. The two counts differ by 6 x the bias and LayerNorm parameters (nanoGPT counts them in N,
     the counter sees no matmul for them): 0.3% at the bench shape.
2. BP (our model + methods code) vs a plain nanoGPT-style loop of the same shape written independently below
   (nn.Linear/LayerNorm/SDPA, AdamW, clip): our per-step time must be no worse. Rounds alternate between the two
   (and the matmul probe) so that machine-load drift hits both; medians are reported.
3. Peak process-tree PSS of async RGC / BP at the bench width, each run in a fresh (spawned) process of its own, so
   neither inherits the other's heap, sampled over that process's tree only: this bench process, which holds
   neither model, is not counted (round 1 counted it on both sides of the ratio, pulling it toward 1). The PSS of
   an idle spawned interpreter (torch and this module imported, nothing built) is reported beside them.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing as mp
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from gradfidelity.harness.io import atomic_write_json
from gradfidelity.harness.memory import PeakPSS
from gradfidelity.harness.threads import configure_threads
from gradfidelity.studies.local.async_runtime import train_async
from gradfidelity.studies.local.config import StudyConfig, TrainConfig
from gradfidelity.studies.local.data import batch_offsets, embedded_enwik8
from gradfidelity.studies.local.memory import bp_steps
from gradfidelity.studies.local.methods import Optimizers, bp_backward
from gradfidelity.studies.local.model import ModelConfig, build_model, flops_per_token

# Which count the headline MFU (`bp_mfu_vs_matmul`, `plain_mfu_vs_matmul`) uses; the other is reported beside it.
FLOP_COUNT_USED = "nanogpt"
FLOP_COUNT_NOTES = {
    "nanogpt": "6N + 12 L T D per token (nanoGPT, PaLM appendix B; model.flops_per_token): 6N = forward + backward "
               "of every weight, N excluding the token and position embeddings (biases and LayerNorm gains "
               "included); 12 L T D = forward + backward (x3) of attention's Q K^T and A V matmuls (2 T D each per "
               "token and layer forward), causal masking not discounted",
    "flop_counter": "torch.utils.flop_counter.FlopCounterMode over one training step (zero_grad, forward, backward, "
                    "clip, AdamW; it counts matmuls only), attention ops excluded, + attention by hand: 4 B T^2 D "
                    "per layer forward (Q K^T and A V), x3 for forward + backward = 12 L T D per token, causal "
                    "masking not discounted (the counter does not count CPU SDPA, "
                    "aten._scaled_dot_product_flash_attention_for_cpu: counter_counts_cpu_sdpa)",
}


# ----------------------------------------------------------------------------------------------- plain reference
class _PlainBlock(nn.Module):
    def __init__(self, d: int, nh: int):
        super().__init__()
        self.nh = nh
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.o = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(self.n1(x)).view(B, T, 3, self.nh, D // self.nh).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, D)
        x = x + self.o(a)
        return x + self.down(F.gelu(self.up(self.n2(x))))


class _PlainGPT(nn.Module):
    def __init__(self, L: int, d: int, nh: int, T: int):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(256, d), nn.Embedding(T, d)
        self.h = nn.Sequential(*[_PlainBlock(d, nh) for _ in range(L)])
        self.ln, self.lm = nn.LayerNorm(d), nn.Linear(d, 256, bias=False)

    def forward(self, idx, y):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        return F.cross_entropy(self.lm(self.ln(self.h(x))).view(-1, 256), y.view(-1))


# ----------------------------------------------------------------------------------------------- probes
def matmul_gflops(n: int = 1024, reps: int = 8) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 * reps / best / 1e9


def attention_flops_per_token(n_layer: int, seq_len: int, d_model: int) -> float:
    """Training FLOPs per token of attention's two activation matmuls, Q K^T and A V: 4 B T^2 D per layer forward
    (2 B T^2 D each, every query against all T keys: the causal mask not discounted), x3 for forward + backward,
    divided by the B T tokens: 12 L T D, nanoGPT's attention term."""
    return 3.0 * 4 * n_layer * seq_len * d_model


def counted_flops_per_token(step, cfg: ModelConfig, batch_size: int, seq_len: int) -> dict:
    """The `flop_counter` count: torch's FlopCounterMode over `step()` (one training step of a model of shape `cfg`
    on batch_size x seq_len tokens), per token, its attention ops (if it sees any) replaced by the hand count
    `attention_flops_per_token` (CPU SDPA it does not see; see the module docstring)."""
    with FlopCounterMode(display=False) as counter:
        step()
    tokens = batch_size * seq_len
    by_op = {str(op): int(n) for op, n in counter.get_flop_counts().get("Global", {}).items()}
    sdpa = sum(n for op, n in by_op.items() if "attention" in op)
    rest = (counter.get_total_flops() - sdpa) / tokens
    by_hand = attention_flops_per_token(cfg.n_layer, seq_len, cfg.d_model)
    return {"per_token": rest + by_hand, "counter_non_attention_per_token": rest,
            "attention_by_hand_per_token": by_hand, "counter_counts_cpu_sdpa": bool(sdpa),
            "counter_attention_per_token": sdpa / tokens,
            "counter_by_op_per_token": {op: n / tokens for op, n in sorted(by_op.items())},
            "note": FLOP_COUNT_NOTES["flop_counter"]}


def _count_training_step(mcfg: ModelConfig, t: TrainConfig, x: torch.Tensor, y: torch.Tensor) -> dict:
    """`counted_flops_per_token` of one BP training step (ours: zero_grad, forward, backward, clip, AdamW) on the
    batch `x`, `y`, with a model and optimizer built for the count alone (the timed ones are left untouched)."""
    model = build_model(mcfg, 0)
    opts = Optimizers([list(model.parameters())], t)

    def step():
        opts.zero_grad()
        bp_backward(model, x, y)
        opts.clip_and_step(t.lr)

    return counted_flops_per_token(step, mcfg, x.shape[0], x.shape[1])


def _timed_steps(step, k: int) -> float:
    t0 = time.perf_counter()
    for _ in range(k):
        step()
    return (time.perf_counter() - t0) / k


def _pss_child(which: str, t: TrainConfig, width: int, data: torch.Tensor, steps: int) -> None:
    data = torch.from_numpy(data)
    if which == "idle":
        time.sleep(1.0)  # a few samples of the interpreter alone
        return
    model = build_model(t.model(width), 0)
    offsets = batch_offsets(len(data), t.block_size, t.batch_size, steps, 0)
    if which == "bp":
        torch.set_num_threads(t.bp_threads)
        bp_steps(model, t, data, offsets)
    else:
        train_async(which, model, t, data, offsets)


def _pss_of(which: str, t: TrainConfig, width: int, data: torch.Tensor, steps: int) -> float:
    ctx = mp.get_context("spawn")
    p = ctx.Process(target=_pss_child, args=(which, t, width, data.numpy(), steps))
    p.start()
    with PeakPSS(pid=p.pid, interval=0.02) as mem:  # the child and its descendants (stages, forkserver), not us
        p.join()
    if p.exitcode != 0:
        raise RuntimeError(f"PSS probe {which} exited with code {p.exitcode}")
    return mem.peak_bytes / 2**30


def run_bench(s: StudyConfig, out: Path) -> dict:
    """Reads train and bench of the config; the probes train at the bench's shape with the training settings."""
    b = dataclasses.asdict(s.bench)
    t = dataclasses.replace(s.train, n_layer=b["n_layer"], batch_size=b["batch_size"], block_size=b["block_size"],
                            steps=b["pss_steps"])
    configure_threads(b["threads"])
    data = torch.frombuffer(bytearray(embedded_enwik8(max(200_000, 40 * b["batch_size"] * b["block_size"]))),
                            dtype=torch.uint8)
    # 3. memory first, while this process is small
    pss_idle = _pss_of("idle", t, b["width"], data, b["pss_steps"])
    pss_bp = _pss_of("bp", t, b["width"], data, b["pss_steps"])
    pss_rgc = _pss_of("rgc_async", t, b["width"], data, b["pss_steps"])
    torch.set_num_threads(b["threads"])

    mcfg = t.model(b["width"])
    ours = build_model(mcfg, 0)
    n_params = sum(p.numel() for p in ours.parameters())
    opts = Optimizers([list(ours.parameters())], t)
    torch.manual_seed(0)
    plain = _PlainGPT(mcfg.n_layer, mcfg.d_model, mcfg.n_head, mcfg.block_size)
    popt = torch.optim.AdamW(plain.parameters(), lr=t.lr, betas=(0.9, 0.95), weight_decay=t.weight_decay)
    x = torch.randint(0, 256, (b["batch_size"], b["block_size"]))
    y = torch.randint(0, 256, (b["batch_size"], b["block_size"]))

    def ours_step():
        opts.zero_grad()
        bp_backward(ours, x, y)
        opts.clip_and_step(t.lr)

    def plain_step():
        popt.zero_grad(set_to_none=True)
        plain(x, y).backward()
        torch.nn.utils.clip_grad_norm_(plain.parameters(), t.grad_clip)
        popt.step()

    counted = _count_training_step(mcfg, t, x, y)  # the independent FLOP count, on a model of its own
    ours_step()
    plain_step()  # warm-up
    rates, t_ours, t_plain = [], [], []
    for _ in range(b["rounds"]):
        rates.append(matmul_gflops())
        for i in range(b["steps"]):  # single steps, alternating which loop goes first: drift hits both
            pair = [(t_ours, ours_step), (t_plain, plain_step)]
            for acc, fn in pair if i % 2 == 0 else reversed(pair):
                acc.append(_timed_steps(fn, 1))
    # Median of rounds on both sides (the definition): a loaded moment moves both medians alike, where the
    # best probe against a median step would flatter the machine and understate the utilisation.
    rate = statistics.median(rates)
    tokens = b["batch_size"] * b["block_size"]
    counts = {"nanogpt": {"per_token": flops_per_token(mcfg, n_params), "attention_per_token":
                          attention_flops_per_token(mcfg.n_layer, b["block_size"], mcfg.d_model),
                          "note": FLOP_COUNT_NOTES["nanogpt"]},
              "flop_counter": counted}
    for c in counts.values():  # model GFLOP/s and MFU of both loops (one shape: one model count) under each count
        c["bp_model_gflops"] = c["per_token"] * tokens / statistics.median(t_ours) / 1e9
        c["plain_model_gflops"] = c["per_token"] * tokens / statistics.median(t_plain) / 1e9
        c["bp_mfu_vs_matmul"] = c["bp_model_gflops"] / rate
        c["plain_mfu_vs_matmul"] = c["plain_model_gflops"] / rate
    used = counts[FLOP_COUNT_USED]
    res = {
        "settings": b, "n_params": n_params, "flops_per_token": used["per_token"],
        "flop_count_used": FLOP_COUNT_USED, "flop_counts": counts,
        "matmul_gflops": rate, "matmul_gflops_rounds": rates,
        "bp_step_s": statistics.median(t_ours), "plain_step_s": statistics.median(t_plain),
        "bp_model_gflops": used["bp_model_gflops"], "plain_model_gflops": used["plain_model_gflops"],
        "bp_mfu_vs_matmul": used["bp_mfu_vs_matmul"], "plain_mfu_vs_matmul": used["plain_mfu_vs_matmul"],
        "bp_mfu_vs_matmul_flop_counter": counts["flop_counter"]["bp_mfu_vs_matmul"],
        "bp_speed_vs_plain": statistics.median(t_plain) / statistics.median(t_ours),
        "pss_idle_gib": pss_idle, "pss_bp_gib": pss_bp, "pss_rgc_async_gib": pss_rgc,
        "pss_ratio_rgc_async_over_bp": pss_rgc / pss_bp,
        "async_processes": t.n_stages, "threads_per_stage": t.threads_per_stage, "bp_threads_pss": t.bp_threads,
        "targets": {"bp_mfu_vs_matmul": ">= 0.70", "bp_speed_vs_plain": ">= 1 (no slower; noise ~5%)",
                    "pss_ratio_rgc_async_over_bp": "<= 1.5"},
    }
    res["meets"] = {"mfu": res["bp_mfu_vs_matmul"] >= 0.70, "no_slower_than_plain": res["bp_speed_vs_plain"] >= 0.95,
                    "pss": res["pss_ratio_rgc_async_over_bp"] <= 1.5}
    atomic_write_json(out, res)
    print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in res.items()
           if k not in ("settings", "flop_counts")})
    return res
