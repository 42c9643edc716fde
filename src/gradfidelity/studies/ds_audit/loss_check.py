"""Loss-normalisation check for a Trainer run: is one accumulation window's gradient the one-batch gradient?

Why: this study's subject is silent failure. A loss that takes a token mean inside each micro-batch and lets the
Trainer (or DeepSpeed) divide by GA trains fine, logs a plausible loss, and optimises a mean of means: a token in a
short micro-batch weighs more than one in a long one (loss_agg.py measures how much). The DeepSpeed audit of the
config (audit.py, the guard's first mode) cannot see it: the bug lives in the user's `compute_loss`, not in
DeepSpeed. So this check runs the user's own model, collator and `compute_loss`, through the Trainer's own code path,
on real windows of the user's data.

What is compared, at the first step of a Hugging Face / TRL Trainer run:
  g_window     the gradient of ONE accumulation window as the Trainer produces it: `trainer.get_batch_samples` (its
               `num_items_in_batch`) and `trainer.training_step` per micro-batch (the user's `compute_loss`, then the
               Trainer's own division by GA when it applies), with the scaling `Accelerator.backward` would apply.
               `accelerator.backward` is replaced for the duration by a recorder; the gradient is taken with
               `torch.autograd.grad`, so nothing reaches `.grad` or DeepSpeed's buffers.
  g_reference  the gradient of the same samples as one batch, in plain torch from `model(input_ids=...,
               attention_mask=...).logits` and `labels` (cross-entropy, reduction "sum", on logits[:, :-1] and
               labels[:, 1:], ignore_index -100; pre-shifted `shift_labels` are used as they are), normalised as the
               loss says: per token (the sum over every label token of the window / the window's label tokens) or per
               sequence (the mean over the window's sequences of each sequence's token mean). It is summed micro-batch
               by micro-batch (the same shapes as the Trainer's pass, so fp32 agrees to rounding, and one micro-batch
               of activations at a time) and divided once by the window's count: one loss over the whole window.
Reported: ratio ||g_window|| / ||g_reference||, relative error ||g_window - g_reference|| / ||g_reference|| and the
cosine; ok when the relative error is within a tolerance fixed a priori by the compute dtype. A failing window is
also compared with the usual culprits (a per-micro-batch mean divided by GA, the same without the division, the
right direction with the wrong scale) so that the message names the cause.

A window whose micro-batches all have the same count (label tokens per token; sequences per sequence) cannot show
the per-micro-batch-mean bug (a mean of equal-sized means is the global mean): the next window is tried, up to
`max_windows`. When none can tell, the first window is still compared (a wrong scale shows on any window): a failure
is a failure (ok False), a pass is ok None, with the reason in `message()`. With GA 1 nothing can be mis-aggregated
across micro-batches; the one micro-batch is compared anyway (cheap, and it still catches a wrong normaliser), and a
pass is ok True with a message saying so.

No trace on training: everything runs under `torch.random.fork_rng` (and Python's and NumPy's random states are
restored); both passes reseed identically before each micro-batch, so dropout masks (and NEFTune noise) match while
the model stays in train mode, as `training_step` puts it (eval mode is not an option: `training_step` calls
`model.train()` itself); every module's train/eval flag, every parameter's `.grad`, the Trainer's attributes (its
counters and metric lists included), the accelerator's dataloader list and gradient state are restored; no optimizer
or scheduler step; the real training dataloader is never iterated (a fresh one from `trainer.get_train_dataloader()`
is: its own sampler, and a plain RandomSampler's draw from the global RNG is undone by fork_rng).

Scope: one process or several (DDP or DeepSpeed ZeRO-0/1/2: the gradients are averaged over ranks as DDP/DeepSpeed
would, the reference uses the ranks' total count; every rank must call the check). The model runs unwrapped (the
DeepSpeed engine's or DDP's `.module`): the engine's forward registers backward hooks that expect `engine.backward`,
and DDP's reducer expects `.backward`. Refused: ZeRO-3 and FSDP (partitioned parameters: a local `autograd.grad`
sees shards), DataParallel, LOMO optimizers (their backward steps). A wrapper that the user placed on
`accelerator.backward` is bypassed: only accelerate's own scaling is replicated.

Cost: about two forward-backward passes over one window (the Trainer's and the reference), plus collating up to
`max_windows` windows; memory: three fp32 copies of the trainable parameters' gradients (window, reference,
per-micro-batch-mean diagnosis). `WindowCheck.seconds` reports the time.
"""

