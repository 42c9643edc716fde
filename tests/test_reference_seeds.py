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
from gradfidelity.reference.seeds import (
    ANOTHER_BASE,
    CANNOT_FAIL,
    FAMILY_ALPHA,
    READING,
    arm_of,
    chaotic_metrics,
    claim_metrics,
    judge,
    prediction_interval,
)
from gradfidelity.studies import STUDIES

REPO = Path(__file__).resolve().parents[1]
CLAIMS = {"sft_rl": {"acc_id": (0.0, 100.0)}}  # the metrics the claims read, as a study declares them
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
    table = compare(committed, inside, {("sft_rl", "acc_id"): None}, seeds=seeds, claims=CLAIMS)
    row = table[table["metric"] == "acc_id"].iloc[0]
    assert row["verdict"] == "ok" and row["rule"].startswith("one more seed") and "(n=8)" in row["rule"]
    assert exit_code(table, None) == 0
    outside = _rows([95.0], host=INTEL, digest='{"a": 2}')
    table = compare(committed, outside, {("sft_rl", "acc_id"): None}, seeds=seeds, claims=CLAIMS)
    assert table.loc[table["metric"] == "acc_id", "verdict"].item() == "MISMATCH"
    assert exit_code(table, None) == 1
    assert "as one more seed" not in summary_line(table, None, {})


def test_the_level_is_bonferroni_over_the_claim_metrics_only():
    """Two metrics a claim reads: m = 2. A third chaotic metric no claim reads (a token count) is a reading: it
    neither widens the claims' intervals (round 5 spent the family on every metric) nor passes or fails."""
    tokens = [568_100.0, 600_000.0, 640_000.0, 610_000.0, 590_000.0, 620_000.0, 605_000.0, 615_000.0]
    seeds = _rows(SEEDS).assign(metric_acc_long=SEEDS, metric_gen_tokens=tokens)
    rerun = _rows([40.0], host=INTEL).assign(metric_acc_long=40.0, metric_gen_tokens=662_733.0)
    claims = {"sft_rl": {"acc_id": (0.0, 100.0), "acc_long": (0.0, 100.0)}}
    table = compare(seeds.iloc[[0]], rerun, {}, seeds=seeds, claims=claims).set_index("metric")
    for metric in ("acc_id", "acc_long"):
        assert f"{100 * (1 - FAMILY_ALPHA / 2):.5g}% PI" in table.loc[metric, "rule"]
        assert table.loc[metric, "verdict"] == "ok"
    assert table.loc["gen_tokens", "verdict"] == READING
    assert table.loc["gen_tokens", "rule"].startswith("reading: no claim reads it; outside the arm's 95% PI")
    line = summary_line(table.reset_index(), None, {})
    assert "2 as one more seed (inside their arm's prediction interval at family level 0.05 over 2 claim metrics)" \
        in line and "1 readings" in line and "0 outside their rule" in line
    assert exit_code(table.reset_index(), None) == 0


def test_a_record_mismatch_on_the_same_host_type_still_fails():
    seeds = _rows(SEEDS)
    same_value_other_record = _rows([SEEDS[0]], digest='{"a": 2}')  # the same host type: exact, record included
    table = compare(seeds.iloc[[0]], same_value_other_record, {}, seeds=seeds, claims=CLAIMS)
    assert table.loc[table["metric"] == RECORD, "verdict"].item() == "MISMATCH"
    assert table.loc[table["metric"] == "acc_id", "rule"].item() == "exact"
    assert exit_code(table, None) == 1


def test_without_a_seed_distribution_the_drift_rule_applies():
    base = _rows([36.2], arm="results/cpu/sft_rl/tiny-qwen2/base")
    rerun = _rows([35.0], host=INTEL, arm="results/cpu/sft_rl/tiny-qwen2/base")
    table = compare(base, rerun, {("sft_rl", "acc_id"): None}, seeds=base, claims=CLAIMS)
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


def test_an_interval_wider_than_the_metrics_range_cannot_fail():
    """Round 5's ReLIFT acc_id interval was [-5.9, 104.9]: wider than an accuracy's whole range 0-100, so no rerun
    could fall outside it. Such a comparison is counted as "cannot fail", never as "ok"."""
    spread = [5.0, 60.0, 95.0, 20.0, 80.0]  # seeds that took off and seeds that did not
    seeds = _rows(spread)
    n, mean, sd = len(spread), sum(spread) / len(spread), pd.Series(spread).std()
    low, high = stats.t.interval(0.95, n - 1, loc=mean, scale=sd * math.sqrt(1 + 1 / n))
    assert low < 0 and high > 100  # the independent reference: scipy's interval holds the whole range
    for value in (50.0, 0.0):  # a rerun anywhere in the range, even at its edge
        table = compare(seeds.iloc[[0]], _rows([value], host=INTEL, digest='{"a": 2}'), {}, seeds=seeds,
                        claims=CLAIMS)
        row = table.set_index("metric").loc["acc_id"]
        assert row["verdict"] == CANNOT_FAIL and "holds the whole range [0, 100]" in row["rule"]
        line = summary_line(table, None, {})
        assert "1 cannot fail (interval wider than the metric's range)" in line and "as one more seed" not in line
        assert exit_code(table, None) == 0
    # an interval past one end only can still fail at the other: judged
    narrow = [10.0, 12.0, 30.0, 14.0]
    table = compare(_rows(narrow).iloc[[0]], _rows([95.0], host=INTEL), {}, seeds=_rows(narrow), claims=CLAIMS)
    assert table.set_index("metric").loc["acc_id", "verdict"] == "MISMATCH"
    assert judge(10.0, 50.0, spread, 0.05, None)[1] == "ok"  # without a declared range nothing says it cannot fail


