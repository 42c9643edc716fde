"""Subcommands of study B: argparse glue, no logic. Heavy imports happen inside the handlers so `gradfidelity --help`
stays fast.

  async-pp-train      train one cell (`--run-dir`, `--cell`: the rule's wildcards) through the harness Run
  async-pp-select-lr  the LR grid's metrics.json -> lr_selection.json + the LR-selection table
  async-pp-aggregate  the metrics.json files given (harness loader, one scale) -> runs.csv + curves.csv
  async-pp-report     tables, figures and/or claim evidence from the aggregates
  bench-async-pp      simulated step cost and real-pipeline throughput -> results/<scale>/bench/async_pp.json

Each rule passes only the config sections its job reads (`--cfg`, rules.JOB_KEYS), so an edit reruns exactly those
jobs; the typed config (config.job) holds None for the sections a job was not given.
"""

from __future__ import annotations

from gradfidelity.config import cfg_from_json


def _cfg(text: str):
    from gradfidelity.studies.async_pp.config import STUDY, load_job

    return load_job(cfg_from_json(text, STUDY))


def _train(args) -> int:
    from gradfidelity.studies.async_pp.plan import cell_from_wildcards
    from gradfidelity.studies.async_pp.train import run_cell

    run_cell(_cfg(args.cfg), cell_from_wildcards(args.cell), args.run_dir, args.threads, args.lr_selection)
    return 0


def _select_lr(args) -> int:
    from gradfidelity.studies.async_pp.lr_select import write_selection

    doc = write_selection(args.metrics, args.scale, args.out)
    if args.table:
        from gradfidelity.studies.async_pp.tables import write_lr_selection

        write_lr_selection(doc, args.table)
    for opt, s in doc["optimizers"].items():
        print(f"{opt}: x{s['multiplier']:g} -> lr {s['lr']:.3g}{' (grid edge)' if s['at_grid_edge'] else ''}")
    return 0


def _aggregate(args) -> int:
    from gradfidelity.studies.async_pp.aggregate import aggregate

    aggregate(args.metrics, args.runs, args.curves, args.scale, args.tokens_per_step)
    return 0


def _report(args) -> int:
    cfg = _cfg(args.cfg)
    if args.main_table:
        import pandas as pd

        from gradfidelity.studies.async_pp.aggregate import read_runs
        from gradfidelity.studies.async_pp.pairing import Gaps
        from gradfidelity.studies.async_pp.tables import write_tables

        curves = pd.read_csv(args.curves) if args.curves else None
        write_tables(Gaps(read_runs(args.runs, args.scale), cfg), args.main_table, args.mitigations_table,
                     args.scale, curves, args.length_table)
    if args.fig_momentum:
        from gradfidelity.studies.async_pp.figures import write_figures

        write_figures(args.runs, args.curves, cfg, {"momentum": args.fig_momentum, "depth": args.fig_depth,
                                                     "gap_vs_tokens": args.fig_gap_vs_tokens,
                                                     "curves": args.fig_curves})
    if args.claims:
        from gradfidelity.studies.async_pp.claims import write_claims

        write_claims(args.runs, cfg, args.scale, args.claims, [args.main_table, args.mitigations_table,
                                                               *(args.claim_source or [])])
    return 0


def _bench(args) -> int:
    from gradfidelity.studies.async_pp.bench import run_bench

    result = run_bench(_cfg(args.cfg), args.out)
    sc, pl = result["sim_step_cost"], result["pipeline"]
    print(f"2bw/sync step cost {sc['ratio_2bw_over_sync']:.3f} (limit {sc['limit']}); pipeline 2bw/sync "
          f"throughput {pl['throughput_ratio_2bw_over_sync']:.3f}")
    for s in ("sync", "2bw"):
        r = pl["runs"][s]
        print(f"  {s}: bubble measured {r['bubble_fraction']:.3f}, theoretical (P-1)/(m+P-1) = "
              f"{r['bubble_theoretical']:.3f}" if s == "sync" else
              f"  {s}: bubble measured {r['bubble_fraction']:.3f}, theoretical {r['bubble_theoretical']:.3f}")
    return 0


def register(sub) -> None:
    from gradfidelity.harness.cli_args import add_run_args

    p = sub.add_parser("async-pp-train", help="study B: train one cell (schedule x mitigation x optimizer)")
    p.add_argument("--cfg", required=True, help="JSON: the model, data, train (and delay) sections")
    add_run_args(p)
    p.add_argument("--lr-selection", help="lr_selection.json (needed by lr~tuned cells)")
    p.add_argument("--threads", default=1, type=int)
    p.set_defaults(func=_train)

    p = sub.add_parser("async-pp-select-lr", help="study B: choose each optimizer's LR on the sync grid")
    p.add_argument("--metrics", nargs="+", required=True, help="the LR grid's metrics.json files")
    p.add_argument("--scale", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--table", help="the LR-selection table (.csv; a .md beside it)")
    p.set_defaults(func=_select_lr)

    p = sub.add_parser("async-pp-aggregate", help="study B: runs -> runs.csv, curves.csv")
    p.add_argument("--metrics", nargs="+", required=True, help="every run's metrics.json (the rule's input)")
    p.add_argument("--runs", required=True)
    p.add_argument("--curves", required=True)
    p.add_argument("--tokens-per-step", type=int)
    p.add_argument("--scale", help="the scale every run must have been made at (default: $GRADFIDELITY_SCALE)")
    p.set_defaults(func=_aggregate)

    p = sub.add_parser("async-pp-report", help="study B: tables, figures, claim evidence")
    p.add_argument("--cfg", required=True)
    p.add_argument("--runs", required=True)
    p.add_argument("--curves")
    p.add_argument("--scale", required=True)
    for opt in ("main-table", "mitigations-table", "length-table", "fig-momentum", "fig-depth", "fig-gap-vs-tokens",
                "fig-curves", "claims"):
        p.add_argument(f"--{opt}")
    p.add_argument("--claim-source", action="append", help="a path (e.g. a table) to list among every claim "
                   "record's sources, after its run directories and runs.csv; repeatable")
    p.set_defaults(func=_report)

    p = sub.add_parser("bench-async-pp", help="study B: 2bw step cost and real pipeline throughput")
    p.add_argument("--cfg", required=True)
    p.add_argument("--out", default="results/bench/async_pp.json")
    p.set_defaults(func=_bench)