from __future__ import annotations

import copy
import math
import random
import time
from collections.abc import Mapping
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

NORMALISE = ("token", "sequence")

# Tolerance on the relative error ||g_window - g_reference|| / ||g_reference||, by compute dtype, fixed a priori from
# the arithmetic (never tuned on results). Both passes run the same backbone on the same micro-batches (same shapes,
# same seeds), so they differ only in the loss-side arithmetic: the user's loss kernel (e.g. TRL's chunked fused
# log-softmax) against F.cross_entropy, the order of the sums, where the division happens. In fp32 (unit roundoff
# u = 2^-24 ~ 6e-8) that is a few ulps per element, amplified by the backward through the backbone: ~1e-6 expected,
# so 1e-3 leaves three orders of margin, while the per-micro-batch mean's error is of the order of the relative
# spread of the micro-batches' token counts (loss_agg.py): 1e-3 catches a spread of a few %. In bf16 (u = 2^-8 ~
# 3.9e-3) the two passes round differently
# at every op in the loss head and in the backward: ~5u = 2e-2; a mis-weighting smaller than 2 % is not detectable in
# bf16. fp16 (u = 2^-11 ~ 4.9e-4): 5u ~ 2.5e-3, taken as 5e-3.
TOLERANCE = {torch.float32: 1e-3, torch.float64: 1e-3, torch.bfloat16: 2e-2, torch.float16: 5e-3}

# The model inputs the reference forward passes on (when the batch has them); never `labels` (the loss is ours).
_FORWARD_KEYS = ("input_ids", "attention_mask", "position_ids", "token_type_ids", "pixel_values",
                 "pixel_attention_mask", "image_grid_thw", "image_sizes", "cu_seq_lens_q", "cu_seq_lens_k",
                 "max_length_q", "max_length_k")
_SEED = 20240917  # any fixed value: both passes reseed with it (plus the micro-batch index) inside fork_rng


@dataclass(frozen=True)
class WindowCheck:
    """The outcome of `check_window_gradient`: one accumulation window's gradient against the one-batch one."""

    ok: bool | None  # None: no window tried could tell (every micro-batch had the same count) and the first passed
    ratio: float  # ||g_window|| / ||g_reference||
    rel_error: float  # ||g_window - g_reference|| / ||g_reference||
    cosine: float
    micro_batches: int
    tokens: list[int]  # label tokens per micro-batch (this rank's, after the one-position shift)
    normalise: str  # "token" | "sequence"
    tolerance: float
    seconds: float
    reason: str = ""  # why ok is what it is (GA 1; no window could tell; the likely cause of a failure)
    windows_tried: int = 1

    def message(self) -> str:
        unit = "label tokens" if self.normalise == "token" else "sequences"
        lines = [
            f"the gradient of one accumulation window ({self.micro_batches} micro-batches, label tokens "
            f"{self.tokens}) is {self.ratio:.4g}x the one-batch gradient of the same samples (relative error "
            f"{self.rel_error:.3g}, cosine {self.cosine:.6f}, tolerance {self.tolerance:g})",
            f"reference: the loss normalised per {self.normalise} over the whole window (sum / window {unit})",
        ]
        if self.ok is True:
            lines.append("ok: the loss is normalised over the whole accumulation window")
        elif self.ok is False:
            lines.append("FAILED: the window's gradient is not the one-batch gradient of its samples")
        else:
            lines.append("undecided: these windows cannot show a per-micro-batch mean")
        if self.reason:
            lines.append(self.reason)
        lines.append(f"check took {self.seconds:.2f} s (two forward-backward passes over one window; "
                     f"{self.windows_tried} window(s) collated)")
        return "\n".join(lines)


# --------------------------------------------------------------------------------------------------- helpers
def _dist_world() -> int:
    d = torch.distributed
    return d.get_world_size() if d.is_available() and d.is_initialized() else 1


def _all_reduce_(t: torch.Tensor, op=None) -> torch.Tensor:
    if _dist_world() > 1:
        torch.distributed.all_reduce(t, op=op or torch.distributed.ReduceOp.SUM)
    return t


def _is_deepspeed(trainer) -> bool:
    from accelerate.utils import DistributedType

    return getattr(trainer.accelerator, "distributed_type", None) == DistributedType.DEEPSPEED


