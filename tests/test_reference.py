"""check-reference: the sample follows its fixed rule, and the comparison fails on any difference where it must."""

import json
from pathlib import Path

import pandas as pd
import pytest

from gradfidelity.errors import UserError
from gradfidelity.harness.provenance import IDENTITY_KEYS, UNKNOWN_ISA
from gradfidelity.reference.check import (
    MAX_REL,
    MIN_REL,
    Job,
    closures,
    compare,
    cross_host_rules,
    parse_dry_run,
    read_drift,
    select,
)

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


RUN = "results/cpu/async_pp/cell/seed0"
# Two host types that both read "AMD EPYC": the committed runs' (AVX2) and an AVX-512 one
AVX2_HOST = {"cpu_model": "AMD EPYC", "cpu_vendor": "AuthenticAMD", "cpu_family": 25, "cpu_model_number": 1,
             "cpu_stepping": 1, "cpu_capability": "AVX2", "cpu_flags": "avx2", "cpu_isa_limits": "none"}
AVX512_HOST = {**AVX2_HOST, "cpu_model_number": 17, "cpu_capability": "AVX512",
               "cpu_flags": "avx2 avx512f avx512_bf16"}
OLD_ROW = {"cpu_model": "AMD EPYC", **{k: UNKNOWN_ISA for k in IDENTITY_KEYS}}


def _rows(host, loss, steps=400, status="ok", delta=0.03):
    return pd.DataFrame([{"run_id": RUN, "study": "async_pp", "status": status, **host, "metric_loss": loss,
                          "metric_steps": steps, "metric_delta": delta}])


DRIFT_ROWS = pd.DataFrame([  # a hand-made drift measurement: loss moved 1%, steps not at all, delta by 40%
    {"study": "async_pp", "run": RUN, "metric": "loss", "rel_difference": 0.01},
    {"study": "async_pp", "run": RUN, "metric": "steps", "rel_difference": 0.0},
    {"study": "async_pp", "run": RUN, "metric": "delta", "rel_difference": 0.40},
    {"study": "async_pp", "run": "x", "metric": "tiny", "rel_difference": 1e-5},
])


def test_cross_host_rules_follow_the_measured_drift():
    rules = cross_host_rules(DRIFT_ROWS)
    assert rules[("async_pp", "loss")] == pytest.approx(0.02)  # twice the largest drift
    assert rules[("async_pp", "steps")] == 0.0  # did not move: exact
    assert rules[("async_pp", "delta")] is None and 2 * 0.40 > MAX_REL  # not comparable across hosts
    assert rules[("async_pp", "tiny")] == MIN_REL
    # two measurements: the larger drift of a metric wins
    more = pd.concat([DRIFT_ROWS, pd.DataFrame([{"study": "async_pp", "metric": "loss", "rel_difference": 0.03}])])
    assert cross_host_rules(more)[("async_pp", "loss")] == pytest.approx(0.06)


def test_same_host_type_is_compared_bit_for_bit():
    committed = _rows(AVX512_HOST, 0.3138)
    rules = cross_host_rules(DRIFT_ROWS)
    assert compare(committed, _rows(AVX512_HOST, 0.3138), rules)["verdict"].eq("ok").all()
    out = compare(committed, _rows(AVX512_HOST, 0.3138 + 1e-12), rules).set_index("metric")
    assert out.loc["loss", "verdict"] == "MISMATCH" and out.loc["loss", "rule"] == "exact"
    assert out.loc["loss", "hosts"] == "same"
    out = compare(committed, _rows(AVX512_HOST, 0.3138, delta=0.031), rules).set_index("metric")
    assert out.loc["delta", "verdict"] == "MISMATCH"  # "not comparable" exists only across hosts


def test_two_records_that_differ_only_in_isa_are_cross_host():
    """The round-4 case: both hosts read 'AMD EPYC', one dispatches to AVX2, the other to AVX-512."""
    rules = cross_host_rules(DRIFT_ROWS)
    for other in (AVX512_HOST, {**AVX2_HOST, "cpu_capability": "AVX512"}, {**AVX2_HOST, "cpu_flags": "avx2 amx"},
                  {**AVX2_HOST, "cpu_isa_limits": "ATEN_CPU_CAPABILITY=avx2"}):
        out = compare(_rows(AVX2_HOST, 0.3138), _rows(other, 0.3150), rules).set_index("metric")
        assert out.loc["loss", "hosts"] == "cross" and out.loc["loss", "rule"] == "rel<=0.02"
        assert out.loc["loss", "verdict"] == "ok"  # 0.4% off, within the measured rule


def test_a_committed_run_without_cpu_identity_is_another_host():
    """Rows written before provenance had the CPU identity read 'unknown ISA' (or lack the columns): never exact."""
    rules = cross_host_rules(DRIFT_ROWS)
    for committed in (_rows(OLD_ROW, 0.3138), _rows({"cpu_model": "AMD EPYC"}, 0.3138)):
        out = compare(committed, _rows(AVX2_HOST, 0.3150), rules).set_index("metric")
        assert out.loc["loss", "hosts"] == "cross" and out.loc["loss", "verdict"] == "ok"


