"""The throughput bench's arithmetic (sft_rl/bench.py): the floor comes from the matmul rate the bench itself
measured, the interval of the median from order statistics; timings are never asserted."""

import json

import pytest
from scipy import stats

from gradfidelity.studies.sft_rl import bench
from tests.sft_rl._config import make_cfg


def test_ratio_summary_is_per_round_with_the_order_statistics_interval():
    s = bench.ratio_summary([1.0, 3.0, 2.0], [2.0, 2.0, 2.0])
    assert s["per_round"] == [0.5, 1.5, 1.0] and s["median"] == 1.0
    assert s["ci95"] == [None, None]  # 3 rounds hold no 95% interval of a median
    s = bench.ratio_summary([float(v) for v in range(15, 0, -1)], [1.0] * 15)
    # the 4th and 12th smallest: P(Bin(15, 1/2) <= 3) = 0.0176 <= 0.025 < P(<= 4)
    assert s["ci95"] == [4.0, 12.0] and 1 - 2 * stats.binom.cdf(3, 15, 0.5) >= 0.95


def test_matmul_rate_is_flops_over_measured_time(monkeypatch):
    clock = iter(x * 0.5 for x in range(1000))  # every timing reads 0.5 s
    monkeypatch.setattr(bench.time, "perf_counter", lambda: next(clock))
    assert bench.matmul_gflops(10, 20, 30, reps=3) == pytest.approx(2 * 10 * 20 * 30 / 0.5 / 1e9)


def test_floor_uses_the_rate_measured_in_the_same_run(tmp_path, monkeypatch):
    """The floor and the overhead are recomputable from the JSON: FLOPs per rollout / the run's own matmul rate."""
    cfg = make_cfg({"rl": {"length_groups": 2}, "deepspeed": {"enabled": False}})
    rates = iter([10.0, 30.0] * 20)  # the two shapes of each probe: mean 20 GFLOP/s
    monkeypatch.setattr(bench, "matmul_gflops", lambda *shape: next(rates))
    rl = {"rollouts_per_step": 64, **{p: {"ms_per_rollout": 8.0, "flops_per_rollout": 4e7,
                                          "train_tokens_per_rollout": 30.0} for p in bench.PATHS}}
    sft = {p: {"ms_per_step": 100.0, "flops_per_step": 1e9} for p in bench.SFT_PATHS}
    monkeypatch.setattr(bench, "_rl_bench", lambda *a: rl)
    monkeypatch.setattr(bench, "_sft_bench", lambda *a: sft)
    out = tmp_path / "bench.json"
    res = bench.run_bench(cfg, tmp_path, out)
    assert res["matmul"]["gflops"] == 20.0
    floor = 4e7 / 20e9 * 1e3  # 2 ms per rollout
    assert res["floor"]["trimmed"]["floor_ms_per_rollout"] == pytest.approx(floor)
    assert res["floor"]["trimmed"]["overhead"] == pytest.approx(8.0 / floor)
    assert res["floor"]["sft_no_fill"]["overhead"] == pytest.approx(100.0 / (1e9 / 20e9 * 1e3))
    assert res["meets"]["trimmed_within_goal"] is False  # 4x the floor
    assert json.loads(out.read_text())["floor"] == res["floor"]


def test_bench_refuses_a_config_without_the_trim(tmp_path):
    cfg = make_cfg({"rl": {"length_groups": 0}, "deepspeed": {"enabled": False}})
    with pytest.raises(ValueError, match="length_groups"):
        bench._rl_bench(cfg, tmp_path, tmp_path, 1, 0)
