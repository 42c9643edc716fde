"""The evidence contract: what a study hands to `verify` for one claim.

A claim's evidence is an estimate with an interval, the number of independent units behind it (paired seeds, or
rows of a deterministic matrix) and the gates (preconditions) that must hold before the number means anything:

    {"estimate": 1.3, "low": 1.1, "high": 1.5, "level": 0.95, "exact": false, "n": 5,
     "gates": [{"name": "reference_learned", "passed": true, "reason": "fixed SFT 41% vs constant 22%"}],
     "detail": "...", "sources": ["results/cpu/local/enwik8/w128/bp/seed0", "paper_tables/cpu/local_main.csv"]}

Why an interval and not a point: with one or two seeds a point estimate on either side of a threshold is a coin
flip; `verify` decides on the whole interval, so "the evidence cannot tell" (inconclusive) is kept apart from
"the evidence is against the claim" (not reproduced).

- `exact: true` marks a measurement with no sampling noise (a deterministic probe, a recomputed statistic such as a
  one-sided bound that is itself the paper's decision rule); its interval has zero width.
- Otherwise `low`/`high` are a two-sided interval at `level`, which must equal the registry's level for the claim
  (`level_for`), so a study cannot quietly use a narrower interval than the registry states.
- A check of kind "true" is decided from its `parts`: one record of this same shape per part named in the
  registry's `check.parts` (e.g. A9: an accuracy difference and a FLOPs ratio), or from an exact boolean estimate.
- `estimate: null` means the study could not measure the claim; `detail` says why (a diverged seed, a missing arm).

Build records with the functions below rather than by hand: they compute the intervals with scipy and refuse
non-finite input, so a diverged run can never become a plausible-looking number.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence

import numpy as np

from gradfidelity.claims.registry import _levels, interval_level, level_for  # noqa: F401  (their old import path)
from gradfidelity.stats.intervals import t_interval
from gradfidelity.stats.power import SIDES as POWER_SIDES

_NUM = {"type": ["number", "null"]}
GATE_SCHEMA = {
    "type": "object", "required": ["name", "passed", "reason"], "additionalProperties": False,
    "properties": {"name": {"type": "string"}, "passed": {"type": "boolean"}, "reason": {"type": "string"}},
}
RECORD_SCHEMA = {
    "type": "object", "required": ["estimate", "n"], "additionalProperties": False,
    "properties": {
        "estimate": {"type": ["number", "boolean", "null"]}, "low": _NUM, "high": _NUM,
        "level": _NUM, "exact": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0},
        "gates": {"type": "array", "items": GATE_SCHEMA}, "detail": {"type": "string"},
        "sources": {"type": "array", "items": {"type": "string"}},
        "diverged": {"type": "integer", "minimum": 0}, "computed_by": {"type": "string"},
        # the host types (provenance.describe_host) of the runs the claim reads, one entry a host type
        "hosts": {"type": "array", "items": {"type": "string"}},
        # what the power table (stats/power.py) needs: POWER_SCHEMA
        "power": {"$ref": "#/$defs/power"},
    },
}
# The deciding statistic as per-seed values whose mean's t interval the claim is decided on, the value (or band) that
# interval must clear, and what one more seed costs; or `not_applicable` with its reason (an exact probe).
POWER_SCHEMA = {
    "type": "object", "required": ["statistic"], "additionalProperties": False,
    "properties": {
        "statistic": {"type": "string"},
        "per_seed": {"type": "array", "items": {"type": "number"}},
        "threshold": {"type": ["number", "array"], "items": {"type": "number"}},
        "side": {"enum": list(POWER_SIDES)},
        "level": {"type": "number"},
        "wall_s_per_seed": {"type": ["number", "null"]},
        "paper_effect": {"type": ["number", "null"]},
        "unit": {"type": "string"},
        "note": {"type": "string"},
        "not_applicable": {"type": "string"},
    },
}
RECORD_SCHEMA["$defs"] = {"power": POWER_SCHEMA}
RECORD_SCHEMA["properties"]["parts"] = {"type": "object", "additionalProperties": {
    **RECORD_SCHEMA, "properties": dict(RECORD_SCHEMA["properties"])}}


def _finite(values, what: str) -> np.ndarray:
    arr = np.asarray(values, dtype=float).ravel()
    if not np.isfinite(arr).all():
        raise ValueError(f"{what}: non-finite values (a diverged run?) must be handled before the statistics")
    return arr


def gate(name: str, passed: bool, reason: str) -> dict:
    return {"name": name, "passed": bool(passed), "reason": reason}


def _caller() -> str:
    """module:function of the first caller outside this module: the evidence function that built the record."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame = frame.f_back
    if frame is None:
        return "unknown"
    return f"{frame.f_globals.get('__name__', '?')}:{frame.f_code.co_name}"


