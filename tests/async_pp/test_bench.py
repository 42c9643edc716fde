"""The benchmarks' arithmetic on hand-made stage timings: the exact bound for the batches used, per-repeat ratios,
their median and its interval, the compute/idle decomposition of each ratio and the idle target; the step-cost
benchmark's shape on a tiny model (no timing is asserted: the numbers are made up or only checked for shape)."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from gradfidelity.stats.intervals import median_interval
from gradfidelity.studies.async_pp.bench import batch_bound, step_cost, summarize, wait_attribution
from tests.async_pp._cfg import study


def _stages(wall: float, busy: list[float], send: float = 0.1) -> dict:
    return {"timing": [{"wall_s": wall, "busy_s": b, "recv_wait_s": wall - b - send, "send_s": send} for b in busy]}


def test_the_bound_counts_the_pipeline_fill_of_the_batches_used():
    assert batch_bound(2, 4, 24) == pytest.approx(24 * 5 / 97)  # 1.237, the number
    assert batch_bound(2, 4, 10**6) == pytest.approx(1.25, abs=1e-5)  # the asymptotic (m + P - 1) / m
    assert batch_bound(4, 8, 1) == pytest.approx(1.0)  # one batch: nothing to overlap


def test_each_repeat_is_decomposed_into_compute_and_idle_and_the_spread_is_reported():
    res = {"sync_0": _stages(10.0, [6.0, 6.0]), "2bw_0": _stages(8.0, [6.0, 6.0]),  # same compute: idle explains
           "sync_1": _stages(10.0, [6.0, 6.0]), "2bw_1": _stages(9.0, [5.4, 5.4])}  # 2bw computed 10% faster
    out = summarize(res, n_stages=2, n_micro=4, steps=24, repeats=2, tokens=1000)
    assert out["ratio_per_repeat"] == pytest.approx([10 / 8, 10 / 9])
    assert out["ratio_median"] == pytest.approx((10 / 8 + 10 / 9) / 2)
    assert (out["ratio_min"], out["ratio_max"]) == pytest.approx((10 / 9, 10 / 8))
    rec = out["decomposition"]
    for r, ratio in enumerate(out["ratio_per_repeat"]):
        assert rec["compute_factor_per_repeat"][r] * rec["idle_factor_per_repeat"][r] == pytest.approx(ratio)
    assert rec["compute_factor_per_repeat"] == pytest.approx([1.0, 12 / 10.8])
    assert out["runs"]["sync"]["repeats"][0]["bubble_fraction"] == pytest.approx(0.4)
    assert out["runs"]["2bw"]["repeats"][0]["send_s"] == pytest.approx(0.2)  # counted apart from busy
    assert out["bound_for_these_batches"] == pytest.approx(120 / 97) and out["median_within_bound"]
    assert out["runs"]["sync"]["busy_s_per_stage_median"] == pytest.approx([6.0, 6.0])
    # the idle factor of repeat 0 is 0.75 / 0.6 = 1.25, of repeat 1 (1 - 1 + 10.8 / 18) / 0.6 = 1.0: median 1.125,
    # 0.909 of the bound 120/97, outside the 3% target
    assert rec["idle_factor"]["median"] == pytest.approx(1.125)
    assert out["idle_factor_over_bound"] == pytest.approx(1.125 / (120 / 97)) and not out["meets_idle_target"]
    assert out["ratio_interval"]["low"] is None  # two repeats: too few for a 95% interval of the median


def test_the_idle_target_is_met_within_3_percent_of_the_bound():
    bound = batch_bound(2, 4, 24)
    res = {}
    for r in range(15):  # sync's bubble at its fill/drain minimum 1/5; 2bw's idle factor 0.98 of the bound
        res[f"sync_{r}"] = _stages(10.0, [8.0, 8.0], send=0.0)
        res[f"2bw_{r}"] = _stages(10.0 / (0.98 * bound), [8.0, 8.0], send=0.0)
    out = summarize(res, n_stages=2, n_micro=4, steps=24, repeats=15, tokens=1000)
    assert out["idle_factor_over_bound"] == pytest.approx(0.98) and out["meets_idle_target"]
    assert out["ratio_interval"]["n"] == 15 and out["ratio_interval"]["low"] == pytest.approx(0.98 * bound)


def test_the_median_interval_is_the_binomial_order_statistics():
    """n = 15 at 0.95: ranks 4 and 12 (P(B <= 3) = 0.0176 <= 0.025 < P(B <= 4) = 0.059), coverage 0.965."""
    x = [float(v) for v in (9, 3, 14, 1, 7, 12, 5, 15, 2, 11, 8, 4, 13, 6, 10)]
    iv = median_interval(x, 0.95)
    assert (iv.estimate, iv.low, iv.high) == (8.0, 4.0, 12.0)
    assert stats.binom.cdf(3, 15, 0.5) <= 0.025 < stats.binom.cdf(4, 15, 0.5)
    assert 1 - 2 * stats.binom.cdf(3, 15, 0.5) == pytest.approx(0.9648, abs=1e-4)
    assert median_interval(x[:5], 0.95).low is None  # 2 / 32 > 0.025: five values cannot give a 95% interval
    with pytest.raises(ValueError, match="non-finite"):
        median_interval([1.0, math.nan], 0.95)


def test_step_cost_reports_every_arm_and_ratio_per_optimizer():
    """One optimizer, two 1-step rounds after the warm-up: the shape of the record and its ratio arithmetic."""
    out = step_cost(study(), ["adamw"], steps=1, repeats=2)
    assert set(out["optimizers"]) == {"adamw"} and out["rounds"] == 2
    r = out["optimizers"]["adamw"]
    assert len(r["per_round_ms"]["plain"]) == 2  # the warm-up round is dropped
    assert all(v > 0 for v in (r["plain_ms"], r["sync_ms"], r["2bw_ms"], r["ratio_2bw_over_sync"]))
    assert r["per_round_ratio"]["sync"] == pytest.approx(
        [a / b for a, b in zip(r["per_round_ms"]["sync"], r["per_round_ms"]["plain"], strict=True)])
    assert r["ratio_2bw"] == pytest.approx(sum(r["per_round_ratio"]["2bw"]) / 2)  # the median of two
    assert out["eval_ms"] > 0 and out["threads"] >= 1


def _waits(waits: list[float], msgs: int) -> dict:
    return {"timing": [{"recv_wait_s": w, "recv_n": msgs} for w in waits]}


def test_the_receive_wait_splits_into_messages_times_latency_and_the_schedule():
    """Issue 47, item 4: 48 messages at 1 ms one-way (round trips of 2 ms) are 0.048 s of a stage's wait; the rest of
    a 0.3 s wait is the schedule's. A wait made of latency alone reads "latency"."""
    res = {}
    for r in range(3):
        res[f"sync_{r}"] = _waits([0.5 + r * 0.01, 0.6], 48)
        res[f"2bw_{r}"] = _waits([0.30, 0.28 + r * 0.02], 48)
    out = wait_attribution(res, repeats=3, round_trip_s=[0.002] * 9 + [0.004])
    assert out["one_way_latency_s"]["median"] == pytest.approx(0.001)
    st = out["2bw"]["stages"]
    assert [x["recv_wait_s_median"] for x in st] == pytest.approx([0.30, 0.30])
    assert [x["latency_part_s"] for x in st] == pytest.approx([0.048, 0.048])
    assert [x["schedule_part_s"] for x in st] == pytest.approx([0.252, 0.252])
    assert out["2bw"]["latency_share"] == pytest.approx(0.16) and out["larger_part_2bw"] == "schedule"
    assert out["sync"]["stages"][0]["recv_wait_s_median"] == pytest.approx(0.51)
    lat = wait_attribution({f"{s}_0": _waits([0.05, 0.05], 48) for s in ("sync", "2bw")}, 1, [0.002])
    assert lat["2bw"]["latency_share"] == pytest.approx(0.96) and lat["larger_part_2bw"] == "latency"


def test_a_stage_whose_message_count_changes_across_repeats_is_refused():
    res = {"sync_0": _waits([0.1], 48), "sync_1": _waits([0.1], 47), "2bw_0": _waits([0.1], 48),
           "2bw_1": _waits([0.1], 48)}
    with pytest.raises(RuntimeError, match="received"):
        wait_attribution(res, repeats=2, round_trip_s=[0.002])
