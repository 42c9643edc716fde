"""The claims registry (registry.yaml and registry/<study>.yaml): every paper claim as one row, its check, scales,
min_n and interval level.

Loaded and checked here, apart from `verify` (which judges evidence) and `evidence` (which builds it): both read the
registry, neither imports the other for it.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path

import jsonschema
import yaml

from gradfidelity.errors import UserError

SCALES = ("smoke", "cpu", "paper")
# between: the value lies in the closed band `range`; outside: it lies outside it (a claim of non-equivalence, C9)
KINDS = ("gt", "ge", "lt", "le", "between", "outside", "equals", "true")
BAND_KINDS = ("between", "outside")

_PART = {
    "type": "object", "required": ["kind"], "additionalProperties": False,
    "properties": {
        "kind": {"enum": [k for k in KINDS if k != "true"]},
        "threshold": {"type": "number"},
        "range": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2},
        "value": {"type": "number"},
    },
}
_CHECK = {**_PART, "properties": {**_PART["properties"], "kind": {"enum": list(KINDS)},
                                  "parts": {"type": "object", "additionalProperties": _PART, "minProperties": 1}}}
_ROW = {
    "type": "object", "additionalProperties": False,
    "required": ["id", "study", "paper", "statement", "paper_value", "metric", "check", "scales", "why", "min_n"],
    "properties": {
        "id": {"type": "string"}, "study": {"type": "string"}, "paper": {"type": "string"},
        "statement": {"type": "string"}, "paper_value": {"type": "string"}, "metric": {"type": "string"},
        "check": _CHECK, "why": {"type": "string"},
        "scales": {"type": "array", "items": {"enum": list(SCALES)}, "minItems": 1},
        "min_n": {"type": "integer", "minimum": 1},
        "level": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
        "evidence": {"enum": ["measured", "arithmetic"]},
        "evidence_version": {"type": "integer", "minimum": 1},
    },
}
_REGISTRY = {
    "type": "object", "required": ["interval_level", "claims"], "additionalProperties": False,
    "properties": {"interval_level": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
                   "claims": {"type": "array", "items": _ROW}},
}
# registry.yaml names the studies whose rows live in registry/<study>.yaml (one file a study, so that each study's
# rows are edited apart from the others'); a single-file registry (a test's, `path`) holds its rows in `claims`.
_STUDY_FILE = {"type": "object", "required": ["claims"], "additionalProperties": False,
               "properties": {"claims": {"type": "array", "items": _ROW}}}


def _packaged_document() -> dict:
    """registry.yaml with the rows of every study file it lists, in its order, as one document."""
    root = resources.files("gradfidelity.claims")
    doc = yaml.safe_load(root.joinpath("registry.yaml").read_text())
    claims = list(doc.pop("claims", None) or [])
    for study in doc.pop("studies", []):
        name = f"registry/{study}.yaml"
        part = yaml.safe_load(root.joinpath(name).read_text())
        try:
            jsonschema.validate(part, _STUDY_FILE)
        except jsonschema.ValidationError as exc:
            raise UserError(f"claims registry {name}: {exc.message} at "
                            f"{'/'.join(map(str, exc.absolute_path))}") from None
        wrong = sorted({row["id"] for row in part["claims"] if row["study"] != study})
        if wrong:
            raise UserError(f"claims registry {name}: rows of another study: {', '.join(wrong)}")
        claims += part["claims"]
    return {**doc, "claims": claims}


def _check_needs(where: str, check: dict) -> None:
    kind = check["kind"]
    need = {"between": "range", "outside": "range", "equals": "value", "true": None}.get(kind, "threshold")
    if need and need not in check:
        raise UserError(f"claims registry: {where} check '{kind}' needs '{need}'")
    if kind in BAND_KINDS and not check["range"][0] <= check["range"][1]:
        raise UserError(f"claims registry: {where} range {check['range']} is not ordered")
    for name, part in (check.get("parts") or {}).items():
        if kind != "true":
            raise UserError(f"claims registry: {where} has parts but kind '{kind}' (parts need kind 'true')")
        _check_needs(f"{where} part {name}", part)


def load_registry_document(path: str | Path | None = None) -> dict:
    data = yaml.safe_load(Path(path).read_text()) if path else _packaged_document()
    try:
        jsonschema.validate(data, _REGISTRY)
    except jsonschema.ValidationError as exc:
        raise UserError(f"claims registry: {exc.message} at {'/'.join(map(str, exc.absolute_path))}") from None
    ids = [row["id"] for row in data["claims"]]
    dupes = {i for i in ids if ids.count(i) > 1}
    if dupes:
        raise UserError(f"claims registry: duplicate ids {sorted(dupes)}")
    for row in data["claims"]:
        _check_needs(f"claim {row['id']}", row["check"])
    return data


def load_registry(path: str | Path | None = None) -> list[dict]:
    doc = load_registry_document(path)
    return [dict(row, level=row.get("level", doc["interval_level"]), evidence=row.get("evidence", "measured"),
                 evidence_version=row.get("evidence_version", 1))
            for row in doc["claims"]]


def describe_check(check: dict) -> str:
    kind = check["kind"]
    if kind == "true":
        parts = check.get("parts")
        if parts:
            return " and ".join(f"{name} {describe_check(part)}" for name, part in parts.items())
        return "is true"
    if kind == "equals":
        return f"== {check['value']:g}"
    if kind == "between":
        return f"in [{check['range'][0]:g}, {check['range'][1]:g}]"
    if kind == "outside":
        return f"outside [{check['range'][0]:g}, {check['range'][1]:g}]"
    return {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}[kind] + f" {check['threshold']:g}"




@lru_cache(maxsize=1)
def _levels() -> tuple[float, dict[str, float]]:
    doc = load_registry_document()
    return doc["interval_level"], {row["id"]: row.get("level", doc["interval_level"]) for row in doc["claims"]}


def interval_level() -> float:
    """The registry's default interval level (every table's intervals use it, as every claim without its own)."""
    return _levels()[0]


def level_for(claim_id: str) -> float:
    """The interval level the registry states for `claim_id` (its own `level`, else the registry default)."""
    default, per_claim = _levels()
    if claim_id not in per_claim:
        raise KeyError(f"claim {claim_id!r} is not in the registry")
    return per_claim[claim_id]