def _record(estimate, low, high, *, level, exact, n, detail, gates, sources, diverged=0) -> dict:
    rec = {"estimate": estimate, "low": low, "high": high, "level": level, "exact": exact, "n": int(n),
           "detail": detail, "gates": list(gates or []), "sources": [str(s) for s in (sources or [])],
           "computed_by": _caller()}
    if diverged:
        rec["diverged"] = int(diverged)
    return rec


def not_measured(detail: str, *, n: int = 0, gates=None, sources=None, diverged: int = 0) -> dict:
    """No number: the study could not measure the claim; `detail` says why."""
    return _record(None, None, None, level=None, exact=False, n=n, detail=detail, gates=gates, sources=sources,
                   diverged=diverged)


def exact(value, *, n: int, detail: str = "", gates=None, sources=None) -> dict:
    """A measurement without sampling noise (deterministic probe, a decision statistic): zero-width interval."""
    if isinstance(value, bool):
        return _record(value, None, None, level=None, exact=True, n=n, detail=detail, gates=gates, sources=sources)
    v = float(_finite([value], "exact")[0])
    return _record(v, v, v, level=None, exact=True, n=n, detail=detail, gates=gates, sources=sources)


def mean_ci(values: Sequence[float], level: float, *, detail: str = "", gates=None, sources=None,
            diverged: int = 0) -> dict:
    """Mean over independent units (paired seeds' differences, per-seed statistics) with a two-sided t interval.

    One unit gives an estimate without an interval; `verify` then reports the claim as not measured (n < min_n).
    """
    x = _finite(values, "mean_ci")
    if len(x) == 0:
        return not_measured(detail or "no values", gates=gates, sources=sources, diverged=diverged)
    iv = t_interval(x, level)
    est, low, high = iv.estimate, iv.low, iv.high
    return _record(est, low, high, level=level, exact=False, n=len(x), detail=detail, gates=gates,
                   sources=sources, diverged=diverged)


def paired_difference(a: Sequence[float], b: Sequence[float], level: float, **kwargs) -> dict:
    """Mean of a - b over paired seeds (same seed = same initialisation and data order) with a t interval."""
    a, b = _finite(a, "paired_difference"), _finite(b, "paired_difference")
    if a.shape != b.shape:
        raise ValueError(f"paired_difference: {len(a)} vs {len(b)} values are not paired")
    return mean_ci(a - b, level, **kwargs)


def paired_ratio(a: Sequence[float], b: Sequence[float], level: float, **kwargs) -> dict:
    """Geometric mean of a / b over paired seeds with a t interval on the log ratios (a ratio's natural scale)."""
    a, b = _finite(a, "paired_ratio"), _finite(b, "paired_ratio")
    if a.shape != b.shape:
        raise ValueError(f"paired_ratio: {len(a)} vs {len(b)} values are not paired")
    if (a <= 0).any() or (b <= 0).any():
        raise ValueError("paired_ratio: ratios need positive values")
    rec = mean_ci(np.log(a / b), level, **kwargs)
    for key in ("estimate", "low", "high"):
        if rec[key] is not None:
            rec[key] = math.exp(rec[key])
    return rec