def _module_to_run(trainer, model):
    """The plain nn.Module the two passes run: unwrap a DeepSpeed engine or DDP; refuse what cannot be checked."""
    if model is None:
        model = getattr(trainer, "model_wrapped", None)
        model = trainer.model if model is None else model
    if getattr(trainer, "is_fsdp_enabled", False) or type(model).__name__.startswith("FullyShardedDataParallel"):
        raise ValueError("loss check: FSDP shards the parameters; a local autograd.grad would see shards only")
    if isinstance(model, torch.nn.DataParallel) or getattr(trainer.args, "n_gpu", 1) > 1:
        raise ValueError("loss check: torch.nn.DataParallel (n_gpu > 1 in one process) is not supported")
    if _is_deepspeed(trainer):
        engine = getattr(getattr(trainer.accelerator, "deepspeed_engine_wrapped", None), "engine", None)
        stage = engine.zero_optimization_stage() if engine is not None else None
        if stage is None:
            plugin = getattr(trainer.accelerator.state, "deepspeed_plugin", None)
            stage = getattr(plugin, "zero_stage", None)
        if stage is not None and int(stage) >= 3:
            raise ValueError(f"loss check: DeepSpeed ZeRO-{stage} partitions the parameters; a local autograd.grad "
                             "would see empty shards (ZeRO-0/1/2 only)")
    if isinstance(model, torch.nn.parallel.DistributedDataParallel) or (
            _is_deepspeed(trainer) and isinstance(getattr(model, "module", None), torch.nn.Module)):
        model = model.module  # DDP, or the DeepSpeed engine (trainer.model_wrapped): the plain module inside
    if any(hasattr(p, "ds_id") or hasattr(p, "ds_numel") for p in model.parameters()):
        raise ValueError("loss check: the parameters are ZeRO-3 partitioned (ds_id); ZeRO-0/1/2 only")
    opt = getattr(trainer, "optimizer", None)
    if "Lomo" in type(getattr(opt, "optimizer", opt)).__name__ or getattr(trainer.accelerator, "has_lomo_optimizer",
                                                                          False):
        raise ValueError("loss check: a LOMO optimizer updates the parameters inside backward")
    return model


def _compute_dtype(trainer, params) -> torch.dtype:
    """The dtype the arithmetic runs in: autocast's (the Trainer's bf16/fp16 mixed precision) or the parameters'."""
    args, mp = trainer.args, str(getattr(trainer.accelerator, "mixed_precision", "no"))
    if getattr(args, "bf16", False) or mp == "bf16":
        return torch.bfloat16
    if getattr(args, "fp16", False) or mp == "fp16":
        return torch.float16
    return params[0].dtype


def _shifted_labels(batch: Mapping) -> torch.Tensor | None:
    """The targets the causal-LM loss scores: `shift_labels` as they are, else labels[..., 1:]."""
    if "shift_labels" in batch:
        return batch["shift_labels"]
    if "labels" in batch and torch.is_tensor(batch["labels"]):
        return batch["labels"][..., 1:]
    return None


def _counts(batch: Mapping, normalise: str) -> tuple[int, int]:
    """(label tokens, sequences with at least one label token) of one micro-batch."""
    tgt = _shifted_labels(batch)
    if tgt is None:
        raise ValueError("loss check: the batch has no `labels`; the reference needs them")
    mask = tgt != -100
    if mask.dim() == 1:
        mask = mask.unsqueeze(0)
    return int(mask.sum()), int((mask.sum(-1) > 0).sum())


