"""The power table (`gradfidelity power --scale cpu`): for every claim (and part) the n at which its verdict is
decided, with the cost in wall time, planned before the run that sets it.

Each evidence record (or part) may carry `power` (claims.evidence.POWER_SCHEMA): the per-seed values whose mean's
t interval decides it, the threshold or band that interval must clear, its level and the wall seconds one more seed
costs on 2 cores. From them the table prints the deciding statistic, its per-seed sd, the measured effect (and the
paper's, where the study converts it onto the statistic's scale), the current n, the probability that the verdict
is decided now, and N: the smallest n at which it is decided (reproduced or not reproduced) with 80% probability when
the measured mean and sd are the truth (stats.power). N moves with the sd, so the table also gives N over the sd's
own 95% interval. Past `stats.power.CAP` seeds it reads "> CAP": no plan at this scale.

The data flow is one way: evidence -> power table -> claims report (`verify` reads power.csv to say "n = k of the N
its power needs"); the table never reads a verdict. A power record that does not describe its claim's verdict (its
side against the registry's check, its n, its level, its interval where it is on the check's own scale) is an error.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from gradfidelity.claims.registry import load_registry
from gradfidelity.claims.verify import load_evidence
from gradfidelity.errors import UserError
from gradfidelity.harness.io import atomic_write_csv, atomic_write_text
from gradfidelity.stats.intervals import t_interval
from gradfidelity.stats.power import (
    BANDS,
    CAP,
    TARGET_POWER,
    decision_probability,
    expected_verdict,
    sd_interval,
    seeds_to_decide,
)
from gradfidelity.tables import markdown

PLANNED, NOT_APPLICABLE, NO_POWER, NO_EVIDENCE, ONE_SEED, STALE = (
    "planned", "not applicable", "no power record", "no evidence", "one seed: no sd", "stale evidence")
# the power side each registry check kind is decided on (a check of another kind has no power side)
SIDE_OF_KIND = {"gt": "gt", "ge": "gt", "lt": "lt", "le": "lt", "outside": "outside", "between": "inside"}
COLUMNS = ["id", "claim", "part", "status", "statistic", "unit", "side", "threshold", "level", "n", "mean", "sd",
           "effect_size", "paper_effect", "power_now", "n_needed", "n_needed_text", "n_needed_sd_low",
           "n_needed_sd_high", "n_needed_paper", "decides", "seeds_to_add", "wall_s_per_seed", "added_wall_h", "note"]


def needed_text(n: int | None, cap: int = CAP) -> str:
    return f"> {cap}" if n is None else str(n)


def _same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def _check_threshold(check: dict | None):
    """The registry's threshold (a number) or band ([lo, hi]) of a numeric check; None for any other."""
    if not check:
        return None
    if check["kind"] in ("between", "outside"):
        return [float(v) for v in check["range"]]
    return float(check["threshold"]) if "threshold" in check else None


def _validate(where: str, power: dict, rec: dict, check: dict | None) -> None:
    """Loud errors for a power record that does not describe the verdict it plans."""
    for key in ("per_seed", "threshold", "side", "level"):
        if key not in power:
            raise UserError(f"power record of {where} lacks '{key}' (or `not_applicable` with a reason)")
    band = power["side"] in BANDS
    if band != isinstance(power["threshold"], list) or (band and len(power["threshold"]) != 2):
        raise UserError(f"power record of {where}: side '{power['side']}' needs "
                        f"{'[lo, hi]' if band else 'one threshold'}, got {power['threshold']!r}")
    want = SIDE_OF_KIND.get(check["kind"]) if check else None
    if want and power["side"] != want:
        raise UserError(f"power record of {where}: side '{power['side']}' but the registry's check is "
                        f"'{check['kind']}' (side '{want}')")
    per_seed = power["per_seed"]
    if rec.get("n") is not None and len(per_seed) != rec["n"]:
        raise UserError(f"power record of {where}: {len(per_seed)} per-seed values but the record's n is {rec['n']}")
    if rec.get("exact") or rec.get("low") is None:
        return
    if rec.get("level") is not None and not _same(power["level"], rec["level"]):
        raise UserError(f"power record of {where}: level {power['level']} but the record's interval is at "
                        f"{rec['level']}")
    if power["threshold"] == _check_threshold(check) and len(per_seed) >= 2:
        # on the check's own scale: the per-seed values must give the very interval the verdict is decided on
        iv = t_interval(per_seed, power["level"])
        if not (_same(iv.low, rec["low"]) and _same(iv.high, rec["high"])):
            raise UserError(f"power record of {where}: the t interval of its per-seed values [{iv.low:.6g}, "
                            f"{iv.high:.6g}] is not the record's [{rec['low']:.6g}, {rec['high']:.6g}]")


