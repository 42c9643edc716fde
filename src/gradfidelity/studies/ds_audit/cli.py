"""ds_audit subcommands: the user-facing `audit-deepspeed` and the workflow's matrix / loss-aggregation / table steps.

Exit codes of `audit-deepspeed`: 0 every micro-batch counts once, 3 some micro-batch is dropped or mis-weighted,
2 the config cannot be audited (one line on stderr, no traceback).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import asdict, fields
from pathlib import Path

from gradfidelity.config import cfg_from_json
from gradfidelity.errors import UserError

EXIT_FAITHFUL, EXIT_UNUSABLE, EXIT_DROPS = 0, 2, 3


def _cfg(text: str) -> dict:
    return cfg_from_json(text, "ds_audit")


# ---------------------------------------------------------------------------------------------- audit-deepspeed
def _audit(args) -> int:
    from gradfidelity.studies.ds_audit.matrix import fmt_vector
    from gradfidelity.studies.ds_audit.userconfig import load_config, plan_audit
    from gradfidelity.studies.ds_audit.versions import base_version, env_for
    from gradfidelity.studies.ds_audit.worker import run_group

    try:
        plan = plan_audit(load_config(args.config), args.gradient_accumulation_steps, args.micro_batch_size,
                          args.dtype, args.backward_calls, args.ranks)
        env_for(args.deepspeed_version)  # validates the version / finds the overlay before any work
    except UserError as exc:
        print(f"gradfidelity audit-deepspeed: error: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    version = args.deepspeed_version or base_version()
    print(f"Auditing {args.config} under DeepSpeed {version}: {plan.summary}")
    for note in plan.notes:
        print(f"  note: {note}")
    with tempfile.TemporaryDirectory(prefix="gf-audit-") as tmp:
        # The probe runs in child processes with the requested DeepSpeed first on PYTHONPATH (the 0.18.9 overlay
        # re-executes this package under the pinned version), so this process never imports DeepSpeed.
        states = run_group(plan.cases, args.ranks, args.deepspeed_version, Path(tmp), log=open(Path(tmp) / "log", "w"))
    code, report, advice = EXIT_FAITHFUL, [], []
    for case, st in zip(plan.cases, states, strict=True):
        what = "one backward per micro-step" if case.backward_calls == 1 else \
            f"{case.backward_calls} backward() calls per optimizer step (GA {case.ga}, boundary set by hand)"
        if st["status"] != "ok":
            print(f"gradfidelity audit-deepspeed: error: DeepSpeed {version} could not run this config "
                  f"({what}): {st['error']}", file=sys.stderr)
            return EXIT_UNUSABLE
        r = st["result"]
        got = r["extra"].get("deepspeed")
        if got != version:
            print(f"gradfidelity audit-deepspeed: error: asked for DeepSpeed {version}, the probe imported {got}",
                  file=sys.stderr)
            return EXIT_UNUSABLE
        vec = fmt_vector(r["contributions"], r["tolerance"])
        norm = "not reported" if r["grad_norm_ratio"] is None else f"{r['grad_norm_ratio']:.3f}"
        report.append(f"\n[{what}]\n  contributions (1 = counted once, 0 = lost): {vec}\n"
                      f"  reported gradient norm / true norm: {norm}\n"
                      f"  applied update norm / true norm:    {r['applied_norm_ratio']:.3f}\n"
                      f"  max |param - reference| after one SGD(lr=1) step: {r['max_param_dev']:.3g}")
        if r["faithful"]:
            report.append("  verdict: FAITHFUL: every micro-batch reached the optimizer with weight 1")
            continue
        code = EXIT_DROPS
        lost = r["dropped"]
        n = len(r["contributions"])
        msg = f"{len(lost)} of {n} micro-batches DROPPED (slots {lost})" if lost else "micro-batches MIS-WEIGHTED"
        report.append(f"  verdict: {msg}; the optimizer did not receive the gradient you asked for")
        if case.backward_calls > 1:
            advice.append("several backward() calls per step with gradient_accumulation_steps 1 lose gradients "
                          "here (PR #7981, fixed in 0.19.0): upgrade, or set gradient_accumulation_steps instead")
        elif tuple(int(x) for x in version.split(".")[:2]) < (0, 19):
            advice.append("upgrade DeepSpeed to >= 0.19.0 (PR #7967) or switch offload_optimizer off")
        else:
            advice.append(f"DeepSpeed {version} still loses data with this config: do not train with it as is")
    print("\n".join(report))
    print(f"\nexit {code}: " + ("faithful" if code == EXIT_FAITHFUL else "; ".join(advice)))
    if args.json:
        Path(args.json).write_text(json.dumps({"config": str(args.config), "deepspeed": version,
                                               "cases": [asdict(c) for c in plan.cases], "states": states}, indent=2))
    return code


# ---------------------------------------------------------------------------------------------- workflow steps
def _matrix_group(args) -> int:
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


def _loss_agg(args) -> int:
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


def _tables(args) -> int:
    from gradfidelity.harness.io import atomic_write_json
    from gradfidelity.studies.ds_audit import claims, tables
    from gradfidelity.studies.ds_audit.ds_step import DSCase
    from gradfidelity.studies.ds_audit.matrix import rows_for_group

    rows = []
    for rec in _ok_runs(args.groups, args.scale):
        g = rec["metrics"]
        cases = [DSCase(**{**c, "zero_extra": tuple(map(tuple, c["zero_extra"]))}) for c in g["cases"]]
        rows += [{**row, "run_dir": rec["run_dir"]} for row in rows_for_group(g["deepspeed"], g["ranks"], cases,
                                                                            g["states"])]
    df = tables.write_matrix_table(rows, Path(args.matrix_csv), Path(args.matrix_md))
    tables.plot_matrix(df, Path(args.matrix_png))
    (loss_run,) = _ok_runs([args.loss], args.scale)
    summ = tables.write_loss_tables(loss_run["metrics"]["rows"], Path(args.loss_csv), Path(args.loss_md))
    tables.plot_loss(summ, Path(args.loss_png))
    atomic_write_json(args.evidence, claims.evidence(
        df, summ, args.scale, matrix_tables=[args.matrix_csv, args.matrix_md], loss_run_dirs=[loss_run["run_dir"]],
        loss_tables=[args.loss_csv, args.loss_md]))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("audit-deepspeed", help="check that DeepSpeed applies every micro-batch of YOUR config",
                              description="Run one optimizer step of a probe model under your DeepSpeed config and "
                              "report each micro-batch's weight in the applied gradient. Exit 0 faithful, 3 dropped "
                              "or mis-weighted micro-batches, 2 unusable config.")
    p.add_argument("config", help="DeepSpeed JSON config (as passed to deepspeed.initialize or the HF Trainer)")
    p.add_argument("--deepspeed-version", default=None,
                   help="run under a pinned DeepSpeed (0.18.9: the repo's .venv-ds0189 overlay or "
                   "$GRADFIDELITY_DS0189) instead of the installed one")
    p.add_argument("--ranks", type=int, default=1, choices=[1, 2], help="data-parallel CPU ranks (gloo)")
    p.add_argument("--gradient-accumulation-steps", type=int, default=None,
                   help="GA to probe (needed when the config says \"auto\")")
    p.add_argument("--micro-batch-size", type=int, default=None)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default=None)
    p.add_argument("--backward-calls", type=int, default=None,
                   help="backward() calls per optimizer step (default: 4 extra when GA is 1, the PR #7981 case)")
    p.add_argument("--json", default=None, help="also write the raw result here")
    p.set_defaults(func=_audit)

    p = subparsers.add_parser("ds-audit-group", help="(workflow) fault-matrix cases of one version and rank count")
    p.add_argument("--cfg", required=True)
    p.add_argument("--version", required=True)
    p.add_argument("--ranks", type=int, required=True)
    p.add_argument("--metrics", required=True, help="the run's metrics.json (its directory is the run directory)")
    p.set_defaults(func=_matrix_group)

    p = subparsers.add_parser("ds-audit-loss-agg", help="(workflow) loss-aggregation audit")
    p.add_argument("--cfg", required=True)
    p.add_argument("--metrics", required=True, help="the run's metrics.json (its directory is the run directory)")
    p.set_defaults(func=_loss_agg)

    p = subparsers.add_parser("ds-audit-tables", help="(workflow) ds_audit tables, figures and claim evidence")
    p.add_argument("--groups", nargs="+", required=True)
    p.add_argument("--loss", required=True)
    for k in ("matrix-csv", "matrix-md", "matrix-png", "loss-csv", "loss-md", "loss-png", "evidence", "scale"):
        p.add_argument(f"--{k}", required=True)
    p.set_defaults(func=_tables)