def _fork_rng(device: torch.device):
    """Fork the CPU generator, and the model's CUDA device's (only that one: forking every device is slow)."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return torch.random.fork_rng(devices=[index], device_type="cuda")
    return torch.random.fork_rng(devices=[], device_type="cuda")


def _seed(i: int, device: torch.device) -> None:
    """Seed the generators a forward can draw from (CPU, and the current CUDA device) before micro-batch i. Not
    torch.manual_seed: that seeds every CUDA device, and fork_rng restores only the current one."""
    torch.random.default_generator.manual_seed(_SEED + i)
    if device.type == "cuda":
        torch.cuda.manual_seed(_SEED + i)


def _recorded_scale(trainer, kwargs: dict) -> float:
    """The factor `Accelerator.backward` applies to the loss before the backward (accelerate 1.15,
    accelerate/accelerator.py: Accelerator.backward):
      not DeepSpeed: loss / self.gradient_accumulation_steps (the Trainer builds its accelerator with num_steps 1,
        transformers/trainer.py: Trainer.create_accelerator_and_postprocess, "The Trainer handles GAS itself"; a
        fp16 GradScaler scales and unscales before the step: no net factor);
      DeepSpeed: DeepSpeedEngineWrapper.backward -> engine.backward(loss, scale_wrt_gas=...) which divides by the
        engine's GA unless scale_wrt_gas=False (deepspeed 0.19.8, deepspeed/runtime/engine.py:
        DeepSpeedEngine.backward, `loss / self.gradient_accumulation_steps() if scale_wrt_gas else loss`); the
        Trainer passes scale_wrt_gas=False (transformers/trainer.py: Trainer.training_step) since it divides itself.
        The ZeRO optimizer's loss scale (fp16) is undone before the step: no net factor."""
    acc = trainer.accelerator
    if _is_deepspeed(trainer):
        if not kwargs.get("scale_wrt_gas", True):
            return 1.0
        engine = acc.deepspeed_engine_wrapped.engine
        return 1.0 / float(engine.gradient_accumulation_steps())
    return 1.0 / float(acc.gradient_accumulation_steps)


def _grads(loss: torch.Tensor, params: list[torch.Tensor]) -> list[torch.Tensor | None]:
    if not loss.requires_grad:  # e.g. a micro-batch without a label token whose loss is a constant zero
        return [None] * len(params)
    try:
        return list(torch.autograd.grad(loss, params, allow_unused=True))
    except RuntimeError as exc:
        if "checkpoint" in str(exc):
            raise RuntimeError("loss check: reentrant activation checkpointing is incompatible with autograd.grad; "
                               "use gradient_checkpointing_kwargs={'use_reentrant': False}") from exc
        raise


def _add_(acc: list[torch.Tensor], grads, scale: float = 1.0) -> None:
    for a, g in zip(acc, grads, strict=True):
        if g is not None:
            a.add_(g.detach().to(a.dtype), alpha=scale)


def _reference_sum(module, batch: Mapping, normalise: str) -> torch.Tensor:
    """The micro-batch's share of the one-batch loss before the window's division: the sum of its label tokens'
    cross-entropies (token) or of its sequences' token means (sequence). Plain torch from the logits."""
    inputs = {k: batch[k] for k in _FORWARD_KEYS if k in batch}
    if "attention_mask" not in batch and "position_ids" in batch and normalise == "sequence":
        raise ValueError("loss check: per-sequence normalisation needs one sequence per row (padding-free batch)")
    out = module(**inputs, use_cache=False)
    logits = out["logits"] if isinstance(out, Mapping) else getattr(out, "logits", out[0])
    tgt = _shifted_labels(batch)
    if "shift_labels" not in batch:
        logits = logits[..., :-1, :]
    tgt = tgt.to(logits.device)
    ce = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), tgt.reshape(-1), ignore_index=-100,
                         reduction="none").view(tgt.shape)
    if normalise == "token":
        return ce.sum()
    mask = tgt != -100
    n = mask.sum(-1)
    rows = n > 0
    return (ce.sum(-1)[rows] / n[rows]).sum()


def _reference_pass(trainer, module, params, batches, per_mb, normalise, device, ds_ctx=nullcontext):
    """This rank's reference sums, micro-batch by micro-batch, same seeds as the Trainer's pass: (the gradient of the
    window's loss sum before the division by its count, the gradient of a per-micro-batch mean divided by GA)."""
    g_sum = [torch.zeros_like(p, dtype=torch.float32) for p in params]
    g_pmm = [torch.zeros_like(p, dtype=torch.float32) for p in params]
    module.train()  # as training_step leaves it: the same dropout behaviour as the Trainer's pass
    for i, b in enumerate(batches):
        _seed(i, device)
        with ds_ctx(), trainer.compute_loss_context_manager():
            s = _reference_sum(module, trainer._prepare_inputs(dict(b)), normalise)
        g = _grads(s, params)
        _add_(g_sum, g)
        if per_mb[i] > 0:
            _add_(g_pmm, g, 1.0 / (len(batches) * per_mb[i]))
    return g_sum, g_pmm


