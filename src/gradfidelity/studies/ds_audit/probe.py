"""Micro-batch contribution probe: which micro-batches reached the optimizer, and with what weight, step by step?

Why this design: a training system that loses micro-batches does so silently; the loss still goes down. To see it
we need a problem where the gradient the optimizer applied can be *decomposed* back into the micro-batches it came
from. The model `TaggedRegression` has

- a shared weight `w` (dim,) that every micro-batch touches, with inputs drawn from one distribution, so the
  per-micro-batch gradients on `w` share their direction (the reported norm under the offload bug is then close to
  2/N of the true one; how close is a property of that alignment, not of DeepSpeed: claim A3 measures the mechanism,
  reported norm = norm of g0 + g(N-1), instead), and
- a tag vector `tag` (n_slots,) where micro-batch k touches only `tag[k]`, so the per-micro-batch gradients are
  linearly independent and the weight of each one is identifiable exactly. Every optimizer step uses its own slots
  (step s, micro-step m, backward call j, rank r -> one k), so a gradient left over from an earlier step (a stale or
  unzeroed buffer) lands on rows that the current step's micro-batches do not touch and shows up in `residual`.

The loss is linear in the prediction, `-mean(y * y_hat)`: its gradient does not depend on the parameters, so the
per-micro-batch gradients of every step are the same known columns whatever earlier steps did, and several
consecutive SGD(lr=1) steps stay identifiable (with a squared error, lr 1 on this problem overshoots by ~17x a step).
With plain SGD at lr 1, no momentum and no weight decay, `p_before - p_after` IS the applied gradient. The probe
solves `applied = G @ c` by least squares, where column k of G is the exact plain-torch gradient of micro-batch k
scaled exactly as DeepSpeed scales it (loss / gradient_accumulation_steps, averaged over data-parallel ranks).
A faithful, unclipped system gives c = 1 everywhere; the DeepSpeed 0.15.2-0.18.9 offload bug gives [1, 0, ..., 0, 1].

Targets are scaled (gradients are linear in y) so that the faithful gradient norm of a step is `target_norm`: the
accumulation cases keep it below any clipping threshold in play (clipping stays on, same code path, but never
rescales a faithful step), and the clipping case sets it to twice the threshold, so the clip coefficient actually
applied is measured and compared with the one the full gradient would give.

Nothing here imports DeepSpeed: the probe is tested against hand-built faulty accumulators.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

# Tolerance on |c_k - expected| (and on |c_k| for a dropped one), fixed a priori from the arithmetic of the dtype,
# never tuned on results. fp32: rounding of one SGD step is ~1e-7 relative. bf16: an 8-bit mantissa (2^-8 = 0.4%)
# rounds each gradient entry by at most 2^-9 relative; the reference runs the same bf16 ops, so 1e-2 (about 2.5
# bf16 ulps) separates a 3% mis-weighting from faithful. A mis-weighting below 1% cannot be resolved in bf16; the
# audit says so in its output.
TOLERANCE = {"fp32": 1e-3, "bf16": 1e-2}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class ProbeSpec:
    """What the probe steps look like; identical on every rank.

    ga: gradient_accumulation_steps; backward_calls: backward() calls per micro-step (>1: the multi-backward pattern,
    used with ga == 1); world: data-parallel ranks; steps: consecutive optimizer steps; target_norm: the faithful
    gradient norm of one step (targets scaled to it).
    """

    ga: int
    world: int = 1
    backward_calls: int = 1
    micro_batch: int = 2
    dim: int = 8
    dtype: str = "fp32"
    steps: int = 1
    target_norm: float = 0.25
    seed: int = 0
    tag_scale: float = 0.05

    @property
    def slots_per_rank(self) -> int:
        """Backward passes per rank per optimizer step."""
        return self.ga * self.backward_calls

    @property
    def slots_per_step(self) -> int:
        return self.slots_per_rank * self.world

    @property
    def n_slots(self) -> int:
        return self.slots_per_step * self.steps

    def slot(self, rank: int, micro_step: int, call: int, step: int = 0) -> int:
        """Global micro-batch index: step-major, then rank, then micro-step, then backward call."""
        return step * self.slots_per_step + rank * self.slots_per_rank + micro_step * self.backward_calls + call


class TaggedRegression(nn.Module):
    """y_hat = x @ w + tag_scale * tag[k]. Parameters start at zero."""

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
    """-mean(y * y_hat) in fp32 whatever the model dtype: linear in the prediction (see the module docstring)."""
    return -(pred.float() * y).mean()


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
    """Target scale that makes the faithful gradient of step 0 have norm `target_norm` (gradients are linear in y)."""
    g = _raw_reference(spec, 1.0)[:, : spec.slots_per_step].sum(dim=1)
    return spec.target_norm / float(g.norm())


@dataclass
class Reference:
    """Exact plain-torch answer: per-slot gradients (P, n_slots) and the target scale."""

    per_slot: torch.Tensor
    y_scale: float
    spec: ProbeSpec

    def step_cols(self, step: int) -> slice:
        n = self.spec.slots_per_step
        return slice(step * n, (step + 1) * n)

    def applied(self, step: int = 0) -> torch.Tensor:  # (P,) the gradient a faithful system applies at `step`
        return self.per_slot[:, self.step_cols(step)].sum(dim=1)


def reference(spec: ProbeSpec) -> Reference:
    scale = y_scale_for(spec)
    return Reference(per_slot=_raw_reference(spec, scale), y_scale=scale, spec=spec)


def clip_coefficient(norm: float, threshold: float) -> float:
    """DeepSpeed's clip coefficient for a gradient of `norm` under `threshold` (0 = off)."""
    if threshold <= 0 or norm <= threshold:
        return 1.0
    return threshold / (norm + 1e-6)


