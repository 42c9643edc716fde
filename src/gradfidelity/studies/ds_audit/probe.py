"""Micro-batch contribution probe: which micro-batches reached the optimizer, and with what weight?

Why this design: a training system that loses micro-batches does so silently; the loss still goes down. To see it
we need a problem where the gradient the optimizer applied can be *decomposed* back into the micro-batches it came
from. The model `TaggedRegression` has

- a shared weight `w` (dim,) that every micro-batch touches, with inputs drawn from one distribution, so the
  per-micro-batch gradients on `w` share their direction (that is what makes the reported gradient norm scale
  like 2/N under the DeepSpeed offload bug, claim A3), and
- a tag vector `tag` (n_slots,) where micro-batch k touches only `tag[k]`, so the per-micro-batch gradients are
  linearly independent and the weight of each one is identifiable exactly.

With plain SGD at lr 1, no momentum and no weight decay, `p_before - p_after` IS the applied gradient. The probe
solves `applied = G @ c` by least squares, where column k of G is the exact plain-torch gradient of micro-batch k
scaled exactly as DeepSpeed scales it (loss / gradient_accumulation_steps, averaged over data-parallel ranks).
A faithful system gives c = 1 everywhere; the DeepSpeed 0.15.2-0.18.9 offload bug gives [1, 0, ..., 0, 1].

Nothing here imports DeepSpeed: the probe is tested against a hand-built dropping accumulator.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

# Tolerance on |c_k - 1| (and on |c_k| for a dropped one), fixed a priori from the arithmetic of the dtype, never
# tuned on results: fp32 rounding of one SGD step is ~1e-7 relative; bf16 has an 8-bit mantissa (2^-8 = 0.4%),
# and a bf16 forward/backward may use other kernels than the reference, so allow ~8 bf16 ulps.
TOLERANCE = {"fp32": 1e-3, "bf16": 3e-2}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class ProbeSpec:
    """What one probe step looks like; identical on every rank.

    ga: gradient_accumulation_steps; backward_calls: backward() calls per micro-step (>1 is the PR #7981 case,
    used with ga == 1); world: data-parallel ranks; clip: gradient clipping threshold (0 = off).
    """

    ga: int
    world: int = 1
    backward_calls: int = 1
    micro_batch: int = 2
    dim: int = 8
    dtype: str = "fp32"
    clip: float = 0.0
    seed: int = 0
    tag_scale: float = 0.05

    @property
    def slots_per_rank(self) -> int:
        """Backward passes per rank per optimizer step."""
        return self.ga * self.backward_calls

    @property
    def n_slots(self) -> int:
        return self.slots_per_rank * self.world

    def slot(self, rank: int, micro_step: int, call: int) -> int:
        """Global micro-batch index: rank-major, then micro-step, then backward call."""
        return rank * self.slots_per_rank + micro_step * self.backward_calls + call


class TaggedRegression(nn.Module):
    """y_hat = x @ w + tag_scale * tag[k]. Parameters start at zero so that a step's delta is exactly -lr * grad."""

    def __init__(self, dim: int, n_slots: int, tag_scale: float):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(dim))  # (dim,) shared by all micro-batches
        self.tag = nn.Parameter(torch.zeros(n_slots))  # (n_slots,) tag[k] touched by micro-batch k only
        self.tag_scale = tag_scale

    def forward(self, x: torch.Tensor, k: int) -> torch.Tensor:  # x: (B, dim) -> (B,)
        return x @ self.w + self.tag_scale * self.tag[k]


