"""check-reference's verdicts and exit codes: a rerun that flips a verdict exits 3, a metric outside its rule exits
1 (whatever the verdicts), and the summary line counts what a reviewer needs; the claims recompute runs only the
jobs between runs and evidence, from run records rebuilt losslessly from a runs table."""

import json
import shutil

import pandas as pd
import pytest

import gradfidelity.reference.check as reference
import gradfidelity.reference.schedule as schedule
import gradfidelity.reference.verdicts as rv
from gradfidelity.claims.verify import INCONCLUSIVE, REPRODUCED, load_evidence, verify
from gradfidelity.errors import UserError
from gradfidelity.harness.results import load_run_records, records_from_runs_table, runs_table
from gradfidelity.reference.check import exit_code, summary_line
from gradfidelity.reference.dag import Job, parse_dry_run
from gradfidelity.reference.verdicts import allowed_rules, verdict_changes
from gradfidelity.studies.local.claims import EVIDENCE_VERSION as LOCAL_EVIDENCE_VERSION
from tests._reference_fakes import FakeSnakemake

ROW = {"id": "X1", "study": "local", "paper": "p", "statement": "s", "paper_value": "v", "metric": "m",
       "check": {"kind": "gt", "threshold": 1.0}, "scales": ["smoke", "cpu"], "why": "w", "min_n": 3,
       "level": 0.95, "evidence": "measured"}
RUN = "results/cpu/local/enwik8/w64/bp/seed0"
HOST = {"cpu_model": "AMD EPYC", "cpu_vendor": "AuthenticAMD", "cpu_family": 25, "cpu_model_number": 17,
        "cpu_stepping": 1, "cpu_capability": "AVX512", "cpu_flags": "avx2 avx512f", "cpu_isa_limits": "none"}


# these fake checkouts list runs without writing their records (conftest.records_in_place)
pytestmark = pytest.mark.usefixtures("records_in_place")


def _verdicts(tmp_path, name, estimate, low, high, registry=(ROW,)):
    """verify's rows for one hand-made evidence file of study 'local'."""
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"study": "local", "scale": "cpu", "values": {"X1": {
        "estimate": estimate, "low": low, "high": high, "level": 0.95, "exact": False, "n": 5}}}))
    return verify(list(registry), load_evidence([path], "cpu"), "cpu")


def _comparison(rel_values):
    """A compare() table of one run whose metrics moved by the given relative amounts (0: bit for bit)."""
    return pd.DataFrame([{"run": RUN, "metric": f"m{i}", "committed": 1.0, "rerun": 1.0 + r, "difference": r,
                          "rel_difference": abs(r), "rule": "rel<=0.02" if r else "exact",
                          "verdict": "ok" if abs(r) <= 0.02 else "MISMATCH", "hosts": "cross"}
                         for i, r in enumerate(rel_values)])


def test_verdict_changes_sees_a_flip_and_an_unchanged_verdict(tmp_path):
    before = _verdicts(tmp_path, "before", 1.2, 1.05, 1.35)
    assert before["verdict"].tolist() == [REPRODUCED]
    flipped = verdict_changes(before, _verdicts(tmp_path, "after", 1.15, 0.98, 1.32))
    assert flipped.to_dict("records")[0] | {} == {
        "id": "X1", "study": "local", "committed": REPRODUCED, "rerun": INCONCLUSIVE, "unchanged": False,
        "committed_value": "1.2 [1.05, 1.35] 95%", "rerun_value": "1.15 [0.98, 1.32] 95%"}
    same = verdict_changes(before, _verdicts(tmp_path, "moved", 1.19, 1.04, 1.34))
    assert same["unchanged"].tolist() == [True]  # the value moved, the verdict did not
    with pytest.raises(UserError, match="X1 has no recomputed verdict"):
        verdict_changes(before, before.iloc[0:0])


