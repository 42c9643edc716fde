"""Verdicts: each registry row's check applied to the *interval* its study measured (claims/evidence.py).

- reproduced: the whole interval satisfies the check;
- not reproduced: the whole interval contradicts it;
- inconclusive: the interval spans the threshold (the evidence cannot tell);
  against a band (kinds between and outside) the interval must lie wholly inside or wholly outside the band to
  decide; one that straddles an end is inconclusive;
- not measured at this scale: the scale is outside the claim's `scales`, the study produced no record, the value
  is null, n < min_n, or a gate failed; the reason is always shown.
A check of kind "true" with parts is the AND of its parts, each judged like a claim of its own (its record's own
gates, value, n and check; the claim's gates apply to every part): one part not reproduced makes the claim not
reproduced, else one part not measured makes it not measured (the reason names the missing parts and lists the
decided ones), else every part reproduced makes it reproduced and anything else inconclusive.
Rows of `evidence: arithmetic` recompute a paper's own numbers (no experiment): they read "arithmetic checked" or
"arithmetic mismatch" and are never counted among reproductions. Nothing here turns a missing number into a pass.
"""

from __future__ import annotations

import math
from pathlib import Path

import jsonschema
import pandas as pd

from gradfidelity.claims.evidence import RECORD_SCHEMA
from gradfidelity.claims.registry import (
    KINDS,
    SCALES,
    describe_check,
    load_registry,
    load_registry_document,
)
from gradfidelity.claims.verdict import (
    ARITHMETIC_BAD,
    ARITHMETIC_OK,
    INCONCLUSIVE,
    NOT_MEASURED,
    NOT_REPRODUCED,
    REPRODUCED,
    VERDICTS,
    Verdict,
)
from gradfidelity.errors import UserError
from gradfidelity.harness.io import read_json

# The registry's and the verdicts' names stay importable from here (their public path before they had modules).
__all__ = ["ARITHMETIC_BAD", "ARITHMETIC_OK", "INCONCLUSIVE", "KINDS", "NOT_MEASURED", "NOT_REPRODUCED", "REPRODUCED",
           "SCALES", "VERDICTS", "Verdict", "describe_check", "host_types", "interval_verdict", "judge",
           "load_evidence", "load_registry", "load_registry_document", "verify"]


def _holds(kind: str, check: dict, x: float) -> bool:
    if kind == "between":
        return check["range"][0] <= x <= check["range"][1]
    if kind == "equals":
        return x == check["value"]
    t = check["threshold"]
    return {"gt": x > t, "ge": x >= t, "lt": x < t, "le": x <= t}[kind]


def interval_verdict(check: dict, low: float, high: float) -> str:
    """The verdict of a numeric check on the closed interval [low, high] (low == high for an exact value)."""
    if not (math.isfinite(low) and math.isfinite(high)) or low > high:
        raise ValueError(f"bad interval [{low}, {high}]")
    kind = check["kind"]
    if kind == "between":
        a, b = check["range"]
        if a <= low and high <= b:
            return REPRODUCED
        return NOT_REPRODUCED if high < a or low > b else INCONCLUSIVE
    if kind == "outside":  # the mirror of between: a claim of non-equivalence (C9: not within +-0.005)
        a, b = check["range"]
        if high < a or low > b:
            return REPRODUCED
        return NOT_REPRODUCED if a <= low and high <= b else INCONCLUSIVE
    if kind == "equals":
        v = check["value"]
        if low == high == v:
            return REPRODUCED
        return NOT_REPRODUCED if v < low or v > high else INCONCLUSIVE
    # one-sided: the check holds on a whole interval iff it holds at the end nearer the threshold
    near, far = (low, high) if kind in ("gt", "ge") else (high, low)
    if _holds(kind, check, near):
        return REPRODUCED
    return INCONCLUSIVE if _holds(kind, check, far) else NOT_REPRODUCED


