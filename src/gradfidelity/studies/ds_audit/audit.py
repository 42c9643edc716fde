"""`gradfidelity audit-deepspeed`: run the probe under a user's DeepSpeed config and say what DeepSpeed did with it.

Exit codes (EXIT_CODES; the most severe finding wins, every finding is printed):
  5  a gradient leaks across optimizer steps: an earlier step's gradient reappears in a later one
  3  some micro-batch is dropped or mis-weighted, or clipping used another gradient than the full one
  4  the result cannot be decided on this machine (a CPU-only artefact, with the reason)
  6  warning: the clipping threshold DeepSpeed applied differs from the one asked for
  0  every audited case is faithful
  2  the config or the options cannot be audited (one line on stderr, no traceback)
  130 / 143  interrupted (SIGINT / SIGTERM): the probe processes are stopped and the temporary folder removed

Why verdicts name a cause: advice must follow from what the probe established (stage, offload, GA, version and the
measured pattern), never from a fixed sentence. A CPU-only artefact (0.18.9's type-string bucketing, see
`ds_step.cpu_reduce_buckets_work`) is detected from the installed DeepSpeed's own function and reported as
undecidable here, never as dropped or faithful. Why a leak has its own code: a gradient carried into the next
optimizer step is applied twice, which no micro-batch weight of one step shows, and its fix (mark the accumulation
boundary, or zero the buffer) differs from the dropped-micro-batch fixes.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from gradfidelity.errors import UserError

EXIT_FAITHFUL, EXIT_UNUSABLE, EXIT_DROPS, EXIT_UNDECIDED, EXIT_LEAK, EXIT_CLIP_THRESHOLD = 0, 2, 3, 4, 5, 6
EXIT_CODES = {  # code -> meaning, most severe first (the order the exit code is chosen in)
    EXIT_LEAK: "a gradient leaks across optimizer steps (an earlier step's gradient reappears in a later one)",
    EXIT_DROPS: "a micro-batch is dropped or mis-weighted, or clipping used a partial gradient",
    EXIT_UNDECIDED: "cannot be decided on this machine (a CPU-only artefact, with the reason)",
    EXIT_CLIP_THRESHOLD: "warning: the clipping threshold DeepSpeed applied differs from the one asked for",
    EXIT_FAITHFUL: "faithful: every micro-batch reached the optimizer with the expected weight",
    EXIT_UNUSABLE: "the config or the options cannot be audited (one line on stderr)",
}
VERDICT_EXIT = {"leaking": EXIT_LEAK, "dropped": EXIT_DROPS, "mis-weighted": EXIT_DROPS, "clipping": EXIT_DROPS,
                "undecidable": EXIT_UNDECIDED, "faithful": EXIT_FAITHFUL}
AFFECTED = ((0, 15, 2), (0, 18, 9))  # PR #6550 shipped in 0.15.2, PRs #7967/#7981 fixed it in 0.19.0 (docs/sources.md)
WARN_ABOVE_S = 60.0  # an audit estimated longer than this is announced up front, with its estimate


def _v(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split(".")[:3])


def fmt_vector(c: list[float], tol: float) -> str:
    """[1, 0, 0, 1] when every weight is within tolerance of an integer, else two decimals."""
    parts = [str(int(round(x))) if abs(x - round(x)) <= tol else f"{x:.2f}" for x in c]
    return "[" + ", ".join(parts) + "]"


def cpu_artefact(case: dict, result: dict, ranks: int) -> str | None:
    """The reason this case cannot be decided on CPU, or None. case: DSCase as a dict; result: ProbeResult dict."""
    contiguous = bool(dict(map(tuple, case["zero_extra"])).get("contiguous_gradients", True)) \
        or case["offload"] != "none"
    if result["extra"].get("cpu_reduce_buckets_work", True) or case["zero_stage"] not in (1, 2) or contiguous \
            or ranks < 2:
        return None
    return ("cannot be decided on this machine: with contiguous_gradients false, ZeRO-1/2 reduces gradients through "
            "split_half_float_double, which in this DeepSpeed matches CUDA-style type strings "
            "(\"torch.cpu.FloatTensor\") that no CPU tensor has, so the all-reduce across ranks is skipped on CPU; "
            "on a GPU the strings match and the reduction runs. Audit accumulation alone with --ranks 1, or with "
            "contiguous_gradients true (docs/sources.md, Study A, CPU-only artefact)")


def _pattern(c: list[float], tol: float) -> list[int] | None:
    r = [round(x) for x in c]
    return r if all(abs(a - b) <= tol and b in (0, 1) for a, b in zip(c, r, strict=True)) else None


def leaks(steps: list[dict], tol: float) -> bool:
    """An earlier step's gradient in a later step: residual (the part of the applied update that no micro-batch of
    the step explains) above tolerance after the first step, where the first step had none. One step cannot show it."""
    over = [s["residual"] > tol + s.get("storage_rounding", 0.0) for s in steps]
    return len(over) > 1 and not over[0] and any(over[1:])


def cause(role: str, case: dict, version: str, ranks: int, steps: list[dict], tol: float) -> str:
    """Advice derived from what the probe established for a case that is not faithful."""
    affected = AFFECTED[0] <= _v(version) <= AFFECTED[1]
    stage12, offload = case["zero_stage"] in (1, 2), case["offload"] != "none"
    n = case["ga"] * case["backward_calls"]
    pats = [_pattern(s["contributions"], tol) for s in steps]
    stale = leaks(steps, tol)
    if role == "multi-backward-no-boundary":
        what = ("a gradient of one optimizer step is carried into the next (the reported norm of later steps "
                "includes it)" if stale else "not every backward() reaches the optimizer with its weight")
        return (f"{what}: at gradient_accumulation_steps 1 every backward() is an accumulation boundary unless the "
                "loop calls engine.set_gradient_accumulation_boundary(False) before each backward but the last (the "
                "fix of open-instruct PR #1498); mark the boundary, or accumulate through gradient_accumulation_steps")
    if stale:
        return ("a gradient of an earlier optimizer step reappears in a later one (a stale or unzeroed buffer): "
                "do not train with this config as is")
    if role == "multi-backward" and affected and stage12 and offload \
            and all(p == ([0] * (n - 1) + [1]) * ranks for p in pats):
        return ("several backward() calls per step with offload_optimizer lose all but the last in this DeepSpeed "
                "(PR #7981, fixed in 0.19.0): upgrade to >= 0.19.0, switch offload_optimizer off, or accumulate "
                "through gradient_accumulation_steps")
    bug = ([1] + [0] * (n - 2) + [1]) * ranks
    if role in ("accumulation", "clipping") and affected and stage12 and offload and case["ga"] >= 3:
        raw = [[round(x / max(s["contributions"]), 3) if max(s["contributions"]) > tol else 0
                for x in s["contributions"]] for s in steps]
        if all(_pattern(r, tol) == bug for r in raw):
            what = ("the gradient norm and the clip coefficient are computed on g0 + g(N-1) only"
                    if role == "clipping" else f"micro-batches 1..{n - 2} of every window are lost")
            return (f"the ZeRO-{case['zero_stage']} CPU-offload accumulation bug of DeepSpeed 0.15.2-0.18.9 "
                    f"(PR #6550, fixed by PR #7967 in 0.19.0): {what}. Upgrade to >= 0.19.0, or switch "
                    "offload_optimizer off, or use gradient_accumulation_steps <= 2")
    return f"DeepSpeed {version} does not apply the gradient you asked for with this config: do not train with it as is"


def judge(role: str, case: dict, result: dict, version: str, ranks: int) -> dict:
    """Verdict of one case: {"verdict": faithful|leaking|dropped|mis-weighted|clipping|undecidable, "reason"}."""
    tol = result["tolerance"]
    why = cpu_artefact(case, result, ranks)
    if why:
        return {"verdict": "undecidable", "reason": why}
    if result["faithful"]:
        return {"verdict": "faithful", "reason": ""}
    dropped = any(result["dropped"])
    if leaks(result["per_step"], tol):
        verdict = "leaking"
    else:
        verdict = "clipping" if role == "clipping" and not dropped else ("dropped" if dropped else "mis-weighted")
    return {"verdict": verdict, "reason": cause(role, case, version, ranks, result["per_step"], tol)}


def clip_finding(plan, clip_used: float) -> str | None:
    """The warning when the threshold DeepSpeed used is not the one asked for (None when they agree)."""
    if abs(clip_used - plan.clip_asked) <= 1e-9 * max(1.0, plan.clip_asked):
        return None
    used = "no clipping" if clip_used == 0 else f"clipping at {clip_used:g}"
    asked = "none" if plan.clip_asked == 0 else f"{plan.clip_asked:g}"
    return (f"DeepSpeed applies {used}, but the threshold asked for is {asked} ({plan.clip_asked_from}); the Hugging "
            "Face integration fills gradient_clipping only from \"auto\", so a missing key replaces max_grad_norm "
            "by this version's default: set gradient_clipping in the config (or \"auto\")")


def exit_code(verdicts: list[dict], clip_warning: str | None) -> int:
    codes = {VERDICT_EXIT[v["verdict"]] for v in verdicts} | ({EXIT_CLIP_THRESHOLD} if clip_warning else set())
    return next((c for c in EXIT_CODES if c in codes), EXIT_FAITHFUL)


def _fmt_case(ac, st: dict, v: dict) -> list[str]:
    r = st["result"]
    tol = r["tolerance"]
    out = [f"\n[{ac.label}]"]
    for i, s in enumerate(r["per_step"]):
        norm = "not reported" if s["reported_over_kept"] is None else f"{s['reported_over_kept']:.3f}"
        out.append(f"  step {i + 1}: contributions {fmt_vector(s['contributions'], tol)}"
                   f"  (residual {s['residual']:.1e}; reported norm / norm of the kept micro-batches {norm})")
    if ac.role == "clipping":
        s = r["per_step"][0]
        applied = "n/a" if s["clip_applied"] is None else f"{s['clip_applied']:.3f}"
        said = {None: " (the config sets no gradient_clipping: this version's default)",
                0.0: " (the config sets 0: no clipping)"}.get(ac.case.clip, "")
        out.append(f"  clipping threshold DeepSpeed used: {r['clip']:g}{said}")
        out.append(f"  clip coefficient applied {applied}; the full gradient would give {s['clip_full']:.3f}")
    labels = {"faithful": "FAITHFUL: every micro-batch reached the optimizer with the expected weight",
              "undecidable": "UNDECIDABLE", "dropped": "micro-batches DROPPED " + str(r["dropped"]),
              "mis-weighted": "micro-batches MIS-WEIGHTED", "clipping": "clipping NOT computed on the full gradient",
              "leaking": "gradient LEAKS across optimizer steps"}
    out.append(f"  verdict: {labels[v['verdict']]}" + (f": {v['reason']}" if v["reason"] else ""))
    return out


class Interrupted(Exception):
    """SIGTERM or SIGINT during an audit: unwinds through the temporary folder's cleanup, no traceback."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_interrupted(signum, frame):
    raise Interrupted(signum)