def plan_row(where: str, claim: str, part: str, power: dict, rec: dict, check: dict | None,
             cap: int = CAP) -> dict:
    """One row of the table: the plan of one power record (a claim's or a part's)."""
    row = {"id": where, "claim": claim, "part": part, "statistic": power["statistic"], "unit": power.get("unit", ""),
           "note": power.get("note", "")}
    if "not_applicable" in power:
        return {**row, "status": NOT_APPLICABLE, "note": power["not_applicable"]}
    _validate(where, power, rec, check)
    x = np.asarray(power["per_seed"], dtype=float)
    if not np.isfinite(x).all():
        raise UserError(f"power record of {where}: non-finite per-seed values")
    threshold, side, level = power["threshold"], power["side"], float(power["level"])
    row.update(side=side, threshold=threshold, level=level, n=len(x), mean=float(x.mean()) if len(x) else None,
               paper_effect=power.get("paper_effect"), wall_s_per_seed=power.get("wall_s_per_seed"))
    if len(x) < 2:
        return {**row, "status": ONE_SEED}
    sd, n = float(x.std(ddof=1)), len(x)
    lo, hi = (threshold, threshold) if side not in BANDS else threshold
    # the distance to the nearer end in sd units: positive on the claim's side for gt and outside
    dist = min(abs(row["mean"] - lo), abs(row["mean"] - hi))
    sign = 1 if expected_verdict(row["mean"], threshold, side) == "reproduced" else -1
    need = seeds_to_decide(row["mean"], sd, threshold, side, level, cap=cap)
    sd_lo, sd_hi = sd_interval(sd, n) if sd > 0 else (0.0, 0.0)
    paper = row["paper_effect"]
    add = None if need is None else max(need - n, 0)
    wall = row["wall_s_per_seed"]
    row.update(
        status=PLANNED, sd=sd, effect_size=sign * dist / sd if sd > 0 else None,
        power_now=float(decision_probability(row["mean"], sd, n, threshold, side, level)) if sd > 0 else None,
        n_needed=need, n_needed_text=needed_text(need, cap),
        n_needed_sd_low=needed_text(seeds_to_decide(row["mean"], sd_lo, threshold, side, level, cap=cap), cap),
        n_needed_sd_high=needed_text(seeds_to_decide(row["mean"], sd_hi, threshold, side, level, cap=cap), cap),
        n_needed_paper=("" if paper is None else
                        needed_text(seeds_to_decide(float(paper), sd, threshold, side, level, cap=cap), cap)),
        decides=expected_verdict(row["mean"], threshold, side),
        seeds_to_add=add if add is not None else f"> {cap - n}",
        added_wall_h=(None if wall is None else
                      (f"{add * wall / 3600:.1f}" if add is not None else f"> {(cap - n) * wall / 3600:.0f}")))
    return row