@dataclass
class StepResult:
    """One optimizer step. contributions[k] = weight of this step's micro-batch k (1 = counted once, 0 = lost)."""

    contributions: list[float]
    reported_norm: float | None  # the norm the system reported (None: it reports none)
    true_norm: float  # norm of the faithful (full-window) gradient
    applied_norm: float  # norm of the gradient actually applied
    kept_norm: float | None  # norm of G @ kept (the unclipped sum of the micro-batches that reached the step)
    residual: float  # relative least-squares residual: what no micro-batch of this step explains
    clip_applied: float | None  # applied_norm / kept_norm: the clip coefficient actually applied
    clip_full: float  # the clip coefficient the full gradient would give under the effective threshold
    max_param_dev: float  # max |p_after - p_after_reference| for this step, from the measured p_before
    storage_rounding: float = 0.0  # bound on the residual that bf16 parameter storage alone causes (see analyse_step)

    @property
    def grad_norm_ratio(self) -> float | None:
        return None if self.reported_norm is None else self.reported_norm / self.true_norm

    @property
    def applied_norm_ratio(self) -> float:
        return self.applied_norm / self.true_norm

    @property
    def reported_over_kept(self) -> float | None:
        """Reported norm / norm of what was accumulated (1 when the norm is computed on the kept gradients)."""
        if self.reported_norm is None or not self.kept_norm:
            return None
        return self.reported_norm / self.kept_norm


def _kept(c: torch.Tensor, tol: float) -> torch.Tensor | None:
    """The 0/1 pattern of which micro-batches reached the step, from c / max(c) (clipping scales c uniformly);
    None when c is not such a pattern (a mis-weighting)."""
    top = float(c.max())
    if top <= tol:
        return torch.zeros_like(c)
    r = c / top
    pattern = r.round()
    if not bool(((r - pattern).abs() <= tol).all()) or bool(((pattern != 0) & (pattern != 1)).any()):
        return None
    return pattern