def _record_verdict(check: dict, rec: dict, claim_id: str, level: float) -> tuple[str, str]:
    """Verdict and reason of one record against a check without parts (a part's own check, or the claim's)."""
    if check["kind"] == "true":
        if check.get("parts"):
            raise ValueError(f"claim {claim_id}: a check with parts is judged by _parts_verdict")
        est = rec.get("estimate")
        if est is None:
            return NOT_MEASURED, rec.get("detail") or "no value"
        if not isinstance(est, bool) or not rec.get("exact"):
            raise UserError(f"claim {claim_id}: a check of kind 'true' without parts needs an exact boolean "
                            f"estimate, got {est!r} (exact={rec.get('exact')})")
        return (REPRODUCED if est else NOT_REPRODUCED), ""
    est = rec.get("estimate")
    if est is None:
        return NOT_MEASURED, rec.get("detail") or "no value"
    if isinstance(est, bool):
        raise UserError(f"claim {claim_id}: check '{check['kind']}' needs a number, got {est!r}")
    if rec.get("exact"):
        low = high = est
        if rec.get("low") not in (None, est) or rec.get("high") not in (None, est):
            raise UserError(f"claim {claim_id}: an exact value must have a zero-width interval")
    else:
        low, high = rec.get("low"), rec.get("high")
        if low is None or high is None:
            return NOT_MEASURED, f"no interval (n = {rec['n']})"
        if rec.get("level") != level:
            raise UserError(f"claim {claim_id}: interval level {rec.get('level')} differs from the registry's {level}")
        if not low <= est <= high:
            raise UserError(f"claim {claim_id}: estimate {est} outside its interval [{low}, {high}]")
    return interval_verdict(check, low, high), ""


def _part_verdicts(claim: dict, rec: dict, scale: str) -> dict[str, tuple[str, str]]:
    """part name -> (verdict, reason), each part judged as a claim of its own."""
    checks = claim["check"]["parts"]
    got = rec.get("parts") or {}
    missing = sorted(set(checks) - set(got))
    if missing:
        raise UserError(f"claim {claim['id']}: evidence lacks the registry's parts {missing}")
    return {name: judge(dict(claim, id=f"{claim['id']}.{name}", check=check, evidence="measured"), got[name], True,
                        scale)
            for name, check in checks.items()}


def _parts_verdict(claim: dict, rec: dict, scale: str) -> tuple[str, str]:
    """A check of kind "true" with parts is the AND of its parts. Each part is judged as a claim of its own: its
    record's own gates (the claim's gates, shared by every part, are checked before), its value, its n against the
    claim's min_n, and its check. An AND with a false part is false, so one part not reproduced decides the claim
    whatever the others' state; otherwise one part not measured leaves the claim not measured, and the reason names
    the missing parts and lists the decided ones with their verdicts (the evidence file is not the only place a
    decided part shows). Every part reproduced: reproduced; else inconclusive."""
    verdicts = _part_verdicts(claim, rec, scale)
    unmeasured = {name: why for name, (v, why) in verdicts.items() if v == NOT_MEASURED}
    decided = {name: v for name, (v, _) in verdicts.items() if v != NOT_MEASURED}
    if NOT_REPRODUCED in decided.values():
        return NOT_REPRODUCED, "; ".join(f"{name}: {v}" + (f" ({why})" if v == NOT_MEASURED else "")
                                         for name, (v, why) in verdicts.items())
    if unmeasured:
        if not decided and len(unmeasured) > 1 and len(set(unmeasured.values())) == 1:
            return NOT_MEASURED, next(iter(unmeasured.values()))  # one reason for the whole claim (n < min_n)
        why = "; ".join(f"part {name}: {why}" for name, why in unmeasured.items())
        if decided:
            why += "; decided: " + ", ".join(f"{name} {v}" for name, v in decided.items())
        return NOT_MEASURED, why
    why = "; ".join(f"{name}: {v}" for name, v in decided.items())
    return (REPRODUCED if all(v == REPRODUCED for v in decided.values()) else INCONCLUSIVE), why


def load_evidence(paths: list[str | Path], scale: str) -> dict[str, dict]:
    """study -> evidence record; an evidence file from another scale is refused (stale results)."""
    evidence = {}
    for path in paths:
        record = read_json(path)
        for key in ("study", "scale", "values"):
            if key not in record:
                raise UserError(f"claim evidence {path} lacks '{key}'")
        if record["scale"] != scale:
            raise UserError(f"claim evidence {path} was made at scale '{record['scale']}', not '{scale}'")
        for cid, rec in record["values"].items():
            try:
                jsonschema.validate(rec, RECORD_SCHEMA)
            except jsonschema.ValidationError as exc:
                where = "/".join(map(str, exc.absolute_path))
                raise UserError(f"claim evidence {path}: {cid}: {exc.message} at '{where}'") from None
        evidence[record["study"]] = dict(record, path=str(path))
    return evidence


