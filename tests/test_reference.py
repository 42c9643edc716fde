"""check-reference: the sample follows its fixed rule, and the comparison fails on any difference where it must."""

import pandas as pd
import pytest

from gradfidelity.errors import UserError
from gradfidelity.reference import Job, closures, compare, integer_metrics, parse_dry_run, select

DRY_RUN = """\
Building DAG of jobs...
[Wed Dec  2 06:54:59 2026]
rule base:
    output: r/base/seed0/metrics.json
    log: r/logs/base.log
    jobid: 1
[Wed Dec  2 06:54:59 2026]
rule rl:
    input: r/base/seed0/metrics.json, r/data/meta.json
    output: r/rl/seed0/metrics.json
    jobid: 0
[Wed Dec  2 06:54:59 2026]
localrule data:
    output: r/data/train.bin, r/data/meta.json
    jobid: 3
"""


def test_parse_dry_run_and_closures():
    jobs = parse_dry_run(DRY_RUN)
    assert [j.rule for j in jobs] == ["base", "rl", "data"]
    assert jobs[1].inputs == ["r/base/seed0/metrics.json", "r/data/meta.json"]
    assert jobs[2].outputs == ["r/data/train.bin", "r/data/meta.json"]
    got = closures(jobs, ["r/rl/seed0/metrics.json", "r/base/seed0/metrics.json"])
    assert got == {"r/rl/seed0/metrics.json": {0, 1, 2}, "r/base/seed0/metrics.json": {0}}
    with pytest.raises(UserError, match="no job that writes r/gone"):
        closures(jobs, ["r/gone/metrics.json"])


def _table(study, rows):
    return pd.DataFrame([{"run_id": f"results/cpu/{study}/{name}", "seed": seed, "status": status, "wall_s": wall}
                         for name, seed, status, wall in rows])


def _train(study, name, inputs=()):
    return Job("train", [f"results/cpu/{study}/{name}/metrics.json"], [f"results/cpu/{study}/{i}/metrics.json"
                                                                         for i in inputs])


def test_select_takes_each_studys_cheapest_closure_then_fills_the_budget():
    tables = {
        # the RL run is cheap alone but needs a 500 s base; the standalone SFT run costs 100 s in all
        "sft_rl": _table("sft_rl", [("base/seed0", 0, "ok", 500), ("rl/seed0", 0, "ok", 20),
                                    ("sft/seed0", 0, "ok", 100), ("sft/seed1", 1, "ok", 1)]),
        "local": _table("local", [("a/seed0", 0, "ok", 50), ("b/seed0", 0, "diverged", 1),
                                  ("c/seed0", 0, "ok", 60)]),
    }
    plans = {"sft_rl": [_train("sft_rl", "base/seed0"), _train("sft_rl", "rl/seed0", ["base/seed0"]),
                        _train("sft_rl", "sft/seed0")],
             "local": [_train("local", "a/seed0"), _train("local", "c/seed0")]}
    # a small budget: one cell per study all the same (every study is checked), the cheapest closure each
    assert select(tables, plans, budget_s=0) == ["results/cpu/sft_rl/sft/seed0", "results/cpu/local/a/seed0"]
    # room for 60 s more: local's c (60 s) fits, sft_rl's rl (520 s with its base) does not
    assert select(tables, plans, budget_s=210) == ["results/cpu/sft_rl/sft/seed0", "results/cpu/local/a/seed0",
                                                    "results/cpu/local/c/seed0"]
    # only the first paired seed and finished runs are candidates: sft/seed1 and the diverged b never appear
    everything = select(tables, plans, budget_s=10_000)
    assert sorted(everything) == sorted(["results/cpu/sft_rl/sft/seed0", "results/cpu/sft_rl/rl/seed0",
                                         "results/cpu/sft_rl/base/seed0", "results/cpu/local/a/seed0",
                                         "results/cpu/local/c/seed0"])


def test_an_upstream_run_already_chosen_costs_nothing_again():
    tables = {"sft_rl": _table("sft_rl", [("base/seed0", 0, "ok", 500), ("rl/seed0", 0, "ok", 20)])}
    plans = {"sft_rl": [_train("sft_rl", "base/seed0"), _train("sft_rl", "rl/seed0", ["base/seed0"])]}
    # base is the cheapest (500); the RL run then adds only its own 20 s
    assert select(tables, plans, budget_s=520) == ["results/cpu/sft_rl/base/seed0", "results/cpu/sft_rl/rl/seed0"]
    assert select(tables, plans, budget_s=519) == ["results/cpu/sft_rl/base/seed0"]


def _rows(cpu, loss, steps=400, status="ok"):
    return pd.DataFrame([{"run_id": "r1", "status": status, "cpu_model": cpu, "metric_loss": loss,
                          "metric_steps": steps}])


def test_same_host_is_compared_bit_for_bit():
    committed = _rows("AMD EPYC", 0.3138)
    assert compare(committed, _rows("AMD EPYC", 0.3138), "AMD EPYC")["verdict"].eq("ok").all()
    out = compare(committed, _rows("AMD EPYC", 0.3138 + 1e-12), "AMD EPYC").set_index("metric")
    assert out.loc["loss", "verdict"] == "MISMATCH" and out.loc["loss", "rule"] == "exact"


def test_another_host_gets_the_tolerance_but_integers_stay_exact():
    committed = _rows("AMD EPYC", 0.3138)
    ints = integer_metrics({"s": committed})
    assert ints == {"metric_steps"}
    near = compare(committed, _rows("Intel Xeon", 0.3107), "Intel Xeon", ints).set_index("metric")
    assert near.loc["loss", "verdict"] == "ok" and near.loc["loss", "rule"] == "rel 0.05"
    far = compare(committed, _rows("Intel Xeon", 0.40), "Intel Xeon", ints).set_index("metric")
    assert far.loc["loss", "verdict"] == "MISMATCH"
    steps = compare(committed, _rows("Intel Xeon", 0.3138, steps=401), "Intel Xeon", ints).set_index("metric")
    assert steps.loc["steps", "verdict"] == "MISMATCH" and steps.loc["steps", "rule"] == "exact"


def test_a_missing_run_a_missing_metric_and_a_changed_status_are_mismatches():
    committed = _rows("AMD EPYC", 0.3138)
    gone = compare(committed, _rows("AMD EPYC", 0.3138).assign(run_id="other"), "AMD EPYC")
    assert gone["verdict"].tolist() == ["MISMATCH"]
    no_metric = compare(committed, _rows("AMD EPYC", 0.3138).drop(columns="metric_loss"), "AMD EPYC")
    assert (no_metric.set_index("metric").loc["loss", "verdict"]) == "MISMATCH"
    diverged = compare(committed, _rows("AMD EPYC", None, status="diverged"), "AMD EPYC").set_index("metric")
    assert diverged.loc["status", "verdict"] == "MISMATCH" and diverged.loc["loss", "verdict"] == "MISMATCH"
