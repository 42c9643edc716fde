"""Verdicts: apply each registry row's check to the value its study measured.

Three verdicts only: "reproduced", "not reproduced", "not measured at this scale". A claim is "not measured" when
the current scale is outside its `scales`, when its study produced no evidence file, or when the study could not
measure it (a null value, e.g. a diverged run or too few seeds; the detail says why). Nothing here can turn a missing
number into a pass.
"""

from __future__ import annotations

import math
from importlib import resources
from pathlib import Path

import jsonschema
import pandas as pd
import yaml

from gradfidelity.errors import UserError
from gradfidelity.harness.io import read_json

REPRODUCED, NOT_REPRODUCED, NOT_MEASURED = "reproduced", "not reproduced", "not measured at this scale"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, NOT_MEASURED)
SCALES = ("smoke", "cpu", "paper")

_CHECK = {
    "type": "object", "required": ["kind"], "additionalProperties": False,
    "properties": {
        "kind": {"enum": ["gt", "ge", "lt", "le", "between", "equals", "true"]},
        "threshold": {"type": "number"},
        "range": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2},
        "value": {},
    },
}
_ROW = {
    "type": "object", "additionalProperties": False,
    "required": ["id", "study", "paper", "statement", "paper_value", "metric", "check", "scales", "why"],
    "properties": {
        "id": {"type": "string"}, "study": {"type": "string"}, "paper": {"type": "string"},
        "statement": {"type": "string"}, "paper_value": {"type": "string"}, "metric": {"type": "string"},
        "check": _CHECK, "why": {"type": "string"},
        "scales": {"type": "array", "items": {"enum": list(SCALES)}, "minItems": 1},
    },
}
_REGISTRY = {"type": "object", "required": ["claims"], "properties": {"claims": {"type": "array", "items": _ROW}}}


def load_registry(path: str | Path | None = None) -> list[dict]:
    text = Path(path).read_text() if path else resources.files("gradfidelity.claims").joinpath(
        "registry.yaml").read_text()
    data = yaml.safe_load(text)
    try:
        jsonschema.validate(data, _REGISTRY)
    except jsonschema.ValidationError as exc:
        raise UserError(f"claims registry: {exc.message} at {'/'.join(map(str, exc.absolute_path))}") from None
    ids = [row["id"] for row in data["claims"]]
    dupes = {i for i in ids if ids.count(i) > 1}
    if dupes:
        raise UserError(f"claims registry: duplicate ids {sorted(dupes)}")
    for row in data["claims"]:
        kind, check = row["check"]["kind"], row["check"]
        need = {"between": "range", "equals": "value", "true": None}.get(kind, "threshold")
        if need and need not in check:
            raise UserError(f"claims registry: claim {row['id']} check '{kind}' needs '{need}'")
    return data["claims"]


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def apply_check(check: dict, measured) -> bool:
    """True iff `measured` satisfies `check`; a type that does not fit the check is an error, not a fail."""
    kind = check["kind"]
    if kind == "true":
        if not isinstance(measured, bool):
            raise ValueError(f"check 'true' needs a boolean, got {measured!r}")
        return measured
    if kind == "equals":
        return measured == check["value"]
    if not _is_number(measured):
        raise ValueError(f"check '{kind}' needs a finite number, got {measured!r}")
    if kind == "between":
        lo, hi = check["range"]
        return lo <= measured <= hi
    t = check["threshold"]
    return {"gt": measured > t, "ge": measured >= t, "lt": measured < t, "le": measured <= t}[kind]


def describe_check(check: dict) -> str:
    kind = check["kind"]
    if kind == "true":
        return "is true"
    if kind == "equals":
        return f"== {check['value']}"
    if kind == "between":
        return f"in [{check['range'][0]}, {check['range'][1]}]"
    return {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}[kind] + f" {check['threshold']}"


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
        evidence[record["study"]] = record
    return evidence


def verify(registry: list[dict], evidence: dict[str, dict], scale: str) -> pd.DataFrame:
    rows = []
    for claim in registry:
        value = evidence.get(claim["study"], {}).get("values", {}).get(claim["id"])
        measured, detail = (value or {}).get("measured"), (value or {}).get("detail", "")
        if scale not in claim["scales"]:
            verdict, detail = NOT_MEASURED, f"measurable at {', '.join(claim['scales'])} only"
        elif claim["study"] not in evidence:
            verdict, detail = NOT_MEASURED, f"study '{claim['study']}' produced no evidence"
        elif value is None:
            verdict, detail = NOT_MEASURED, f"study '{claim['study']}' reported no value for {claim['id']}"
        elif measured is None:
            verdict = NOT_MEASURED
        else:
            verdict = REPRODUCED if apply_check(claim["check"], measured) else NOT_REPRODUCED
        rows.append({
            "id": claim["id"], "study": claim["study"], "paper": claim["paper"], "statement": claim["statement"],
            "paper_value": claim["paper_value"], "metric": claim["metric"],
            "check": describe_check(claim["check"]), "measured": measured, "n": (value or {}).get("n"),
            "detail": detail, "verdict": verdict, "scale": scale,
        })
    return pd.DataFrame(rows)