def test_another_host_gets_the_measured_rules():
    committed = _rows(AVX2_HOST, 0.3138)
    rules = cross_host_rules(DRIFT_ROWS)
    near = compare(committed, _rows(AVX512_HOST, 0.3107), rules).set_index("metric")
    assert near.loc["loss", "verdict"] == "ok" and near.loc["loss", "rule"] == "rel<=0.02"  # 1.0% off
    far = compare(committed, _rows(AVX512_HOST, 0.3250), rules).set_index("metric")
    assert far.loc["loss", "verdict"] == "MISMATCH"  # 3.6% off
    steps = compare(committed, _rows(AVX512_HOST, 0.3138, steps=401), rules).set_index("metric")
    assert steps.loc["steps", "verdict"] == "MISMATCH" and steps.loc["steps", "rule"] == "exact"
    delta = compare(committed, _rows(AVX512_HOST, 0.3138, delta=0.9), rules).set_index("metric")
    assert delta.loc["delta", "verdict"] == "not comparable"
    no_rule = compare(committed, _rows(AVX512_HOST, 0.3138), {}).set_index("metric")
    assert no_rule.loc["loss", "rule"] == "exact" and no_rule.loc["loss", "verdict"] == "ok"
    forced = compare(committed, _rows(AVX2_HOST, 0.3107), rules, force_cross_host=True).set_index("metric")
    assert forced.loc["loss", "rule"] == "rel<=0.02"  # --cross-host: the rules on one host type too


def test_the_committed_drift_measurements_give_rules_for_every_study_they_saw():
    drift = read_drift(Path(__file__).resolve().parents[1])
    rules = cross_host_rules(drift)
    assert {s for s, _ in rules} == {"ds_audit", "sft_rl", "async_pp", "local"}
    assert rules[("async_pp", "plateau_delta")] is None  # a difference of two late losses: amplified drift
    assert 0 < rules[("async_pp", "final_val_loss")] <= 0.05
    # the round-4 cross-ISA rerun (committed AVX2 host vs an AVX-512 host) is among them: local's bpb moved 0.66%
    assert "drift_hosts_avx2_vs_avx512.csv" in set(drift["source"])
    assert rules[("local", "val_bpb")] >= 2 * 0.0065


def test_no_drift_measurement_is_an_error(tmp_path):
    with pytest.raises(UserError, match="no drift_"):
        read_drift(tmp_path)


def test_a_missing_run_a_missing_metric_and_a_changed_status_are_mismatches():
    committed = _rows(AVX2_HOST, 0.3138)
    gone = compare(committed, _rows(AVX2_HOST, 0.3138).assign(run_id="other"))
    assert gone["verdict"].tolist() == ["MISMATCH"]
    no_metric = compare(committed, _rows(AVX2_HOST, 0.3138).drop(columns="metric_loss"))
    assert (no_metric.set_index("metric").loc["loss", "verdict"]) == "MISMATCH"
    diverged = compare(committed, _rows(AVX2_HOST, None, status="diverged")).set_index("metric")
    assert diverged.loc["status", "verdict"] == "MISMATCH" and diverged.loc["loss", "verdict"] == "MISMATCH"


def test_a_study_whose_committed_evidence_predates_its_registry_rows_is_not_sampled(tmp_path):
    """Study B's rows are at evidence version 2 or later (lost compute); evidence without a version (1) comes from
    round 2's design, whose cells today's code does not rerun: check-reference says so instead of reporting
    mismatches."""
    from gradfidelity.claims.registry import load_registry
    from gradfidelity.reference.check import stale_studies
    from gradfidelity.studies.local.claims import EVIDENCE_VERSION as LOCAL_EVIDENCE_VERSION

    want = max(row["evidence_version"] for row in load_registry() if row["study"] == "async_pp")
    assert want >= 2
    claims = tmp_path / "results" / "cpu" / "claims"
    claims.mkdir(parents=True)
    (claims / "async_pp.json").write_text(json.dumps({"study": "async_pp", "scale": "cpu", "values": {}}))
    (claims / "local.json").write_text(json.dumps({"study": "local", "scale": "cpu",  # today's version: current
                                                   "evidence_version": LOCAL_EVIDENCE_VERSION, "values": {}}))
    got = stale_studies(tmp_path, ("async_pp", "local"))
    assert list(got) == ["async_pp"] and "evidence version 1" in got["async_pp"] and f"at {want}" in got["async_pp"]
    (claims / "async_pp.json").write_text(json.dumps({"study": "async_pp", "scale": "cpu",
                                                      "evidence_version": want, "values": {}}))
    assert stale_studies(tmp_path, ("async_pp", "local")) == {}


