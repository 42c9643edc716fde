"""The training methods of study C, run serially in one process (and the pieces the async workers reuse).

Our reading of each method (the paper has no code; its summary in docs/sources.md, "Study C", gives the likely
meaning; fixed before any result):

- ``bp`` (global backpropagation): one AdamW over all parameters, one global gradient-norm clip; the loss is the
  cross-entropy of the readout on the last stage's output. ``bp_tm`` is the same run given the async run's whole
  thread budget (the thread-matched baseline that removes the paper's 29-vs-24-thread confound).
- Local methods: the model is cut into S stages of H blocks. Stage s receives the *detached* output of stage s-1
  (no gradient ever crosses a stage boundary), computes a local loss L_s = CE(head_s(h_s), y) and backpropagates it
  into its own parameters only. Every stage has its own AdamW and clips its own gradient norm. The readout (final
  LayerNorm + unembedding) belongs to the last stage and is updated by the last stage's optimizer.
  - ``live_local``: head_s is the live shared readout; the readout receives the uniformly weighted deep-supervision
    gradient (1/S) sum_s dL_s/dR. Needs one shared state, hence serial only.
  - ``broadcast`` (serial, async): head_s (s < S-1) is a frozen *snapshot* of the readout, as the last stage
    broadcast it; the readout learns only from the last stage's loss.
  - ``rgc`` (readout-gradient collection; serial, async): as broadcast, but each upstream stage also differentiates
    L_s with respect to its snapshot and publishes that gradient; the last stage sets the readout gradient to
    (sum_{s<S-1} dL_s/dR_snap + dL_{S-1}/dR) / S. With a snapshot equal to the live readout (zero latency, shared
    state) this is exactly live_local's readout gradient (the paper's Proposition 2; tested).
- Snapshot schedule (shared by the serial and async variants, so "serial vs async" differs only in execution): at
  step t an upstream stage uses the readout after v(t) = max(0, k * floor((t - lag) / k)) updates, k =
  snapshot_every, lag = readout_lag. In the async pipeline stage s cannot see fresher readout weights than about
  S - 1 - s steps back, so lag >= S - 1 keeps the pipeline from stalling; a fixed, step-indexed schedule also makes
  the async run deterministic (the same numbers as its serial twin, up to thread-count rounding).
- Learning rate: linear warm-up then cosine decay to min_lr_frac * lr, the same for every method and stage.
"""

from __future__ import annotations

import copy
import math
import time

import torch
import torch.nn.functional as F
from torch import nn

from gradfidelity.studies.local.config import TrainConfig
from gradfidelity.studies.local.data import eval_offsets, get_batch
from gradfidelity.studies.local.model import VOCAB, ByteTransformer, Readout, Stage, partition

KIND = {"bp": "bp", "bp_tm": "bp", "live_local": "live", "broadcast_serial": "broadcast",
        "rgc_serial": "rgc", "broadcast_async": "broadcast", "rgc_async": "rgc"}
LN2 = math.log(2.0)