def check_json_target(path: str | None) -> Path | None:
    """The --json path, checked before any work: its folder exists and is writable, and it is not a folder."""
    if path is None:
        return None
    out = Path(path)
    if out.is_dir():
        raise UserError(f"--json {path}: is a folder; give a file path")
    if not out.parent.is_dir():
        raise UserError(f"--json {path}: folder {out.parent} does not exist")
    if not os.access(out.parent, os.W_OK):
        raise UserError(f"--json {path}: folder {out.parent} is not writable")
    return out


def _error(msg: str) -> int:
    print(f"gradfidelity audit-deepspeed: error: {msg}", file=sys.stderr)
    return EXIT_UNUSABLE


def run(args) -> int:
    """The command, with SIGTERM/SIGINT turned into a clean stop (probe processes killed, temporary folder gone)."""
    handlers = {sig: signal.signal(sig, _raise_interrupted) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return _audit(args)
    except Interrupted as exc:
        print(f"\ngradfidelity audit-deepspeed: interrupted ({exc}): probe processes stopped, temporary folder "
              "removed", file=sys.stderr)
        return 128 + exc.signum
    finally:
        for sig, h in handlers.items():
            signal.signal(sig, h)


def _audit(args) -> int:
    from gradfidelity.harness.io import atomic_write_json
    from gradfidelity.studies.ds_audit.case import SECONDS_PER_BACKWARD
    from gradfidelity.studies.ds_audit.userconfig import backward_calls, load_config, plan_audit
    from gradfidelity.studies.ds_audit.versions import env_for, installed_version_noimport, shm_op_cached
    from gradfidelity.studies.ds_audit.worker import run_group

    try:
        plan = plan_audit(load_config(args.config), args.gradient_accumulation_steps, args.micro_batch_size,
                          args.dtype, args.backward_per_step, args.ranks, args.world_size, args.steps,
                          args.boundary, args.max_grad_norm)
        env_for(args.deepspeed_version)  # validates the version / finds the overlay before any work
        json_out = check_json_target(args.json)
    except UserError as exc:
        return _error(str(exc))
    version = args.deepspeed_version or installed_version_noimport()
    print(f"Auditing {args.config} under DeepSpeed {version}: {plan.summary}", flush=True)
    if args.ranks > (os.cpu_count() or 1):
        print(f"  note: {args.ranks} ranks on {os.cpu_count()} cores: slower, same result")
    calls = backward_calls(plan)
    estimate = calls * SECONDS_PER_BACKWARD * max(1.0, args.ranks / (os.cpu_count() or 1))
    if estimate > WARN_ABOVE_S:
        took = f"{estimate:.0f} s" if estimate < 120 else f"{estimate / 60:.0f} min"
        print(f"  warning: {calls:,} probe backward calls per rank (GA x backward calls x steps, over "
              f"{len(plan.cases)} cases): about {took} on 2 cores. The verdict does not need a large GA to show a "
              "pattern: --gradient-accumulation-steps 8 and --steps 1 decide the same bugs", flush=True)
    if not shm_op_cached(version):
        print(f"  note: DeepSpeed {version}'s CPU ops are not built yet: the first audit builds them (minutes); "
              "`make setup` prebuilds them")
    t0 = time.perf_counter()
    n = len(plan.cases)

    def progress(i: int, state: dict) -> None:
        took = f" in {state['seconds']:.1f} s" if "seconds" in state else ""
        what = "done" if state.get("status") == "ok" else f"error: {state.get('error', '')[:120]}"
        print(f"  case {i + 1}/{n} {plan.cases[i].role}: {what}{took}", flush=True)

    with tempfile.TemporaryDirectory(prefix="gf-audit-") as tmp:
        # The probe runs in child processes with the requested DeepSpeed first on PYTHONPATH, so this process
        # never imports DeepSpeed.
        with open(Path(tmp) / "log", "w") as log:
            states = run_group([c.case for c in plan.cases], args.ranks, args.deepspeed_version, Path(tmp), log=log,
                               on_case=progress)
    seconds = time.perf_counter() - t0
    report, verdicts = [], []
    for ac, st in zip(plan.cases, states, strict=True):
        if st["status"] != "ok":
            return _error(f"DeepSpeed {version} could not run this config ({ac.label}): {st['error']}")
        got = st["result"]["extra"].get("deepspeed")
        if got != version:
            return _error(f"asked for DeepSpeed {version}, the probe imported {got}")
        v = judge(ac.role, asdict(ac.case), st["result"], version, args.ranks)
        verdicts.append(v)
        report += _fmt_case(ac, st, v)
    print("\n".join(report))
    print("\nnot audited / assumed (the probe did not use these keys as given):")
    for a in plan.assumed or [{"key": "(none)", "how": "", "detail": "every key was used as given"}]:
        print(f"  {a['key']}: {a['how']}{': ' if a['how'] else ''}{a['detail']}")
    tol = states[0]["result"]["tolerance"]
    if tol > 1e-3:
        print(f"  resolution: in bf16 a mis-weighting below {tol:.0%} cannot be told from rounding")
    clip_used = next(st["result"]["clip"] for ac, st in zip(plan.cases, states, strict=True) if ac.role == "clipping")
    clip_warning = clip_finding(plan, clip_used)
    code = exit_code(verdicts, clip_warning)
    findings = list(dict.fromkeys([v["reason"] for v in verdicts if v["verdict"] != "faithful"]
                                  + ([clip_warning] if clip_warning else [])))
    print(f"\naudit took {seconds:.1f} s ({n} cases, {args.ranks} rank{'s' if args.ranks > 1 else ''})")
    print(f"exit {code}: {EXIT_CODES[code]}" + "".join(f"\n  - {r}" for r in findings))
    if json_out is not None:
        atomic_write_json(json_out, {
            "config": str(args.config), "deepspeed": version, "ranks": args.ranks, "summary": plan.summary,
            "exit_code": code, "exit_meaning": EXIT_CODES[code], "seconds": seconds, "assumed": plan.assumed,
            "clip": {"used": clip_used, "asked": plan.clip_asked, "asked_from": plan.clip_asked_from,
                     "warning": clip_warning},
            "cases": [{"role": ac.role, "label": ac.label, "case": asdict(ac.case), "state": st, **v}
                      for ac, st, v in zip(plan.cases, states, verdicts, strict=True)]})
    return code


def _exit_code_help() -> str:
    return "exit codes (the most severe finding wins; every finding is printed):\n" + "\n".join(
        f"  {code}  {meaning}" for code, meaning in EXIT_CODES.items()) + \
        "\n  130/143  interrupted by SIGINT/SIGTERM (probe processes stopped, temporary folder removed)"


def register(subparsers) -> None:
    import argparse

    p = subparsers.add_parser("audit-deepspeed", help="check that DeepSpeed applies every micro-batch of YOUR config",
                              formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_exit_code_help(),
                              description="Run a few optimizer steps of a probe model under your DeepSpeed config and "
                              "report each micro-batch's weight in the applied gradient, step by step, any gradient "
                              "carried from one optimizer step into the next, and the clip threshold and coefficient "
                              "applied.")
    p.add_argument("config", help="DeepSpeed JSON config (as passed to deepspeed.initialize or the HF Trainer)")
    p.add_argument("--deepspeed-version", default=None,
                   help="run under a pinned DeepSpeed (0.18.9: the repo's .venv-ds0189 overlay or "
                   "$GRADFIDELITY_DS0189) instead of the one this environment imports")
    p.add_argument("--ranks", type=int, default=1, help="data-parallel CPU ranks (gloo processes), any N >= 1")
    p.add_argument("--world-size", type=int, default=None,
                   help="data-parallel size of YOUR run, used only to derive a missing gradient_accumulation_steps "
                   "from train_batch_size (default: --ranks)")
    p.add_argument("--gradient-accumulation-steps", type=int, default=None,
                   help="GA to probe (needed when the config says \"auto\")")
    p.add_argument("--micro-batch-size", type=int, default=None)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default=None)
    p.add_argument("--backward-per-step", type=int, default=1,
                   help="backward() calls per micro-step in your loop (K > 1 audits the multi-backward pattern at "
                   "GA 1; needs --boundary)")
    p.add_argument("--boundary", choices=["manual", "none", "both"], default=None,
                   help="with --backward-per-step K > 1: your loop calls engine.set_gradient_accumulation_boundary "
                   "before each backward (manual), or not (none); both audits the two patterns, each deciding")
    p.add_argument("--max-grad-norm", type=float, default=None,
                   help="the clipping threshold your run asks for (the Trainer's max_grad_norm; 0: none), compared "
                   "with the one DeepSpeed applies (default: the config's gradient_clipping, else none)")
    p.add_argument("--steps", type=int, default=3, help="consecutive optimizer steps to audit (>= 2 to see a leak)")
    p.add_argument("--json", default=None, help="also write the result (cases, verdicts, assumed keys) here")
    p.set_defaults(func=run)
