"""The workflow's ds_audit steps (called by workflow/rules/ds_audit.smk): fault-matrix groups, the loss-aggregation
audit, and tables + figures + claim evidence. The user-facing command is in `audit.py`."""

from __future__ import annotations

from dataclasses import asdict, fields
from pathlib import Path

from gradfidelity.config import cfg_from_json
from gradfidelity.errors import UserError


def _cfg(text: str) -> dict:
    return cfg_from_json(text, "ds_audit")


def matrix_group(args) -> int:
    from gradfidelity.harness import Run
    from gradfidelity.studies.ds_audit.matrix import MatrixConfig
    from gradfidelity.studies.ds_audit.versions import base_version, installed_version_noimport
    from gradfidelity.studies.ds_audit.worker import run_group

    cfg = _cfg(args.cfg)
    mcfg = MatrixConfig.from_dict(cfg["matrix"])
    got = installed_version_noimport()
    if got != args.version:
        raise UserError(f"--version {args.version} but this environment imports deepspeed {got} "
                        f"(installed {base_version()}); run the 0.18.9 group under DS0189_ENV")
    cases = mcfg.cases()
    with Run(Path(args.metrics).parent, study="ds_audit", config=cfg, seed=0, threads=1, sample_memory=False) as run:
        states = run_group(cases, args.ranks, None, Path(args.metrics).parent / "work", mcfg.case_timeout_s)
        got = {st["result"]["extra"]["deepspeed"] for st in states if st["status"] == "ok"}
        if got - {args.version}:
            raise RuntimeError(f"group labelled {args.version} ran deepspeed {sorted(got)}")
        run.log.info("%d cases, %d ran", len(cases), sum(st["status"] == "ok" for st in states))
        # raw measurements only: predictions and agreement are computed by ds-audit-tables from these
        run.finish({"deepspeed": args.version, "ranks": args.ranks, "cases": [asdict(c) for c in cases],
                    "states": states}, timing={"case_seconds": [st.get("seconds") for st in states]})
    return 0


def loss_agg(args) -> int:
    from gradfidelity.harness import Run
    from gradfidelity.studies.ds_audit.loss_agg import AggConfig, audit

    cfg = _cfg(args.cfg)
    la = cfg["loss_aggregation"]
    names = {f.name for f in fields(AggConfig)}
    if set(la) - names:
        raise UserError(f"ds_audit.loss_aggregation: unknown keys {sorted(set(la) - names)}")
    acfg = AggConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in la.items()})
    with Run(Path(args.metrics).parent, study="ds_audit", config=cfg, seed=0, threads=acfg.threads) as run:
        run.finish({"rows": audit(acfg)})
    return 0


def _ok_runs(paths: list[str], scale: str) -> list[dict]:
    """The runs' metrics.json records (the shared loader refuses another scale); every one must have finished ok."""
    from gradfidelity.harness.results import load_run_records

    records = load_run_records(paths, scale=scale)
    for rec in records:
        if rec["status"] != "ok":
            raise UserError(f"{rec['path']}: status {rec['status']!r}, expected ok")
    return records


def tables(args) -> int:
    from gradfidelity.claims.evidence import level_for
    from gradfidelity.harness.io import atomic_write_json
    from gradfidelity.studies.ds_audit import alignment, claims, tables
    from gradfidelity.studies.ds_audit.ds_step import DSCase
    from gradfidelity.studies.ds_audit.rows import rows_for_group

    rows = []
    for rec in _ok_runs(args.groups, args.scale):
        g = rec["metrics"]
        cases = [DSCase.from_dict(c) for c in g["cases"]]
        rows += [{**row, "run_dir": rec["run_dir"]} for row in rows_for_group(g["deepspeed"], g["ranks"], cases,
                                                                            g["states"])]
    df = tables.write_matrix_table(rows, Path(args.matrix_csv), Path(args.matrix_md))
    tables.plot_matrix(df, Path(args.matrix_png))
    (loss_run,) = _ok_runs([args.loss], args.scale)
    summ = tables.write_loss_tables(loss_run["metrics"]["rows"], Path(args.loss_csv), Path(args.loss_md))
    tables.plot_loss(summ, Path(args.loss_png))
    (align_run,) = _ok_runs([args.alignment], args.scale)
    align = alignment.write_tables(align_run["metrics"], Path(args.alignment_csv), Path(args.alignment_md),
                                   level=level_for("A3"))
    align["sources"] = [align_run["run_dir"], args.alignment_csv, args.alignment_md]
    atomic_write_json(args.evidence, claims.evidence(
        df, summ, args.scale, matrix_tables=[args.matrix_csv, args.matrix_md], loss_run_dirs=[loss_run["run_dir"]],
        loss_tables=[args.loss_csv, args.loss_md], alignment=align))
    return 0