def judge(claim: dict, rec: dict | None, evidence_present: bool, scale: str,
          evidence_version: int | None = None) -> tuple[str, str]:
    """(verdict, reason) for one registry row and the record its study wrote (None if none). `evidence_version`: the
    version the evidence file was written at (1 when it names none); below the row's `evidence_version` the record
    was computed for an earlier metric of the claim and is not judged against the current check."""
    if scale not in claim["scales"]:
        return NOT_MEASURED, f"measurable at {', '.join(claim['scales'])} only"
    if not evidence_present:
        return NOT_MEASURED, f"study '{claim['study']}' produced no evidence"
    wanted = claim.get("evidence_version", 1)
    if evidence_version is not None and evidence_version < wanted:
        return NOT_MEASURED, (f"stale evidence: written at evidence version {evidence_version}, but this claim's "
                              f"metric is at version {wanted} (registry); rebuild results/{scale}/claims/"
                              f"{claim['study']}.json from runs made by the current code")
    if rec is None:
        return NOT_MEASURED, f"study '{claim['study']}' reported no value for {claim['id']}"
    failed = [g for g in rec.get("gates") or [] if not g["passed"]]
    if failed:
        return NOT_MEASURED, "gate failed: " + "; ".join(f"{g['name']}: {g['reason']}" for g in failed)
    # a missing value says why in its own words; n < min_n is the reason only when there is something to judge
    if rec.get("estimate") is None and not rec.get("parts"):
        return NOT_MEASURED, rec.get("detail") or "no value"
    if claim["check"]["kind"] == "true" and claim["check"].get("parts"):
        verdict, why = _parts_verdict(claim, rec, scale)
    else:
        for name, part in (rec.get("parts") or {}).items():
            if part.get("estimate") is None:
                return NOT_MEASURED, f"part {name}: {part.get('detail') or 'no value'}"
        if rec["n"] < claim["min_n"]:
            return NOT_MEASURED, f"n = {rec['n']} < min_n = {claim['min_n']}"
        verdict, why = _record_verdict(claim["check"], rec, claim["id"], claim["level"])
    if claim["evidence"] == "arithmetic" and verdict != NOT_MEASURED:
        if verdict == INCONCLUSIVE:
            raise UserError(f"claim {claim['id']}: an arithmetic check must be exact")
        verdict = ARITHMETIC_OK if verdict == REPRODUCED else ARITHMETIC_BAD
    return verdict, why


def _gates_text(rec: dict) -> str:
    """The claim's gates, then each part's own gates under the part's name ("soap: transient=pass"); a part's copy
    of a claim gate is not repeated."""
    def text(gates):
        return [f"{g['name']}={'pass' if g['passed'] else 'FAIL'}" for g in gates]
    shared = rec.get("gates") or []
    out = text(shared)
    for name, part in (rec.get("parts") or {}).items():
        out += [f"{name}: {t}" for t in text([g for g in part.get("gates") or [] if g not in shared])]
    return "; ".join(out)


def parts_text(rec: dict) -> str:
    """A parts record's numbers as one cell, "name est [low, high]; ...", every part whatever the gates say (issue
    46: behind a failed gate, every claim shows its estimate, or none does; a one-number record shows its estimate
    column). Parts with the same numbers are named together once (A8-mech's four parts are one reused number)."""
    groups: dict[str, list[str]] = {}
    for name, part in (rec.get("parts") or {}).items():
        est = part.get("estimate")
        if est is None:
            value = "no value"
        elif part.get("exact") or part.get("low") is None:
            value = f"{est:+.4g}" + (" exact" if part.get("exact") else "")
        else:
            value = f"{est:+.4g} [{part['low']:+.4g}, {part['high']:+.4g}]"
        groups.setdefault(value, []).append(name)
    return "; ".join(f"{', '.join(names)} {value}" for value, names in groups.items())


def host_types(rec: dict) -> list[str]:
    """The host types (provenance.describe_host) of the runs a record reads: its own `hosts` and its parts', once
    each, sorted; empty where the study wrote none."""
    hosts = set(rec.get("hosts") or [])
    for part in (rec.get("parts") or {}).values():
        hosts |= set(part.get("hosts") or [])
    return sorted(hosts)


def _is_open(verdict: str, reason: str) -> bool:
    """A verdict more seeds could decide: inconclusive, or not measured for n < min_n."""
    return verdict == INCONCLUSIVE or (verdict == NOT_MEASURED and "< min_n" in reason)