def test_exit_codes_and_the_summary_line(tmp_path):
    before = _verdicts(tmp_path, "before", 1.2, 1.05, 1.35)
    flip = verdict_changes(before, _verdicts(tmp_path, "after", 1.15, 0.98, 1.32))
    keep = verdict_changes(before, before)
    within = _comparison([0.0, 0.0, 0.0066])
    outside = _comparison([0.0, 0.05])
    assert exit_code(within, keep) == 0
    assert exit_code(within, None) == 0  # nothing recomputed: no flip to report, said in the summary
    assert exit_code(within, flip) == 3  # every metric within its rule, a verdict flipped
    assert exit_code(outside, keep) == 1
    assert exit_code(outside, flip) == 1  # a metric outside its rule decides, whatever the verdicts
    line = summary_line(within, keep, {"async_pp": "no metrics_json"})
    assert line == ("1 runs, 3 metrics: 2 bit for bit, 1 within cross-host drift (largest 0.66%), 0 outside their "
                    "rule; verdicts unchanged: 1 of 1; verdicts not recomputed for async_pp (reason above)")
    assert "verdicts unchanged: 0 of 1 (flipped: X1)" in summary_line(within, flip, {})
    assert "1 outside their rule" in summary_line(outside, keep, {})


@pytest.fixture
def fake_checkout(tmp_path, monkeypatch):
    """A checkout with one committed local run, a drift measurement, committed evidence for X1 (reproduced), and
    check_reference's dry run, Snakemake calls and recompute replaced by hand-made results
    (`set_rerun(loss, estimate, low, high)`)."""
    repo = tmp_path / "repo"
    for sub in ("runs", "reference", "claims"):
        (repo / "results" / "cpu" / sub).mkdir(parents=True)
    committed = pd.DataFrame([{"run_id": RUN, "study": "local", "seed": 0, "status": "ok", "wall_s": 10.0,
                               "cpu_model": "AMD EPYC", "metric_val_bpb": 2.8393}])  # an old row: unknown ISA
    committed.to_csv(repo / "results/cpu/runs/local.csv", index=False)
    pd.DataFrame([{"study": "local", "run": RUN, "metric": "val_bpb", "rel_difference": 0.0066}]).to_csv(
        repo / "results/cpu/reference/drift_x.csv", index=False)
    (repo / "results/cpu/claims/local.json").write_text(json.dumps(  # today's evidence version: not stale
        {"study": "local", "scale": "cpu", "evidence_version": LOCAL_EVIDENCE_VERSION, "values": {}}))
    monkeypatch.setattr(reference, "dry_run_plans", lambda *a, **k: {"local": [Job("train", [f"{RUN}/metrics.json"])]})
    monkeypatch.setattr(rv, "committed_verdicts", lambda *a, **k: _verdicts(tmp_path, "before", 1.2, 1.05, 1.35))

    def set_rerun(loss, estimate, low, high):
        monkeypatch.setattr(schedule, "snakemake_call", FakeSnakemake({RUN: ("local", {"val_bpb": loss}, 20.0)}))
        monkeypatch.setattr(rv, "recompute_study", lambda *a, **k: _verdicts(tmp_path, "after", estimate, low, high))
    return repo, set_rerun


def test_a_rerun_that_flips_a_verdict_exits_3(fake_checkout, tmp_path, capsys):
    repo, set_rerun = fake_checkout
    set_rerun(2.8393 * 1.006, 1.15, 0.98, 1.32)  # 0.6% off: within the 1.32% rule; X1 reproduced -> inconclusive
    out = tmp_path / "table.csv"
    assert reference.check_reference(repo, studies=("local",), workdir=tmp_path / "work", out=out) == 3
    text = capsys.readouterr().out
    assert ("1 runs, 1 metrics: 0 bit for bit, 1 within cross-host drift (largest 0.6%), 0 outside "
            "their rule; verdicts unchanged: 0 of 1 (flipped: X1)") in text
    summary = next(line for line in text.splitlines() if line.startswith("check-reference: committed on "))
    assert summary.startswith("check-reference: committed on unknown ISA, rerun on ")  # the two host types named
    assert "unknown ISA (AMD EPYC)" in text  # the committed row predates the CPU identity: another host
    assert pd.read_csv(out)["hosts"].tolist() == ["cross"]
    assert pd.read_csv(out.with_suffix(".verdicts.csv"))["rerun"].tolist() == [INCONCLUSIVE]


