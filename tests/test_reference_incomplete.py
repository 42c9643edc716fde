"""check-reference finishes, or says how far it got (issue 58): the drift-only studies rerun first, one Snakemake
call per study; a failed job, the budget or Ctrl-C ends the rerun without losing a finished run; what finished is
compared, its table written, the summary line says "incomplete: k of n runs" and the exit code is 4 (1 if a
finished run is outside its rule). `--budget` sizes the sample to this host's measured speed."""

import os
import signal
import sys
import threading
import time

import pandas as pd
import pytest

import gradfidelity.reference.check as reference
import gradfidelity.reference.rerun as rerun_module
import gradfidelity.reference.sample as sample_module
import gradfidelity.reference.schedule as schedule
from gradfidelity.reference.dag import Job
from gradfidelity.reference.rerun import BUDGET, INTERRUPTED, Call, expected_s, snakemake_call, speed_ratio
from gradfidelity.reference.sample import run_order, select
from gradfidelity.studies.local.claims import EVIDENCE_VERSION as LOCAL_EVIDENCE_VERSION
from tests._reference_fakes import FakeSnakemake

LOCAL = [f"results/cpu/local/enwik8/w64/{m}/seed0" for m in ("bp", "rgc", "bp_tm")]
SFT = [f"results/cpu/sft_rl/m/{a}/seed0" for a in ("base", "fixed/sft")]
WALL = {LOCAL[0]: 10.0, LOCAL[1]: 30.0, LOCAL[2]: 40.0, SFT[0]: 100.0, SFT[1]: 50.0}
BPB = {LOCAL[0]: 2.80, LOCAL[1]: 2.90, LOCAL[2]: 3.00}


# these fake checkouts list runs without writing their records (conftest.records_in_place)
pytestmark = pytest.mark.usefixtures("records_in_place")


def _committed_row(run, study, metrics):
    return {"run_id": run, "study": study, "seed": 0, "status": "ok", "wall_s": WALL[run], "cpu_model": "AMD EPYC",
            **{f"metric_{k}": v for k, v in metrics.items()}}  # an old row: unknown ISA, another host type


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """A checkout with three committed local runs and, with `sft=True`, two study-A runs; the dry run replaced by
    a hand-made plan (sft's fixed/sft starts from its base) and no verdict recompute (the committed evidence holds
    no claim)."""
    def make(sft=False):
        repo = tmp_path / "repo"
        for sub in ("runs", "reference", "claims"):
            (repo / "results" / "cpu" / sub).mkdir(parents=True, exist_ok=True)
        pd.DataFrame([_committed_row(r, "local", {"val_bpb": BPB[r]}) for r in LOCAL]).to_csv(
            repo / "results/cpu/runs/local.csv", index=False)
        pd.DataFrame([{"study": "local", "run": LOCAL[0], "metric": "val_bpb", "rel_difference": 0.0066}]).to_csv(
            repo / "results/cpu/reference/drift_x.csv", index=False)
        (repo / "results/cpu/claims/local.json").write_text(
            f'{{"study": "local", "scale": "cpu", "evidence_version": {LOCAL_EVIDENCE_VERSION}, "values": {{}}}}')
        plans = {"local": [Job("train", [f"{r}/metrics.json"]) for r in LOCAL]}
        studies = ("local",)
        if sft:
            pd.DataFrame([_committed_row(r, "sft_rl", {"acc_id": 30.0}) for r in SFT]).to_csv(
                repo / "results/cpu/runs/sft_rl.csv", index=False)
            plans["sft_rl"] = [Job("train", [f"{SFT[0]}/metrics.json"]),
                               Job("train", [f"{SFT[1]}/metrics.json"], [f"{SFT[0]}/metrics.json"])]
            studies = ("sft_rl", "local")  # the registry's order: study A first
            monkeypatch.setattr(sample_module, "stale_studies", lambda *a, **k: {})
        monkeypatch.setattr(reference, "dry_run_plans", lambda *a, **k: plans)
        return repo, studies
    return make


