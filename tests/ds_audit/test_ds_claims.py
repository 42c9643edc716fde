"""Claim evidence on hand-made matrix rows and loss summaries: for every claim one input where it holds and one where
it is false, judged by the registry's own rows through `verify.judge`, so a record that could never fail is caught.
Also the table, figure and claims jobs end to end on made-up metrics.json files (shared loader, scale check,
sources)."""

import json
from dataclasses import asdict

import jsonschema
import numpy as np
import pandas as pd
import pytest

from gradfidelity.claims.evidence import RECORD_SCHEMA
from gradfidelity.claims.verify import (
    INCONCLUSIVE,
    NOT_MEASURED,
    NOT_REPRODUCED,
    REPRODUCED,
    judge,
    load_evidence,
    load_registry,
)
from gradfidelity.cli import main
from gradfidelity.studies.ds_audit import claims
from gradfidelity.studies.ds_audit.aggregate import rows_for_group
from gradfidelity.studies.ds_audit.case import DSCase
from tests.ds_audit._states import state

ROWS = {row["id"]: row for row in load_registry() if row["study"] == "ds_audit"}


def _verdict(cid: str, rec: dict) -> str:
    jsonschema.validate(rec, RECORD_SCHEMA)
    return judge(ROWS[cid], rec, True, "smoke")[0]


def _state(c, norm=None, tol=1e-3, **kw):
    return state(c, tol=tol, gn=norm, rok=None if norm is None else 1.0, **kw)


def _matrix(*groups) -> pd.DataFrame:
    """groups: (version, ranks, [(DSCase, state), ...]); each group is one run directory."""
    rows = []
    for version, ranks, items in groups:
        cases, states = zip(*items, strict=True)
        run_dir = f"results/ds_audit/matrix/deepspeed~{version}/ranks~{ranks}/seed0"
        rows += [{**r, "run_dir": run_dir} for r in rows_for_group(version, ranks, list(cases), list(states))]
    return pd.DataFrame(rows)


def test_registry_has_every_claim_of_the_study():
    assert set(ROWS) == {"A1", "A1-z1-r1", "A1-z1-r2", "A1-7981", "A2", "A3", "A4"}


# ------------------------------------------------------------------------------------------------------------- A1
def test_a1_holds_when_every_row_matches_the_prediction():
    df = _matrix(("0.18.9", 1, [(DSCase(2, "cpu", 4, "fp32"), _state([1, 0, 0, 1])),
                                (DSCase(3, "cpu", 4, "fp32"), _state([1, 1, 1, 1])),
                                (DSCase(2, "cpu", 2, "fp32"), _state([1, 1]))]),
                 ("0.19.8", 1, [(DSCase(2, "cpu", 4, "fp32"), _state([1, 1, 1, 1]))]))
    rec = claims.a1(df, ["paper_tables/ds_fault_matrix.csv"])
    assert rec["exact"] and rec["estimate"] == 0 and rec["n"] == 4
    assert rec["sources"] == ["results/ds_audit/matrix/deepspeed~0.18.9/ranks~1/seed0",
                              "results/ds_audit/matrix/deepspeed~0.19.8/ranks~1/seed0",
                              "paper_tables/ds_fault_matrix.csv"]
    assert _verdict("A1", rec) == REPRODUCED


def test_a1_fails_on_one_disagreeing_row_and_ignores_errors():
    df = _matrix(("0.18.9", 1, [(DSCase(2, "cpu", 4, "fp32"), _state([1, 0, 0, 1])),
                                (DSCase(0, "none", 2, "fp32"), _state([1, 0.5])),  # ZeRO-0 must be exact
                                (DSCase(2, "cpu", 8, "fp32"), {"status": "error", "error": "RuntimeError: boom"}),
                                (DSCase(1, "cpu", 4, "fp32"), _state([1, 0, 0, 1]))]),  # stage 1: not part of A1
                 ("0.19.8", 1, [(DSCase(2, "cpu", 4, "fp32"), _state([1, 0, 0, 1]))]))  # the fix must be exact
    rec = claims.a1(df)
    assert rec["estimate"] == 2 and rec["n"] == 3
    assert "1 could not run" in rec["detail"] and "0.19.8 r1 z2 cpu ga4" in rec["detail"]
    assert _verdict("A1", rec) == NOT_REPRODUCED


