"""Gradient-delay schedules and mitigations as a wrapper around any torch optimizer (single process).

Words: `schedule` is where the gradient is evaluated, `mitigation` is the add-on; a run is (schedule, mitigation).
Weights W(t) are the weights before update t; W(-k) = W(0) (the pipeline starts from one version).

schedule
- `sync`:      W(t+1) = W(t) - u_t(g(W(t), b_t)).
- `2bw`:       W(t+1) = W(t) - u_t(g(W(t-1), b_t)): PipeDream-2BW, one step stale at any depth.
- `pipedream`: original PipeDream (weight stashing, update after every minibatch) without vertical sync: stage k of
               P evaluates with its own weights d_k = P-1-k updates stale, so the gradient is taken at the mixed
               point (W_0(t-d_0), ..., W_{P-1}(t)); stage k applies it to W_k(t). The last stage (final norm and an
               UNTIED LM head) is fresh. A tied head is refused: its weight would be shared by stage 0 and stage
               P-1, and neither copy could take update t before stage 0's gradient of batch t exists, so the head
               could not be fresh; the depth sweep unties it (README).
- `pipedream_vsync`: the same per-stage staleness d_k but with a consistent weight version for all stages of one
               evaluation (a per-stage gradient FIFO; our model of vertical sync, see docs/sources.md, Study B):
               stage k's gradient is g_k(W(t-d_k), b_t). Costs one forward/backward per distinct delay.
mitigation
- `none`.
- `sync_start`:    no delay for the first K steps.  `sync_cooldown`: no delay for the last K steps (the LR decay).
- `taylor`:        DC-ASGD (Zheng et al. 2017): g~ = g + lam * g*g*(W(t) - W_stale), elementwise. With
                   `taylor_adaptive` lam = lam0 / sqrt(EMA(g*g) + eps) (their DC-ASGD-a).
- `error_feedback`: update-level EF: W(t+1) = W(t) - 2 u_t + u_{t-1} (u_{-1} = 0): the optimizer's displacement
                   u_t is applied and then (u_t - u_{t-1}) is subtracted; one extra model-sized buffer.

Every optimizer step receives FRESH gradient tensors (`torch.autograd.grad` outputs, never reused): pytorch-optimizer
implementations modify p.grad in place or keep references to it (MARS keeps the last gradient), and a reused buffer
would silently corrupt the delayed gradient.

`UpdateRule` (Taylor + step + EF on a set of parameters) is shared with the real pipeline, which applies it per
stage; `DelaySimulator` decides where to evaluate the gradient, which the pipeline realises physically.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call

from gradfidelity.errors import UserError
from gradfidelity.studies.async_pp.config import MITIGATIONS, SCHEDULES


@dataclass(frozen=True)
class DelaySpec:
    schedule: str = "sync"
    mitigation: str = "none"
    depth: int = 1  # pipeline stages P; only pipedream's staleness depends on it
    total_steps: int = 0  # needed by sync_cooldown
    sync_start_steps: int = 0  # K of sync_start
    sync_cooldown_steps: int = 0  # K of sync_cooldown
    taylor_lambda: float = 2.0
    taylor_adaptive: bool = True
    taylor_ema: float = 0.95

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise UserError(f"async_pp schedule {self.schedule!r} not in {list(SCHEDULES)}")
        if self.mitigation not in MITIGATIONS:
            raise UserError(f"async_pp mitigation {self.mitigation!r} not in {list(MITIGATIONS)}")
        if self.depth < 1:
            raise UserError(f"async_pp depth {self.depth} must be >= 1")
        if self.mitigation != "none" and self.schedule == "sync":
            raise UserError("async_pp: a mitigation needs a delayed schedule, not sync")

    def delays(self, step: int) -> list[int]:
        """Per-stage staleness (in updates) of the gradient applied at `step`."""
        P = self.depth if self.schedule.startswith("pipedream") else 1
        if self.schedule == "sync":
            return [0] * P
        if self.mitigation == "sync_start" and step < self.sync_start_steps:
            return [0] * P
        if self.mitigation == "sync_cooldown" and step >= self.total_steps - self.sync_cooldown_steps:
            return [0] * P
        if self.schedule == "2bw":
            return [1]
        return [P - 1 - k for k in range(P)]

    @property
    def max_delay(self) -> int:
        return 0 if self.schedule == "sync" else (1 if self.schedule == "2bw" else self.depth - 1)


class UpdateRule:
    """Taylor compensation -> optimizer step -> error feedback, on the parameters `named` (a model or a stage)."""

    def __init__(self, named: list[tuple[str, nn.Parameter]], opt: torch.optim.Optimizer, spec: DelaySpec):
        self.named, self.opt, self.spec = named, opt, spec
        self.u_prev: dict[str, torch.Tensor] = {}  # EF: u_{t-1}
        self.mean_sq: dict[str, torch.Tensor] = {}  # adaptive Taylor: EMA of g*g

    @torch.no_grad()
    def apply(self, grads: dict[str, torch.Tensor], stale: dict[str, torch.Tensor] | None = None) -> None:
        """One update. `grads` are fresh tensors evaluated at `stale` weights (None: at the current weights)."""
        s = self.spec
        seen: set[int] = set()
        for name, p in self.named:
            g = grads[name]
            if g.data_ptr() in seen:  # autograd may return ONE tensor for several inputs (e.g. through a sum):
                g = g.clone()  # an optimizer mutating one p.grad in place would corrupt the others
            seen.add(g.data_ptr())
            if s.mitigation == "taylor" and stale is not None:
                lam = s.taylor_lambda
                if s.taylor_adaptive:
                    ms = self.mean_sq.get(name)
                    ms = g * g if ms is None else ms.mul(s.taylor_ema).add_(g * g, alpha=1 - s.taylor_ema)
                    self.mean_sq[name] = ms
                    lam = s.taylor_lambda / (ms.sqrt() + 1e-12)
                g = g + lam * g * g * (p - stale[name])  # new tensor: the fresh gradient is never mutated
            p.grad = g
        before = {n: p.detach().clone() for n, p in self.named} if s.mitigation == "error_feedback" else None
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if before is not None:
            for name, p in self.named:
                u = before[name] - p  # displacement applied by the optimizer: p = before - u
                prev = self.u_prev.get(name)
                p.sub_(u if prev is None else u - prev)  # p = before - 2u + u_prev
                self.u_prev[name] = u

    def state_dict(self) -> dict:
        return {"opt": self.opt.state_dict(), "u_prev": dict(self.u_prev), "mean_sq": dict(self.mean_sq)}

    def load_state_dict(self, state: dict) -> None:
        self.opt.load_state_dict(state["opt"])
        self.u_prev = dict(state["u_prev"])
        self.mean_sq = dict(state["mean_sq"])


LossFn = Callable[[dict[str, torch.Tensor], int], torch.Tensor]


class DelaySimulator:
    """Wraps a model and an optimizer; `step(t, loss_fn, n_micro)` evaluates the gradient where the schedule says
    and applies it. loss_fn(params, j) returns the mean loss of micro-batch j computed with `params` (via
    functional_call); the gradient is the sum over j of grad(loss_j / n_micro), accumulated in micro-batch order
    exactly as a pipeline stage accumulates it.

    Weight history: the last `max_delay` versions as detached copies (one copy per step for 2bw: the only cost
    over sync besides a functional_call).
    """

    def __init__(self, model: nn.Module, opt: torch.optim.Optimizer, spec: DelaySpec,
                 stage_of: dict[str, int] | None = None):
        self.model, self.spec = model, spec
        self.named = list(model.named_parameters())
        self.stage_of = stage_of or {n: 0 for n, _ in self.named}
        if spec.schedule.startswith("pipedream"):
            if len(list(model.named_parameters(remove_duplicate=False))) != len(self.named):
                raise UserError("async_pp: pipedream needs untied weights: a weight shared by stage 0 and the last "
                                "stage (a tied LM head) cannot be fresh at the last stage of an asynchronous "
                                "pipeline; untie the head (the depth sweep does)")
            missing = {n for n, _ in self.named} - set(self.stage_of)
            if missing or max(self.stage_of.values()) != spec.depth - 1:
                raise UserError(f"async_pp: stage map does not cover depth {spec.depth} stages")
        self.rule = UpdateRule(self.named, opt, spec)
        self.history: list[dict[str, torch.Tensor]] = []  # newest first: W(t-1), W(t-2), ...

    def _version(self, d: int) -> dict[str, torch.Tensor] | None:
        """W(t-d) clamped at W(0); None means the live parameters."""
        if d == 0 or not self.history:
            return None
        return self.history[min(d, len(self.history)) - 1]

    def _grads(self, point: dict[str, torch.Tensor], loss_fn: LossFn, n_micro: int):
        names = list(point)
        acc, total = None, 0.0
        for j in range(n_micro):
            loss = loss_fn(point, j)
            g = torch.autograd.grad(loss / n_micro, [point[n] for n in names])
            acc = list(g) if acc is None else [a + b for a, b in zip(acc, g, strict=True)]
            total += float(loss.detach()) / n_micro
        return dict(zip(names, acc, strict=True)), total

    def step(self, t: int, loss_fn: LossFn, n_micro: int = 1) -> float:
        delays = self.spec.delays(t)
        live = dict(self.named)
        if self.spec.schedule == "pipedream_vsync" and len(set(delays)) > 1:
            grads, stale, loss = {}, {}, 0.0
            for d in sorted(set(delays)):
                ver = self._version(d)
                point = {n: (live[n] if ver is None else ver[n]) for n, _ in self.named}
                g, loss_d = self._grads(point, loss_fn, n_micro)
                loss = loss_d if not grads else loss  # report the freshest evaluation's loss
                for n, _ in self.named:
                    if delays[self.stage_of[n]] == d:
                        grads[n], stale[n] = g[n], point[n]
        else:
            point = {}
            for n, _ in self.named:
                ver = self._version(delays[self.stage_of[n] if len(delays) > 1 else 0])
                point[n] = live[n] if ver is None else ver[n]
            grads, loss = self._grads(point, loss_fn, n_micro)
            stale = point
        if self.spec.max_delay > 0:  # push W(t) before it is updated
            snap = {n: p.detach().clone().requires_grad_(True) for n, p in self.named}
            self.history.insert(0, snap)
            del self.history[self.spec.max_delay:]
        self.rule.apply(grads, {n: v.detach() for n, v in stale.items()})
        return loss

    def state_dict(self) -> dict:
        return {"rule": self.rule.state_dict(),
                "history": [{n: v.detach() for n, v in h.items()} for h in self.history]}

    def load_state_dict(self, state: dict) -> None:
        self.rule.load_state_dict(state["rule"])
        self.history = [{n: v.clone().requires_grad_(True) for n, v in h.items()} for h in state["history"]]


def model_loss_fn(model: nn.Module, micro_batches: list[tuple[torch.Tensor, torch.Tensor]], loss) -> LossFn:
    """loss_fn for DelaySimulator: micro-batch j through `model` with the given parameter tensors."""

    def fn(params: dict[str, torch.Tensor], j: int) -> torch.Tensor:
        x, y = micro_batches[j]
        return loss(functional_call(model, params, (x,)), y)

    return fn