def test_an_identical_value_across_host_types_is_ok():
    """Issue 58: a selected LR identical on every run (and a record digest of equal records) counted as "not
    comparable" across hosts. Equal is equal on any host type: bit for bit, whatever the metric's rule."""
    committed = _rows([3e-5], metric="lr", study="async_pp", arm="results/cpu/async_pp/c", digest='{"lr": 3e-5}')
    rerun = _rows([3e-5], host=INTEL, metric="lr", study="async_pp", arm="results/cpu/async_pp/c",
                  digest='{"lr": 3e-5}')
    table = compare(committed, rerun, {("async_pp", "lr"): None}).set_index("metric")
    assert table.loc["lr", "verdict"] == "ok" and table.loc["lr", "hosts"] == "cross"
    assert table.loc[RECORD, "verdict"] == "ok"  # equal records: ok on another host type too
    assert "2 metrics: 2 bit for bit" in summary_line(table.reset_index(), None, {})
    moved = compare(committed, rerun.assign(metric_lr=1e-4, metrics_json='{"lr": 1e-4}'),
                    {("async_pp", "lr"): None}).set_index("metric")
    assert moved.loc["lr", "verdict"] == "not comparable" and moved.loc[RECORD, "verdict"] == "not comparable"
    # study A's chaotic lr, identical: ok, never judged as one more seed
    seeds = _rows([3e-5, 3e-5, 1e-4, 3e-5], metric="lr")
    same = compare(seeds.iloc[[0]], _rows([3e-5], host=INTEL, metric="lr"), {}, seeds=seeds, claims=CLAIMS)
    assert same.set_index("metric").loc["lr", "verdict"] == "ok"


def test_a_run_from_another_base_is_not_judged_as_one_more_seed():
    seeds = _rows(SEEDS)
    far = _rows([95.0], host=INTEL, digest='{"a": 2}')  # would be outside the interval
    table = compare(seeds.iloc[[0]], far, {}, seeds=seeds, claims=CLAIMS,
                    other_base={seeds["run_id"][0]: "tiny-qwen2/base/seed0's record a -> b"}).set_index("metric")
    assert table.loc["acc_id", "verdict"] == ANOTHER_BASE
    assert table.loc["acc_id", "rule"] == "another base: tiny-qwen2/base/seed0's record a -> b"
    assert exit_code(table.reset_index(), None) == 0
    assert "1 another base" in summary_line(table.reset_index(), None, {})


def test_another_base_compares_the_upstream_records(tmp_path):
    from gradfidelity.reference.check import another_base

    base, run = "results/cpu/sft_rl/m/base/seed0", "results/cpu/sft_rl/m/fixed/sft/seed0"
    (tmp_path / base).mkdir(parents=True)
    (tmp_path / base / "metrics.json").write_text('{"metrics": {"acc_id": 35.0}, "timing": {"wall_s": 9}}')
    same = '{"metrics": {"acc_id": 35.0}, "timing": {"wall_s": 108}}'  # wall clock aside: the same record
    assert another_base({run: [base]}, {base: same}, tmp_path) == {}
    other = another_base({run: [base]}, {base: '{"metrics": {"acc_id": 36.0}}'}, tmp_path)
    assert list(other) == [run] and other[run].startswith("sft_rl/m/base/seed0's record ")
    assert another_base({run: [base]}, {}, tmp_path) == {}  # not a committed run: nothing to compare


def test_every_chaotic_study_declares_the_metrics_its_claims_read():
    """check-reference judges only the metrics a claim reads (issue 58); each one a column of the study's committed
    runs table, with a range (an accuracy: 0-100)."""
    for study in STUDIES:
        if not chaotic_metrics(study):
            continue
        declared = claim_metrics(study)
        columns = set(pd.read_csv(REPO / "results/cpu/runs" / f"{study}.csv", nrows=1).columns)
        assert declared, f"{study} is chaotic across hosts but declares no CLAIM_METRICS"
        assert {f"metric_{m}" for m in declared} <= columns
        assert all(low < high for low, high in declared.values())
