"""Subcommands of the sft_rl study (called by workflow/rules/sft_rl.smk)."""

from __future__ import annotations

from pathlib import Path

from gradfidelity.config import cfg_from_json
from gradfidelity.errors import UserError


def _cfg(args):
    from gradfidelity.studies.sft_rl.config import StudyConfig

    return StudyConfig.from_dict(cfg_from_json(args.cfg, "sft_rl"))


def _pretrain(args) -> int:
    from gradfidelity.studies.sft_rl.train import run_pretrain

    run_pretrain(_cfg(args), args.model, Path(args.out))
    return 0


def _sft(args) -> int:
    from gradfidelity.studies.sft_rl.train import run_sft

    cfg = _cfg(args)
    if args.variant not in cfg.variants:
        raise UserError(f"--variant {args.variant!r} is not in sft_rl.variants {list(cfg.variants)}")
    run_sft(cfg, args.model, args.variant, args.seed, Path(args.base), Path(args.out))
    return 0


def _alignment(args) -> int:
    from gradfidelity.studies.sft_rl.alignment import run_alignment

    run_alignment(_cfg(args), args.model, Path(args.base), Path(args.out))
    return 0


def _rl(args) -> int:
    from gradfidelity.studies.sft_rl.train import run_rl

    cfg = _cfg(args)
    if args.method not in cfg.methods:
        raise UserError(f"--method {args.method!r} is not in sft_rl.methods {list(cfg.methods)}")
    run_rl(cfg, args.model, args.variant, args.method, args.seed, Path(args.init), Path(args.out))
    return 0


def _aggregate(args) -> int:
    from gradfidelity.studies.sft_rl.aggregate import write_aggregate

    write_aggregate(_cfg(args), args.runs, args.scale, Path(args.out))
    return 0


def _tables(args) -> int:
    from gradfidelity.studies.sft_rl.aggregate import read_aggregate
    from gradfidelity.studies.sft_rl.tables import write_tables

    cfg = _cfg(args)
    write_tables(read_aggregate(args.aggregate), cfg, *(Path(getattr(args, k)) for k in _TABLE_ARGS))
    return 0


def _figures(args) -> int:
    from gradfidelity.studies.sft_rl.aggregate import read_aggregate
    from gradfidelity.studies.sft_rl.figures import write_figures

    cfg = _cfg(args)
    write_figures(read_aggregate(args.aggregate), cfg, Path(args.score_vs_flops), Path(args.reward_curves))
    return 0


def _claims(args) -> int:
    from gradfidelity.harness.io import atomic_write_json
    from gradfidelity.studies.sft_rl.aggregate import read_aggregate
    from gradfidelity.studies.sft_rl.claims import claims

    cfg = _cfg(args)
    tables = {"main": [args.main_csv, args.main_md], "ablation": [args.abl_csv, args.abl_md]}
    atomic_write_json(Path(args.out), claims(read_aggregate(args.aggregate), cfg, args.scale, tables))
    return 0


_TABLE_ARGS = ("main_csv", "main_md", "abl_csv", "abl_md")


def _table_paths(p) -> None:
    for k in _TABLE_ARGS:
        p.add_argument(f"--{k.replace('_', '-')}", required=True, dest=k)


def _probe(args) -> int:
    from gradfidelity.studies.sft_rl.probe import run_probe

    run_probe(args.variant, Path(args.out))
    return 0


def register(sub) -> None:
    p = sub.add_parser("sft-rl-pretrain", help="sft_rl: pretrain the tiny base model on unlabeled task text")
    p.add_argument("--cfg", required=True, help="the sft_rl config section as JSON")
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True, help="run directory")
    p.set_defaults(func=_pretrain)

    p = sub.add_parser("sft-rl-sft", help="sft_rl: SFT (TRL SFTTrainer) on one infrastructure variant")
    p.add_argument("--cfg", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--variant", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--base", required=True, help="run directory of the base model")
    p.add_argument("--out", required=True)
    p.set_defaults(func=_sft)

    p = sub.add_parser("sft-rl-rl", help="sft_rl: an RL-stage method (TRL GRPOTrainer or a mixed-policy subclass)")
    p.add_argument("--cfg", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--variant", required=True)
    p.add_argument("--method", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--init", required=True, help="run directory of the starting model (base or SFT)")
    p.add_argument("--out", required=True)
    p.set_defaults(func=_rl)

    p = sub.add_parser("sft-rl-alignment", help="sft_rl: Gram matrices of real SFT micro-batch gradients (for A3)")
    p.add_argument("--cfg", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--base", required=True, help="run directory of the base model")
    p.add_argument("--out", required=True, help="run directory")
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

    p = sub.add_parser("sft-rl-probe", help="sft_rl: one SGD step through the SFT trainer + DeepSpeed path")
    p.add_argument("--variant", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(func=_probe)