def test_a1_every_row_errored_is_not_measured():
    """Rows that errored are not counted; when every row errored nothing was measured (not 'reproduced', n 0)."""
    err = {"status": "error", "error": "RuntimeError: boom"}
    df = _matrix(("0.18.9", 1, [(DSCase(2, "cpu", 4, "fp32"), err), (DSCase(0, "none", 2, "fp32"), err)]),
                 ("0.19.8", 1, [(DSCase(3, "cpu", 8, "fp32"), err)]))
    rec = claims.a1(df)
    assert rec["estimate"] is None and rec["n"] == 0 and "3 of 3 could not run" in rec["detail"]
    assert _verdict("A1", rec) == NOT_MEASURED


def test_a1_without_rows_is_not_measured():
    df = _matrix(("0.18.9", 1, [(DSCase(2, "cpu", 4, "fp32"), {"status": "error", "error": "boom"})]))
    rec = claims.a1(df)
    assert rec["estimate"] is None and _verdict("A1", rec) == NOT_MEASURED


# ------------------------------------------------------------------------------------------------------- A1-z1-*
@pytest.mark.parametrize(("ranks", "cid"), [(1, "A1-z1-r1"), (2, "A1-z1-r2")])
def test_a1_z1_holds_when_a_stage1_row_drops(ranks, cid):
    drop = [1, 0, 0, 1] * ranks
    df = _matrix(("0.18.9", ranks, [(DSCase(1, "cpu", 4, "fp32"), _state(drop)),
                                    (DSCase(1, "cpu", 8, "fp32"), _state([1] * 8 * ranks))]))
    rec = claims.a1_z1(df, ranks)
    assert rec["estimate"] is True and rec["exact"] and rec["n"] == 2
    assert _verdict(cid, rec) == REPRODUCED


@pytest.mark.parametrize(("ranks", "cid"), [(1, "A1-z1-r1"), (2, "A1-z1-r2")])
def test_a1_z1_fails_when_every_stage1_row_is_exact(ranks, cid):
    df = _matrix(("0.18.9", ranks, [(DSCase(1, "cpu", 4, "fp32"), _state([1] * 4 * ranks)),
                                    (DSCase(1, "cpu", 3, "bf16"), _state([1] * 3 * ranks, tol=3e-2)),
                                    (DSCase(1, "none", 4, "fp32"), _state([1, 0, 0, 1] * ranks))]))  # no offload
    rec = claims.a1_z1(df, ranks)
    assert rec["estimate"] is False and rec["n"] == 2
    assert _verdict(cid, rec) == NOT_REPRODUCED


def test_a1_z1_other_rank_count_or_error_is_not_measured():
    df = _matrix(("0.18.9", 1, [(DSCase(1, "cpu", 4, "fp32"), _state([1, 0, 0, 1]))]),
                 ("0.18.9", 2, [(DSCase(1, "cpu", 4, "fp32"), {"status": "error", "error": "RuntimeError: x"})]))
    rec = claims.a1_z1(df, 2)
    assert rec["estimate"] is None and "RuntimeError: x" in rec["detail"]
    assert rec["sources"] == ["results/ds_audit/matrix/deepspeed~0.18.9/ranks~2/seed0"]
    assert _verdict("A1-z1-r2", rec) == NOT_MEASURED


# ------------------------------------------------------------------------------------------------------- A1-7981
def test_a1_7981_holds_when_only_the_last_backward_counts():
    df = _matrix(("0.18.9", 1, [(DSCase(2, "cpu", 1, "fp32", 4), _state([0, 0, 0, 1]))]),
                 ("0.18.9", 2, [(DSCase(2, "cpu", 1, "fp32", 4), _state([0, 0, 0, 1, 0, 0, 0, 1]))]))
    rec = claims.a1_7981(df)
    assert rec["estimate"] == pytest.approx(0.0) and rec["n"] == 2
    assert _verdict("A1-7981", rec) == REPRODUCED