def _records(scale=2.0, bpb_shift=0.0):
    """Every run's rerun record: `scale` times its committed wall time, val_bpb moved by `bpb_shift` (relative)."""
    out = {r: ("local", {"val_bpb": BPB[r] * (1 + bpb_shift)}, scale * WALL[r]) for r in LOCAL}
    out.update({r: ("sft_rl", {"acc_id": 30.0}, scale * WALL[r]) for r in SFT})
    return out


def _summary(text):
    return [line for line in text.splitlines() if line.startswith("check-reference: ") and "runs, " in line][-1]


def test_a_rerun_that_fails_midway_compares_what_finished_and_exits_4(checkout, tmp_path, monkeypatch, capsys):
    repo, studies = checkout()
    fake = FakeSnakemake(_records(), fail_after=2)
    monkeypatch.setattr(schedule, "snakemake_call", fake)
    out = tmp_path / "table.csv"
    code = reference.check_reference(repo, studies=studies, workdir=tmp_path / "work", out=out)
    text = capsys.readouterr().out
    assert code == reference.INCOMPLETE == 4
    line = _summary(text)
    assert line.startswith("check-reference: incomplete: 2 of 3 runs (a rerun job failed (local: ")
    assert "2 runs, 2 metrics: 2 bit for bit" in line and "0 outside their rule" in line
    assert "the local call failed (1 of 2 runs finished)" in text
    assert "verdicts are not recomputed: the rerun is incomplete" in text
    table = pd.read_csv(out)  # the compared runs' table is written
    assert set(table["run"]) == {LOCAL[0], fake.calls[1][0]} and set(table["verdict"]) == {"ok"}
    assert "Traceback" not in text


def test_a_finished_run_outside_its_rule_still_exits_1_when_incomplete(checkout, tmp_path, monkeypatch, capsys):
    repo, studies = checkout()
    monkeypatch.setattr(schedule, "snakemake_call", FakeSnakemake(_records(bpb_shift=0.05), fail_after=2))
    assert reference.check_reference(repo, studies=studies, workdir=tmp_path / "work") == 1
    line = _summary(capsys.readouterr().out)
    assert line.startswith("check-reference: incomplete: 2 of 3 runs") and "2 outside their rule" in line


def test_the_budget_stops_the_rerun_and_the_finished_runs_are_compared(checkout, tmp_path, monkeypatch, capsys):
    repo, studies = checkout()
    monkeypatch.setattr(schedule, "snakemake_call", FakeSnakemake(_records(), budget_after=1))
    code = reference.check_reference(repo, studies=studies, workdir=tmp_path / "work", budget_s=3600)
    line = _summary(capsys.readouterr().out)
    assert code == 4
    assert line.startswith("check-reference: incomplete: 1 of 3 runs (the budget of 3600 s ran out)")


def test_ctrl_c_in_a_call_compares_what_finished(checkout, tmp_path, monkeypatch, capsys):
    repo, studies = checkout()
    fake = FakeSnakemake(_records())

    def interrupted_second_call(work, call, *a, **k):
        if fake.calls:  # the probe ran; Ctrl-C during the next call, after its first run (the real call's handling
            fake.budget_after = 2  # of KeyboardInterrupt is tested below, with a real process)
            call = fake(work, call, *a, **k)
            call.status = INTERRUPTED
            return call
        return fake(work, call, *a, **k)
    monkeypatch.setattr(schedule, "snakemake_call", interrupted_second_call)
    assert reference.check_reference(repo, studies=studies, workdir=tmp_path / "work") == 4
    text = capsys.readouterr().out
    assert _summary(text).startswith("check-reference: incomplete: 2 of 3 runs (interrupted (Ctrl-C")
    assert len(fake.calls) == 2  # nothing ran after it


