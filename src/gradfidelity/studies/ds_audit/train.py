"""The study's two kinds of run, each inside the harness (one run directory, metrics.json written last):

- a fault-matrix group: every case of one (DeepSpeed version, rank count) in the same rank processes
  (`worker.run_group`, which runs `ds_step.run_case` per case and rank, analysed by `probe.py`);
- the loss-aggregation audit (`loss_agg.audit`, pure torch).

Runs record raw measurements only: predictions, agreement, tables and evidence are made later from these files.
The plan's cell (the rule's wildcards) goes into the records, so nothing downstream parses a run's path.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from gradfidelity.config import build, cfg_from_json
from gradfidelity.errors import UserError
from gradfidelity.studies.ds_audit.config import STUDY, StudyConfig


def load_job(text: str, section: str) -> tuple[dict, StudyConfig]:
    """The job's `--cfg` (its keys of the validated section, rules.job_cfg): as given, for provenance, and typed."""
    raw = cfg_from_json(text, STUDY)
    cfg = build(StudyConfig, raw, STUDY)
    if getattr(cfg, section) is None:
        raise UserError(f"{STUDY}: this job reads {STUDY}.{section}, which its --cfg does not hold (rules.JOB_KEYS)")
    return raw, cfg


def matrix_group(cfg_text: str, version: str, ranks: int, run_dir: str | Path, cell: dict) -> int:
    """Every case of the plan under DeepSpeed `version` (the one this environment imports) on `ranks` ranks."""
    from gradfidelity.harness import Run
    from gradfidelity.studies.ds_audit.plan import cases as plan_cases
    from gradfidelity.studies.ds_audit.versions import base_version, installed_version_noimport
    from gradfidelity.studies.ds_audit.worker import run_group

    raw, cfg = load_job(cfg_text, "matrix")
    got = installed_version_noimport()
    if got != version:
        raise UserError(f"--version {version} but this environment imports deepspeed {got} "
                        f"(installed {base_version()}); run the 0.18.9 group under DS0189_ENV")
    cases = plan_cases(cfg.matrix)
    run_dir = Path(run_dir)
    with Run(run_dir, study=STUDY, config=raw, seed=0, threads=1, sample_memory=False, cell=cell) as run:
        states = run_group(cases, ranks, None, run_dir / "work", cfg.matrix.case_timeout_s)
        got = {st["result"]["extra"]["deepspeed"] for st in states if st["status"] == "ok"}
        if got - {version}:
            raise RuntimeError(f"group labelled {version} ran deepspeed {sorted(got)}")
        run.log.info("%d cases, %d ran", len(cases), sum(st["status"] == "ok" for st in states))
        # raw measurements only: predictions and agreement are computed by the aggregation from these
        run.finish({"deepspeed": version, "ranks": ranks, "cases": [asdict(c) for c in cases],
                    "states": states}, timing={"case_seconds": [st.get("seconds") for st in states]})
    return 0


def loss_agg(cfg_text: str, run_dir: str | Path, cell: dict) -> int:
    """The loss-aggregation audit: one row per (spread, seed, method)."""
    from gradfidelity.harness import Run
    from gradfidelity.studies.ds_audit.loss_agg import audit

    raw, cfg = load_job(cfg_text, "loss_aggregation")
    la = cfg.loss_aggregation
    with Run(Path(run_dir), study=STUDY, config=raw, seed=0, threads=la.threads, cell=cell) as run:
        run.finish({"rows": audit(la)})
    return 0