def power_table(registry: list[dict], evidence: dict[str, dict], cap: int = CAP) -> pd.DataFrame:
    """One row per power record of every measured claim (and part), in registry order; a claim with none gets one
    row that says so."""
    rows = []
    for claim in registry:
        if claim["evidence"] != "measured":
            continue
        cid = claim["id"]
        study = evidence.get(claim["study"]) or {}
        rec = (study.get("values") or {}).get(cid)
        if rec is None:
            rows.append({"id": cid, "claim": cid, "part": "", "status": NO_EVIDENCE})
            continue
        if study.get("evidence_version", 1) < claim["evidence_version"]:  # computed for the claim's old metric
            rows.append({"id": cid, "claim": cid, "part": "", "status": STALE,
                         "note": f"evidence version {study.get('evidence_version', 1)}, the registry's "
                                 f"{claim['evidence_version']}: rebuild the study's claims"})
            continue
        check = claim["check"] if claim["check"]["kind"] != "true" else None
        planned = []
        if "power" in rec:
            planned.append(plan_row(cid, cid, "", rec["power"], rec, check, cap))
        part_checks = claim["check"].get("parts") or {}
        for name, part in (rec.get("parts") or {}).items():
            if "power" in part:
                planned.append(plan_row(f"{cid}.{name}", cid, name, part["power"], part, part_checks.get(name), cap))
        rows += planned or [{"id": cid, "claim": cid, "part": "", "status": NO_POWER}]
    return pd.DataFrame(rows, columns=COLUMNS)


def _num(value, fmt: str = ".3g") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value == "":
        return ""
    return format(value, fmt) if isinstance(value, float) else str(value)


def _threshold_text(side, threshold) -> str:
    if side in BANDS:
        return f"{side} [{_num(float(threshold[0]))}, {_num(float(threshold[1]))}]"
    return {"gt": "> ", "lt": "< "}[side] + _num(float(threshold))


def _note(r: dict) -> str:
    return r["note"] if isinstance(r["note"], str) else ""


def shown(df: pd.DataFrame) -> pd.DataFrame:
    """The table for a reader: one row per claim or part, the numbers rounded; a row that is not planned says why
    (its status). The records' notes go below the table (`row_notes`)."""
    out = []
    for r in df.to_dict("records"):
        what = r["statistic"] if isinstance(r["statistic"], str) else ""
        if isinstance(r["unit"], str) and r["unit"]:
            what += f" ({r['unit']})"
        row = dict.fromkeys(["claim", "deciding statistic", "decided on", "n", "mean", "per-seed sd", "paper",
                             "P(decided) now", f"N for {TARGET_POWER:.0%}", "N over the sd's 95% CI",
                             "N at the paper's", "decides", "+ seeds", "+ wall h (2 cores)"], "")
        row.update({"claim": r["id"], "deciding statistic": what})
        if r["status"] != PLANNED:
            row.update({"n": _num(r["n"]) if r["status"] == ONE_SEED else "",
                        f"N for {TARGET_POWER:.0%}": r["status"]})
            out.append(row)
            continue
        row.update({
            "decided on": f"{100 * r['level']:g}% CI {_threshold_text(r['side'], r['threshold'])}",
            "n": str(int(r["n"])), "mean": _num(r["mean"], ".4g"), "per-seed sd": _num(r["sd"], ".3g"),
            "paper": _num(r["paper_effect"], ".4g"), "P(decided) now": _num(r["power_now"], ".0%"),
            f"N for {TARGET_POWER:.0%}": r["n_needed_text"],
            "N over the sd's 95% CI": f"{r['n_needed_sd_low']} to {r['n_needed_sd_high']}",
            "N at the paper's": _num(r["n_needed_paper"]), "decides": r["decides"],
            "+ seeds": _num(r["seeds_to_add"]), "+ wall h (2 cores)": _num(r["added_wall_h"]) or "unknown"})
        out.append(row)
    return pd.DataFrame(out)


def row_notes(df: pd.DataFrame) -> list[str]:
    """'id: note' for every row with a note (the study's words: what the paper's effect is, how the wall time of a
    seed was measured; a not-applicable record's reason)."""
    return [f"{r['id']}: {_note(r)}" for r in df.to_dict("records") if _note(r)]