def test_a_metric_outside_its_rule_exits_1(fake_checkout, tmp_path, capsys):
    repo, set_rerun = fake_checkout
    set_rerun(2.8393 * 1.03, 1.2, 1.05, 1.35)  # 3% off: outside the 1.32% rule; the verdict holds
    assert reference.check_reference(repo, studies=("local",), workdir=tmp_path / "work") == 1
    assert "0 within cross-host drift, 1 outside their rule; verdicts unchanged: 1 of 1" in capsys.readouterr().out


def test_within_the_rules_and_no_flip_exits_0(fake_checkout, tmp_path, capsys):
    repo, set_rerun = fake_checkout
    set_rerun(2.8393 * 1.006, 1.19, 1.04, 1.34)
    assert reference.check_reference(repo, studies=("local",), workdir=tmp_path / "work") == 0
    assert "verdicts unchanged: 1 of 1" in capsys.readouterr().out


def test_a_study_that_cannot_be_recomputed_is_named_not_passed(fake_checkout, tmp_path, capsys, monkeypatch):
    repo, set_rerun = fake_checkout
    set_rerun(2.8393 * 1.006, 1.2, 1.05, 1.35)

    def refuse(*a, **k):
        raise UserError("the runs table of local has no metrics_json for every run")
    monkeypatch.setattr(rv, "recompute_study", refuse)
    assert reference.check_reference(repo, studies=("local",), workdir=tmp_path / "work") == 0
    text = capsys.readouterr().out
    assert "local's verdicts are not recomputed: the runs table of local has no metrics_json" in text
    assert "verdicts not recomputed for local" in text and "verdicts unchanged" not in text


DRY_RUN = """\
rule data:
    output: r/data/train.bin
rule grid:
    input: r/data/train.bin
    output: r/grid/metrics.json
rule select:
    input: r/grid/metrics.json
    output: r/select.json
rule train:
    input: r/data/train.bin, r/select.json
    output: r/a/metrics.json
rule bench:
    output: r/bench.json
rule aggregate:
    input: r/a/metrics.json
    output: r/agg.csv
rule tables:
    input: r/agg.csv
    output: t/main.csv
rule claims:
    input: r/agg.csv, t/main.csv, r/bench.json
    output: r/claims/s.json
"""


def test_the_recompute_runs_only_the_jobs_between_runs_and_evidence():
    rules = allowed_rules(parse_dry_run(DRY_RUN), "r/claims/s.json")
    assert rules == ["aggregate", "bench", "claims", "tables"]  # no training, no data, no LR selection
    assert allowed_rules(parse_dry_run(DRY_RUN), "r/agg.csv") == ["aggregate"]


def _run_dir(root, rel, metrics, timing=None, seed=0):
    d = root / rel
    d.mkdir(parents=True)
    (d / "metrics.json").write_text(json.dumps({
        "status": "ok", "seed": seed, "scale": "cpu", "study": "local",
        "cell": {"study": "local", "corpus": "enwik8", "width": 64, "method": "bp"},
        "metrics": metrics, "timing": timing or {}}))
    (d / "provenance.json").write_text(json.dumps({"seed": seed, "status": "ok", "machine": HOST, "git_sha": "abc"}))
    return rel + "/metrics.json"


