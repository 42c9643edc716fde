"""The probe itself, tested without DeepSpeed: hand-built accumulators drop, re-weight, clip or leave stale
gradients, and the probe must recover exactly that, step by step, and flag it."""

import pytest
import torch

from gradfidelity.studies.ds_audit.probe import DTYPES, ProbeSpec, clip_coefficient, loss_fn, probe_plain


def accumulator(weights, spec, *, stale=False, clip=0.0):
    """A plain-torch step that accumulates micro-batch k with weight weights[k] (0 = dropped), as DeepSpeed scales
    losses (/ ga, mean over ranks), optionally clips on the accumulated norm, then ONE SGD(lr=1) step; with
    `stale`, the buffer is never zeroed between optimizer steps. Returns the norm of what it accumulated."""
    buf = {}

    def step(model, batches, s):
        if not stale or not buf:
            buf["g"] = [torch.zeros_like(p, dtype=torch.float32) for p in model.parameters()]
        grads = buf["g"]
        for j, (k, x, y) in enumerate(batches):
            model.zero_grad(set_to_none=True)
            (loss_fn(model(x.to(DTYPES[spec.dtype]), k), y) / spec.ga).backward()
            for g, p in zip(grads, model.parameters(), strict=True):
                g += weights[j] * p.grad.float() / spec.world
        norm = float(torch.cat([g.reshape(-1) for g in grads]).norm())
        coef = clip_coefficient(norm, clip)
        with torch.no_grad():
            for g, p in zip(grads, model.parameters(), strict=True):
                p -= (coef * g).to(p.dtype)
        return norm

    return step


@pytest.mark.parametrize(("ga", "world", "weights"), [
    (4, 1, [1, 0, 0, 1]),  # the DeepSpeed offload bug
    (4, 1, [1, 1, 1, 1]),  # faithful
    (3, 1, [1, 0.5, 1]),  # mis-weighted, not dropped
    (2, 2, [1, 0, 0, 1]),  # two ranks: rank 0 loses its 2nd, rank 1 its 1st
    (8, 1, [1, 0, 0, 0, 0, 0, 0, 1]),
])
def test_probe_recovers_known_weighting_every_step(ga, world, weights):
    spec = ProbeSpec(ga=ga, world=world, steps=3)
    res = probe_plain(spec, accumulator(weights, spec))
    assert len(res.per_step) == 3
    for s in res.per_step:
        assert s.contributions == pytest.approx(weights, abs=1e-5) and s.residual < 1e-5
        assert s.reported_over_kept == pytest.approx(1.0, rel=1e-5) if 0.5 not in weights else True
    assert res.faithful == all(w == 1 for w in weights)
    assert res.dropped == [[k for k, w in enumerate(weights) if w == 0]] * 3


def test_stale_buffer_shows_from_step_two():
    """A buffer never zeroed between steps: step 1 looks faithful, step 2 carries step 1's gradient (residual)."""
    spec = ProbeSpec(ga=4, steps=3)
    res = probe_plain(spec, accumulator([1, 1, 1, 1], spec, stale=True))
    assert res.per_step[0].residual < 1e-5 and res.step_faithful(res.per_step[0])
    assert all(s.residual > res.tolerance for s in res.per_step[1:])
    assert not res.faithful


def test_bf16_tells_a_three_percent_misweighting_from_faithful():
    spec = ProbeSpec(ga=4, dtype="bf16", steps=2)
    assert probe_plain(spec, accumulator([1, 1, 1, 1], spec)).faithful
    bad = probe_plain(spec, accumulator([1, 0.97, 1, 1], spec))
    assert not bad.faithful and bad.per_step[0].contributions[1] == pytest.approx(0.97, abs=bad.tolerance)


def test_clipping_on_the_partial_gradient_is_measured():
    """Faithful norm twice the threshold: a faithful clipper applies 0.5; a dropping one clips on what it kept."""
    spec = ProbeSpec(ga=4, target_norm=2.0)
    good = probe_plain(spec, accumulator([1, 1, 1, 1], spec, clip=1.0), clip=1.0)
    s = good.per_step[0]
    assert s.clip_full == pytest.approx(0.5, rel=1e-5) and s.clip_applied == pytest.approx(0.5, rel=1e-5)
    assert good.faithful
    bad = probe_plain(spec, accumulator([1, 0, 0, 1], spec, clip=1.0), clip=1.0)
    s = bad.per_step[0]
    assert s.clip_applied == pytest.approx(clip_coefficient(s.kept_norm, 1.0), rel=1e-5)
    assert abs(s.clip_applied - s.clip_full) > 0.1 and not bad.faithful


def test_multi_backward_slots():
    """GA 1 x 4 backward calls: four identifiable slots per step; the PR #7981 pattern keeps only the last."""
    spec = ProbeSpec(ga=1, backward_calls=4, steps=2)
    res = probe_plain(spec, accumulator([0, 0, 0, 1], spec))
    assert spec.n_slots == 8
    assert res.per_step[1].contributions == pytest.approx([0, 0, 0, 1], abs=1e-5)


def test_bf16_parameter_storage_rounding_is_allowed_but_small():
    """Parameters held in bf16 round the delta; the residual allowance is that bound, 0 when parameters are fp32."""
    spec = ProbeSpec(ga=1, dtype="bf16", steps=3)
    res = probe_plain(spec, accumulator([1], spec))
    assert all(s.storage_rounding > 0 for s in res.per_step[1:]) and res.faithful
    fp32 = probe_plain(ProbeSpec(ga=1, steps=3), accumulator([1], ProbeSpec(ga=1, steps=3)))
    assert all(s.storage_rounding == 0 for s in fp32.per_step)
    bad = probe_plain(spec, accumulator([1], spec, stale=True))  # a stale buffer is far above the allowance
    assert not bad.faithful


def test_the_diagonal_solve_is_the_least_squares_solve():
    """analyse_step divides by the tag block's diagonal (checked diagonal) instead of a cubic least squares: on a
    faulty update (the 0.18.9 offload pattern, one micro-batch at half weight) both give the same weights."""
    import torch

    from gradfidelity.studies.ds_audit.probe import ProbeSpec, analyse_step, reference

    spec = ProbeSpec(ga=5, steps=2)
    ref = reference(spec)
    weights = torch.tensor([1.0, 0.0, 0.5, 0.0, 1.0], dtype=torch.float64)
    cols = ref.step_cols(1)
    G = ref.per_slot[:, cols].double()
    before = torch.zeros(ref.per_slot.shape[0])
    after = -(G @ weights).float()
    got = analyse_step(spec, ref, 1, before, after, None).contributions
    ids = slice(spec.dim + cols.start, spec.dim + cols.stop)
    lstsq = torch.linalg.lstsq(G[ids], (before - after).double()[ids].unsqueeze(1)).solution.squeeze(1)
    assert torch.allclose(torch.tensor(got, dtype=torch.float64), lstsq, rtol=0, atol=1e-6)
    assert torch.allclose(torch.tensor(got, dtype=torch.float64), weights, rtol=0, atol=1e-6)
