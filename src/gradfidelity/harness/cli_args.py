"""The one run-directory convention of every training CLI: `--run-dir DIR` (the run's directory: metrics.json,
provenance.json, log.txt and checkpoints go there) and `--cell JSON` (the plan's cell: the rule's wildcards,
written into the run's records so that aggregates never parse paths)."""

from __future__ import annotations

import argparse
import json

from gradfidelity.errors import UserError


def add_run_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run-dir", required=True, help="the run's directory (metrics.json is written last)")
    parser.add_argument("--cell", type=parse_cell, default={},
                        help="the plan's cell as JSON, e.g. '{\"seed\": \"0\"}' (the rule passes its wildcards)")


def parse_cell(text: str) -> dict:
    try:
        cell = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"--cell is not valid JSON: {exc}") from None
    if not isinstance(cell, dict):
        raise UserError(f"--cell must be a JSON object, got {type(cell).__name__}")
    return cell