def reference_gradient(trainer, batches: list, model=None, normalise: str = "token") -> list[torch.Tensor]:
    """The check's reference on given micro-batches, one process: the one-batch gradient of their samples, per
    trainable parameter (fp32), normalised per token or per sequence over all of them. Exposed so that the reference
    itself can be tested against an independent computation; leaves no trace, like the check."""
    if normalise not in NORMALISE:
        raise ValueError(f"normalise must be one of {NORMALISE}, not {normalise!r}")
    module = _module_to_run(trainer, model)
    params = [p for p in module.parameters() if p.requires_grad]
    device = params[0].device
    per_mb = [_counts(b, normalise)[0 if normalise == "token" else 1] for b in batches]
    if sum(per_mb) == 0:
        raise ValueError("loss check: the micro-batches have no label token")
    snap = _Restore(trainer, module, params)
    try:
        with _fork_rng(device):
            g_sum, _ = _reference_pass(trainer, module, params, batches, per_mb, normalise, device,
                                       _deepspeed_autocast(trainer))
    finally:
        snap.restore()
    return [g.div_(sum(per_mb)) for g in g_sum]


class _Restore:
    """Snapshots of what the two passes may touch, restored by `restore()`."""

    def __init__(self, trainer, module, params):
        self.trainer, self.module, self.params = trainer, module, params
        self.py_random = random.getstate()
        self.np_random = np.random.get_state()
        self.training = [(m, m.training) for m in module.modules()]
        self.grads = [p.grad for p in params]
        acc = trainer.accelerator
        self.dataloaders = list(getattr(acc, "_dataloaders", []))
        gs = getattr(acc, "gradient_state", None)
        self.gradient_state = dict(gs.__dict__) if gs is not None else None
        self.backward_in_dict = "backward" in acc.__dict__
        self.backward = acc.__dict__.get("backward")
        # The Trainer's attributes: rebinding (counters, current_gradient_accumulation_steps) is undone; containers
        # of plain values (TRL's _metrics) and simple counter objects (attributes all numbers) are deep-copied.
        self.attrs = dict(trainer.__dict__)
        self.containers = {k: copy.deepcopy(v) for k, v in self.attrs.items() if _plain(v)}  # restored in place
        self.objects = {k: dict(v.__dict__) for k, v in self.attrs.items()
                        if not _plain(v) and _simple_object(v)}

    def restore_backward(self) -> None:
        """Put accelerator.backward back (an instance attribute, e.g. a user's wrapper, or the class's method)."""
        acc = self.trainer.accelerator
        if self.backward_in_dict:
            acc.__dict__["backward"] = self.backward
        else:
            acc.__dict__.pop("backward", None)

    def restore(self) -> None:
        t, acc = self.trainer, self.trainer.accelerator
        self.restore_backward()
        for m, flag in self.training:
            m.training = flag
        for p, g in zip(self.params, self.grads, strict=True):
            p.grad = g
        if hasattr(acc, "_dataloaders"):
            acc._dataloaders[:] = self.dataloaders
        if self.gradient_state is not None:
            acc.gradient_state.__dict__.update(self.gradient_state)
        for k in [k for k in t.__dict__ if k not in self.attrs]:
            del t.__dict__[k]
        for k, v in self.attrs.items():
            t.__dict__[k] = v
            if k in self.containers:  # in place: whoever else holds the container sees the restored one
                saved = self.containers[k]
                if isinstance(v, dict):
                    v.clear()
                    v.update(saved)
                elif isinstance(v, list):
                    v[:] = saved
                elif isinstance(v, set):
                    v.clear()
                    v.update(saved)
                else:  # a tuple: immutable, only rebinding can change it
                    t.__dict__[k] = saved
        for k, d in self.objects.items():
            self.attrs[k].__dict__.clear()
            self.attrs[k].__dict__.update(d)
        random.setstate(self.py_random)
        np.random.set_state(self.np_random)


def _plain(v, depth: int = 0) -> bool:
    """A container of plain values (dict/list/tuple/set of numbers and strings, nested a few levels)."""
    if depth > 4:
        return False
    if isinstance(v, dict):
        return all(_plain(k, depth + 1) and _plain(x, depth + 1) for k, x in v.items())
    if isinstance(v, (list, tuple, set)):
        return all(_plain(x, depth + 1) for x in v)
    return depth > 0 and (v is None or isinstance(v, (bool, int, float, str)))


