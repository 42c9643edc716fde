"""`gradfidelity <subcommand>`: the one entry point every Snakemake rule calls.

Shared subcommands live here; each study adds its own through `gradfidelity.studies.<study>.cli.register`.
A UserError (bad config, missing or corrupt input) prints one line and exits 2, before any work is done.
"""

from __future__ import annotations

import argparse
import importlib
import os
import select
import sys

from gradfidelity.errors import UserError
from gradfidelity.harness.environment import prepare_job_environment
from gradfidelity.studies import STUDIES


def _verify(args) -> int:
    from gradfidelity.claims.report import write_claims_report

    write_claims_report(args.evidence, args.csv, args.md, args.scale, drift_verdicts=args.drift_verdicts,
                        power_csv=args.power)
    return 0


def _runs_table(args) -> int:
    from gradfidelity.harness.io import atomic_write_csv
    from gradfidelity.harness.results import runs_table

    atomic_write_csv(runs_table(args.runs, args.scale), args.out)
    return 0


def _unlock_stale(args) -> int:
    from gradfidelity.workflow_lock import unlock_if_stale

    print(unlock_if_stale(args.snakemake))
    return 0


def _check_reference(args) -> int:
    from pathlib import Path

    from gradfidelity.reference.check import check_reference

    if args.measure_drift:
        from gradfidelity.reference.drift import measure_drift

        return measure_drift(Path(args.repo), workdir=Path(args.workdir) if args.workdir else None,
                             cores=args.cores, extra_config=tuple(args.config))
    return check_reference(Path(args.repo), workdir=Path(args.workdir) if args.workdir else None, cores=args.cores,
                           budget_s=args.budget, extra_config=tuple(args.config), cross_host=args.cross_host,
                           out=Path(args.out) if args.out else None)


def _check_record(args) -> int:
    from gradfidelity.harness.records import check

    print(check(args.committed, args.fresh, args.repo))
    return 0


def _restore_records(args) -> int:
    from gradfidelity.harness.records import restore

    for table in args.runs_table:
        written = restore(table, args.repo, overwrite=args.overwrite)
        print(f"{table}: {len(written)} run records written")
    return 0


def _cpu_part(args) -> int:
    from pathlib import Path

    from gradfidelity.parts import cpu_part

    return cpu_part(Path(args.repo), args.study, args.scale, args.part, list_only=args.list, status=args.status,
                    cores=args.cores, config=tuple(args.config))


def _check_rebuild(args) -> int:
    from pathlib import Path

    from gradfidelity.rebuild import check_rebuild

    return check_rebuild(Path(args.repo), args.scale, args.cores)


def _claim(args) -> int:
    from gradfidelity.claims.explain import explain_claim, list_claims

    if args.list:
        print(list_claims(args.scale))
    elif args.id:
        print(explain_claim(args.id, args.scale))
    else:
        raise UserError("give a claim id (e.g. `gradfidelity claim C4`) or --list")
    return 0


def _claims_figure(args) -> int:
    from pathlib import Path

    from gradfidelity.claims.figure import claims_figure

    claims_figure(Path(args.claims), Path(args.out), args.scale)
    return 0


def _report_summary(args) -> int:
    from gradfidelity.claims.summary import write_summary

    write_summary(args.claims, args.figure, args.runs, args.out, args.scale)
    return 0


def _docs(args) -> int:
    from pathlib import Path

    from gradfidelity.docs import write_or_check

    return write_or_check(Path(args.readme), args.check)


