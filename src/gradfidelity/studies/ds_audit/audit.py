"""`gradfidelity audit-deepspeed`: run the probe under a user's DeepSpeed config and say what DeepSpeed did with it.

Exit codes: 0 every audited case is faithful; 3 some micro-batch is dropped or mis-weighted, or clipping used
another gradient than the full one; 4 the result cannot be decided on this machine (a CPU-only artefact, with the
reason); 2 the config cannot be audited (one line on stderr, no traceback).

Why verdicts name a cause: advice must follow from what the probe established (stage, offload, GA, version and the
measured pattern), never from a fixed sentence. A CPU-only artefact (0.18.9's type-string bucketing, see
`ds_step.cpu_reduce_buckets_work`) is detected from the installed DeepSpeed's own function and reported as
undecidable here, never as dropped or faithful.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from gradfidelity.errors import UserError

EXIT_FAITHFUL, EXIT_UNUSABLE, EXIT_DROPS, EXIT_UNDECIDED = 0, 2, 3, 4
AFFECTED = ((0, 15, 2), (0, 18, 9))  # PR #6550 shipped in 0.15.2, PRs #7967/#7981 fixed it in 0.19.0 (docs/sources.md)
DECIDING = ("accumulation", "clipping", "multi-backward")  # "multi-backward-no-boundary" is reported, not decisive


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


def cause(role: str, case: dict, version: str, ranks: int, steps: list[dict], tol: float, clip_cfg) -> str:
    """Advice derived from what the probe established for a case that is not faithful."""
    affected = AFFECTED[0] <= _v(version) <= AFFECTED[1]
    stage12, offload = case["zero_stage"] in (1, 2), case["offload"] != "none"
    n = case["ga"] * case["backward_calls"]
    pats = [_pattern(s["contributions"], tol) for s in steps]
    over = [s["residual"] > tol + s.get("storage_rounding", 0.0) for s in steps]
    stale = any(over[1:]) and not over[0]
    if role == "multi-backward-no-boundary":
        tail = " (and a gradient from an earlier step reappears in later steps)" if stale else ""
        return ("with gradient_accumulation_steps 1 every backward() is an accumulation boundary unless the loop "
                "calls engine.set_gradient_accumulation_boundary(False) before each backward but the last (the fix "
                f"of open-instruct PR #1498){tail}; mark the boundary, or set gradient_accumulation_steps instead")
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
    if stale:
        return ("a gradient of an earlier optimizer step reappears in a later one (a stale or unzeroed buffer): "
                "do not train with this config as is")
    return f"DeepSpeed {version} does not apply the gradient you asked for with this config: do not train with it as is"


def judge(role: str, case: dict, result: dict, version: str, ranks: int) -> dict:
    """Verdict of one case: {"verdict": faithful|dropped|mis-weighted|clipping|undecidable, "reason", "deciding"}."""
    tol = result["tolerance"]
    why = cpu_artefact(case, result, ranks)
    if why:
        return {"verdict": "undecidable", "reason": why, "deciding": role in DECIDING}
    if result["faithful"]:
        return {"verdict": "faithful", "reason": "", "deciding": role in DECIDING}
    dropped = any(result["dropped"])
    verdict = "clipping" if role == "clipping" and not dropped else ("dropped" if dropped else "mis-weighted")
    return {"verdict": verdict, "deciding": role in DECIDING,
            "reason": cause(role, case, version, ranks, result["per_step"], tol, case["clip"])}


def _fmt_case(ac, st: dict, v: dict, ranks: int) -> list[str]:
    r = st["result"]
    tol = r["tolerance"]
    out = [f"\n[{ac.label}]" + ("" if v["deciding"] else "  (reported, does not set the exit code)")]
    for i, s in enumerate(r["per_step"]):
        norm = "not reported" if s["reported_over_kept"] is None else f"{s['reported_over_kept']:.3f}"
        out.append(f"  step {i + 1}: contributions {fmt_vector(s['contributions'], tol)}"
                   f"  (residual {s['residual']:.1e}; reported norm / norm of the kept micro-batches {norm})")
    if ac.role == "clipping":
        s = r["per_step"][0]
        applied = "n/a" if s["clip_applied"] is None else f"{s['clip_applied']:.3f}"
        out.append(f"  clipping threshold DeepSpeed used: {r['clip']:g}"
                   + (" (the config sets none: this version's default)" if ac.case.clip is None else ""))
        out.append(f"  clip coefficient applied {applied}; the full gradient would give {s['clip_full']:.3f}")
    labels = {"faithful": "FAITHFUL: every micro-batch reached the optimizer with the expected weight",
              "undecidable": "UNDECIDABLE", "dropped": "micro-batches DROPPED " + str(r["dropped"]),
              "mis-weighted": "micro-batches MIS-WEIGHTED", "clipping": "clipping NOT computed on the full gradient"}
    out.append(f"  verdict: {labels[v['verdict']]}" + (f": {v['reason']}" if v["reason"] else ""))
    return out


def run(args) -> int:
    from gradfidelity.studies.ds_audit.userconfig import load_config, plan_audit
    from gradfidelity.studies.ds_audit.versions import env_for, installed_version_noimport
    from gradfidelity.studies.ds_audit.worker import run_group

    try:
        plan = plan_audit(load_config(args.config), args.gradient_accumulation_steps, args.micro_batch_size,
                          args.dtype, args.backward_per_step, args.ranks, args.world_size, args.steps)
        env_for(args.deepspeed_version)  # validates the version / finds the overlay before any work
    except UserError as exc:
        print(f"gradfidelity audit-deepspeed: error: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    version = args.deepspeed_version or installed_version_noimport()
    print(f"Auditing {args.config} under DeepSpeed {version}: {plan.summary}")
    if args.ranks > (os.cpu_count() or 1):
        print(f"  note: {args.ranks} ranks on {os.cpu_count()} cores: slower, same result")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gf-audit-") as tmp:
        # The probe runs in child processes with the requested DeepSpeed first on PYTHONPATH, so this process
        # never imports DeepSpeed.
        with open(Path(tmp) / "log", "w") as log:
            states = run_group([c.case for c in plan.cases], args.ranks, args.deepspeed_version, Path(tmp), log=log)
    seconds = time.perf_counter() - t0
    report, verdicts = [], []
    for ac, st in zip(plan.cases, states, strict=True):
        if st["status"] != "ok":
            print(f"gradfidelity audit-deepspeed: error: DeepSpeed {version} could not run this config "
                  f"({ac.label}): {st['error']}", file=sys.stderr)
            return EXIT_UNUSABLE
        got = st["result"]["extra"].get("deepspeed")
        if got != version:
            print(f"gradfidelity audit-deepspeed: error: asked for DeepSpeed {version}, the probe imported {got}",
                  file=sys.stderr)
            return EXIT_UNUSABLE
        v = judge(ac.role, asdict(ac.case), st["result"], version, args.ranks)
        verdicts.append(v)
        report += _fmt_case(ac, st, v, args.ranks)
    print("\n".join(report))
    print("\nnot audited / assumed (the probe did not use these keys as given):")
    for a in plan.assumed or [{"key": "(none)", "how": "", "detail": "every key was used as given"}]:
        print(f"  {a['key']}: {a['how']}{': ' if a['how'] else ''}{a['detail']}")
    tol = states[0]["result"]["tolerance"]
    if tol > 1e-3:
        print(f"  resolution: in bf16 a mis-weighting below {tol:.0%} cannot be told from rounding")
    deciding = [v for v in verdicts if v["deciding"]]
    if any(v["verdict"] not in ("faithful", "undecidable") for v in deciding):
        code = EXIT_DROPS
    elif any(v["verdict"] == "undecidable" for v in deciding):
        code = EXIT_UNDECIDED
    else:
        code = EXIT_FAITHFUL
    reasons = list(dict.fromkeys(v["reason"] for v in deciding if v["verdict"] != "faithful"))
    print(f"\naudit took {seconds:.1f} s ({len(plan.cases)} cases, {args.ranks} rank{'s' if args.ranks > 1 else ''})")
    print(f"exit {code}: " + ({EXIT_FAITHFUL: "faithful", EXIT_UNDECIDED: "undecidable on this machine",
                               EXIT_DROPS: "the optimizer did not receive the gradient you asked for"}[code])
          + "".join(f"\n  - {r}" for r in reasons))
    if args.json:
        Path(args.json).write_text(json.dumps({
            "config": str(args.config), "deepspeed": version, "ranks": args.ranks, "summary": plan.summary,
            "exit_code": code, "seconds": seconds, "assumed": plan.assumed,
            "cases": [{"role": ac.role, "label": ac.label, "case": asdict(ac.case), "state": st, **v}
                      for ac, st, v in zip(plan.cases, states, verdicts, strict=True)]}, indent=2))
    return code


def register(subparsers) -> None:
    p = subparsers.add_parser("audit-deepspeed", help="check that DeepSpeed applies every micro-batch of YOUR config",
                              description="Run a few optimizer steps of a probe model under your DeepSpeed config and "
                              "report each micro-batch's weight in the applied gradient, step by step, and the clip "
                              "coefficient applied. Exit 0 faithful, 3 dropped or mis-weighted micro-batches (or "
                              "clipping on a partial gradient), 4 undecidable on this machine, 2 unusable config.")
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
                   help="backward() calls per micro-step in your loop (K > 1 audits the multi-backward pattern, "
                   "with and without set_gradient_accumulation_boundary, each its own line)")
    p.add_argument("--steps", type=int, default=3, help="consecutive optimizer steps to audit")
    p.add_argument("--json", default=None, help="also write the result (cases, verdicts, assumed keys) here")
    p.set_defaults(func=run)