def test_a1_7981_fails_when_every_backward_counts():
    df = _matrix(("0.18.9", 1, [(DSCase(2, "cpu", 1, "fp32", 4), _state([0, 0, 0, 1])),
                                (DSCase(2, "cpu", 1, "bf16", 4), _state([1, 1, 1, 1], tol=3e-2))]))
    rec = claims.a1_7981(df)
    assert rec["estimate"] == pytest.approx(1.0)
    assert _verdict("A1-7981", rec) == NOT_REPRODUCED
    assert _verdict("A1-7981", claims.a1_7981(df[df.dtype == "fp32"].iloc[:0])) == NOT_MEASURED


# ------------------------------------------------------------------------------------------------------------- A2
def test_a2_holds_when_ga2_is_exact():
    df = _matrix(("0.18.9", 1, [(DSCase(2, "cpu", 2, "fp32"), _state([1, 0.9999])),
                                (DSCase(2, "cpu", 2, "bf16"), _state([1.005, 1], tol=3e-2))]))
    rec = claims.a2(df)
    assert rec["estimate"] == pytest.approx(0.005) and rec["n"] == 2
    assert _verdict("A2", rec) == REPRODUCED


def test_a2_fails_when_ga2_drops():
    df = _matrix(("0.18.9", 1, [(DSCase(2, "cpu", 2, "fp32"), _state([1, 0]))]))
    rec = claims.a2(df)
    assert rec["estimate"] == pytest.approx(1.0)
    assert _verdict("A2", rec) == NOT_REPRODUCED
    assert _verdict("A2", claims.a2(_matrix(("0.19.8", 1, [(DSCase(2, "cpu", 2, "fp32"), _state([1, 1]))])))) \
        == NOT_MEASURED


# ------------------------------------------------------------------------------------------------------------- A3
DROP8 = [1, 0, 0, 0, 0, 0, 0, 1]


def _ga8(rok=1.0, clip_applied=1.0, kept=0.5, pattern=DROP8):
    """0.18.9 ZeRO-2 + offload GA 8: a clipping-off row (reported / kept = rok) and an active-clipping row whose
    full gradient has norm 2 (coefficient 0.5) and whose kept gradient has norm `kept`."""
    off = DSCase(2, "cpu", 8, "fp32", steps=2)
    act = DSCase(2, "cpu", 8, "fp32", clip=1.0, target_norm=2.0)
    return _matrix(("0.18.9", 1, [(off, state(pattern, steps=2, gn=0.3, rok=rok)),
                                  (act, state([x * clip_applied for x in pattern], rok=1.0, kept_norm=kept,
                                              clip=1.0, clip_applied=clip_applied, clip_full=0.5))]))


def test_a3_holds_when_norm_and_clip_are_those_of_the_kept_gradient():
    rec = claims.a3(_ga8())
    assert rec["parts"]["norm"]["estimate"] == pytest.approx(0.0) and rec["parts"]["clip"]["estimate"] == 0.0
    assert all(g["passed"] for g in rec["gates"])
    assert "1.200" in rec["detail"]  # 0.3 / (2/8): the alignment figure, reported only
    assert _verdict("A3", rec) == REPRODUCED


@pytest.mark.parametrize(("rok", "clip_applied"), [(4.0, 1.0), (1.0, 0.5)])  # full norm reported; full-gradient clip
def test_a3_fails_when_norm_or_clip_use_the_full_gradient(rok, clip_applied):
    rec = claims.a3(_ga8(rok=rok, clip_applied=clip_applied))
    assert _verdict("A3", rec) == NOT_REPRODUCED


def test_a3_without_the_bug_or_rows_is_not_measured():
    assert _verdict("A3", claims.a3(_ga8(pattern=[1] * 8, kept=2.0, clip_applied=0.5))) == NOT_MEASURED  # no drop
    assert _verdict("A3", claims.a3(_ga8().iloc[:1])) == NOT_MEASURED  # no clipping row


