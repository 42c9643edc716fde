"""Subcommands of study B. Heavy imports happen inside the handlers so `gradfidelity --help` stays fast.

  async-pp-train      train a group of cells (one run directory each) through the harness Run
  async-pp-aggregate  metrics.json of every planned cell (harness loader, one scale) -> runs.csv + curves.csv
  async-pp-report     tables, figures and/or claim evidence from the aggregates
  bench-async-pp      simulated step cost and real-pipeline throughput -> results/bench/async_pp.json
"""

from __future__ import annotations

import json

from gradfidelity.config import cfg_from_json
from gradfidelity.errors import UserError


def _cfg(text: str) -> dict:
    cfg = cfg_from_json(text, "async_pp")
    for key in ("seeds", "model", "data", "train", "delay", "sweeps"):
        if key not in cfg:
            raise UserError(f"async_pp config: missing key {key!r}")
    return cfg


def _train(args) -> int:
    from gradfidelity.studies.async_pp.plan import cell_from_dict
    from gradfidelity.studies.async_pp.train import run_cell

    cfg = _cfg(args.cfg)
    cells = [cell_from_dict(d) for d in json.loads(args.cells)]
    for cell in cells:
        run_cell(cfg, cell, args.root, int(cfg.get("threads_per_run", 1)))
    return 0


def _aggregate(args) -> int:
    from gradfidelity.studies.async_pp.analysis import aggregate

    aggregate(_cfg(args.cfg), args.root, args.runs, args.curves, args.scale)
    return 0


def _report(args) -> int:
    from gradfidelity.studies.async_pp.analysis import Gaps, read_runs, write_claims

    cfg = _cfg(args.cfg)
    if args.main_table:
        from gradfidelity.studies.async_pp.report import write_tables

        write_tables(Gaps(read_runs(args.runs, args.scale), cfg), args.main_table, args.mitigations_table,
                     args.scale)
    if args.fig_momentum:
        from gradfidelity.studies.async_pp.report import write_figures

        write_figures(args.runs, args.curves, cfg, {"momentum": args.fig_momentum, "depth": args.fig_depth,
                                                     "gap_vs_tokens": args.fig_gap_vs_tokens,
                                                     "curves": args.fig_curves})
    if args.claims:
        write_claims(args.runs, cfg, args.scale, args.claims, [args.main_table, args.mitigations_table,
                                                               *(args.claim_source or [])])
    return 0


def _bench(args) -> int:
    from gradfidelity.studies.async_pp.bench import run_bench

    result = run_bench(_cfg(args.cfg), args.out)
    sc = result["sim_step_cost"]
    print(f"2bw/sync step cost {sc['ratio_2bw_over_sync']:.3f} (limit {sc['limit']}); pipeline 2bw/sync "
          f"throughput {result['pipeline']['throughput_ratio_2bw_over_sync']:.3f}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("async-pp-train", help="study B: train cells (schedule x mitigation x optimizer)")
    p.add_argument("--cfg", required=True, help="the async_pp config section as JSON")
    p.add_argument("--cells", required=True, help="JSON list of cells (plan.Cell fields)")
    p.add_argument("--root", default="results/async_pp")
    p.set_defaults(func=_train)

    p = sub.add_parser("async-pp-aggregate", help="study B: runs -> runs.csv, curves.csv")
    p.add_argument("--cfg", required=True)
    p.add_argument("--root", default="results/async_pp")
    p.add_argument("--runs", required=True)
    p.add_argument("--curves", required=True)
    p.add_argument("--scale", help="the scale every run must have been made at (default: $GRADFIDELITY_SCALE)")
    p.set_defaults(func=_aggregate)

    p = sub.add_parser("async-pp-report", help="study B: tables, figures, claim evidence")
    p.add_argument("--cfg", required=True)
    p.add_argument("--runs", required=True)
    p.add_argument("--curves")
    p.add_argument("--scale", required=True)
    for opt in ("main-table", "mitigations-table", "fig-momentum", "fig-depth", "fig-gap-vs-tokens",
                "fig-curves", "claims"):
        p.add_argument(f"--{opt}")
    p.add_argument("--claim-source", action="append", help="a path (e.g. a table) to list among every claim "
                   "record's sources, after its run directories and runs.csv; repeatable")
    p.set_defaults(func=_report)

    p = sub.add_parser("bench-async-pp", help="study B: 2bw step cost and real pipeline throughput")
    p.add_argument("--cfg", required=True)
    p.add_argument("--out", default="results/bench/async_pp.json")
    p.set_defaults(func=_bench)
