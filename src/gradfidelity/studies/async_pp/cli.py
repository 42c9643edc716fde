"""Subcommands of study B: argparse glue, no logic. Heavy imports happen inside the handlers so `gradfidelity --help`
stays fast.

  async-pp-data       a text file -> BPE-tokenized train/val splits (data.corpus file)
  async-pp-train      train one cell (`--run-dir`, `--cell`: the rule's wildcards) through the harness Run
  async-pp-lr-round   one round of the LR grid -> the points the next round trains (a Snakemake checkpoint)
  async-pp-select-lr  the LR grid's metrics.json (every round) -> lr_selection.json + the LR-selection table
  async-pp-aggregate  the metrics.json files given (harness loader, one scale) -> runs.csv + curves.csv
  async-pp-report     tables, figures and/or claim evidence from the aggregates (and the host-drift table,
                      against an archived round's runs.csv)
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

    run_cell(_cfg(args.cfg), cell_from_wildcards(args.cell), args.run_dir, args.threads, args.lr_selection,
             args.data)
    return 0


def _data(args) -> int:
    from gradfidelity.studies.async_pp.data import prepare_file

    data = _cfg(args.cfg).need("data").data
    path = args.corpus or data.path  # the workflow resolves `<study>:<name>` (common.smk study_file)
    meta = prepare_file(path, args.out, data.bpe_vocab, data.val_fraction)
    print(f"{path}: {meta['sizes']['train']} train / {meta['sizes']['val']} val tokens, vocabulary "
          f"{meta['vocab_size']}, {meta['chars_per_token']} characters a token")
    return 0


def _select_lr(args) -> int:
    import json

    from gradfidelity.studies.async_pp.lr_select import write_selection

    doc = write_selection(args.metrics, args.scale, args.out, args.base, json.loads(args.near_tie_sd))
    if args.table:
        from gradfidelity.studies.async_pp.tables import write_lr_selection

        write_lr_selection(doc, args.table)
    for c in doc["choices"]:
        at = f" at d {c['width']}" if c.get("width") else ""  # the width ladder's arms share the own width's keys
        print(f"{c['optimizer']} momentum {c['momentum']:g} {c['schedule']} depth {c['depth']}{at}: "
              f"x{c['multiplier']:g} "
              f"-> lr {c['lr']:.3g}{'' if c['bracketed'] else ' (NOT bracketed)'}"
              f"{' (near-tie: best x' + format(c['best_multiplier'], 'g') + ')' if c['near_tie'] else ''}")
    return 0


def _lr_table(args) -> int:
    import json

    from gradfidelity.studies.async_pp.lr_select import check
    from gradfidelity.studies.async_pp.tables import write_lr_selection

    with open(args.selection) as f:
        doc = json.load(f)
    rows = (check(doc, args.check_metrics, args.scale, args.check_steps, args.check_optimizers)
            if args.check_steps else None)
    write_lr_selection(doc, args.table, rows)
    for r in rows or []:
        print(f"{r['optimizer']} momentum {r['momentum']:g} {r['schedule']}: x{r['chosen_multiplier']:g} at "
              f"{r['check_steps']} steps: {r['check']}")
    return 0


def _lr_round(args) -> int:
    from gradfidelity.harness.io import atomic_write_json
    from gradfidelity.studies.async_pp.lr_select import extension_round

    doc = extension_round(args.metrics, args.scale, args.base, args.max_extensions)
    atomic_write_json(args.out, doc)
    for e in doc["extension"]:
        print(f"{e['optimizer']} momentum {e['momentum']:g} {e['schedule']} depth {e['depth']}: won at an edge, next "
              f"round trains x{e['multiplier']:g}")
    return 0


def _aggregate(args) -> int:
    from gradfidelity.studies.async_pp.aggregate import aggregate

    aggregate(args.metrics, args.runs, args.curves, args.scale, args.tokens_per_step)
    return 0


def _report(args) -> int:
    cfg = _cfg(args.cfg)
    if args.main_table:
        from gradfidelity.studies.async_pp.aggregate import read_runs
        from gradfidelity.studies.async_pp.pairing import Gaps
        from gradfidelity.studies.async_pp.tables import write_tables

        write_tables(Gaps(read_runs(args.runs, args.scale), cfg), args.main_table, args.mitigations_table,
                     args.scale, args.length_table, args.momentum_table, args.width_table)
    if args.fig_momentum:
        from gradfidelity.studies.async_pp.figures import write_figures

        write_figures(args.runs, args.curves, cfg, {"momentum": args.fig_momentum, "depth": args.fig_depth,
                                                     "ladder": args.fig_ladder, "curves": args.fig_curves,
                                                     "width": args.fig_width})
    if args.host_drift_table:
        import os

        from gradfidelity.errors import UserError
        from gradfidelity.studies.async_pp.aggregate import read_runs
        from gradfidelity.studies.async_pp.tables import write_host_drift

        if not args.archive_runs:
            raise UserError("async-pp-report: --host-drift-table needs --archive-runs (an archived round's runs.csv)")
        write_host_drift(read_runs(args.runs, args.scale), read_runs(args.archive_runs, args.scale),
                         args.host_drift_table, os.path.dirname(args.archive_runs))
    if args.claims:
        from gradfidelity.studies.async_pp.claims import write_claims

        write_claims(args.runs, cfg, args.scale, args.claims, [args.main_table, args.mitigations_table,
                                                               *(args.claim_source or [])], args.budget_table,
                     args.lr_selection_table, args.near_tie_table)
    return 0


def _bench(args) -> int:
    from gradfidelity.studies.async_pp.bench import run_bench

    result = run_bench(_cfg(args.cfg), args.out, args.data)
    sc, pl = result["step_cost"], result["pipeline"]
    for o, r in sc["optimizers"].items():
        print(f"{o}: plain {r['plain_ms']:.1f} ms, sync {r['sync_ms']:.1f} ({r['ratio_sync']:.2f}x), 2bw "
              f"{r['2bw_ms']:.1f} ({r['ratio_2bw']:.2f}x plain, {r['ratio_2bw_over_sync']:.2f}x sync)")
    print(f"one validation pass {sc['eval_ms']:.1f} ms ({sc['eval_share_of_a_main_step_ms']:.1f} ms a main step)")
    iv, dec = pl["ratio_interval"], pl["decomposition"]
    span = "no interval" if iv["low"] is None else f"[{iv['low']:.3f}, {iv['high']:.3f}]"
    print(f"pipeline 2bw/sync throughput: median {iv['median']:.3f} {span} over "
          f"{pl['repeats']} repeats; bound for {pl['steps']} batches {pl['bound_for_these_batches']:.3f}")
    print(f"  idle factor {dec['idle_factor']['median']:.3f} = {pl['idle_factor_over_bound']:.3f} of the bound "
          f"({'meets' if pl['meets_idle_target'] else 'misses'} the target: {pl['idle_target']}); compute factor "
          f"{dec['compute_factor']['median']:.3f}")
    for s in ("sync", "2bw"):
        r = pl["runs"][s]
        print(f"  {s}: bubble {r['bubble_fraction']:.3f} (theory {r['bubble_theoretical']:.3f}), busy per stage "
              f"{', '.join(f'{b:.2f}' for b in r['busy_s_per_stage_median'])} s")
    return 0


def register(sub) -> None:
    from gradfidelity.harness.cli_args import add_run_args

    p = sub.add_parser("async-pp-train", help="study B: train one cell (schedule x mitigation x optimizer)")
    p.add_argument("--cfg", required=True, help="JSON: the model, data, train (and delay) sections")
    add_run_args(p)
    p.add_argument("--lr-selection", help="lr_selection.json (needed by lr~tuned cells)")
    p.add_argument("--threads", default=1, type=int)
    p.add_argument("--data", help="the prepared corpus folder (data.corpus file: the async_pp_data rule's output)")
    p.set_defaults(func=_train)

    p = sub.add_parser("async-pp-data", help="study B: a text file -> BPE-tokenized train/val splits")
    p.add_argument("--cfg", required=True, help="JSON: the data section")
    p.add_argument("--out", required=True, help="the prepared corpus folder")
    p.add_argument("--corpus", help="the text file (default: data.path)")
    p.set_defaults(func=_data)

    p = sub.add_parser("async-pp-select-lr", help="study B: choose each arm's LR on its own grid")
    p.add_argument("--metrics", nargs="+", required=True, help="the LR grid's metrics.json files")
    p.add_argument("--scale", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--table", help="the LR-selection table (.csv; a .md beside it)")
    p.add_argument("--base", nargs="+", type=float, required=True, help="the configured multipliers "
                   "(lr_selection.multipliers): the others are extensions")
    p.add_argument("--near-tie-sd", default="{}", help="JSON {optimizer: sd} (lr_selection.near_tie_sd)")
    p.set_defaults(func=_select_lr)

    p = sub.add_parser("async-pp-lr-table", help="study B: the LR-selection table, with the check at a longer "
                       "budget (lr_selection.check_steps)")
    p.add_argument("--selection", required=True, help="the selection document (lr_selection.json)")
    p.add_argument("--scale", required=True)
    p.add_argument("--table", required=True, help="the LR-selection table (.csv; a .md beside it)")
    p.add_argument("--check-steps", type=int, help="lr_selection.check_steps (none: no check)")
    p.add_argument("--check-metrics", nargs="*", default=[], help="the LR check's metrics.json files")
    p.add_argument("--check-optimizers", nargs="+", help="lr_selection.check_optimizers (default: every one)")
    p.set_defaults(func=_lr_table)

    p = sub.add_parser("async-pp-lr-round", help="study B: one round of the LR grid -> the points the next adds")
    p.add_argument("--metrics", nargs="+", required=True, help="the grid's metrics.json files so far")
    p.add_argument("--scale", required=True)
    p.add_argument("--base", nargs="+", type=float, required=True, help="lr_selection.multipliers")
    p.add_argument("--max-extensions", type=int, required=True, help="lr_selection.max_extensions")
    p.add_argument("--out", required=True)
    p.set_defaults(func=_lr_round)

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
    for opt in ("main-table", "mitigations-table", "length-table", "momentum-table", "width-table", "fig-momentum",
                "fig-depth", "fig-ladder", "fig-curves", "fig-width", "claims", "budget-table", "near-tie-table"):
        p.add_argument(f"--{opt}")
    p.add_argument("--lr-selection-table", help="the LR-selection table (its near-tie rows: the claims' near-tie "
                   "reading, written to --near-tie-table)")
    p.add_argument("--claim-source", action="append", help="a path (e.g. a table) to list among every claim "
                   "record's sources, after its run directories and runs.csv; repeatable")
    p.add_argument("--archive-runs", help="an archived round's runs.csv (async-pp-aggregate of its records): the "
                   "host-drift table pairs each of its runs with the --runs run of the same cell, seed and LR value")
    p.add_argument("--host-drift-table", help="the drift between host types per arm (needs --archive-runs)")
    p.set_defaults(func=_report)

    p = sub.add_parser("bench-async-pp", help="study B: 2bw step cost and real pipeline throughput")
    p.add_argument("--cfg", required=True)
    p.add_argument("--out", default="results/bench/async_pp.json")
    p.add_argument("--data", help="the prepared corpus folder (data.corpus file)")
    p.set_defaults(func=_bench)
