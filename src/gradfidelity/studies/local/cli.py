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


def _corpus(args) -> int:
    from gradfidelity.studies.local.data import concat_tree

    digest = concat_tree(Path(args.root), args.suffix, Path(args.out))
    if args.md5 and digest != args.md5:
        Path(args.out).unlink()
        raise UserError(f"{args.out}: MD5 {digest}, expected {args.md5} (another release of the package under "
                        f"{args.root}? see docs/sources.md, Study C)")
    print(f"{args.out}: MD5 {digest}")
    return 0


def _cell(args) -> int:
    from gradfidelity.studies.local.cell import run_cell
    from gradfidelity.studies.local.settings import METHODS

    cfg, s = _settings(args)
    methods = args.methods.split(",")
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise UserError(f"--methods: unknown {bad} (allowed: {list(METHODS)})")
    for name in ("train.bin", "val.bin", "meta.json"):
        if not (Path(args.data) / name).exists():
            raise UserError(f"{args.data}/{name} does not exist (prepare the corpus with the local_data rule)")
    run_cell(methods, cfg, args.corpus, args.width, args.seed, Path(args.data), Path(args.root))
    return 0


def _aggregate(args) -> int:
    from gradfidelity.studies.local.aggregate import write_aggregate

    write_aggregate(args.runs, args.scale, Path(args.out))
    return 0


def _tables(args) -> int:
    from gradfidelity.studies.local.aggregate import read_aggregate
    from gradfidelity.studies.local.tables import write_tables

    cfg, s = _settings(args)
    out = {"aggregate": Path(args.aggregate), **{k: Path(getattr(args, k)) for k in (
        "main_csv", "main_md", "mech_csv", "mech_md")}}
    write_tables(read_aggregate(args.aggregate), s, out)
    return 0


def _figures(args) -> int:
    from gradfidelity.studies.local.aggregate import read_aggregate
    from gradfidelity.studies.local.figures import write_figures

    cfg, s = _settings(args)
    write_figures(read_aggregate(args.aggregate), s, Path(args.frontier), Path(args.scaling))
    return 0


def _claims(args) -> int:
    from gradfidelity.harness.io import atomic_write_json
    from gradfidelity.studies.local.aggregate import read_aggregate
    from gradfidelity.studies.local.claims import claims

    cfg, s = _settings(args)
    tables = {"aggregate": args.aggregate, "main": args.main_csv, "mechanism": args.mech_csv}
    atomic_write_json(Path(args.out), claims(read_aggregate(args.aggregate), s, args.scale, tables))
    return 0


def _bench(args) -> int:
    from gradfidelity.studies.local.bench import run_bench

    cfg, s = _settings(args)
    run_bench(s, Path(args.out))
    return 0


def register(sub) -> None:
    p = sub.add_parser("local-data", help="study C: prepare a byte corpus (embedded, download, path or file)")
    p.add_argument("--cfg", required=True, help="JSON of the local.corpora section")
    p.add_argument("--corpus", required=True, choices=["enwik8", "tinystories"])
    p.add_argument("--out", required=True)
    p.set_defaults(func=_data)

    p = sub.add_parser("local-corpus", help="study C: join a text tree (e.g. python3.11-doc's sources) into one file")
    p.add_argument("--root", required=True)
    p.add_argument("--suffix", required=True)
    p.add_argument("--md5", default="")
    p.add_argument("--out", required=True)
    p.set_defaults(func=_corpus)

    p = sub.add_parser("local-cell", help="study C: BP, thread-matched BP and methods on one paired seed")
    p.add_argument("--cfg", required=True)
    p.add_argument("--corpus", required=True)
    p.add_argument("--width", required=True, type=int)
    p.add_argument("--seed", required=True, type=int)
    p.add_argument("--methods", required=True, help="comma-separated method names")
    p.add_argument("--data", required=True, help="folder with train.bin/val.bin")
    p.add_argument("--root", required=True, help="results/local")
    p.set_defaults(func=_cell)

    p = sub.add_parser("local-aggregate", help="study C: run directories -> one tidy CSV")
    p.add_argument("--scale", required=True)
    p.add_argument("--runs", nargs="+", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(func=_aggregate)

    p = sub.add_parser("local-tables", help="study C: tidy CSV -> main and mechanism tables")
    p.add_argument("--cfg", required=True)
    for k in ("aggregate", "main-csv", "main-md", "mech-csv", "mech-md"):
        p.add_argument(f"--{k}", required=True)
    p.set_defaults(func=_tables)

    p = sub.add_parser("local-figures", help="study C: tidy CSV -> frontier and width figures")
    p.add_argument("--cfg", required=True)
    for k in ("aggregate", "frontier", "scaling"):
        p.add_argument(f"--{k}", required=True)
    p.set_defaults(func=_figures)

    p = sub.add_parser("local-claims", help="study C: tidy CSV -> claim evidence")
    p.add_argument("--cfg", required=True)
    p.add_argument("--scale", required=True)
    for k in ("aggregate", "main-csv", "mech-csv", "out"):
        p.add_argument(f"--{k}", required=True)
    p.set_defaults(func=_claims)

    p = sub.add_parser("local-bench", help="study C: MFU vs matmul rate, vs a plain nanoGPT loop; PSS ratio")
    p.add_argument("--cfg", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(func=_bench)