# ------------------------------------------------------------------------------------------------------------- A4
def _summary(errors, seeds=3):
    spreads = [0.0, 0.2, 0.4, 0.6, 0.8, 0.95][: len(errors)]
    rows = [{"spread": s, "method": "per_microbatch_mean", "rel_error": e, "seeds": seeds}
            for s, e in zip(spreads, errors, strict=True)]
    rows += [{"spread": s, "method": "global_token_mean", "rel_error": 0.0, "seeds": seeds} for s in spreads]
    return pd.DataFrame(rows)


def test_a4_holds_when_error_grows_with_spread():
    rec = claims.a4(_summary([0.0, 0.01, 0.03, 0.05, 0.09, 0.12]), ["results/ds_audit/loss_agg/seed0"],
                    ["paper_tables/loss_aggregation.csv"])
    assert rec["estimate"] == pytest.approx(1.0) and rec["exact"] and rec["n"] == 6
    assert rec["sources"] == ["results/ds_audit/loss_agg/seed0", "paper_tables/loss_aggregation.csv"]
    assert _verdict("A4", rec) == REPRODUCED


@pytest.mark.parametrize("errors", [[0.12, 0.09, 0.05, 0.03, 0.01, 0.0], [0.05, 0.01, 0.09, 0.0, 0.12, 0.03]])
def test_a4_fails_when_error_does_not_grow(errors):
    rec = claims.a4(_summary(errors))
    assert rec["estimate"] < 0.9
    assert _verdict("A4", rec) == NOT_REPRODUCED


@pytest.mark.parametrize("errors", [[0.1], [0.02, 0.02, 0.02]])
def test_a4_undefined_correlation_is_not_measured(errors):
    rec = claims.a4(_summary(errors))
    assert rec["estimate"] is None
    assert _verdict("A4", rec) == NOT_MEASURED


def test_no_record_is_ever_inconclusive_or_unvalidated():
    """Exact records have zero-width intervals: a verdict is never 'inconclusive' for this study."""
    df = _ga8()
    ev = claims.evidence(df, _summary([0.0, 0.1]), "smoke")
    assert set(ev["values"]) == set(ROWS) and ev["study"] == "ds_audit" and ev["scale"] == "smoke"
    for cid, rec in ev["values"].items():
        assert _verdict(cid, rec) != INCONCLUSIVE


# ------------------------------------------------------------------------- ds-audit-tables / -figures / -claims (CLI)
TABLES = {"matrix-csv": "m.csv", "matrix-md": "m.md", "loss-csv": "l.csv", "loss-md": "l.md", "alignment-csv": "a.csv",
          "alignment-md": "a.md"}
FIGURES = {"matrix-png": "m.png", "loss-png": "l.png"}


def _write_run(path, metrics, scale="smoke", status="ok"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"status": status, "study": "ds_audit", "scale": scale, "seed": 0, "metrics": metrics}))
    return path


def _job_args(tmp_path, groups, loss, scale="smoke"):
    """The three jobs' command lines (as the rules write them) and their outputs."""
    out = {k: tmp_path / "out" / name for k, name in {**TABLES, **FIGURES, "evidence": "ev.json"}.items()}
    align = _write_run(tmp_path / "alignment/seed0/metrics.json", {
        "model": "tiny", "micro_batch_size": 1, "grams": [np.eye(8).tolist(), (np.eye(8) + 1.0).tolist()]}, scale)
    runs = ["--groups", *map(str, groups), "--loss", str(loss), "--scale", scale]
    tables = [f"--{k}={out[k]}" for k in TABLES]
    evidence = f"--evidence={out['evidence']}"
    return {"tables": ["ds-audit-tables", *runs, "--alignment", str(align), *tables],
            "figures": ["ds-audit-figures", *runs, *[f"--{k}={out[k]}" for k in FIGURES]],
            "claims": ["ds-audit-claims", *runs, "--alignment", str(align), *tables, evidence]}, out