def _simple_object(v) -> bool:
    d = getattr(v, "__dict__", None)
    return (isinstance(d, dict) and bool(d) and not isinstance(v, (type, torch.nn.Module))
            and all(isinstance(x, (bool, int, float)) for x in d.values()))


def _windows(trainer, ga: int, max_windows: int, normalise: str):
    """Collate up to `max_windows` windows from a fresh training dataloader; stop at the first whose micro-batches'
    counts differ (on any rank). Returns (chosen window, its num_items_in_batch, windows collated, can tell)."""
    loader = trainer.get_train_dataloader()
    it = iter(loader)
    first = None
    tried = 0
    try:
        for _ in range(max(1, max_windows)):
            batches, n_items = trainer.get_batch_samples(it, ga, trainer.args.device)
            if not batches:
                break
            tried += 1
            if first is None:
                first = (batches, n_items)
            idx = 0 if normalise == "token" else 1
            counts = [_counts(b, normalise)[idx] for b in batches]
            lo_hi = torch.tensor([min(counts), -max(counts)], dtype=torch.float64, device=_reduce_device())
            _all_reduce_(lo_hi, torch.distributed.ReduceOp.MIN if _dist_world() > 1 else None)
            if lo_hi[0].item() != -lo_hi[1].item():
                return batches, n_items, tried, True
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()
        end = getattr(loader, "end", None)  # accelerate's DataLoaderShard: leave the gradient state's list
        if end is not None:
            end()
    if first is None:
        raise ValueError("loss check: the training dataloader yields no batch")
    return first[0], first[1], tried, False


def _reduce_device() -> torch.device:
    if _dist_world() > 1 and torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# --------------------------------------------------------------------------------------------------- the check
def check_window_gradient(trainer, model=None, normalise: str = "token", tolerance: float | None = None,
                          max_windows: int = 4) -> WindowCheck:
    """Compare the gradient of one accumulation window, through the Trainer's own path, with the one-batch
    gradient of the same samples (module docstring). `model`: the model the Trainer trains (a callback's
    kwargs["model"]; default trainer.model_wrapped or trainer.model). Leaves no trace on training."""
    if normalise not in NORMALISE:
        raise ValueError(f"normalise must be one of {NORMALISE}, not {normalise!r}")
    t0 = time.perf_counter()
    module = _module_to_run(trainer, model)
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        raise ValueError("loss check: the model has no trainable parameter")
    if tolerance is None:
        tolerance = TOLERANCE.get(_compute_dtype(trainer, params), 2e-2)
    ga = int(trainer.args.gradient_accumulation_steps)
    device = params[0].device
    acc = trainer.accelerator
    snap = _Restore(trainer, module, params)
    try:
        with _fork_rng(device):
            batches, n_items, tried, can_tell = _windows(trainer, ga, max_windows, normalise)
            trainer.current_gradient_accumulation_steps = len(batches)  # as Trainer._run_epoch sets it
            counts = [_counts(b, normalise) for b in batches]
            per_mb = [c[0] if normalise == "token" else c[1] for c in counts]

            # (1) the Trainer's pass: record the loss handed to accelerator.backward, differentiate it ourselves
            recorded: list[tuple[torch.Tensor, dict]] = []
            acc.__dict__["backward"] = lambda loss, **kw: recorded.append((loss, kw))
            g_win = [torch.zeros_like(p, dtype=torch.float32) for p in params]
            ds_ctx = _deepspeed_autocast(trainer)
            for i, b in enumerate(batches):
                _seed(i, device)
                recorded.clear()
                with ds_ctx():
                    trainer.training_step(module, dict(b), n_items)
                if len(recorded) != 1:
                    raise RuntimeError(f"loss check: training_step called accelerator.backward {len(recorded)} "
                                       "times for one micro-batch (expected once)")
                loss, kw = recorded[0]
                _add_(g_win, _grads(loss * _recorded_scale(trainer, kw), params))
                del loss, recorded[:]
            snap.restore_backward()

            # (2) the reference: plain cross-entropy sums from the logits, one division by the window's count
            g_sum, g_pmm = _reference_pass(trainer, module, params, batches, per_mb, normalise, device, ds_ctx)
            total = torch.tensor(float(sum(per_mb)), dtype=torch.float64, device=_reduce_device())
            _all_reduce_(total)
            world = _dist_world()
            for a, b_, c in zip(g_win, g_sum, g_pmm, strict=True):  # DDP / DeepSpeed average the ranks' gradients
                _all_reduce_(a).div_(world)
                _all_reduce_(b_)
                _all_reduce_(c).div_(world)
            if total.item() == 0:
                raise ValueError("loss check: the window has no label token")
            g_ref = [x.div_(total.item()) for x in g_sum]
    finally:
        snap.restore()

    ref_n, win_n = _norm(g_ref), _norm(g_win)
    diff = math.sqrt(sum(float((a - b).pow(2).sum()) for a, b in zip(g_win, g_ref, strict=True)))
    dot = sum(float((a * b).sum()) for a, b in zip(g_win, g_ref, strict=True))
    ratio = win_n / ref_n if ref_n > 0 else math.inf
    rel = diff / ref_n if ref_n > 0 else math.inf
    cos = dot / (win_n * ref_n) if win_n > 0 and ref_n > 0 else 0.0
    passed = rel <= tolerance
    tokens = [c[0] for c in counts]
    if not passed:
        ok, reason = False, _diagnose(g_win, g_pmm, ref_n, ratio, cos, len(batches), tolerance, normalise)
    elif ga == 1:
        ok, reason = True, ("gradient accumulation is 1: nothing can be mis-aggregated across micro-batches; the one "
                            "micro-batch's normalisation was checked")
    elif can_tell:
        ok, reason = True, ""
    else:
        unit = "label-token" if normalise == "token" else "sequence"
        ok, reason = None, (f"every micro-batch of the {tried} window(s) tried had the same {unit} count "
                            f"({per_mb} in the first): a per-micro-batch mean gives the same gradient as the window "
                            "mean there, so this check cannot tell; give it data of different lengths")
    return WindowCheck(ok=ok, ratio=ratio, rel_error=rel, cosine=cos, micro_batches=len(batches), tokens=tokens,
                       normalise=normalise, tolerance=float(tolerance), seconds=time.perf_counter() - t0,
                       reason=reason, windows_tried=tried)


