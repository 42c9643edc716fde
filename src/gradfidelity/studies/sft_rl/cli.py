"""Subcommands of the sft_rl study (called by workflow/rules/sft_rl.smk): argparse glue, no logic.

Every subcommand's `--cfg` is the part of the validated sft_rl section its job reads (rules.JOB_KEYS); the training
subcommands write their run directory (`--run-dir`) and record the rule's wildcards (`--cell`) as the run's identity.
"""

from __future__ import annotations

from pathlib import Path

from gradfidelity.config import cfg_from_json
from gradfidelity.errors import UserError
from gradfidelity.harness.cli_args import add_run_args
from gradfidelity.studies.sft_rl.plan import RL_STAGE, TABLES, VARIANTS


def _cfg(args, job: str):
    from gradfidelity.studies.sft_rl.config import load_job
    from gradfidelity.studies.sft_rl.rules import JOB_KEYS

    return load_job(cfg_from_json(args.cfg, "sft_rl"), JOB_KEYS[job])


def _pretrain(args) -> int:
    from gradfidelity.studies.sft_rl.train import run_pretrain

    run_pretrain(_cfg(args, "pretrain"), args.model, Path(args.run_dir), seed=args.seed, cell=args.cell)
    return 0


def _sft(args) -> int:
    from gradfidelity.studies.sft_rl.train import run_sft

    run_sft(_cfg(args, "sft"), args.model, args.variant, args.seed, Path(args.base), Path(args.run_dir),
            cell=args.cell)
    return 0


def _alignment(args) -> int:
    from gradfidelity.studies.sft_rl.alignment import run_alignment

    run_alignment(_cfg(args, "alignment"), args.model, Path(args.base), Path(args.run_dir), cell=args.cell)
    return 0


def _rl(args) -> int:
    from gradfidelity.studies.sft_rl.train import run_rl

    run_rl(_cfg(args, "rl"), args.model, args.variant, args.method, args.seed, Path(args.init), Path(args.run_dir),
           cell=args.cell, lr=args.lr, lr_selection=Path(args.lr_selection) if args.lr_selection else None)
    return 0


def _lr_round(args) -> int:
    from gradfidelity.harness.io import atomic_write_json
    from gradfidelity.studies.sft_rl.lr_select import extension_round

    doc = extension_round(args.metrics, args.scale, args.lrs, args.factor, args.max_extensions)
    atomic_write_json(Path(args.out), doc)
    return 0


