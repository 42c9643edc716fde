"""Subcommands of the sft_rl study (called by workflow/rules/sft_rl.smk)."""

from __future__ import annotations

from pathlib import Path

from gradfidelity.config import cfg_from_json
from gradfidelity.errors import UserError


def _cfg(args):
    from gradfidelity.studies.sft_rl.config import StudyConfig

    return StudyConfig.from_dict(cfg_from_json(args.cfg, "sft_rl"))


def _pretrain(args) -> int:
    from gradfidelity.studies.sft_rl.runs import run_pretrain

    run_pretrain(_cfg(args), args.model, Path(args.out))
    return 0


def _sft(args) -> int:
    from gradfidelity.studies.sft_rl.runs import run_sft

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
    from gradfidelity.studies.sft_rl.runs import run_rl

    cfg = _cfg(args)
    if args.method not in cfg.methods:
        raise UserError(f"--method {args.method!r} is not in sft_rl.methods {list(cfg.methods)}")
    run_rl(cfg, args.model, args.variant, args.method, args.seed, Path(args.init), Path(args.out))
    return 0


def _aggregate(args) -> int:
    from gradfidelity.studies.sft_rl.aggregate import aggregate

    aggregate(_cfg(args), args.runs, args.scale, Path(args.tables), Path(args.figures), Path(args.evidence))
    return 0


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

    p = sub.add_parser("sft-rl-aggregate", help="sft_rl: tables, figures and claim evidence from the runs")
    p.add_argument("--cfg", required=True)
    p.add_argument("--runs", nargs="+", required=True,
                   help="every run's metrics.json (from plan.planned_runs), all under one results directory")
    p.add_argument("--scale", required=True)
    p.add_argument("--tables", required=True, help="paper_tables directory")
    p.add_argument("--figures", required=True, help="figures directory")
    p.add_argument("--evidence", required=True, help="results/claims/sft_rl.json")
    p.set_defaults(func=_aggregate)

    p = sub.add_parser("sft-rl-probe", help="sft_rl: one SGD step through the SFT trainer + DeepSpeed path")
    p.add_argument("--variant", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(func=_probe)
