"""The probe itself, tested without DeepSpeed: a hand-built accumulator drops / re-weights chosen micro-batches and
the probe must recover exactly that weighting (and must flag it)."""

import pytest
import torch

from gradfidelity.studies.ds_audit.probe import (
    DTYPES,
    ProbeSpec,
    loss_fn,
    predicted_norm_ratio_under_drop,
    probe_plain,
)


def weighted_accumulator(weights, spec, extra=None):
    """A plain-torch step that accumulates micro-batch k with weight weights[k] (0 = dropped), as DeepSpeed scales
    losses (/ ga, mean over ranks), then ONE SGD(lr=1) step; returns the norm of what it applied."""

    def step(model, batches):
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        opt.zero_grad(set_to_none=True)
        grads = [torch.zeros_like(p, dtype=torch.float32) for p in model.parameters()]
        for k, x, y in batches:
            model.zero_grad(set_to_none=True)
            (loss_fn(model(x.to(DTYPES[spec.dtype]), k), y) / spec.ga).backward()
            for g, p in zip(grads, model.parameters(), strict=True):
                g += weights[k] * p.grad.float() / spec.world
        if extra is not None:
            grads[0] += extra
        for g, p in zip(grads, model.parameters(), strict=True):
            p.grad = g.to(p.dtype)
        opt.step()
        return float(torch.cat([g.reshape(-1) for g in grads]).norm())

    return step


@pytest.mark.parametrize(
    ("ga", "world", "weights"),
    [
        (4, 1, [1, 0, 0, 1]),  # the DeepSpeed offload bug
        (4, 1, [1, 1, 1, 1]),  # faithful
        (3, 1, [1, 0.5, 1]),  # mis-weighted, not dropped
        (2, 2, [1, 0, 0, 1]),  # two ranks: rank 0 loses its 2nd, rank 1 its 1st
        (8, 1, [1, 0, 0, 0, 0, 0, 0, 1]),
    ],
)
def test_probe_recovers_known_weighting(ga, world, weights):
    spec = ProbeSpec(ga=ga, world=world)
    res = probe_plain(spec, weighted_accumulator(weights, spec))
    assert res.contributions == pytest.approx(weights, abs=1e-5)
    assert res.residual < 1e-5
    assert res.faithful == all(w == 1 for w in weights)
    assert res.dropped == [k for k, w in enumerate(weights) if w == 0]
    # the norm the accumulator reported is the norm of what it applied, and the probe's yardstick agrees
    assert res.grad_norm_ratio == pytest.approx(res.applied_norm_ratio, rel=1e-5)
    assert res.applied_norm_ratio == pytest.approx(predicted_norm_ratio_under_drop(spec, weights), rel=1e-5)
    if res.faithful:
        assert res.max_param_dev < 1e-5
    else:
        assert res.max_param_dev > 1e-2


def test_probe_bf16_within_tolerance():
    spec = ProbeSpec(ga=4, dtype="bf16")
    res = probe_plain(spec, weighted_accumulator([1, 0, 0, 1], spec))
    assert res.contributions == pytest.approx([1, 0, 0, 1], abs=res.tolerance)
    assert not res.faithful


def test_probe_flags_gradient_no_micro_batch_explains():
    """A system that adds something of its own (e.g. a stale buffer) must not pass: the residual catches it."""
    spec = ProbeSpec(ga=4)
    res = probe_plain(spec, weighted_accumulator([1, 1, 1, 1], spec, extra=torch.full((spec.dim,), 0.5)))
    assert res.residual > res.tolerance
    assert not res.faithful


def test_clipping_scale_keeps_faithful_step_unclipped():
    """With clipping on, the probe scales targets so the faithful norm is half the threshold."""
    spec = ProbeSpec(ga=4, clip=1.0)
    res = probe_plain(spec, weighted_accumulator([1, 1, 1, 1], spec))
    assert res.grad_norm_ratio == pytest.approx(1.0, rel=1e-5)
    from gradfidelity.studies.ds_audit.probe import reference

    assert float(reference(spec).applied.norm()) == pytest.approx(0.5, rel=1e-5)


def test_multi_backward_slots():
    """GA 1 x 4 backward calls: four identifiable slots; the PR #7981 pattern keeps only the last."""
    spec = ProbeSpec(ga=1, backward_calls=4)
    res = probe_plain(spec, weighted_accumulator([0, 0, 0, 1], spec))
    assert spec.n_slots == 4
    assert res.contributions == pytest.approx([0, 0, 0, 1], abs=1e-5)
