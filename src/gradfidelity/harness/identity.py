"""A run's identity: the config and the data that made its record. Torch-free (the workflow reads it as it plans).

Why: a committed record used to stand by its path. A user's own corpus under a key the scale already had, or a
trimmed config with another step count, returned the committed numbers without a word, and an aggregate mixed runs
of two configs in one cell. A record now stands only for what made it:

- `config`: the job's resolved config section, exactly the `--cfg` the rule passes (a study's `rules.job_section`),
  with the keys that cannot change a result (`HARMLESS`, with their reasons) left out;
- `data`: what it read, by checksum or by identity: the corpus text's MD5 and the data job's settings, the upstream
  job's identity and its record's digest, a chosen LR. Each study's `rules.py` says what its jobs read.

The workflow computes a job's identity as it plans (common.smk, `unless_committed`) and hands it to the job in the
environment (`ENV`); the harness writes it into provenance.json (`identity`). A record whose identity differs from
the one its job would run now is planned again like a new cell, with the keys that differ as the reason, printed in
a dry run. Records made before identities existed carry one computed from the committed config (`backfilled`,
saying so), checked against the config the record itself kept where it kept one.
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import lru_cache
from pathlib import Path

ENV = "GRADFIDELITY_IDENTITY"

# The config keys that cannot change a run's result, per study, each with its reason: left out of the identity, so
# that editing one never replans a record. A key belongs here only when a test shows the result does not move.
HARMLESS: dict[str, dict[str, str]] = {
    "local": {
        "train.checkpoint_every": "a run killed and resumed from a checkpoint ends with the same record "
                                  "(tests/test_recovery.py, tests/local/test_async.py)",
        "train.stall_timeout_s": "the async runtime's watchdog: it only decides when a hung run is stopped",
    },
    "async_pp": {
        "train.checkpoint_every": "a resumed run ends with the same record (tests/async_pp/test_plan_train.py)",
    },
    "sft_rl": {
        "checkpoint_every": "a resumed run ends with the same record (tests/sft_rl/test_resume.py)",
        "lr_selection.max_extensions": "how far the LR grid may grow, not what any run trains: a grid point trains "
                                       "at its own LR (a wildcard), an RL-stage run at the LR the selection file "
                                       "gives it (an input, rebuilt from the grid's records)",
    },
}


def md5_file(path: str | Path) -> str:
    """The file's MD5, read once per version of the file (a plan asks it for every cell of a corpus)."""
    st = os.stat(path)
    return _md5(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=64)
def _md5(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def flatten(value, prefix: str = "") -> dict[str, object]:
    """{"train": {"steps": 5}} -> {"train.steps": 5}; a list, a scalar or an inner {} is one leaf; {} -> {}."""
    if isinstance(value, dict) and not value and not prefix:
        return {}
    if isinstance(value, dict) and value:
        out = {}
        for key in sorted(value):
            out.update(flatten(value[key], f"{prefix}{key}."))
        return out
    return {prefix[:-1]: value}


def _prune(config: dict, study: str) -> dict:
    """`config` without the study's HARMLESS keys (at any depth, by dotted name)."""
    harmless = HARMLESS.get(study, {})

    def walk(value, prefix):
        if not isinstance(value, dict):
            return value
        return {k: walk(v, f"{prefix}{k}.") for k, v in value.items() if f"{prefix}{k}" not in harmless}

    return walk(config, "")


def canonical(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def job_identity(study: str, job: str, config: dict, data: dict | None = None) -> dict:
    """The identity of one job: its study and job kind, its config section (HARMLESS keys left out) and its data,
    with `hash` over all of them (the runs table's `config_hash`)."""
    body = {"study": study, "job": job, "config": _prune(json.loads(canonical(config)), study),
            "data": json.loads(canonical(data or {}))}
    return {**body, "hash": hashlib.sha256(canonical(body).encode()).hexdigest()[:16]}


def _short(value) -> str:
    text = canonical(value) if not isinstance(value, str) else value
    return text if len(text) <= 40 else text[:37] + "..."


def differences(recorded: dict, now: dict) -> list[str]:
    """What differs between a record's identity and the job's now, one phrase per part:
    "config changed: train.steps 2000 -> 100", "data changed: corpus.text_md5 ffe3... -> 1a2b...". A key one side
    lacks reads "(none)" there. Empty when the two are the same identity."""
    out = []
    for part in ("job", "config", "data"):
        old, new = flatten(recorded.get(part, {})), flatten(now.get(part, {}))
        if part == "job":
            old, new = {"job": recorded.get("job")}, {"job": now.get("job")}
        changed = [f"{k} {_short(old.get(k, '(none)'))} -> {_short(new.get(k, '(none)'))}"
                   for k in sorted(set(old) | set(new)) if old.get(k, "(none)") != new.get(k, "(none)")]
        if changed:
            out.append(f"{part} changed: " + ", ".join(changed))
    return out


def recorded(run_dir: str | Path) -> dict | None:
    """The identity a run's provenance.json carries, or None (no provenance, or a record made before identities)."""
    path = Path(run_dir) / "provenance.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text()).get("identity")


def from_env() -> dict | None:
    """The identity the workflow handed to this job (ENV), or None for a run started by hand."""
    raw = os.environ.get(ENV)
    if not raw:
        return None
    identity = json.loads(raw)
    if not isinstance(identity, dict) or "hash" not in identity:
        raise ValueError(f"{ENV} is not a job identity: {raw[:80]!r}")
    return identity
