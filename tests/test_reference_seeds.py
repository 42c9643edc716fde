"""check-reference across host types: a trajectory-chaotic metric is judged as one more seed of its arm (inside the
committed seeds' prediction interval), a same-host record mismatch still fails, the declarations of chaotic metrics
agree with the committed drift measurements, and every claim of a chaotic study gets a sampled run."""

import math
from pathlib import Path

import pandas as pd
import pytest
from scipy import stats

from gradfidelity.reference.check import (
    MAX_REL,
    RECORD,
    Job,
    compare,
    coverage,
    cross_host_rules,
    exit_code,
    read_drift,
    select,
    summary_line,
)
from gradfidelity.reference.seeds import FAMILY_ALPHA, arm_of, chaotic_metrics, judge, prediction_interval
from gradfidelity.studies import STUDIES

REPO = Path(__file__).resolve().parents[1]
AMD = {"cpu_vendor": "AuthenticAMD", "cpu_family": 25, "cpu_model_number": 17, "cpu_stepping": 1,
       "cpu_capability": "AVX512", "cpu_flags": "avx2 avx512f avx512_bf16", "cpu_isa_limits": "none"}
INTEL = {**AMD, "cpu_vendor": "GenuineIntel", "cpu_family": 6, "cpu_model_number": 167}
ARM = "results/cpu/sft_rl/tiny-qwen2/fixed/relift"
SEEDS = [32.5, 31.5, 46.2, 35.5, 39.8, 35.8, 34.2, 32.8]  # the committed ReLIFT acc_id of the 8 seeds


def _rows(values, host=AMD, metric="acc_id", study="sft_rl", arm=ARM, digest='{"a": 1}'):
    return pd.DataFrame([{"run_id": f"{arm}/seed{k}", "study": study, "status": "ok", "seed": k, **host,
                          f"metric_{metric}": v, "metrics_json": digest} for k, v in enumerate(values)])


def test_the_prediction_interval_is_scipys():
    values = SEEDS
    n, mean, sd = len(values), sum(values) / len(values), pd.Series(values).std()
    want = stats.t.interval(0.99, n - 1, loc=mean, scale=sd * math.sqrt(1 + 1 / n))
    assert prediction_interval(values, 0.01) == pytest.approx(want, rel=1e-12)


def test_a_chaotic_rerun_inside_its_arms_interval_passes_and_one_outside_fails():
    seeds = _rows(SEEDS)
    committed = seeds.iloc[[0]]
    inside = _rows([46.3], host=INTEL, digest='{"a": 2}')  # the Intel host's rerun of seed 0
    table = compare(committed, inside, {("sft_rl", "acc_id"): None}, seeds=seeds)
    row = table[table["metric"] == "acc_id"].iloc[0]
    assert row["verdict"] == "ok" and row["rule"].startswith("one more seed") and "(n=8)" in row["rule"]
    assert exit_code(table, None) == 0
    outside = _rows([95.0], host=INTEL, digest='{"a": 2}')
    table = compare(committed, outside, {("sft_rl", "acc_id"): None}, seeds=seeds)
    assert table.loc[table["metric"] == "acc_id", "verdict"].item() == "MISMATCH"
    assert exit_code(table, None) == 1
    assert "as one more seed" not in summary_line(table, None, {})


def test_the_level_is_bonferroni_over_the_checks_chaotic_comparisons():
    seeds = _rows(SEEDS).assign(metric_acc_macro=SEEDS)  # two chaotic metrics: m = 2
    rerun = _rows([40.0], host=INTEL).assign(metric_acc_macro=40.0)
    table = compare(seeds.iloc[[0]], rerun, {}, seeds=seeds)
    rules = table.loc[table["metric"].isin(["acc_id", "acc_macro"]), "rule"]
    assert all(f"{100 * (1 - FAMILY_ALPHA / 2):.5g}% PI" in r for r in rules)


def test_a_record_mismatch_on_the_same_host_type_still_fails():
    seeds = _rows(SEEDS)
    same_value_other_record = _rows([SEEDS[0]], digest='{"a": 2}')  # the same host type: exact, record included
    table = compare(seeds.iloc[[0]], same_value_other_record, {}, seeds=seeds)
    assert table.loc[table["metric"] == RECORD, "verdict"].item() == "MISMATCH"
    assert table.loc[table["metric"] == "acc_id", "rule"].item() == "exact"
    assert exit_code(table, None) == 1