def micro_batch(spec: ProbeSpec, k: int, y_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic micro-batch k (any rank can rebuild any other rank's data): x (B, dim), y (B,) in fp32.

    x ~ N(1, 1) per coordinate and y = x @ w* + 1 with w* = 0.5: one distribution, so the gradients on `w` point
    roughly the same way for every k, and mean(y) > 0 so every tag gradient is far from zero.
    """
    gen = torch.Generator().manual_seed(1_000_003 * spec.seed + k)
    x = 1.0 + torch.randn(spec.micro_batch, spec.dim, generator=gen)
    y = x @ torch.full((spec.dim,), 0.5) + 1.0 + 0.1 * torch.randn(spec.micro_batch, generator=gen)
    return x, y * y_scale


def loss_fn(pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean squared error in fp32 whatever the model dtype."""
    return ((pred.float() - y) ** 2).mean()


def flat_params(model: nn.Module) -> torch.Tensor:
    return torch.cat([model.w.detach().float().reshape(-1), model.tag.detach().float().reshape(-1)])


def _raw_reference(spec: ProbeSpec, y_scale: float) -> torch.Tensor:
    """Per-micro-batch gradients (P, n_slots), scaled as DeepSpeed scales them: / ga, then mean over ranks."""
    model = TaggedRegression(spec.dim, spec.n_slots, spec.tag_scale).to(DTYPES[spec.dtype])
    cols = []
    for k in range(spec.n_slots):
        model.zero_grad(set_to_none=True)
        x, y = micro_batch(spec, k, y_scale)
        (loss_fn(model(x.to(DTYPES[spec.dtype]), k), y) / spec.ga).backward()
        cols.append(torch.cat([model.w.grad.float(), model.tag.grad.float()]) / spec.world)
    return torch.stack(cols, dim=1)  # (P = dim + n_slots, n_slots)


def y_scale_for(spec: ProbeSpec) -> float:
    """Scale the targets (gradients are linear in y at the zero start) so the faithful gradient norm is half the
    clipping threshold: clipping stays on (same code path) but never rescales a faithful step, so the contribution
    vector measures accumulation only. Without clipping the scale is 1."""
    if spec.clip <= 0:
        return 1.0
    norm = float(_raw_reference(spec, 1.0).sum(dim=1).norm())
    return 0.5 * spec.clip / norm


@dataclass
class Reference:
    """Exact plain-torch answer for one probe step."""

    per_slot: torch.Tensor  # (P, n_slots)
    y_scale: float

    @property
    def applied(self) -> torch.Tensor:  # (P,) the gradient a faithful system applies
        return self.per_slot.sum(dim=1)


def reference(spec: ProbeSpec) -> Reference:
    scale = y_scale_for(spec)
    return Reference(per_slot=_raw_reference(spec, scale), y_scale=scale)


@dataclass
class ProbeResult:
    """What the probe measured. contributions[k] is the weight of micro-batch k (1 = counted once, 0 = lost)."""

    contributions: list[float]
    grad_norm_ratio: float | None  # norm the system reported / faithful norm (None: system reports none)
    applied_norm_ratio: float  # norm of the applied gradient / faithful norm
    max_param_dev: float  # max |p_after - p_after_reference|
    residual: float  # relative least-squares residual: how much of the applied gradient no micro-batch explains
    tolerance: float
    slots_per_rank: int
    world: int
    extra: dict = field(default_factory=dict)

    @property
    def rounded(self) -> list[float]:
        return [round(c, 3) + 0.0 for c in self.contributions]

    @property
    def dropped(self) -> list[int]:
        return [k for k, c in enumerate(self.contributions) if abs(c) <= self.tolerance]

    @property
    def faithful(self) -> bool:
        return self.residual <= self.tolerance and all(abs(c - 1) <= self.tolerance for c in self.contributions)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(faithful=self.faithful, dropped=self.dropped)
        return d


def analyse(
    spec: ProbeSpec,
    ref: Reference,
    before: torch.Tensor,
    after: torch.Tensor,
    reported_norm: float | None,
    lr: float = 1.0,
) -> ProbeResult:
    """Solve applied = G c by least squares. before/after: flat fp32 parameters (P,) around one SGD(lr) step.

    The weights come from the identifying rows (the tag block, where column k alone is non-zero in row k), solved
    by least squares; the shared rows (w) are then a check: `residual` is how much of the WHOLE applied gradient
    G c fails to explain. Why not one least squares over all rows: the w-columns are nearly parallel by design
    (A3 needs that), so in bf16 their rounding, large in absolute terms, would leak into c through the
    near-singular w-block; the tag block is diagonal and well conditioned.
    """
    applied = (before - after).double() / lr  # (P,)
    G = ref.per_slot.double()  # (P, n_slots)
    ids = slice(spec.dim, spec.dim + spec.n_slots)  # rows of the tag block
    c = torch.linalg.lstsq(G[ids], applied[ids].unsqueeze(1)).solution.squeeze(1)  # (n_slots,)
    true = ref.applied.double()
    resid = float((G @ c - applied).norm() / true.norm())
    dev = float((after.double() - (before.double() - lr * true)).abs().max())
    return ProbeResult(
        contributions=[float(v) for v in c],
        grad_norm_ratio=None if reported_norm is None else float(reported_norm) / float(true.norm()),
        applied_norm_ratio=float(applied.norm() / true.norm()),
        max_param_dev=dev,
        residual=resid,
        tolerance=TOLERANCE[spec.dtype],
        slots_per_rank=spec.slots_per_rank,
        world=spec.world,
    )


StepFn = Callable[[TaggedRegression, Sequence[tuple[int, torch.Tensor, torch.Tensor]]], float | None]


def probe_plain(spec: ProbeSpec, step: StepFn) -> ProbeResult:
    """Run the probe against a single-process accumulator `step(model, batches) -> reported norm`.

    `batches` lists (k, x, y) for every slot of every rank in order; the step must do ONE SGD(lr=1) update.
    Used to test the probe itself without DeepSpeed.
    """
    ref = reference(spec)
    model = TaggedRegression(spec.dim, spec.n_slots, spec.tag_scale).to(DTYPES[spec.dtype])
    before = flat_params(model)
    batches = [(k, *micro_batch(spec, k, ref.y_scale)) for k in range(spec.n_slots)]
    norm = step(model, batches)
    return analyse(spec, ref, before, flat_params(model), norm)


def predicted_norm_ratio_under_drop(spec: ProbeSpec, kept: Sequence[float]) -> float:
    """Norm ratio a system keeping micro-batch k with weight kept[k] would report (the A3 yardstick)."""
    ref = reference(spec)
    w = torch.tensor(kept, dtype=torch.float64)
    return float((ref.per_slot.double() @ w).norm() / ref.applied.double().norm())