def test_a_runs_table_rebuilds_its_run_records_losslessly(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = _run_dir(tmp_path, RUN, {"val_bpb": 2.839312119, "history": [3.1, 2.9000000000000004]},
                    {"tokens_per_s": 1234.5678, "stage_busy_s": [1.0, 2.0]})
    table = runs_table([path], "cpu")
    assert table.loc[0, "cpu_capability"] == "AVX512" and table.loc[0, "cpu_flags"] == "avx2 avx512f"
    table.to_csv(tmp_path / "runs.csv", index=False)
    back = reference.read_runs_table(tmp_path / "runs.csv")  # as check-reference reads a committed table
    rebuilt = records_from_runs_table(back, tmp_path / "rebuilt")
    strip = ("path", "run_dir")
    (old,), (new,) = load_run_records([path], "cpu"), load_run_records(rebuilt, "cpu")
    assert {k: v for k, v in new.items() if k not in strip} == {k: v for k, v in old.items() if k not in strip}
    again = runs_table(rebuilt, "cpu")
    for col in ("metric_val_bpb", "cpu_capability", "cpu_flags", "metrics_json"):
        assert again.loc[0, col] == table.loc[0, col]


def test_a_runs_table_without_metrics_json_is_not_rebuilt(tmp_path):
    old = pd.DataFrame([{"run_id": RUN, "study": "local", "seed": 0, "status": "ok", "metric_val_bpb": 2.8}])
    with pytest.raises(UserError, match="local has no metrics_json"):
        records_from_runs_table(old, tmp_path)
    with pytest.raises(UserError, match="no metrics_json"):
        records_from_runs_table(old.assign(metrics_json=[None]), tmp_path)
    assert not (tmp_path / RUN).exists()


TOY_SNAKEFILE = '''
rule train:
    output: "results/cpu/toy/{run}/metrics.json"
    shell: "echo a recompute must never train; exit 1"
rule bench:
    output: "results/cpu/bench/toy.json"
    shell: "echo the committed benchmark is kept; exit 1"
rule claims:
    input: expand("results/cpu/toy/{run}/metrics.json", run=["a/seed0", "b/seed0"]), "results/cpu/bench/toy.json"
    output: "results/cpu/claims/stats.json"
    run:
        import json
        total = 400 + sum(json.load(open(p))["metrics"]["x"] for p in input[:2])
        rec = {"estimate": total, "low": total, "high": total, "exact": True, "n": 5}
        json.dump({"study": "stats", "scale": "cpu", "values": {"C5": rec}}, open(output[0], "w"))
'''


@pytest.mark.slow
def test_recompute_study_runs_the_real_evidence_jobs_on_rebuilt_records(tmp_path, monkeypatch):
    """A toy workflow with the shape of a study: runs -> claim evidence (C5, 'between 422 and 424'), a benchmark
    input. The committed table rebuilds run b; run a is the rerun's; only the claims job may run."""
    origin, repo, work = tmp_path / "origin", tmp_path / "repo", tmp_path / "work"
    monkeypatch.chdir(origin.mkdir() or origin)
    runs = [_run_dir(origin, f"results/cpu/toy/{r}/seed0", {"x": 11.5}) for r in ("a", "b")]
    table = runs_table(runs, "cpu").assign(study="stats")
    (repo / "results/cpu/bench").mkdir(parents=True)
    (repo / "results/cpu/bench/toy.json").write_text("{}")
    sample = ["results/cpu/toy/a/seed0"]

    def recompute(x):
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        (work / "Snakefile").write_text(TOY_SNAKEFILE)
        _run_dir(work, sample[0], {"x": x})  # the rerun's record of the sampled run
        return rv.recompute_study(repo, work, "stats", table, sample, 1, ())

    assert recompute(11.5)["verdict"].tolist() == ["arithmetic checked"]  # 423: the committed value
    assert recompute(12.5)["verdict"].tolist() == ["arithmetic checked"]  # 424: moved, within the range
    flipped = recompute(14.0)  # 425.5
    assert flipped["verdict"].tolist() == ["arithmetic mismatch"] and flipped["estimate"].tolist() == [425.5]
    assert json.loads((work / "results/cpu/toy/b/seed0/metrics.json").read_text())["metrics"] == {"x": 11.5}