def test_drift_only_studies_run_first_one_call_each_and_a_probe_first(checkout, tmp_path, monkeypatch, capsys):
    """Study A (chaotic) is first in the registry's order but reruns last; each study's cheapest cell runs alone
    first (the speed probe) and the expected time is printed after the first probe, before the sample runs."""
    repo, studies = checkout(sft=True)
    fake = FakeSnakemake(_records(scale=2.0))
    monkeypatch.setattr(schedule, "snakemake_call", fake)
    monkeypatch.setattr(reference, "claim_metrics", lambda study: {"acc_id": (0.0, 100.0)})
    assert run_order(studies) == ["local", "sft_rl"]
    reference.check_reference(repo, studies=studies, workdir=tmp_path / "work")
    assert [sorted(c) for c in fake.calls] == [[LOCAL[0]], sorted(LOCAL[1:]), [SFT[0]], [SFT[1]]]
    text = capsys.readouterr().out
    probe = next(line for line in text.splitlines() if "probe" in line)
    assert "local's probe local/enwik8/w64/bp/seed0 ran 20 s here, 10 s committed: speed ratio 2" in probe
    # the rest: local 70 s and sft_rl 150 s committed, both at local's ratio 2 (sft_rl's assumed), 2 at a time
    # (220 s), plus Snakemake's start-up per call (3 calls; the fake's is 0 s)
    assert "expected time for the 4 runs left of 5: about 4 min" in probe and "sft_rl 2 assumed" in probe
    assert text.index("probe") < text.index(f"  {LOCAL[1]}")  # printed before the sample's list and its calls


def test_a_run_started_from_another_base_is_reported_as_such(checkout, tmp_path, monkeypatch, capsys):
    """Study A's runs start from a base model the rerun pretrains again: when its record differs from the committed
    one, a downstream run's chaotic metrics are 'another base', never judged against the committed seeds."""
    repo, studies = checkout(sft=True)
    table = pd.read_csv(repo / "results/cpu/runs/sft_rl.csv")
    committed_base = '{"metrics": {"acc_id": 30.0}, "status": "ok", "study": "sft_rl"}'
    table["metrics_json"] = [committed_base, '{"x": 1}']
    seeds = [dict(table.iloc[1], run_id=SFT[1].replace("seed0", f"seed{k}"), seed=k, metric_acc_id=v,
                  metrics_json='{"x": 1}') for k, v in ((1, 28.0), (2, 33.0), (3, 31.0))]
    pd.concat([table, pd.DataFrame(seeds)]).to_csv(repo / "results/cpu/runs/sft_rl.csv", index=False)
    records = _records()
    records[SFT[1]] = ("sft_rl", {"acc_id": 31.5}, 100.0)
    monkeypatch.setattr(schedule, "snakemake_call", FakeSnakemake(records))
    monkeypatch.setattr(reference, "claim_metrics", lambda study: {"acc_id": (0.0, 100.0)})
    out = tmp_path / "t.csv"
    reference.check_reference(repo, studies=studies, workdir=tmp_path / "work", out=out)
    rows = pd.read_csv(out).set_index(["run", "metric"])
    assert rows.loc[(SFT[1], "acc_id"), "verdict"] == "another base"
    assert rows.loc[(SFT[1], "acc_id"), "rule"].startswith("another base: sft_rl/m/base/seed0's record ")
    assert "1 another base" in _summary(capsys.readouterr().out)


# ----------------------------------------------------------------------------------------------- the budget
def test_the_budget_sizes_the_sample_to_the_measured_speed():
    tables = {"local": pd.DataFrame([{"run_id": r, "seed": 0, "status": "ok", "wall_s": WALL[r]} for r in LOCAL])}
    plans = {"local": [Job("train", [f"{r}/metrics.json"]) for r in LOCAL]}
    # 80 s committed in all: at the committed speed all three fit 80 job-seconds; at half the speed only the
    # cheapest (the probe: 20 s here) and rgc (60 s here), not bp_tm (80 s here)
    assert sorted(select(tables, plans, 80, strict=True)) == sorted(LOCAL)
    assert select(tables, plans, 80, scale={"local": 2.0}, strict=True) == [LOCAL[0], LOCAL[1]]
    # the cheapest cell of every study is taken whatever the budget: a budget below it ends incomplete instead
    assert select(tables, plans, 0, scale={"local": 2.0}, strict=True) == [LOCAL[0]]


