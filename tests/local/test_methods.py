"""Gradient flow of each method against plain-autograd references, and the paper's Proposition 2:
with zero latency and a shared state, RGC's readout gradient equals live deep supervision's."""

from __future__ import annotations

import copy

import pytest
import torch

from gradfidelity.errors import UserError
from gradfidelity.studies.local.methods import (
    SnapshotHistory,
    bp_backward,
    ce,
    flat,
    load_flat,
    local_backward,
    make_head,
    snapshot_version,
)
from gradfidelity.studies.local.model import ModelConfig, build_model, partition
from tests.local._config import train

S = 3
CFG = ModelConfig(n_layer=6, d_model=16, n_head=2, block_size=12)


@pytest.fixture
def setup():
    torch.manual_seed(0)
    model = build_model(CFG, seed=3).double()
    x = torch.randint(0, 256, (2, CFG.block_size))
    y = torch.randint(0, 256, (2, CFG.block_size))
    return model, x, y


def _stage_outputs(model, x):
    """Reference forward on one undetached graph: the output of every stage."""
    H, h, outs = CFG.n_layer // S, model.embed(x), []
    for s in range(S):
        for blk in model.blocks[s * H:(s + 1) * H]:
            h = blk(h)
        outs.append(h)
    return outs


def _grads(model):
    return [p.grad.clone() if p.grad is not None else None for p in model.parameters()]


def test_rgc_readout_gradient_equals_live_deep_supervision(setup):
    """Proposition 2 against autograd: d/dR (1/S) sum_s CE(R(h_s)) on the full graph."""
    model, x, y = setup
    ref_model = copy.deepcopy(model)
    outs = _stage_outputs(ref_model, x)
    ds_loss = sum(ce(ref_model.readout(h), y) for h in outs) / S
    ref = torch.autograd.grad(ds_loss, list(ref_model.readout.parameters()))

    stages = partition(model, S)
    head = make_head(model.readout, "rgc")  # a snapshot equal to the live readout: zero latency
    local_backward(stages, model.readout, head, x, y, "rgc")
    for p, r in zip(model.readout.parameters(), ref, strict=True):
        torch.testing.assert_close(p.grad, r, rtol=1e-10, atol=1e-12)

    live = copy.deepcopy(setup[0])
    local_backward(partition(live, S), live.readout, None, x, y, "live")
    for p, r in zip(live.readout.parameters(), ref, strict=True):
        torch.testing.assert_close(p.grad, r, rtol=1e-10, atol=1e-12)


def test_rgc_with_a_stale_snapshot_differs(setup):
    """The equality above is not vacuous: a snapshot one update old gives a different readout gradient."""
    model, x, y = setup
    live = copy.deepcopy(model)
    local_backward(partition(live, S), live.readout, None, x, y, "live")
    head = make_head(model.readout, "rgc")
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.05 * torch.randn_like(p))
    local_backward(partition(model, S), model.readout, head, x, y, "rgc")
    diff = max(float((a.grad - b.grad).abs().max()) for a, b in
               zip(model.readout.parameters(), live.readout.parameters(), strict=True))
    assert diff > 1e-6


def test_broadcast_readout_learns_from_last_stage_only(setup):
    model, x, y = setup
    ref_model = copy.deepcopy(model)
    last = _stage_outputs(ref_model, x)[-1]
    ref = torch.autograd.grad(ce(ref_model.readout(last), y), list(ref_model.readout.parameters()))
    head = make_head(model.readout, "broadcast")
    assert not any(p.requires_grad for p in head.parameters())
    local_backward(partition(model, S), model.readout, head, x, y, "broadcast")
    for p, r in zip(model.readout.parameters(), ref, strict=True):
        torch.testing.assert_close(p.grad, r, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["live", "broadcast", "rgc"])
def test_no_gradient_crosses_a_stage_boundary(setup, kind):
    """Stage s's parameters get dL_s/dtheta_s only; with BP-style flow stage 0 would also get dL_1, dL_2."""
    model, x, y = setup
    ref_model = copy.deepcopy(model)
    ref_stages = partition(ref_model, S)
    outs = _stage_outputs(ref_model, x)
    stages = partition(model, S)
    head = make_head(model.readout, kind) if kind != "live" else None
    local_backward(stages, model.readout, head, x, y, kind)
    for s in range(S):
        params = list(ref_stages[s].parameters())
        own = torch.autograd.grad(ce(ref_model.readout(outs[s]), y), params, retain_graph=True)
        for p, r in zip(stages[s].parameters(), own, strict=True):
            torch.testing.assert_close(p.grad, r, rtol=1e-10, atol=1e-12)
        if s < S - 1:  # the reference with gradient crossing the boundary is measurably different
            crossing = torch.autograd.grad(sum(ce(ref_model.readout(h), y) for h in outs[s:]), params,
                                           retain_graph=True)
            assert max(float((a - b).abs().max()) for a, b in zip(own, crossing, strict=True)) > 1e-8


def test_bp_equals_plain_autograd(setup):
    model, x, y = setup
    ref_model = copy.deepcopy(model)
    ref = torch.autograd.grad(torch.nn.functional.cross_entropy(ref_model(x).reshape(-1, 256), y.reshape(-1)),
                              list(ref_model.parameters()))
    bp_backward(model, x, y)
    for p, r in zip(model.parameters(), ref, strict=True):
        torch.testing.assert_close(p.grad, r, rtol=1e-10, atol=1e-12)


def test_snapshot_schedule_and_history():
    assert [snapshot_version(t, 0, 1) for t in range(4)] == [0, 1, 2, 3]
    assert [snapshot_version(t, 2, 1) for t in range(5)] == [0, 0, 0, 1, 2]
    assert [snapshot_version(t, 2, 3) for t in range(9)] == [0, 0, 0, 0, 0, 3, 3, 3, 6]
    model = build_model(CFG, 0)
    h = SnapshotHistory()
    h.publish(0, model.readout)
    with torch.no_grad():
        model.readout.head.weight.add_(1.0)
    h.publish(1, model.readout)
    head = make_head(model.readout, "broadcast")
    load_flat(head, h.get(0))
    assert not torch.equal(flat(head.parameters()), flat(model.readout.parameters()))
    h2 = SnapshotHistory()
    h2.load_state_dict(h.state_dict())
    assert torch.equal(h2.get(1), flat(model.readout.parameters()))


def test_partition_owns_embedding_first_and_rejects_bad_split():
    model = build_model(CFG, 0)
    stages = partition(model, S)
    assert stages[0].embed is model.embed and all(s.embed is None for s in stages[1:])
    assert sum(len(s.blocks) for s in stages) == CFG.n_layer
    with pytest.raises(ValueError):
        partition(model, 4)
    with pytest.raises(UserError, match="n_layer=5"):
        train(n_layer=5, n_stages=2)