def analyse_step(spec: ProbeSpec, ref: Reference, step: int, before: torch.Tensor, after: torch.Tensor,
                 reported_norm: float | None, clip: float = 0.0, lr: float = 1.0) -> StepResult:
    """Solve applied = G_step c by least squares. before/after: flat fp32 parameters (P,) around one SGD(lr) step.

    The weights come from the identifying rows (the tag block of this step's slots, where column k alone is non-zero
    in row k); the remaining rows are then a check: `residual` is how much of the WHOLE applied gradient G c fails
    to explain (a gradient on an earlier step's tag is a stale buffer). Why not one least squares over all rows: the
    w-columns are nearly parallel by design, so in bf16 their rounding would leak into c through the near-singular
    w-block; the tag block is diagonal and well conditioned. Being diagonal (checked here, not assumed), it is solved
    by division: a general least squares costs (GA x K x ranks)^3, minutes at GA 5000, for the same answer.
    """
    applied = (before - after).double() / lr  # (P,)
    cols = ref.step_cols(step)
    G = ref.per_slot[:, cols].double()  # (P, slots_per_step)
    ids = slice(spec.dim + cols.start, spec.dim + cols.stop)  # this step's tag rows
    block, diag = G[ids], torch.diagonal(G[ids])
    if bool((diag != 0).all()) and int(torch.count_nonzero(block)) == diag.numel():
        c = applied[ids] / diag
    else:  # not the probe's own reference (a hand-built one in a test): the general solve
        c = torch.linalg.lstsq(block, applied[ids].unsqueeze(1)).solution.squeeze(1)
    true = ref.applied(step).double()
    true_norm = float(true.norm())
    resid = float((G @ c - applied).norm() / true.norm())
    clip_full = clip_coefficient(true_norm, clip)
    dev = float((after.double() - (before.double() - lr * clip_full * true)).abs().max())
    kept = _kept(c, TOLERANCE[spec.dtype])
    kept_norm = None if kept is None else float((G @ kept).norm())
    applied_norm = float(applied.norm())
    # When the system stores the parameters themselves in bf16 (DeepSpeed's ZeRO-0 bf16 keeps no fp32 copy that the
    # probe can read), before and after are each rounded by at most 2^-9 relative, so the delta carries an error of
    # up to 2^-9 (||before|| + ||after||) that no micro-batch explains; it grows with the parameters, step by step.
    # This is the probe's resolution, not a gradient error: the residual allows it on top of the dtype tolerance.
    bf16_stored = spec.dtype == "bf16" and bool((after.to(torch.bfloat16).float() == after).all()) \
        and bool((before.to(torch.bfloat16).float() == before).all())
    storage = float(2.0 ** -9 * (before.norm() + after.norm()) / true.norm()) if bf16_stored else 0.0
    return StepResult(
        contributions=[float(v) for v in c],
        reported_norm=None if reported_norm is None else float(reported_norm),
        true_norm=true_norm, applied_norm=applied_norm, kept_norm=kept_norm, residual=resid,
        clip_applied=None if not kept_norm else applied_norm / kept_norm, clip_full=clip_full, max_param_dev=dev,
        storage_rounding=storage,
    )


@dataclass
class ProbeResult:
    """What the probe measured over `steps` consecutive optimizer steps (`per_step`), and the verdict."""

    per_step: list[StepResult]
    tolerance: float
    slots_per_rank: int
    world: int
    clip: float = 0.0  # the effective clipping threshold the system used (0 = off)
    extra: dict = field(default_factory=dict)

    @property
    def contributions(self) -> list[float]:
        """Step 0's vector (all steps: `per_step`)."""
        return self.per_step[0].contributions

    def step_faithful(self, s: StepResult) -> bool:
        return s.residual <= self.tolerance + s.storage_rounding \
            and all(abs(c - s.clip_full) <= self.tolerance for c in s.contributions)

    @property
    def faithful(self) -> bool:
        return all(self.step_faithful(s) for s in self.per_step)

    @property
    def dropped(self) -> list[list[int]]:
        """Per step, the micro-batches whose weight is zero."""
        return [[k for k, c in enumerate(s.contributions) if abs(c) <= self.tolerance] for s in self.per_step]

    def to_dict(self) -> dict:
        d = asdict(self)
        for s, out in zip(self.per_step, d["per_step"], strict=True):
            out.update(grad_norm_ratio=s.grad_norm_ratio, applied_norm_ratio=s.applied_norm_ratio,
                       reported_over_kept=s.reported_over_kept, faithful=self.step_faithful(s))
        d.update(faithful=self.faithful, dropped=self.dropped)
        return d


StepFn = Callable[[TaggedRegression, Sequence[tuple[int, torch.Tensor, torch.Tensor]], int], float | None]


def probe_plain(spec: ProbeSpec, step: StepFn, clip: float = 0.0) -> ProbeResult:
    """Run the probe against a single-process accumulator `step(model, batches, s) -> reported norm`.

    `batches` lists (k, x, y) for every slot of every rank of step s in order; each call must do ONE SGD(lr=1)
    update. Used to test the probe itself without DeepSpeed.
    """
    ref = reference(spec)
    model = TaggedRegression(spec.dim, spec.n_slots, spec.tag_scale).to(DTYPES[spec.dtype])
    out = []
    for s in range(spec.steps):
        before = flat_params(model)
        cols = ref.step_cols(s)
        batches = [(k, *micro_batch(spec, k, ref.y_scale)) for k in range(cols.start, cols.stop)]
        norm = step(model, batches, s)
        out.append(analyse_step(spec, ref, s, before, flat_params(model), norm, clip))
    return ProbeResult(per_step=out, tolerance=TOLERANCE[spec.dtype], slots_per_rank=spec.slots_per_rank,
                       world=spec.world, clip=clip)