def test_the_schedule_sizes_the_sample_after_the_probe(checkout, tmp_path, monkeypatch, capsys):
    """--budget: the probe runs at ratio 2, so of the 80 committed seconds left only what fits the rest of the
    budget (job-seconds = time left x cores) is sampled; the line says how many runs fit."""
    repo, studies = checkout()
    fake = FakeSnakemake(_records(scale=2.0))
    monkeypatch.setattr(schedule, "snakemake_call", fake)
    monkeypatch.setattr(schedule.time, "monotonic", lambda: 1000.0)  # no time passes: the budget is all left
    assert reference.check_reference(repo, studies=studies, workdir=tmp_path / "work", budget_s=71, cores=1) == 0
    text = capsys.readouterr().out
    # 71 s left on one core (the probe's call start-up measured 0 s), plus the probe's 20 s already spent: 91
    # job-seconds at this host's speed; rgc (60 s here) fits beside the probe, bp_tm (80 s here) does not
    assert "2 runs fit the budget" in text and "speed ratio 2" in text
    assert fake.calls == [[LOCAL[0]], [LOCAL[1]]]


def test_expected_time_and_speed_ratio():
    assert speed_ratio(10.0, 25.0) == 2.5
    assert speed_ratio(0.0, 25.0) != speed_ratio(0.0, 25.0)  # NaN: nothing measured
    # 100 s of ds work at ratio 2 and 50 s at 1, two at a time, 3 calls of 10 s start-up
    assert expected_s({"a": 100.0, "b": 50.0}, {"a": 2.0, "b": 1.0}, 2, 3, 10.0) == pytest.approx(155.0)


# ----------------------------------------------------------------------------------------------- a real process
STANDIN = """
import sys, time, pathlib, json
for target in [a for a in sys.argv[1:] if a.endswith('/metrics.json')][:1]:
    p = pathlib.Path(target); p.parent.mkdir(parents=True, exist_ok=True); p.write_text('{}')
time.sleep(60)
"""


@pytest.fixture
def standin(monkeypatch, tmp_path):
    """snakemake_call's process replaced by a stand-in that writes its first target's record and then hangs: the
    call's own deadline and Ctrl-C handling run on a real process group."""
    script = tmp_path / "standin.py"
    script.write_text(STANDIN)
    real = rerun_module.subprocess.Popen

    def popen(cmd, **kw):
        return real([sys.executable, str(script), *[c for c in cmd if c.endswith("/metrics.json")]], **kw)
    monkeypatch.setattr(rerun_module.subprocess, "Popen", popen)
    monkeypatch.setattr(rerun_module, "STOP_GRACE_S", 5.0)
    return tmp_path / "work"


def test_a_real_call_stops_at_its_deadline_and_keeps_the_finished_run(standin):
    start = time.monotonic()
    call = snakemake_call(standin, Call("t", ["r/a", "r/b"]), 1, (), deadline=time.monotonic() + 3)
    assert call.status == BUDGET and call.finished == ["r/a"]
    assert time.monotonic() - start < 30  # stopped, not waited out


def test_ctrl_c_stops_a_real_call_and_keeps_the_finished_run(standin):
    # A shell starts a background job (`make test &`, nohup) with SIGINT ignored, and Python then keeps it ignored:
    # Ctrl-C's handler is set here, as an interactive session has it, so the test reads the call, not how it started.
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(3.0, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        call = snakemake_call(standin, Call("t", ["r/a", "r/b"]), 1, ())
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, before)
    assert call.status == INTERRUPTED and call.finished == ["r/a"]


def test_a_sigterm_stops_the_check_like_ctrl_c(checkout, tmp_path, monkeypatch, capsys):
    """A `timeout` or a scheduler ending the check (SIGTERM) gets the summary of what finished, not a dead
    process: round 5's hour limit left nothing compared."""
    repo, studies = checkout()
    fake = FakeSnakemake(_records())

    def terminated_after_the_probe(work, call, *a, **k):
        call = fake(work, call, *a, **k)
        if len(fake.calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return call
    monkeypatch.setattr(schedule, "snakemake_call", terminated_after_the_probe)
    assert reference.check_reference(repo, studies=studies, workdir=tmp_path / "work") == 4
    assert _summary(capsys.readouterr().out).startswith("check-reference: incomplete: 3 of 3 runs (interrupted")
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back as it was