def _power(args) -> int:
    from gradfidelity.claims.power_table import run

    return run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gradfidelity", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")

    p = sub.add_parser("verify", help="compute every claim's verdict from the studies' evidence")
    p.add_argument("--evidence", nargs="*", default=[], help="results/claims/<study>.json files")
    p.add_argument("--csv", required=True)
    p.add_argument("--md", required=True)
    p.add_argument("--scale", required=True)
    p.add_argument("--drift-verdicts", nargs="*", default=[],
                   help="results/<scale>/reference/verdicts_*.csv: verdicts recomputed under measured hardware drift")
    p.add_argument("--power", default=None,
                   help="paper_tables/<scale>/power.csv: a claim below the n its power needs says so")
    p.set_defaults(func=_verify)

    p = sub.add_parser("power", help="the power table: per claim, its deciding statistic, its per-seed sd, the n at "
                                     "which its verdict is decided with 80%% probability and what that costs")
    p.add_argument("--scale", required=True)
    p.add_argument("--evidence", nargs="*", default=None,
                   help="results/<scale>/claims/<study>.json files (default: every study's at --scale)")
    p.add_argument("--csv", default=None, help="default: paper_tables/<scale>/power.csv")
    p.add_argument("--md", default=None, help="default: paper_tables/<scale>/power.md")
    p.add_argument("--cap", type=int, default=None, help="the largest n reported (beyond it: '> cap')")
    p.set_defaults(func=_power)

    p = sub.add_parser("runs-table", help="one row per run (seed, status, metrics, git sha, versions, CPU, threads)")
    p.add_argument("--runs", nargs="+", required=True, help="the study's metrics.json files")
    p.add_argument("--scale", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(func=_runs_table)

    p = sub.add_parser("unlock-stale", help="remove Snakemake's lock left by a killed run (never a live one's)")
    p.add_argument("--snakemake", default="snakemake", help="the snakemake executable")
    p.set_defaults(func=_unlock_stale)

    what = ("rerun a fixed stratified sample of the committed cpu runs, compare every training metric with the "
            "committed runs tables and recompute the sampled studies' verdicts (exit 0: all within their rules; 1: a "
            "metric outside its rule; 2: a bad input; 3: only verdicts flipped; 4: incomplete (a rerun job failed, "
            "the budget ran out or Ctrl-C): the runs that finished are compared and none is outside its rule)")
    p = sub.add_parser("check-reference", help=what, description=what)
    p.add_argument("--repo", default=".", help="the checkout whose committed results/cpu/runs/*.csv are checked")
    p.add_argument("--workdir", default=None,
                   help="where the scratch copy runs (default: a temporary folder, removed afterwards)")
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                   help="the wall time this check may take on this host: the sample is sized to it after a speed "
                   "probe, and the check stops there, compares what finished and exits 4 if it did not finish "
                   "(default: the fixed sample, run to its end, with its expected time printed first)")
    p.add_argument("--config", nargs="*", default=[], help="extra snakemake --config items (key=value)")
    p.add_argument("--cross-host", action="store_true",
                   help="apply the cross-host rules even to a rerun on the committed runs' host type")
    p.add_argument("--out", default=None, help="write the full comparison table to this CSV (the verdicts beside "
                   "it, .verdicts.csv); stdout then shows only the metrics that are not bit for bit")
    p.add_argument("--measure-drift", action="store_true",
                   help="instead: rerun the sample with kernels at AVX2 and at this host's own ISA level and write "
                   "results/cpu/reference/drift_<a>_vs_<b>.csv (needs a host above AVX2, e.g. AVX-512)")
    p.set_defaults(func=_check_reference)

    p = sub.add_parser("check-record", help="a committed run redone elsewhere (a replay) against its committed record")
    p.add_argument("--committed", required=True, help="the committed run's metrics.json")
    p.add_argument("--fresh", required=True, help="the rerun's metrics.json (its provenance.json beside it)")
    p.add_argument("--repo", default=".", help="checkout whose results/cpu/reference/drift_*.csv hold the rules")
    p.set_defaults(func=_check_record)

    p = sub.add_parser("restore-records", help="write the run records (metrics.json, provenance.json, benchmark.tsv) "
                                                "a committed runs table carries into its run directories")
    p.add_argument("runs_table", nargs="+", help="results/<scale>/runs/<study>.csv")
    p.add_argument("--repo", default=".", help="the checkout the run ids are relative to")
    p.add_argument("--overwrite", action="store_true", help="replace records already there (default: keep them)")
    p.set_defaults(func=_restore_records)

    p = sub.add_parser("cpu-part", help="a study's run in parts: train part k/n (by seed) of its missing runs, or "
                                         "list what is missing")
    p.add_argument("--study", required=True)
    p.add_argument("--scale", default="cpu")
    p.add_argument("--part", help="k/n: the k-th of n parts of the missing runs, split by seed (default 1/1)")
    p.add_argument("--list", action="store_true", help="list the part's runs, train nothing")
    p.add_argument("--status", action="store_true", help="list every missing run; exit 1 if any")
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--repo", default=".")
    p.add_argument("--config", nargs="*", default=[], help="extra KEY=VALUE config, as given to snakemake --config")
    p.set_defaults(func=_cpu_part)

    p = sub.add_parser("check-rebuild", help="rebuild every committed table, figure, claim and runs table from the "
                                              "committed run records (no training) and list what differs")
    p.add_argument("--scale", default="cpu")
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--repo", default=".")
    p.set_defaults(func=_check_rebuild)

    p = sub.add_parser("claim", help="one claim with everything behind it: evidence, verdict, runs, rebuild command")
    p.add_argument("id", nargs="?", help="claim id, e.g. C4 (see --list)")
    p.add_argument("--scale", default="smoke")
    p.add_argument("--list", action="store_true", help="one line per claim")
    p.set_defaults(func=_claim)

    p = sub.add_parser("claims-figure", help="every claim's estimate and interval against its threshold")
    p.add_argument("--claims", required=True, help="the claims CSV written by verify")
    p.add_argument("--out", required=True)
    p.add_argument("--scale", required=True)
    p.set_defaults(func=_claims_figure)

    p = sub.add_parser("report-summary", help="the landing page of the HTML report (reStructuredText)")
    p.add_argument("--claims", required=True)
    p.add_argument("--figure", required=True)
    p.add_argument("--runs", nargs="+", required=True, help="the studies' runs tables")
    p.add_argument("--out", required=True)
    p.add_argument("--scale", required=True)
    p.set_defaults(func=_report_summary)

    p = sub.add_parser("docs", help="regenerate the README's claims-to-targets table from the registry and rules")
    p.add_argument("--readme", default="README.md")
    p.add_argument("--check", action="store_true", help="exit 1 if the README differs from the generated one")
    p.set_defaults(func=_docs)

    for study in STUDIES:
        try:
            module = importlib.import_module(f"gradfidelity.studies.{study}.cli")
        except ModuleNotFoundError as exc:
            if exc.name != f"gradfidelity.studies.{study}.cli" and exc.name != f"gradfidelity.studies.{study}":
                raise  # a real import error inside the study must be loud
            continue
        module.register(sub)
    return parser


def _stdout_reader_gone() -> bool:
    """True when stdout is a pipe whose reading end has closed (poll reports POLLERR on the writing end)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError):  # stdout closed or not a real file: not the `| head` case
        return False


def main(argv: list[str] | None = None) -> int:
    prepare_job_environment()
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"gradfidelity {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise  # a broken pipe elsewhere (a worker's, a socket's) is a real failure and stays loud
        # The reader closed stdout (`gradfidelity cpu-part --list | head`): stop quietly with the shell's SIGPIPE
        # status, as cat does. stdout goes to devnull so the interpreter's exit-time flush cannot raise again
        # (the recipe of Python's signal documentation, "Note on SIGPIPE").
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13  # 141: SIGPIPE's status


if __name__ == "__main__":
    sys.exit(main())