def _power_shortfalls(claim: dict, rec: dict, scale: str, power: dict[str, dict]) -> list[tuple[str, bool]]:
    """(text, open) for every power record of the claim (or of its parts) whose n is below the N its power table row
    needs: "n = k of the N its power needs", open when the verdict it plans is still open (it then belongs in the
    reason, else in the detail). A power table row that no longer matches its record (another n or mean) is stale:
    an error, not a plan for other data."""
    part_checks = claim["check"].get("parts") or {}
    parts = {f"{claim['id']}.{name}": (name, part, part_checks.get(name))
             for name, part in (rec.get("parts") or {}).items() if "power" in part}
    # where the parts carry their own power records they speak for the claim (its own record repeats the deciding
    # part's), so the shortfall is named once, by part
    records = parts or {claim["id"]: ("", rec, claim["check"])}
    out = []
    for key, (name, part_rec, check) in records.items():
        plan = part_rec.get("power") or {}
        if "per_seed" not in plan or "not_applicable" in plan or len(plan["per_seed"]) < 2:
            continue  # no plan (the table's "one seed" rows: a spread needs two)
        row = power.get(key)
        per_seed = plan["per_seed"]
        if row is None:
            raise UserError(f"claim {key}: the evidence has a power record the power table has no row for: rebuild "
                            f"paper_tables/{scale}/power.csv")
        if row["n"] != len(per_seed) or not math.isclose(row["mean"], sum(per_seed) / len(per_seed),
                                                           rel_tol=1e-9, abs_tol=1e-12):
            raise UserError(f"claim {key}: the power table's row (n = {row['n']}, mean {row['mean']:.6g}) is not its "
                            f"evidence's (n = {len(per_seed)}): rebuild paper_tables/{scale}/power.csv")
        if row["n_needed"] is not None and row["n"] >= row["n_needed"]:
            continue
        needed = row["n_needed_text"].replace("> ", "more than ")
        text = f"n = {row['n']} of the {needed} its power needs"
        if name and check is not None:
            part_open = _is_open(*judge(dict(claim, id=key, check=check, evidence="measured"), part_rec, True, scale))
        else:
            part_open = True
        out.append(((f"part {name}: " if name else "") + text, part_open))
    return out


def _join(text: str, more: list[str]) -> str:
    return "; ".join([t for t in [text, *more] if t])


def verify(registry: list[dict], evidence: dict[str, dict], scale: str,
           power: dict[str, dict] | None = None) -> pd.DataFrame:
    """Every registry row's verdict, reason and numbers. `power`: the power table's planned rows
    (power_table.read_power_csv), whose N a claim below it names ("n = k of the N its power needs"): in its reason
    while its verdict is open (inconclusive, n < min_n), else in its detail; None: no power reading at all."""
    rows = []
    for claim in registry:
        study = evidence.get(claim["study"])
        rec = (study or {}).get("values", {}).get(claim["id"])
        verdict, reason = judge(claim, rec, study is not None, scale,
                                (study or {}).get("evidence_version", 1))
        rec = rec or {}
        n = rec.get("n")
        if verdict == NOT_REPRODUCED and claim["check"].get("parts") and rec.get("parts"):
            # decided by its false parts while another part was not measured: n is that of the decided parts (the
            # record's n is the least over every part, an unmeasured one's included)
            n = min(rec["parts"][name]["n"] for name, (v, _) in _part_verdicts(claim, rec, scale).items()
                    if v != NOT_MEASURED)
        detail = rec.get("detail", "")
        hosts = host_types(rec)
        if len(hosts) > 1:
            detail = _join(detail, [f"its runs come from {len(hosts)} host types ({' | '.join(hosts)})"])
        stale = (study or {}).get("evidence_version", 1) < claim.get("evidence_version", 1)
        if power is not None and rec and not stale:  # the power table plans no stale record either
            short = _power_shortfalls(claim, rec, scale, power)
            claim_open = _is_open(verdict, reason)
            reason = _join(reason, [t for t, part_open in short if claim_open and part_open])
            detail = _join(detail, [t for t, part_open in short if not (claim_open and part_open)])
        rows.append({
            "id": claim["id"], "study": claim["study"], "paper": claim["paper"], "statement": claim["statement"],
            "paper_value": claim["paper_value"], "metric": claim["metric"], "check": describe_check(claim["check"]),
            "evidence": claim["evidence"], "estimate": rec.get("estimate"), "low": rec.get("low"),
            "high": rec.get("high"), "parts": parts_text(rec),
            "level": None if rec.get("exact") else claim["level"],
            "exact": bool(rec.get("exact")), "n": n, "min_n": claim["min_n"],
            "diverged": rec.get("diverged", 0),
            "gates": _gates_text(rec), "hosts": " | ".join(hosts),
            "verdict": verdict, "reason": reason, "detail": detail,
            "sources": " ".join(rec.get("sources") or []), "evidence_file": (study or {}).get("path", ""),
            "scale": scale,
        })
    return pd.DataFrame(rows)