def power_record(statistic: str, per_seed: Sequence[float], threshold, side: str, level: float, *,
                 wall_s_per_seed: float | None = None, paper_effect: float | None = None, unit: str = "",
                 note: str = "") -> dict:
    """A record's `power` (POWER_SCHEMA): the per-seed values whose mean's t interval at `level` decides the claim,
    the threshold (a number for side "gt"/"lt", [lo, hi] for "outside"/"inside") it must clear, and what one more
    seed costs in wall seconds on 2 cores. The power table (claims/power_table.py) plans the claim's n from it."""
    x = _finite(per_seed, "power_record")
    if side not in POWER_SIDES:
        raise ValueError(f"power_record: side {side!r} is not one of {POWER_SIDES}")
    band = side in ("outside", "inside")
    if band != isinstance(threshold, (list, tuple)) or (band and len(threshold) != 2):
        raise ValueError(f"power_record: side {side!r} needs {'[lo, hi]' if band else 'one number'}, got "
                         f"{threshold!r}")
    rec = {"statistic": statistic, "per_seed": [float(v) for v in x],
           "threshold": [float(v) for v in threshold] if band else float(threshold), "side": side,
           "level": float(level), "wall_s_per_seed": None if wall_s_per_seed is None else float(wall_s_per_seed),
           "paper_effect": None if paper_effect is None else float(paper_effect)}
    return {**rec, **({"unit": unit} if unit else {}), **({"note": note} if note else {})}


def power_not_applicable(statistic: str, reason: str) -> dict:
    """A record's `power` where no n would change the verdict (an exact probe, a recomputation): its reason."""
    return {"statistic": statistic, "not_applicable": reason}


def with_parts(parts: dict[str, dict], *, detail: str = "", gates=None, sources=None) -> dict:
    """A check of kind "true": its verdict comes from the parts, each a record of its own."""
    ns = [p["n"] for p in parts.values()]
    rec = _record(None, None, None, level=None, exact=all(p.get("exact") for p in parts.values()),
                  n=min(ns) if ns else 0, detail=detail, gates=gates, sources=sources)
    rec["parts"] = parts
    return rec


def weakest(records: dict[str, dict], threshold: float = 0.0) -> dict:
    """The deciding record of an "every comparison holds" claim (intersection-union test, one check for all).

    Every comparison must hold on its whole interval for the claim to hold, so the record with the smallest lower
    bound decides a pass; any comparison whose whole interval contradicts the claim decides a fail. For checks of
    the form "> threshold" on each record. The chosen comparison's name is put in front of its detail.
    """
    if not records:
        raise ValueError("weakest: no comparisons")
    missing = {k: r for k, r in records.items() if r["estimate"] is None}
    if missing:
        name, rec = next(iter(missing.items()))
        return dict(rec, detail=f"{name}: {rec.get('detail', '')}")
    no_interval = {k: r for k, r in records.items() if r["low"] is None}
    if no_interval:
        name, rec = next(iter(no_interval.items()))
    else:
        name, rec = min(records.items(), key=lambda kv: (kv[1]["high"], kv[1]["low"]))
        if not rec["high"] <= threshold:  # nothing contradicts on its whole interval: the lowest bound decides
            name, rec = min(records.items(), key=lambda kv: kv[1]["low"])
    others = ", ".join(f"{k} {r['estimate']:.4g} [{r['low']:.4g}, {r['high']:.4g}]" if r["low"] is not None
                       else f"{k} {r['estimate']:.4g}" for k, r in records.items())
    own = f"; {rec['detail']}" if rec.get("detail") else ""
    return dict(rec, detail=f"deciding comparison: {name}; all: {others}{own}")
