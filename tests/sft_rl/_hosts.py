"""Provenance for hand-made study-A runs (tests/sft_rl/_runs.py writes metrics.json only): each run's
provenance.json with the CPU identity of one of two host types, as the harness writes it, so that the aggregate
reads every run's host type (aggregate.write_aggregate) and the claims can list them."""

import json
from pathlib import Path

from gradfidelity.harness.io import atomic_write_json

INTEL = {"cpu_vendor": "GenuineIntel", "cpu_family": "6", "cpu_model_number": "167", "cpu_stepping": "1",
         "cpu_capability": "AVX512", "cpu_flags": "avx2 avx512f avx512_bf16 amx", "cpu_isa_limits": "none"}
AMD = {"cpu_vendor": "AuthenticAMD", "cpu_family": "25", "cpu_model_number": "17", "cpu_stepping": "1",
       "cpu_capability": "AVX512", "cpu_flags": "avx2 avx512f avx512_bf16", "cpu_isa_limits": "none"}


# A run of round 6: started after A6's proposition was committed (claims.A6_RULE_COMMITTED)
ROUND6 = "2026-12-07T09:00:00+00:00"


def write_provenance(paths: list[str], machine_of=lambda path: INTEL, started: str = ROUND6) -> list[str]:
    """A provenance.json beside each metrics.json of `paths` (its seed and status, `machine_of(path)` as its
    machine, `started` as its start time); returns `paths`."""
    for path in paths:
        rec = json.loads(Path(path).read_text())
        atomic_write_json(Path(path).parent / "provenance.json",
                          {"seed": rec["seed"], "status": rec["status"], "machine": machine_of(path),
                           "started": started})
    return paths


def set_wall(paths: list[str], wall_of) -> None:
    """Each run's metrics.json `timing.wall_s` set to `wall_of(path, record)` (seconds)."""
    for path in paths:
        rec = json.loads(Path(path).read_text())
        rec["timing"] = {"wall_s": float(wall_of(path, rec))}
        atomic_write_json(path, rec)