def _pair(text: str, option: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key or not value:
        raise UserError(f"{option} {text!r}: expected KEY=VALUE")
    return key, value


def _select_lr(args) -> int:
    from gradfidelity.studies.sft_rl.lr_select import write_selection

    starts = dict(_pair(x, "--start") for x in args.start or [])
    write_selection(args.metrics, args.scale, args.out, args.lrs, table_csv=args.table, table_md=args.table_md,
                    starts=starts, n_val=args.n_val)
    return 0


def _aggregate(args) -> int:
    from gradfidelity.studies.sft_rl.aggregate import write_aggregate

    write_aggregate(_cfg(args, "aggregate"), args.runs, args.scale, Path(args.out))
    return 0


def _tables(args) -> int:
    from gradfidelity.studies.sft_rl.aggregate import read_aggregate
    from gradfidelity.studies.sft_rl.tables import write_tables

    cfg = _cfg(args, "tables")
    write_tables(read_aggregate(args.aggregate), cfg, *(Path(getattr(args, k)) for k in TABLES))
    return 0


def _starts(args) -> int:
    from gradfidelity.studies.sft_rl.aggregate import read_aggregate
    from gradfidelity.studies.sft_rl.tables import starts_table

    starts_table(read_aggregate(args.aggregate), _cfg(args, "tables"), Path(args.csv), Path(args.md))
    return 0


def _figures(args) -> int:
    from gradfidelity.studies.sft_rl.aggregate import read_aggregate
    from gradfidelity.studies.sft_rl.figures import write_figures

    cfg = _cfg(args, "figures")
    write_figures(read_aggregate(args.aggregate), cfg, Path(args.score_vs_flops), Path(args.reward_curves))
    return 0


def _claims(args) -> int:
    from gradfidelity.harness.io import atomic_write_json
    from gradfidelity.studies.sft_rl.aggregate import read_aggregate
    from gradfidelity.studies.sft_rl.claims import claims

    cfg = _cfg(args, "claims")
    tables = {"main": [args.main_csv, args.main_md], "ablation": [args.abl_csv, args.abl_md]}
    atomic_write_json(Path(args.out), claims(read_aggregate(args.aggregate), cfg, args.scale, tables))
    return 0


def _compare(args) -> int:
    from gradfidelity.studies.sft_rl.aggregate import read_aggregate
    from gradfidelity.studies.sft_rl.earlier import write_comparison

    cfg = _cfg(args, "compare")
    cmp = cfg.compare_with
    write_comparison(cfg, read_aggregate(args.aggregate), cmp.records, args.records, cmp.rl_steps, args.scale,
                     Path(args.csv), Path(args.md))
    return 0


def _table_paths(p) -> None:
    for k in TABLES:
        p.add_argument(f"--{k.replace('_', '-')}", required=True, dest=k)


def _bench(args) -> int:
    from gradfidelity.studies.sft_rl.bench import run_bench

    run_bench(_cfg(args, "bench"), Path(args.init), Path(args.out), rounds=args.rounds)
    return 0


def _pilot(args) -> int:
    from gradfidelity.studies.sft_rl.pilot import run_pilot

    run_pilot(_cfg(args, "rl"), args.method, Path(args.init), args.lr, args.eval_steps, args.seed, Path(args.out))
    return 0


def _probe(args) -> int:
    from gradfidelity.studies.sft_rl.probe import run_probe

    run_probe(args.variant, Path(args.out))
    return 0


def register(sub) -> None:
    p = sub.add_parser("sft-rl-pretrain", help="sft_rl: pretrain the tiny base model on unlabeled task text")
    p.add_argument("--cfg", required=True, help="the sft_rl sections the job reads, as JSON (rules.JOB_KEYS)")
    p.add_argument("--model", required=True)
    p.add_argument("--seed", type=int, default=0, help="the pretraining seed (sft_rl.base_seeds)")
    add_run_args(p)
    p.set_defaults(func=_pretrain)

    p = sub.add_parser("sft-rl-sft", help="sft_rl: SFT (TRL SFTTrainer) on one infrastructure variant")
    p.add_argument("--cfg", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--variant", required=True, choices=VARIANTS)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--base", required=True, help="run directory of the base model")
    add_run_args(p)
    p.set_defaults(func=_sft)

    p = sub.add_parser("sft-rl-rl", help="sft_rl: an RL-stage method (TRL GRPOTrainer or a mixed-policy subclass)")
    p.add_argument("--cfg", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--variant", required=True, choices=VARIANTS)
    p.add_argument("--method", required=True, choices=RL_STAGE)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--init", required=True, help="run directory of the starting model (base or SFT)")
    lr = p.add_mutually_exclusive_group()
    lr.add_argument("--lr", type=float, help="train at this learning rate (an LR-selection run)")
    lr.add_argument("--lr-selection", help="lr_selection.json: train at the arm's chosen learning rate")
    add_run_args(p)
    p.set_defaults(func=_rl)

    p = sub.add_parser("sft-rl-lr-round", help="sft_rl: one round of the LR grid (the points the next round adds)")
    p.add_argument("--metrics", nargs="+", required=True, help="the grid runs' metrics.json so far")
    p.add_argument("--scale", required=True)
    p.add_argument("--lrs", nargs="+", type=float, required=True, help="the configured grid (lr_selection.lrs)")
    p.add_argument("--factor", type=float, required=True)
    p.add_argument("--max-extensions", type=int, required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(func=_lr_round)

    p = sub.add_parser("sft-rl-select-lr", help="sft_rl: every RL-stage arm's chosen LR from the grid runs")
    p.add_argument("--metrics", nargs="+", required=True, help="every grid run's metrics.json (all rounds)")
    p.add_argument("--scale", required=True)
    p.add_argument("--lrs", nargs="+", type=float, required=True)
    p.add_argument("--out", required=True, help="lr_selection.json")
    p.add_argument("--table", required=True, help="the selection table (csv)")
    p.add_argument("--table-md", required=True)
    p.add_argument("--start", nargs="*", help="METHOD=metrics.json of the run each arm starts from (compared on val)")
    p.add_argument("--n-val", type=int, help="the val set's size (the start comparison's evaluation noise)")
    p.set_defaults(func=_select_lr)

    p = sub.add_parser("sft-rl-compare", help="sft_rl: each run at an earlier RL budget against the earlier record "
                                              "of its cell (compare_with)")
    p.add_argument("--cfg", required=True)
    p.add_argument("--scale", required=True)
    p.add_argument("--aggregate", required=True, help="the tidy CSV of this config's runs")
    p.add_argument("--records", nargs="+", required=True, help="every earlier run's metrics.json")
    p.add_argument("--csv", required=True)
    p.add_argument("--md", required=True)
    p.set_defaults(func=_compare)

    p = sub.add_parser("sft-rl-alignment", help="sft_rl: Gram matrices of real SFT micro-batch gradients (for A3)")
    p.add_argument("--cfg", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--base", required=True, help="run directory of the base model")
    add_run_args(p)
    p.set_defaults(func=_alignment)

    p = sub.add_parser("sft-rl-aggregate", help="sft_rl: the runs -> one tidy CSV (one row per table cell and seed)")
    p.add_argument("--cfg", required=True)
    p.add_argument("--runs", nargs="+", required=True, help="every run's metrics.json (the rule's input)")
    p.add_argument("--scale", required=True)
    p.add_argument("--out", required=True, help="the tidy CSV")
    p.set_defaults(func=_aggregate)

    p = sub.add_parser("sft-rl-tables", help="sft_rl: main and bug-ablation tables from the tidy CSV")
    p.add_argument("--cfg", required=True)
    p.add_argument("--aggregate", required=True)
    _table_paths(p)
    p.set_defaults(func=_tables)

    p = sub.add_parser("sft-rl-starts", help="sft_rl: SFT-then-RL's start per seed (the start rule's table)")
    p.add_argument("--cfg", required=True)
    p.add_argument("--aggregate", required=True)
    p.add_argument("--csv", required=True)
    p.add_argument("--md", required=True)
    p.set_defaults(func=_starts)

    p = sub.add_parser("sft-rl-figures", help="sft_rl: score-vs-FLOPs and training-curve figures")
    p.add_argument("--cfg", required=True)
    p.add_argument("--aggregate", required=True)
    p.add_argument("--score-vs-flops", required=True)
    p.add_argument("--reward-curves", required=True)
    p.set_defaults(func=_figures)

    p = sub.add_parser("sft-rl-claims", help="sft_rl: claim evidence A5-A9 from the tidy CSV")
    p.add_argument("--cfg", required=True)
    p.add_argument("--scale", required=True)
    p.add_argument("--aggregate", required=True)
    _table_paths(p)
    p.add_argument("--out", required=True, help="results/<scale>/claims/sft_rl.json")
    p.set_defaults(func=_claims)

    p = sub.add_parser("sft-rl-bench", help="sft_rl: ms per rollout and per SFT step, round 3's path vs round 4's, "
                                            "against the FLOP floor")
    p.add_argument("--cfg", required=True)
    p.add_argument("--init", required=True, help="the SFT run directory the bench trains from")
    p.add_argument("--rounds", type=int, default=15, help="rounds (one step of each path) per bench")
    p.add_argument("--out", required=True, help="results/<scale>/bench/sft_rl.json")
    p.set_defaults(func=_bench)

    p = sub.add_parser("sft-rl-pilot", help="sft_rl: the RL-stage sizing pilot (one arm, evaluated at several steps)")
    p.add_argument("--cfg", required=True, help="the rl job's sections, as JSON (rules.JOB_KEYS['rl'])")
    p.add_argument("--method", required=True, choices=RL_STAGE)
    p.add_argument("--init", required=True, help="run directory of the starting model (base or SFT)")
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--eval-steps", type=int, nargs="+", required=True, help="optimizer steps to evaluate at")
    p.add_argument("--out", required=True, help="the pilot's JSON")
    p.set_defaults(func=_pilot)

    p = sub.add_parser("sft-rl-probe", help="sft_rl: one SGD step through the SFT trainer + DeepSpeed path")
    p.add_argument("--variant", required=True)
    p.add_argument("--out", required=True, help="a folder: one run directory per variant, the base model, probe.pt")
    p.set_defaults(func=_probe)
