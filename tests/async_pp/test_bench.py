"""The pipeline benchmark's arithmetic on hand-made stage timings: the exact bound for the batches used, per-repeat
ratios and their spread, and the reconciliation of each ratio with the bubbles (no timing is asserted: the numbers
are made up)."""

from __future__ import annotations

import pytest

from gradfidelity.studies.async_pp.bench import batch_bound, summarize


def _stages(wall: float, busy: list[float], send: float = 0.1) -> dict:
    return {"timing": [{"wall_s": wall, "busy_s": b, "recv_wait_s": wall - b - send, "send_s": send} for b in busy]}


def test_the_bound_counts_the_pipeline_fill_of_the_batches_used():
    assert batch_bound(2, 4, 24) == pytest.approx(24 * 5 / 97)  # 1.237, the number
    assert batch_bound(2, 4, 10**6) == pytest.approx(1.25, abs=1e-5)  # the asymptotic (m + P - 1) / m
    assert batch_bound(4, 8, 1) == pytest.approx(1.0)  # one batch: nothing to overlap


def test_each_repeat_is_reconciled_with_its_bubbles_and_the_spread_is_reported():
    res = {"sync_0": _stages(10.0, [6.0, 6.0]), "2bw_0": _stages(8.0, [6.0, 6.0]),  # same compute: idle explains
           "sync_1": _stages(10.0, [6.0, 6.0]), "2bw_1": _stages(9.0, [5.4, 5.4])}  # 2bw computed 10% faster
    out = summarize(res, n_stages=2, n_micro=4, steps=24, repeats=2, tokens=1000)
    assert out["ratio_per_repeat"] == pytest.approx([10 / 8, 10 / 9])
    assert out["ratio_median"] == pytest.approx((10 / 8 + 10 / 9) / 2)
    assert (out["ratio_min"], out["ratio_max"]) == pytest.approx((10 / 9, 10 / 8))
    rec = out["reconciliation"]
    for r, ratio in enumerate(out["ratio_per_repeat"]):
        assert rec["compute_factor_per_repeat"][r] * rec["idle_factor_per_repeat"][r] == pytest.approx(ratio)
    assert rec["compute_factor_per_repeat"] == pytest.approx([1.0, 12 / 10.8])
    assert out["runs"]["sync"]["repeats"][0]["bubble_fraction"] == pytest.approx(0.4)
    assert out["runs"]["2bw"]["repeats"][0]["send_s"] == pytest.approx(0.2)  # counted apart from busy
    assert out["bound_for_these_batches"] == pytest.approx(120 / 97) and out["median_within_bound"]