def test_a_study_whose_committed_runs_were_moved_aside_is_not_sampled(tmp_path):
    """Round 6 moved study B's round-5 records to results/cpu/archive/ (a new design, its run in parts): the
    committed runs table still lists them, and check-reference says the study is not sampled instead of rerunning
    cells today's plan does not have. A table whose every run is there is sampled (the false case)."""
    from gradfidelity.reference.check import stale_studies
    from gradfidelity.studies.local.claims import EVIDENCE_VERSION as LOCAL_EVIDENCE_VERSION

    claims, runs = tmp_path / "results" / "cpu" / "claims", tmp_path / "results" / "cpu" / "runs"
    claims.mkdir(parents=True)
    runs.mkdir(parents=True)
    (claims / "local.json").write_text(json.dumps({"study": "local", "scale": "cpu",
                                                   "evidence_version": LOCAL_EVIDENCE_VERSION, "values": {}}))
    ids = ["results/cpu/local/a/seed0", "results/cpu/local/a/seed1"]
    pd.DataFrame({"run_id": ids, "status": ["ok", "ok"]}).to_csv(runs / "local.csv", index=False)
    for run in ids[:1]:
        (tmp_path / run).mkdir(parents=True)
        (tmp_path / run / "metrics.json").write_text("{}")
    got = stale_studies(tmp_path, ("local",))
    assert list(got) == ["local"] and "1 runs" in got["local"] and ids[1] in got["local"]
    (tmp_path / ids[1]).mkdir(parents=True)
    (tmp_path / ids[1] / "metrics.json").write_text("{}")
    assert stale_studies(tmp_path, ("local",)) == {}


def test_the_round4_cross_isa_rerun_is_within_the_committed_rules():
    """The real cross-ISA rerun (committed AVX2 host vs an AVX-512 host: 0.66% on local's bpb, 0.23% on a Muon
    loss), replayed through compare(): every metric within its rule or not comparable, none outside (exit 0)."""
    from gradfidelity.reference.check import exit_code, summary_line

    root = Path(__file__).resolve().parents[1]
    measured = pd.read_csv(root / "results/cpu/reference/drift_hosts_avx2_vs_avx512.csv")
    committed, rerun = {}, {}
    for r in measured.itertuples():
        base = {"run_id": r.run, "study": r.study, "status": "ok"}
        committed.setdefault(r.run, {**base, **OLD_ROW})[f"metric_{r.metric}"] = r.value_a
        rerun.setdefault(r.run, {**base, **AVX512_HOST})[f"metric_{r.metric}"] = r.value_b
    table = compare(pd.DataFrame(committed.values()), pd.DataFrame(rerun.values()), cross_host_rules(read_drift(root)))
    assert exit_code(table, None) == 0
    assert set(table["hosts"]) == {"cross"}
    assert ", 0 outside their rule" in summary_line(table, None, {})


def _with_record(df, record):
    return df.assign(metrics_json=json.dumps(record))


AUDIT = {"study": "ds_audit", "metrics": {"states": [{"contributions": [1.0, 0.0, 0.0, 1.0], "seconds": 2.01}]},
         "timing": {"wall_s": 9.5}}


def test_a_runs_whole_record_is_compared_on_the_same_host():
    """An audit run keeps its evidence nested (no scalar metric): its record is compared, wall-clock values aside."""
    from gradfidelity.reference.check import RECORD, exit_code, summary_line

    committed = _with_record(_rows(AVX512_HOST, 0.3138), AUDIT)
    slower = {**AUDIT, "metrics": {"states": [{"contributions": [1.0, 0.0, 0.0, 1.0], "seconds": 1.39}]},
              "timing": {"wall_s": 7.0}}
    out = compare(committed, _with_record(_rows(AVX512_HOST, 0.3138), slower)).set_index("metric")
    assert out.loc[RECORD, "verdict"] == "ok" and out.loc[RECORD, "rule"] == "exact"
    table = compare(committed, _with_record(_rows(AVX512_HOST, 0.3138), slower))
    assert "0 outside their rule" in summary_line(table, None, {}) and exit_code(table, None) == 0
    dropped = {**AUDIT, "metrics": {"states": [{"contributions": [1.0, 0.0, 0.0, 0.0], "seconds": 2.01}]}}
    table = compare(committed, _with_record(_rows(AVX512_HOST, 0.3138), dropped))
    assert table.set_index("metric").loc[RECORD, "verdict"] == "MISMATCH"  # every scalar equal, the record not
    assert table.set_index("metric").loc["loss", "verdict"] == "ok"
    assert exit_code(table, None) == 1
    missing = compare(committed, _rows(AVX512_HOST, 0.3138)).set_index("metric")
    assert missing.loc[RECORD, "verdict"] == "MISMATCH"


def test_a_record_across_hosts_is_not_comparable_and_an_old_row_has_none():
    from gradfidelity.reference.check import RECORD

    rules = cross_host_rules(DRIFT_ROWS)
    out = compare(_with_record(_rows(AVX2_HOST, 0.3138), AUDIT),
                  _with_record(_rows(AVX512_HOST, 0.3150), {**AUDIT, "metrics": {}}), rules).set_index("metric")
    assert out.loc[RECORD, "verdict"] == "not comparable" and out.loc["loss", "verdict"] == "ok"
    assert RECORD not in set(compare(_rows(OLD_ROW, 0.3138), _with_record(_rows(AVX2_HOST, 0.3150), AUDIT),
                                     rules)["metric"])
