"""check-reference --measure-drift: two ISA levels really differ (read from the runs' own provenance) or nothing is
measured, and the drift table pairs like with like."""

import pandas as pd
import pytest

from gradfidelity.errors import UserError
from gradfidelity.reference.check import cross_host_rules
from gradfidelity.reference.drift import capability_of, drift_table, level_env, rules_text

RUN = "results/cpu/local/enwik8/w64/bp/seed0"


def _rerun(cap, bpb, status="ok", **extra):
    return pd.DataFrame([{"run_id": RUN, "study": "local", "status": status, "cpu_capability": cap,
                          "metric_val_bpb": bpb, "metric_steps": 2000, **extra}])


def test_level_env_sets_one_level_and_drops_the_callers_limits():
    env = level_env("avx2", {"PATH": "/bin", "DNNL_MAX_CPU_ISA": "AVX512_CORE"})
    assert env == {"PATH": "/bin", "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                   "DNNL_MAX_CPU_ISA": "AVX2"}
    assert level_env("native", {"PATH": "/bin", "ATEN_CPU_CAPABILITY": "avx2"}) == {"PATH": "/bin"}
    with pytest.raises(UserError, match="unknown ISA level"):
        level_env("avx9")


def test_a_limit_that_did_not_reach_the_training_processes_is_refused():
    assert capability_of(_rerun("AVX2", 2.8), "avx2") == "AVX2"
    assert capability_of(_rerun("AVX512", 2.8), "native") == "AVX512"
    with pytest.raises(UserError, match="not avx2"):
        capability_of(_rerun("AVX512", 2.8), "avx2")
    mixed = pd.concat([_rerun("AVX512", 2.8), _rerun("AVX2", 2.8).assign(run_id="other")])
    with pytest.raises(UserError, match="different ISA levels"):
        capability_of(mixed, "native")


def test_a_host_without_a_second_level_measures_nothing():
    with pytest.raises(UserError, match="no second ISA level"):
        drift_table(_rerun("AVX2", 2.8), _rerun("AVX2", 2.8), "AVX2", "AVX2")


def test_drift_table_pairs_each_metric_of_each_run():
    table = drift_table(_rerun("AVX2", 2.8393), _rerun("AVX512", 2.8206), "AVX2", "AVX512").set_index("metric")
    assert table.loc["val_bpb", "rel_difference"] == pytest.approx(0.0187 / 2.8393, rel=1e-3)
    assert table.loc["steps", "rel_difference"] == 0
    rules = cross_host_rules(table.reset_index())
    assert rules[("local", "val_bpb")] == pytest.approx(2 * 0.0187 / 2.8393, rel=1e-3)
    assert rules[("local", "steps")] == 0
    assert "local/val_bpb: largest 0.659%" in rules_text(table.reset_index())


def test_unlike_pairs_are_refused():
    with pytest.raises(UserError, match="rerun at AVX2 only"):
        drift_table(_rerun("AVX2", 2.8), _rerun("AVX512", 2.8).assign(run_id="other"), "AVX2", "AVX512")
    with pytest.raises(UserError, match="status ok at AVX2, diverged at AVX512"):
        drift_table(_rerun("AVX2", 2.8), _rerun("AVX512", None, status="diverged"), "AVX2", "AVX512")
    with pytest.raises(UserError, match="at one level only"):
        drift_table(_rerun("AVX2", 2.8, metric_x=1.0), _rerun("AVX512", 2.8), "AVX2", "AVX512")