def notes(df: pd.DataFrame, scale: str, cap: int = CAP) -> list[str]:
    planned = df[df["status"] == PLANNED]
    return [
        f"Scale: {scale}. {len(planned)} power records planned; "
        + ", ".join(f"{int((df['status'] == s).sum())} {s}"
                    for s in (NOT_APPLICABLE, NO_POWER, NO_EVIDENCE, ONE_SEED, STALE) if (df["status"] == s).any())
        + ".",
        "Each claim is decided on the two-sided t interval of its deciding statistic's mean over seeds (the level and "
        "threshold or band in 'decided on'): decided, reproduced or not reproduced, when the interval clears the "
        "threshold on either side, or lies wholly outside or wholly inside the band.",
        f"N for {TARGET_POWER:.0%}: the smallest n at which the verdict is decided with {TARGET_POWER:.0%} probability "
        "when the measured mean and per-seed sd are the truth: the two-sided t test's power (statsmodels TTestPower) "
        "against one threshold; against a band the noncentral t tails (scipy.stats.nct) plus the probability of an "
        "interval wholly inside it (integrated over the sd's chi-square law). 'decides': the verdict it would then "
        "read. P(decided) now: the same probability at the current n.",
        "N over the sd's 95% CI: N with the sd at the ends of its own chi-square interval (the plan's uncertainty). "
        "N at the paper's: N at the paper's effect, converted onto the statistic's scale, with the measured sd.",
        f"N is capped at {cap} seeds: '> {cap}' means no plan at this scale (a mean at or near its threshold). "
        "+ seeds and + wall h: the seeds to add to reach N and their wall time on 2 cores, from the committed "
        "per-run wall times (the study's wall_s_per_seed).",
    ]


def power_markdown(df: pd.DataFrame, scale: str, cap: int = CAP) -> str:
    body = ["# Power: the n each claim's verdict needs", "", *[f"- {n}" for n in notes(df, scale, cap)], "",
            markdown(shown(df))]
    if row_notes(df):
        body += ["", "Notes of the rows:", "", *[f"- {n}" for n in row_notes(df)]]
    return "\n".join(body) + "\n"


def write_power_table(evidence_paths, csv_path, md_path, scale: str, cap: int = CAP,
                      registry: list[dict] | None = None) -> pd.DataFrame:
    """power.csv (every column) and power.md (the reader's table with its notes), where given; `registry`: the
    packaged one unless a test gives its own."""
    df = power_table(load_registry() if registry is None else registry, load_evidence(evidence_paths, scale), cap)
    if csv_path:
        atomic_write_csv(df, csv_path)
    if md_path:
        atomic_write_text(md_path, power_markdown(df, scale, cap))
    return df


def read_power_csv(path) -> dict[str, dict]:
    """id -> the planned row (n, mean, n_needed, n_needed_text) of a power.csv, for `verify`."""
    df = pd.read_csv(path, dtype={"n_needed_text": str})
    missing = {"id", "status", "n", "mean", "n_needed", "n_needed_text"} - set(df.columns)
    if missing:
        raise UserError(f"{path}: no column(s) {sorted(missing)}: not a power table")
    planned = df[df["status"] == PLANNED]
    return {r["id"]: {"n": int(r["n"]), "mean": float(r["mean"]),
                      "n_needed": None if pd.isna(r["n_needed"]) else int(r["n_needed"]),
                      "n_needed_text": str(r["n_needed_text"])} for r in planned.to_dict("records")}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The subcommand's arguments (cli.py spells the same ones inline, so that building its parser imports no
    statistics)."""
    p.add_argument("--scale", required=True)
    p.add_argument("--evidence", nargs="*", default=None,
                   help="results/<scale>/claims/<study>.json files (default: every one under results/<scale>/claims)")
    p.add_argument("--csv", default=None, help="write the table here (e.g. paper_tables/<scale>/power.csv)")
    p.add_argument("--md", default=None, help="write the table here (e.g. paper_tables/<scale>/power.md)")
    p.add_argument("--cap", type=int, default=None, help=f"the largest N planned (default {CAP})")


def run(args) -> int:
    """`gradfidelity power`: print the table, and write it where --csv / --md say."""
    cap = args.cap or CAP
    paths = args.evidence if args.evidence is not None else sorted(Path("results", args.scale, "claims").glob("*.json"))
    if not paths:
        raise UserError(f"no claim evidence under results/{args.scale}/claims (run the studies' claims rules first)")
    df = write_power_table(paths, args.csv, args.md, args.scale, cap)
    print(power_markdown(df, args.scale, cap), end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gradfidelity power", description=__doc__.splitlines()[0])
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        return run(args)
    except UserError as exc:
        print(f"gradfidelity power: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
