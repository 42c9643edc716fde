"""ds_audit subcommands (argument parsing only): the user-facing `audit-deepspeed` (audit.py) and the workflow's
matrix / loss-aggregation / table steps (steps.py)."""

from __future__ import annotations

import argparse

from gradfidelity.studies.ds_audit import audit, steps


def register(subparsers: argparse._SubParsersAction) -> None:
    audit.register(subparsers)

    p = subparsers.add_parser("ds-audit-group", help="(workflow) fault-matrix cases of one version and rank count")
    p.add_argument("--cfg", required=True)
    p.add_argument("--version", required=True)
    p.add_argument("--ranks", type=int, required=True)
    p.add_argument("--metrics", required=True, help="the run's metrics.json (its directory is the run directory)")
    p.set_defaults(func=steps.matrix_group)

    p = subparsers.add_parser("ds-audit-loss-agg", help="(workflow) loss-aggregation audit")
    p.add_argument("--cfg", required=True)
    p.add_argument("--metrics", required=True, help="the run's metrics.json (its directory is the run directory)")
    p.set_defaults(func=steps.loss_agg)

    p = subparsers.add_parser("ds-audit-tables", help="(workflow) ds_audit tables, figures and claim evidence")
    p.add_argument("--groups", nargs="+", required=True)
    p.add_argument("--loss", required=True)
    p.add_argument("--alignment", required=True, help="the sft_rl alignment run's metrics.json (Gram matrices)")
    for k in ("matrix-csv", "matrix-md", "matrix-png", "loss-csv", "loss-md", "loss-png", "alignment-csv",
              "alignment-md", "evidence", "scale"):
        p.add_argument(f"--{k}", required=True)
    p.set_defaults(func=steps.tables)
