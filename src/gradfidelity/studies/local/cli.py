"""Subcommands of study C (called by workflow/rules/local.smk); each validates its config before any work."""

from __future__ import annotations

from pathlib import Path

from gradfidelity.config import cfg_from_json
from gradfidelity.errors import UserError


def _settings(args):
    from gradfidelity.studies.local.settings import parse

    cfg = cfg_from_json(args.cfg, "local")
    return cfg, parse(cfg)


def _data(args) -> int:
    """--cfg is the `local.corpora` section (so that a training change does not redo the data)."""
    from gradfidelity.studies.local.settings import parse

    corpora = cfg_from_json(args.cfg, "local.corpora")
    from gradfidelity.studies.local.data import prepare

    s = parse({"train": {"n_layer": 1, "n_stages": 1}, "widths": [8], "main_width": 8, "corpora": corpora})
    if args.corpus not in s.corpora:
        raise UserError(f"local.corpora has no entry '{args.corpus}'")
    prepare(args.corpus, s.corpora[args.corpus], Path(args.out))
    return 0


def _cell(args) -> int:
    from gradfidelity.studies.local.runner import run_cell
    from gradfidelity.studies.local.settings import METHODS

    cfg, s = _settings(args)
    methods = args.methods.split(",")
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise UserError(f"--methods: unknown {bad} (allowed: {list(METHODS)})")
    if not (Path(args.data) / "train.bin").exists():
        raise UserError(f"{args.data}/train.bin does not exist")
    run_cell(methods, s, cfg, args.corpus, args.width, args.seed, Path(args.data), Path(args.root))
    return 0


def _report(args) -> int:
    from gradfidelity.studies.local.analysis import report

    cfg, s = _settings(args)
    out = {k: Path(getattr(args, k)) for k in ("aggregate", "main_csv", "main_md", "mech_csv", "mech_md",
                                                 "frontier", "scaling", "evidence")}
    report(args.runs, s, args.scale, out)
    return 0


def _bench(args) -> int:
    from gradfidelity.studies.local.bench import run_bench

    cfg, s = _settings(args)
    run_bench(s, Path(args.out))
    return 0


def register(sub) -> None:
    p = sub.add_parser("local-data", help="study C: prepare a byte corpus (embedded, download or local copy)")
    p.add_argument("--cfg", required=True, help="JSON of the local.corpora section")
    p.add_argument("--corpus", required=True, choices=["enwik8", "tinystories"])
    p.add_argument("--out", required=True)
    p.set_defaults(func=_data)

    p = sub.add_parser("local-cell", help="study C: BP, thread-matched BP and methods on one paired seed")
    p.add_argument("--cfg", required=True)
    p.add_argument("--corpus", required=True)
    p.add_argument("--width", required=True, type=int)
    p.add_argument("--seed", required=True, type=int)
    p.add_argument("--methods", required=True, help="comma-separated method names")
    p.add_argument("--data", required=True, help="folder with train.bin/val.bin")
    p.add_argument("--root", required=True, help="results/local")
    p.set_defaults(func=_cell)

    p = sub.add_parser("local-report", help="study C: aggregate, statistics, tables, figures, claim evidence")
    p.add_argument("--cfg", required=True)
    p.add_argument("--scale", required=True)
    p.add_argument("--runs", nargs="+", required=True)
    for k in ("aggregate", "main-csv", "main-md", "mech-csv", "mech-md", "frontier", "scaling", "evidence"):
        p.add_argument(f"--{k}", required=True)
    p.set_defaults(func=_report)

    p = sub.add_parser("local-bench", help="study C: MFU vs matmul rate, vs a plain nanoGPT loop; PSS ratio")
    p.add_argument("--cfg", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(func=_bench)
