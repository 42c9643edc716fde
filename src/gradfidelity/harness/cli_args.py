"""The one run-directory convention of every training CLI: `--run-dir DIR` (the run's directory: metrics.json,
provenance.json, log.txt and checkpoints go there) and `--cell JSON` (the plan's cell: the rule's wildcards,
written into the run's records so that aggregates never parse paths)."""

from __future__ import annotations

import argparse

from gradfidelity.config import cfg_from_json
from gradfidelity.errors import UserError


def add_run_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run-dir", required=True, help="the run's directory (metrics.json is written last)")
    parser.add_argument("--cell", type=parse_cell, default={},
                        help="the plan's cell as JSON, e.g. '{\"seed\": \"0\"}' (the rule passes its wildcards)")


def parse_cell(text: str) -> dict:
    """argparse type of `--cell`: a bad value is argparse's own error (usage line, exit 2), not a traceback."""
    try:
        return cfg_from_json(text, "the run's cell", option="--cell")
    except UserError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