def _deepspeed_autocast(trainer):
    """DeepSpeed's torch-autocast config wraps the engine's forward (deepspeed/runtime/engine.py:
    DeepSpeedEngine.forward, `autocast_if_enabled(self)`); the unwrapped module needs it around both passes."""
    if not _is_deepspeed(trainer):
        return nullcontext
    engine = getattr(getattr(trainer.accelerator, "deepspeed_engine_wrapped", None), "engine", None)
    try:
        from deepspeed.runtime.torch_autocast import autocast_if_enabled
    except ImportError:  # pragma: no cover - older DeepSpeed: no torch-autocast config
        return nullcontext
    if engine is None:
        return nullcontext

    def ctx():
        stack = ExitStack()
        stack.enter_context(autocast_if_enabled(engine))
        return stack

    return ctx


def _norm(gs: list[torch.Tensor]) -> float:
    return math.sqrt(sum(float(g.pow(2).sum()) for g in gs))


def _diagnose(g_win, g_pmm, ref_n, ratio, cos, m, tol, normalise) -> str:
    """Name the likely cause of a failed comparison from the usual culprits."""
    unit = "token" if normalise == "token" else "sequence"
    pmm_n = _norm(g_pmm)
    if pmm_n > 0:
        for scale, what in ((1.0, f"divided by GA ({m})"), (float(m), "NOT divided by GA")):
            d = math.sqrt(sum(float((a - scale * b).pow(2).sum()) for a, b in zip(g_win, g_pmm, strict=True)))
            if d <= tol * scale * pmm_n:
                return (f"likely cause: the loss is a {unit} mean per micro-batch, {what} (a mean of means: each "
                        f"micro-batch weighs the same whatever its {unit} count); normalise by the whole window's "
                        "count (transformers passes it to compute_loss as num_items_in_batch)")
    if cos >= 1 - tol:
        hint = ""
        if abs(ratio * m - 1) <= 10 * tol:
            hint = f" (about 1/GA: divided by GA = {m} once too often)"
        elif abs(ratio / m - 1) <= 10 * tol:
            hint = f" (about GA = {m}: a division by GA is missing)"
        return f"likely cause: the right direction with the wrong scale, {ratio:.4g}x{hint}"
    return ("likely cause: unknown; the loss weighs the window's tokens differently from the one-batch "
            f"{unit} mean (another normaliser, masking that differs from labels != -100, or an extra term)")
