"""Subcommands of study C (called by workflow/rules/local.smk): argparse glue. Each job reads its
`--cfg` (the keys `rules.JOB_KEYS` gives it) into the typed config before any work."""

from __future__ import annotations

from pathlib import Path

from gradfidelity.config import cfg_from_json
from gradfidelity.harness.cli_args import add_run_args
from gradfidelity.studies.local.config import CORPORA


def _config(args, job: str):
    from gradfidelity.studies.local.config import load_job

    return load_job(cfg_from_json(args.cfg, "local"), job)


def _data(args) -> int:
    from gradfidelity.studies.local.data import prepare_configured

    prepare_configured(args.corpus, _config(args, "data").corpora, Path(args.out))
    return 0


def _corpus(args) -> int:
    from gradfidelity.studies.local.data import concat_tree_checked

    concat_tree_checked(Path(args.root), args.suffix, Path(args.out), args.md5)
    return 0


def _cell(args) -> int:
    from gradfidelity.studies.local.train import run_job

    run_job(_config(args, "train").train, cfg_from_json(args.cfg, "local"), args.methods.split(","), args.cell,
            Path(args.data), args.run_dir, shares_machine=args.shares_machine)
    return 0


def _memory(args) -> int:
    from gradfidelity.studies.local.memory import run_probe

    run_probe(_config(args, "memory"), cfg_from_json(args.cfg, "local"), args.cell, Path(args.data),
              Path(args.run_dir))
    return 0


def _aggregate(args) -> int:
    from gradfidelity.studies.local.aggregate import write_aggregate, write_memory_aggregate

    write_aggregate(args.runs, args.scale, Path(args.out))
    write_memory_aggregate(args.memory_runs, args.scale, Path(args.memory_out))
    return 0


def _tables(args) -> int:
    from gradfidelity.studies.local.aggregate import read_aggregate, read_memory
    from gradfidelity.studies.local.tables import write_tables

    out = {"aggregate": Path(args.aggregate), **{k: Path(getattr(args, k)) for k in (
        "main_csv", "main_md", "mech_csv", "mech_md", "mem_csv", "mem_md")}}
    write_tables(read_aggregate(args.aggregate), _config(args, "tables"), out, read_memory(args.memory))
    return 0


def _figures(args) -> int:
    from gradfidelity.studies.local.aggregate import read_aggregate
    from gradfidelity.studies.local.figures import write_figures

    write_figures(read_aggregate(args.aggregate), _config(args, "figures"), Path(args.frontier),
                  Path(args.scaling))
    return 0


def _claims(args) -> int:
    from gradfidelity.studies.local.claims import write_claims

    tables = {"aggregate": args.aggregate, "memory": args.memory, "main": args.main_csv,
              "mechanism": args.mech_csv, "memory_table": args.mem_csv}
    write_claims(_config(args, "claims"), args.scale, tables, Path(args.out))
    return 0


def _bench(args) -> int:
    from gradfidelity.studies.local.bench import run_bench

    run_bench(_config(args, "bench"), Path(args.out))
    return 0


def _stats_check(args) -> int:
    from gradfidelity.studies.local.check import write_stats_check

    write_stats_check(args.csv, args.md, args.evidence, args.scale)
    return 0


def register(sub) -> None:
    p = sub.add_parser("stats-check", help="C5: recompute study C's reported statistics from its summary numbers")
    p.add_argument("--csv", required=True)
    p.add_argument("--md", required=True)
    p.add_argument("--evidence", required=True, help="claim evidence JSON to write")
    p.add_argument("--scale", required=True)
    p.set_defaults(func=_stats_check)

    p = sub.add_parser("local-data", help="study C: prepare a byte corpus (embedded, download, path or file)")
    p.add_argument("--cfg", required=True, help="JSON {\"corpora\": {<corpus>: its entry of local.corpora}}")
    p.add_argument("--corpus", required=True, choices=list(CORPORA))
    p.add_argument("--out", required=True)
    p.set_defaults(func=_data)

    p = sub.add_parser("local-corpus", help="study C: join a text tree (e.g. python3.11-doc's sources) into one file")
    p.add_argument("--root", required=True)
    p.add_argument("--suffix", required=True)
    p.add_argument("--md5", default="")
    p.add_argument("--out", required=True)
    p.set_defaults(func=_corpus)

    p = sub.add_parser("local-cell", help="study C: BP, thread-matched BP and methods on one paired seed")
    p.add_argument("--cfg", required=True, help="JSON {\"train\": local.train}")
    p.add_argument("--methods", required=True, help="comma-separated method names")
    p.add_argument("--shares-machine", action="store_true",
                   help="the job runs beside another (a quality job): its runs' throughput is recorded, never read")
    p.add_argument("--data", required=True, help="folder with train.bin/val.bin/meta.json")
    add_run_args(p)  # --run-dir: with {method} in place of each method's name; --cell: corpus, width, seed
    p.set_defaults(func=_cell)

    p = sub.add_parser("local-memory", help="study C: C3's memory probe (BP and async RGC, each beside its bare tree)")
    p.add_argument("--cfg", required=True, help="JSON {\"train\": local.train, \"memory\": local.memory}")
    p.add_argument("--data", required=True, help="folder with train.bin/meta.json")
    add_run_args(p)  # --run-dir: the probe's run directory; --cell: width, seed
    p.set_defaults(func=_memory)

    p = sub.add_parser("local-aggregate", help="study C: run directories -> tidy CSVs (training runs, memory probes)")
    p.add_argument("--scale", required=True)
    p.add_argument("--runs", nargs="+", required=True)
    p.add_argument("--memory-runs", nargs="+", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--memory-out", required=True)
    p.set_defaults(func=_aggregate)

    p = sub.add_parser("local-tables", help="study C: tidy CSV -> main and mechanism tables")
    p.add_argument("--cfg", required=True)
    for k in ("aggregate", "memory", "main-csv", "main-md", "mech-csv", "mech-md", "mem-csv", "mem-md"):
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
    for k in ("aggregate", "memory", "main-csv", "mech-csv", "mem-csv", "out"):
        p.add_argument(f"--{k}", required=True)
    p.set_defaults(func=_claims)

    p = sub.add_parser("local-bench", help="study C: MFU vs matmul rate, vs a plain nanoGPT loop; PSS ratio")
    p.add_argument("--cfg", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(func=_bench)
