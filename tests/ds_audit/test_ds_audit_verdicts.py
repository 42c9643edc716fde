"""The audit's verdicts and exit codes from hand-made probe results (no DeepSpeed): a leak across optimizer steps
gets its own verdict and exit code, the clipping threshold is compared with the one asked for, the most severe
finding sets the code, and --json is checked before any work."""

import pytest

from gradfidelity.cli import main
from gradfidelity.studies.ds_audit.audit import (
    EXIT_CLIP_THRESHOLD,
    EXIT_CODES,
    EXIT_DROPS,
    EXIT_FAITHFUL,
    EXIT_LEAK,
    EXIT_UNDECIDED,
    clip_finding,
    exit_code,
    judge,
    leaks,
)
from gradfidelity.studies.ds_audit.case import DSCase
from gradfidelity.studies.ds_audit.userconfig import AuditPlan

TOL = 1e-3


def _step(contrib, residual=0.0):
    return {"contributions": contrib, "residual": residual, "storage_rounding": 0.0, "reported_over_kept": 1.0}


def _result(steps, dropped=None, faithful=False):
    return {"tolerance": TOL, "faithful": faithful, "per_step": steps,
            "dropped": dropped or [[] for _ in steps], "extra": {}}


def _case(**kw):
    from dataclasses import asdict

    return asdict(DSCase(2, "cpu", 1, "fp32", **kw))


# 0.19.8, ZeRO-2 + CPU offload, GA 1, 4 backward calls without the boundary: the measured pattern
NO_BOUNDARY_0198 = [_step([0, 1, 1, 1], 2e-8), _step([0, 1, 1, 1], 0.66), _step([0, 0.85, 0.85, 0.85], 1.2)]


def test_a_gradient_carried_into_the_next_step_is_a_leak():
    assert leaks(NO_BOUNDARY_0198, TOL)
    v = judge("multi-backward-no-boundary", _case(backward_calls=4, boundary="none"),
              _result(NO_BOUNDARY_0198, dropped=[[0]] * 3), "0.19.8", 1)
    assert v["verdict"] == "leaking" and "set_gradient_accumulation_boundary" in v["reason"]
    assert exit_code([v], None) == EXIT_LEAK


def test_no_leak_when_every_step_is_clean_or_when_only_one_step_ran():
    clean = [_step([0, 0, 0, 1], 3e-8)] * 3  # 0.18.9 without the boundary: only the last backward counts
    assert not leaks(clean, TOL)
    v = judge("multi-backward-no-boundary", _case(backward_calls=4, boundary="none"),
              _result(clean, dropped=[[0, 1, 2]] * 3), "0.18.9", 1)
    assert v["verdict"] == "dropped" and exit_code([v], None) == EXIT_DROPS
    assert not leaks(NO_BOUNDARY_0198[:1], TOL)  # one step cannot show a leak
    assert not leaks([_step([1], 0.5), _step([1], 0.5)], TOL)  # residual from the first step on: not carried over


def test_the_most_severe_finding_sets_the_code():
    faithful, undecided = {"verdict": "faithful"}, {"verdict": "undecidable"}
    dropped, leaking = {"verdict": "dropped"}, {"verdict": "leaking"}
    assert exit_code([faithful], None) == EXIT_FAITHFUL
    assert exit_code([faithful], "clips at 1") == EXIT_CLIP_THRESHOLD
    assert exit_code([undecided], "clips at 1") == EXIT_UNDECIDED
    assert exit_code([dropped, undecided], "clips at 1") == EXIT_DROPS
    assert exit_code([dropped, leaking], None) == EXIT_LEAK
    assert list(EXIT_CODES)[:4] == [EXIT_LEAK, EXIT_DROPS, EXIT_UNDECIDED, EXIT_CLIP_THRESHOLD]


@pytest.mark.parametrize(("asked", "used", "warns"), [(0.0, 1.0, True), (1.0, 1.0, False), (0.0, 0.0, False),
                                                      (0.3, 1.0, True), (1.0, 0.0, True)])
def test_clip_threshold_is_compared_with_the_one_asked_for(asked, used, warns):
    plan = AuditPlan(cases=[], clip_asked=asked, clip_asked_from="test")
    finding = clip_finding(plan, used)
    assert (finding is not None) == warns
    if warns:
        assert "gradient_clipping" in finding


def test_help_lists_every_exit_code(capsys):
    with pytest.raises(SystemExit):
        main(["audit-deepspeed", "--help"])
    out = capsys.readouterr().out
    for code in (0, 2, 3, 4, 5, 6):
        assert f"  {code}  " in out
    assert "130/143" in out


@pytest.mark.parametrize("where", ["missing/out.json", "."])
def test_json_target_is_checked_before_any_work(tmp_path, capsys, monkeypatch, where):
    cfg = tmp_path / "ds.json"
    cfg.write_text('{"gradient_accumulation_steps": 2, "zero_optimization": {"stage": 2}}')

    def no_run(*a, **k):
        raise AssertionError("the probe must not start")

    monkeypatch.setattr("gradfidelity.studies.ds_audit.worker.run_group", no_run)
    target = tmp_path / where
    assert main(["audit-deepspeed", str(cfg), "--json", str(target)]) == 2
    err = capsys.readouterr().err
    assert "--json" in err and len(err.strip().splitlines()) == 1