# ----------------------------------------------------------------------------------------------- schedule
def lr_at(step: int, t: TrainConfig) -> float:
    if step < t.warmup:
        return t.lr * (step + 1) / t.warmup
    frac = (step - t.warmup) / max(1, t.steps - t.warmup)
    return t.lr * (t.min_lr_frac + (1 - t.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def snapshot_version(step: int, lag: int, every: int) -> int:
    """Readout version (number of readout updates) an upstream stage uses at `step`."""
    return max(0, every * ((step - lag) // every))


# ----------------------------------------------------------------------------------------------- optimizers
def make_adamw(params: list[nn.Parameter], t: TrainConfig) -> torch.optim.AdamW:
    """nanoGPT's grouping: weight decay on matrices (dim >= 2) only."""
    decay = [p for p in params if p.dim() >= 2]
    other = [p for p in params if p.dim() < 2]
    # fused: one kernel per parameter group instead of a chain of foreach ops (torch >= 2.4 on CPU)
    return torch.optim.AdamW([{"params": decay, "weight_decay": t.weight_decay},
                              {"params": other, "weight_decay": 0.0}], lr=t.lr, betas=(0.9, 0.95), fused=True)


class Optimizers:
    """One optimizer + clip group per stage (or one for BP); has state_dict() for the harness checkpoint."""

    def __init__(self, groups: list[list[nn.Parameter]], t: TrainConfig):
        self.groups = groups
        self.opts = [make_adamw(g, t) for g in groups]
        self.clip = t.grad_clip

    def zero_grad(self) -> None:
        for o in self.opts:
            o.zero_grad(set_to_none=True)

    def clip_and_step(self, lr: float) -> list[float]:
        norms = []
        for g, o in zip(self.groups, self.opts, strict=True):
            norms.append(float(torch.nn.utils.clip_grad_norm_(g, self.clip)))
            for pg in o.param_groups:
                pg["lr"] = lr
            o.step()
        return norms

    def state_dict(self) -> dict:
        return {str(i): o.state_dict() for i, o in enumerate(self.opts)}

    def load_state_dict(self, sd: dict) -> None:
        for i, o in enumerate(self.opts):
            o.load_state_dict(sd[str(i)])


def stage_groups(model: ByteTransformer, stages: list[Stage]) -> list[list[nn.Parameter]]:
    """Parameters per stage; the readout joins the last stage (it owns it)."""
    groups = [list(s.parameters()) for s in stages]
    groups[-1] += list(model.readout.parameters())
    return groups


# ----------------------------------------------------------------------------------------------- readout helpers
def flat(params) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in params])


def flat_grad(module: nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in module.parameters()])


def set_flat_grad(module: nn.Module, vec: torch.Tensor) -> None:
    i = 0
    for p in module.parameters():
        n = p.numel()
        p.grad = vec[i:i + n].view_as(p).clone()
        i += n


@torch.no_grad()
def load_flat(module: nn.Module, vec: torch.Tensor) -> None:
    torch.nn.utils.vector_to_parameters(vec, module.parameters())


class SnapshotHistory:
    """Readout snapshots by version for the serial broadcast/RGC runs (the async run keeps them in a shared ring)."""

    def __init__(self):
        self.snaps: dict[int, torch.Tensor] = {}

    def publish(self, version: int, readout: Readout) -> None:
        self.snaps[version] = flat(readout.parameters()).clone()

    def get(self, version: int) -> torch.Tensor:
        return self.snaps[version]

    def evict_below(self, version: int) -> None:
        for v in [v for v in self.snaps if v < version]:
            del self.snaps[v]

    def state_dict(self) -> dict:
        vs = sorted(self.snaps)
        return {"versions": torch.tensor(vs, dtype=torch.long),
                "data": torch.stack([self.snaps[v] for v in vs]) if vs else torch.empty(0)}

    def load_state_dict(self, sd: dict) -> None:
        self.snaps = {int(v): sd["data"][i].clone() for i, v in enumerate(sd["versions"].tolist())}


def make_head(readout: Readout, kind: str) -> Readout:
    """A private copy of the readout for upstream stages: frozen (broadcast) or differentiated (RGC)."""
    head = copy.deepcopy(readout)
    head.requires_grad_(kind == "rgc")
    return head


# ----------------------------------------------------------------------------------------------- one step
def ce(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(B, T, 256), (B, T) -> mean cross-entropy in nats."""
    return F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))


def stage_forward_backward(stage: Stage, head: Readout, inp: torch.Tensor, y: torch.Tensor):
    """Forward one stage on a (detached) input, backpropagate its local loss through `head` into the stage.
    Returns the detached output (B, T, D) for the next stage and the loss."""
    h = stage(inp)
    loss = ce(head(h), y)
    loss.backward()
    return h.detach(), loss.detach()


def bp_backward(model: ByteTransformer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    loss = ce(model(x), y)
    loss.backward()
    return loss.detach()


def local_backward(stages: list[Stage], readout: Readout, head: Readout | None, x: torch.Tensor,
                   y: torch.Tensor, kind: str) -> list[torch.Tensor]:
    """Fill .grad of every stage and of the readout for one local step; returns the per-stage losses."""
    S = len(stages)
    h, rgc_sum, losses = x, None, []
    for s, stage in enumerate(stages):
        last = s == S - 1
        use = readout if (last or kind == "live") else head
        h, loss = stage_forward_backward(stage, use, h, y)
        losses.append(loss)
        if kind == "rgc" and not last:
            g = flat_grad(head)
            rgc_sum = g.clone() if rgc_sum is None else rgc_sum + g
            head.zero_grad(set_to_none=True)
    if kind == "live":  # autograd summed the S stage contributions into the live readout
        for p in readout.parameters():
            p.grad /= S
    elif kind == "rgc":
        own = flat_grad(readout)
        set_flat_grad(readout, ((rgc_sum + own) if rgc_sum is not None else own) / S)
    return losses


# ----------------------------------------------------------------------------------------------- evaluation
@torch.no_grad()
def evaluate_bpb(model: ByteTransformer, data: torch.Tensor, t: TrainConfig) -> float:
    """Held-out bits per byte of the full model (last stage + readout), on fixed evenly spaced windows."""
    model.eval()
    offs = eval_offsets(len(data), t.block_size, t.eval_batches, t.batch_size)
    total = 0.0
    for row in offs:
        x, y = get_batch(data, row, t.block_size)
        total += float(ce(model(x), y))
    model.train()
    return total / len(offs) / LN2


# ----------------------------------------------------------------------------------------------- serial loop
def train_serial(method: str, model: ByteTransformer, t: TrainConfig, train: torch.Tensor,
                 offsets: torch.Tensor, run) -> dict:
    """Train with a serial method inside a harness Run; returns metrics (deterministic) and timing."""
    kind = KIND[method]
    stages = partition(model, t.n_stages)
    groups = [list(model.parameters())] if kind == "bp" else stage_groups(model, stages)
    opts = Optimizers(groups, t)
    head = make_head(model.readout, kind) if kind in ("broadcast", "rgc") else None
    history = SnapshotHistory()
    history.publish(0, model.readout)
    state = {"model": model, "opt": opts, "snapshots": history}
    start, extra = run.resume(state)
    losses: list[list[float]] = extra.get("losses", [])
    busy = 0.0
    for step in run.progress(range(start, t.steps), desc=method):
        t0 = time.perf_counter()
        x, y = get_batch(train, offsets[step], t.block_size)
        opts.zero_grad()
        if kind == "bp":
            loss = bp_backward(model, x, y)
        else:
            if head is not None:
                load_flat(head, history.get(snapshot_version(step, t.readout_lag, t.snapshot_every)))
            loss = local_backward(stages, model.readout, head, x, y, kind)[-1]
        run.check_finite(loss, step)
        opts.clip_and_step(lr_at(step, t))
        if head is not None and (step + 1) % t.snapshot_every == 0:
            history.publish(step + 1, model.readout)
            history.evict_below(snapshot_version(step + 1, t.readout_lag, t.snapshot_every))
        if step % t.loss_every == 0 or step == t.steps - 1:
            losses.append([step, float(loss)])
        busy += time.perf_counter() - t0  # the loop's wall time, checkpoint writes excluded
        run.maybe_checkpoint(step + 1, state, extra={"losses": losses})
    return {"losses": losses, "train_s": busy, "steps_timed": t.steps - start}