def test_without_a_seed_distribution_the_drift_rule_applies():
    base = _rows([36.2], arm="results/cpu/sft_rl/tiny-qwen2/base")
    rerun = _rows([35.0], host=INTEL, arm="results/cpu/sft_rl/tiny-qwen2/base")
    table = compare(base, rerun, {("sft_rl", "acc_id"): None}, seeds=base)
    assert table.loc[table["metric"] == "acc_id", "verdict"].item() == "not comparable"
    assert judge(1.0, 1.0, [1.0, 1.0], 0.05)[1] == "not comparable"  # fewer than 3 seeds
    assert judge(7.0, 7.0, [7.0] * 4, 0.05)[1] == "ok" and judge(7.0, 8.0, [7.0] * 4, 0.05)[1] == "MISMATCH"


def test_a_drifting_study_keeps_its_tolerance():
    seeds = _rows([3.50, 3.51, 3.52], metric="final_val_loss", study="async_pp", arm="results/cpu/async_pp/c")
    rerun = _rows([3.55], host=INTEL, metric="final_val_loss", study="async_pp", arm="results/cpu/async_pp/c")
    table = compare(seeds.iloc[[0]], rerun, {("async_pp", "final_val_loss"): 0.005}, seeds=seeds)
    assert table.loc[table["metric"] == "final_val_loss", "verdict"].item() == "MISMATCH"  # 1.4% > 0.5%


def test_the_declarations_agree_with_the_committed_measurements():
    """Every metric measured beyond any cross-host rule is declared chaotic by its study, and a study declares
    chaos only where some metric was measured so: the declarations come from the drift tables, not a guess."""
    rules = cross_host_rules(read_drift(REPO))
    # study B's LR choice (a discrete selection, rerun with its grid in round 3's measurement) and plateau_delta (a
    # difference of two late losses) amplify a 0.2% loss drift: derived values of a drifting study, "not comparable"
    # under its drift rule, not a trajectory that leaves its path
    derived = {("async_pp", "lr"), ("async_pp", "plateau_delta")}
    beyond = {(s, m) for (s, m), tol in rules.items() if tol is None} - derived
    assert beyond, "the committed drift tables show no chaotic metric at all"
    undeclared = sorted((s, m) for s, m in beyond if not ("*" in chaotic_metrics(s) or m in chaotic_metrics(s)))
    assert not undeclared, f"measured beyond {MAX_REL:.0%} across hosts, not declared chaotic: {undeclared}"
    for study in STUDIES:
        if chaotic_metrics(study):
            assert any(s == study for s, _ in beyond), f"{study} declares chaos no measurement shows"
    assert chaotic_metrics("sft_rl") == frozenset({"*"})
    assert not chaotic_metrics("async_pp") and not chaotic_metrics("local") and not chaotic_metrics("ds_audit")


def test_every_claim_of_a_chaotic_study_gets_a_run_from_two_of_its_arms():
    study = "sft_rl"
    root = f"results/cpu/{study}/m"
    runs = [f"{root}/fixed/sft/seed0", f"{root}/ds_bug/sft/seed0", f"{root}/fixed/relift/seed0", f"{root}/base/seed0"]
    tables = {study: pd.DataFrame([{"run_id": r, "seed": 0, "status": "ok", "wall_s": w}
                                   for r, w in zip(runs, [70, 236, 156, 119], strict=True)])}
    jobs = [Job("train", [f"{r}/metrics.json"]) for r in runs]
    claims = {study: {"A5": [f"{root}/fixed/sft/seed0", f"{root}/fixed/sft/seed1", f"{root}/ds_bug/sft/seed0"],
                      "A7": [f"{root}/fixed/relift/seed0"], "A9": []}}
    plain = select(tables, {study: jobs}, budget_s=0)
    assert plain == [f"{root}/fixed/sft/seed0"]  # the cheapest cell alone: A5's buggy side and A7 unsampled
    assert coverage(claims, plain) == {study: (1, 2)}
    chosen = select(tables, {study: jobs}, budget_s=0, runs_of=claims)
    assert set(chosen) == {f"{root}/fixed/sft/seed0", f"{root}/ds_bug/sft/seed0", f"{root}/fixed/relift/seed0"}
    assert coverage(claims, chosen) == {study: (2, 2)}
    line = summary_line(pd.DataFrame(columns=["run", "metric", "difference", "rel_difference", "rule", "verdict"]),
                        None, {}, "committed on A, rerun on B", coverage(claims, plain))
    assert line.startswith("committed on A, rerun on B; ") and "claims with a sampled run: sft_rl 1 of 2" in line


def test_an_arm_is_its_run_without_the_seed():
    assert arm_of(f"{ARM}/seed12") == ARM and arm_of(ARM) == ARM