def _fixture_runs(tmp_path, scale="smoke"):
    cases = [DSCase(2, "cpu", 4, "fp32"), DSCase(2, "cpu", 2, "fp32"), DSCase(1, "cpu", 4, "fp32"),
             DSCase(2, "cpu", 8, "fp32"), DSCase(2, "cpu", 1, "fp32", 4),
             DSCase(2, "cpu", 8, "fp32", clip=1.0, target_norm=2.0)]
    states = [_state([1, 0, 0, 1]), _state([1, 1]), _state([1, 1, 1, 1]),
              _state(DROP8, norm=0.25), _state([0, 0, 0, 1]),
              state(DROP8, rok=1.0, kept_norm=0.5, clip=1.0, clip_full=0.5)]
    group = _write_run(tmp_path / "matrix/deepspeed~0.18.9/ranks~1/seed0/metrics.json",
                       {"deepspeed": "0.18.9", "ranks": 1, "cases": [asdict(c) for c in cases], "states": states},
                       scale)
    loss_rows = [{"spread": s, "method": m, "seed": seed, "length_cv": s / 2, "weight_min": 1.0, "weight_max": 1.0,
                  "rel_error": (s * (seed + 1) if m == "per_microbatch_mean" else 0.0), "cosine": 1.0}
                 for s in (0.0, 0.4, 0.8) for m in ("global_token_mean", "per_microbatch_mean") for seed in (0, 1)]
    loss = _write_run(tmp_path / "loss_agg/seed0/metrics.json", {"rows": loss_rows}, scale)
    return group, loss


def test_each_job_writes_only_its_own_outputs_and_the_evidence_cites_the_tables(tmp_path):
    group, loss = _fixture_runs(tmp_path)
    jobs, out = _job_args(tmp_path, [group], loss)
    assert main(jobs["tables"]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(TABLES.values())  # no figure, no evidence
    assert main(jobs["figures"]) == 0
    assert all(out[k].stat().st_size > 0 for k in FIGURES)
    assert not out["evidence"].exists()
    assert main(jobs["claims"]) == 0
    ev = load_evidence([out["evidence"]], "smoke")["ds_audit"]["values"]
    verdicts = {cid: judge(ROWS[cid], ev[cid], True, "smoke")[0] for cid in ROWS}
    assert verdicts == {"A1": REPRODUCED, "A1-z1-r1": NOT_REPRODUCED, "A1-z1-r2": NOT_MEASURED,
                        "A1-7981": REPRODUCED, "A2": REPRODUCED, "A3": REPRODUCED, "A4": REPRODUCED}
    assert ev["A1"]["sources"] == [str(group.parent), str(out["matrix-csv"]), str(out["matrix-md"])]
    assert ev["A4"]["sources"] == [str(loss.parent), str(out["loss-csv"]), str(out["loss-md"])]
    assert str(out["alignment-md"]) in ev["A3"]["sources"]
    assert "sqrt(2/N) = 0.500" in ev["A3"]["detail"] and "2/N = 0.250" in ev["A3"]["detail"]
    assert ev["A1"]["computed_by"] == "gradfidelity.studies.ds_audit.claims:a1"
    md = out["matrix-md"].read_text()
    header = next(line for line in md.splitlines() if line.startswith("| deepspeed"))
    assert "agrees_with_prediction" in header and "nan" not in md
    assert pd.read_csv(out["matrix-csv"]).run_dir.unique().tolist() == [str(group.parent)]


def test_the_table_and_claims_jobs_show_one_alignment_interval(tmp_path):
    """The alignment table's note and A3's detail: one interval (t_interval at A3's level) on the same windows."""
    group, loss = _fixture_runs(tmp_path)
    jobs, out = _job_args(tmp_path, [group], loss)
    assert main(jobs["tables"]) == 0 and main(jobs["claims"]) == 0
    note = out["alignment-md"].read_text().split("Mean ", 1)[1].split(" (")[0]
    detail = json.loads(out["evidence"].read_text())["values"]["A3"]["detail"]
    assert f"= {note} =" in detail


@pytest.mark.parametrize("job", ["tables", "figures", "claims"])
def test_every_job_refuses_runs_of_another_scale(tmp_path, capsys, job):
    group, loss = _fixture_runs(tmp_path, scale="cpu")
    jobs, out = _job_args(tmp_path, [group], loss, scale="smoke")
    assert main(jobs[job]) == 2
    assert "scale 'cpu', not 'smoke'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
