"""ds_audit subcommands (argument parsing only): the user-facing `audit-deepspeed` (audit.py) and the workflow's
jobs: the two kinds of run (train.py), then the tables, the figures and the claim evidence, one job each."""

from __future__ import annotations

import argparse

from gradfidelity.harness.cli_args import add_run_args
from gradfidelity.studies.ds_audit import audit
from gradfidelity.studies.ds_audit.plan import FIGURES, TABLES


def _options(p: argparse.ArgumentParser, names) -> None:
    for name in names:
        p.add_argument(f"--{name.replace('_', '-')}", dest=name, required=True)


def _runs(p: argparse.ArgumentParser, alignment: bool = True) -> None:
    p.add_argument("--groups", nargs="+", required=True, help="the fault-matrix group runs' metrics.json")
    p.add_argument("--loss", required=True, help="the loss-aggregation run's metrics.json")
    if alignment:
        p.add_argument("--alignment", required=True, help="the sft_rl alignment run's metrics.json (Gram matrices)")
    p.add_argument("--scale", required=True)


def _group(args) -> int:
    from gradfidelity.studies.ds_audit import train

    return train.matrix_group(args.cfg, args.version, args.ranks, args.run_dir, args.cell)


def _loss_agg(args) -> int:
    from gradfidelity.studies.ds_audit import train

    return train.loss_agg(args.cfg, args.run_dir, args.cell)


def _tables(args) -> int:
    from gradfidelity.studies.ds_audit import tables

    tables.write(args.groups, args.loss, args.alignment, {k: getattr(args, k) for k in TABLES}, args.scale)
    return 0


def _figures(args) -> int:
    from gradfidelity.studies.ds_audit import figures

    figures.write(args.groups, args.loss, {k: getattr(args, k) for k in FIGURES}, args.scale)
    return 0


def _claims(args) -> int:
    from gradfidelity.studies.ds_audit import claims

    claims.write(args.groups, args.loss, args.alignment, {k: getattr(args, k) for k in TABLES}, args.evidence,
                 args.scale)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    audit.register(subparsers)

    p = subparsers.add_parser("ds-audit-group", help="(workflow) fault-matrix cases of one version and rank count")
    p.add_argument("--cfg", required=True, help="the job's keys of the ds_audit section as JSON (rules.job_cfg)")
    p.add_argument("--version", required=True)
    p.add_argument("--ranks", type=int, required=True)
    add_run_args(p)
    p.set_defaults(func=_group)

    p = subparsers.add_parser("ds-audit-loss-agg", help="(workflow) loss-aggregation audit")
    p.add_argument("--cfg", required=True, help="the job's keys of the ds_audit section as JSON (rules.job_cfg)")
    add_run_args(p)
    p.set_defaults(func=_loss_agg)

    p = subparsers.add_parser("ds-audit-tables", help="(workflow) ds_audit paper tables")
    _runs(p)
    _options(p, TABLES)
    p.set_defaults(func=_tables)

    p = subparsers.add_parser("ds-audit-figures", help="(workflow) ds_audit figures")
    _runs(p, alignment=False)
    _options(p, FIGURES)
    p.set_defaults(func=_figures)

    p = subparsers.add_parser("ds-audit-claims", help="(workflow) ds_audit claim evidence (the tables are its sources)")
    _runs(p)
    _options(p, TABLES)
    p.add_argument("--evidence", required=True)
    p.set_defaults(func=_claims)
