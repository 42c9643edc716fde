"""Provenance of one run: what code, which packages, which machine, which settings.

Written next to metrics.json so a number can always be traced to the exact software and hardware that made it.

The machine's CPU identity (`cpu_identity`) is more than its marketing name: two hosts that both read "AMD EPYC"
(a hypervisor often masks the rest) can run different kernels, since torch dispatches its CPU kernels by the
instruction set the CPU offers (AVX2, AVX-512, ...) and floating-point reductions differ between them. So the
identity holds the vendor, family/model/stepping, the ISA level torch dispatches to and the flags that decide it,
and `host_type` turns it into the key that says whether two runs can be compared bit for bit.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

PACKAGES = (
    "torch", "deepspeed", "trl", "transformers", "accelerate", "datasets", "numpy", "scipy", "statsmodels",
    "pandas", "matplotlib", "psutil", "pytorch-optimizer", "snakemake", "gradfidelity",
)


def config_hash(config: dict) -> str:
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


# The tracked folders a run's DAG writes its outputs into (common.smk's RESULTS, TABLES, FIGURES roots): a change
# there is the workflow's own product, not a change of the code that made the run.
OUTPUT_DIRS = ("results", "paper_tables", "figures")


def split_dirty(files: list[str]) -> tuple[list[str], list[str]]:
    """(changed files outside the output folders, changed files under them), each sorted; paths relative to the
    repository root."""
    outputs = sorted(f for f in files if f.startswith(tuple(f"{d}/" for d in OUTPUT_DIRS)))
    return sorted(f for f in files if f not in outputs), outputs


def _porcelain_paths(status: str) -> list[str]:
    """The changed paths of `git status --porcelain -z`: one entry per file, a rename's or copy's origin dropped
    (it follows its entry), never quoted."""
    entries, paths = status.split("\0"), []
    i = 0
    while i < len(entries):
        entry = entries[i]
        if entry:
            paths.append(entry[3:])
            if {"R", "C"} & set(entry[:2]):
                i += 1  # the next entry is the origin path
        i += 1
    return paths


def git_state(cwd: str | os.PathLike | None = None) -> dict:
    """The commit a run ran at and which tracked files differ from it (untracked files are not the run's code).

    `git_dirty`: a tracked file outside the output folders (OUTPUT_DIRS) differs, named in `git_dirty_files`; the
    changed tracked files under them are `git_dirty_outputs` (a DAG's earlier jobs rewrite committed tables, bench
    files and figures while later runs train: that alone does not make the code uncommitted)."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
                             check=True, timeout=10).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "-z", "--untracked-files=no"], cwd=cwd,
                                capture_output=True, text=True, check=True, timeout=10).stdout
        # Which tracked files differ from HEAD, so a reader can tell an edit of the run's own code from an
        # unrelated one (a dirty flag alone cannot).
        code, outputs = split_dirty(_porcelain_paths(status))
        return {"git_sha": sha, "git_dirty": bool(code), "git_dirty_files": code, "git_dirty_outputs": outputs}
    except (OSError, subprocess.SubprocessError):
        return {"git_sha": "unknown", "git_dirty": None, "git_dirty_files": None, "git_dirty_outputs": None}


def package_versions() -> dict:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    # importlib.metadata searches sys.path in order, so the deepspeed 0.18.9 overlay (first on PYTHONPATH) is
    # what it reports; where deepspeed is already imported, its own __version__ is the final word.
    loaded = sys.modules.get("deepspeed")
    if loaded is not None:
        versions["deepspeed"] = loaded.__version__
        versions["deepspeed_path"] = str(Path(loaded.__file__).parent)
    return versions


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# The /proc/cpuinfo flags that change which kernels torch, MKL and oneDNN run (AMX: any of amx_tile/bf16/int8).
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx")
# What a process can set to limit its kernels below the CPU's own level (check-reference --measure-drift does).
ISA_LIMITS = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "DNNL_MAX_CPU_ISA")
IDENTITY_KEYS = ("cpu_vendor", "cpu_family", "cpu_model_number", "cpu_stepping", "cpu_capability", "cpu_flags",
                 "cpu_isa_limits")
UNKNOWN_ISA = "unknown ISA"  # a record made before provenance had the CPU identity


def _cpuinfo_fields(text: str) -> dict[str, str]:
    """The first processor's `key: value` lines of /proc/cpuinfo (every core of one host is the same type)."""
    fields = {}
    for line in text.splitlines():
        if not line.strip():
            break
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def isa_flags(flags: str) -> str:
    """The ISA_FLAGS present in a cpuinfo `flags` line, in ISA_FLAGS order, space-separated ("none": none of them;
    never '', which a CSV reads back as missing)."""
    have = set(flags.split())
    present = [f for f in ISA_FLAGS if (any(h.startswith("amx_") for h in have) if f == "amx" else f in have)]
    return " ".join(present) or "none"


def torch_cpu_capability() -> str:
    """The ISA level torch dispatches its CPU kernels to in this process ("AVX512", "AVX2", "DEFAULT", ...): it
    follows ATEN_CPU_CAPABILITY, so it is read in the process that trains, never assumed from the CPU."""
    import torch

    return str(torch.backends.cpu.get_cpu_capability())


def cpu_identity(cpuinfo: str | None = None, capability: str | None = None) -> dict:
    """vendor, family/model/stepping, torch's dispatched ISA level, the ISA flags and the ISA limits set in the
    environment ("none"). A field /proc/cpuinfo does not have (another OS, another architecture) reads "unknown"."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    f = _cpuinfo_fields(cpuinfo)
    return {
        "cpu_vendor": f.get("vendor_id", "unknown"),
        "cpu_family": f.get("cpu family", "unknown"),
        "cpu_model_number": f.get("model", "unknown"),
        "cpu_stepping": f.get("stepping", "unknown"),
        "cpu_capability": capability if capability is not None else torch_cpu_capability(),
        "cpu_flags": isa_flags(f.get("flags", "")),
        # MKL's and oneDNN's limits do not show in torch's capability, yet change their kernels
        "cpu_isa_limits": " ".join(f"{k}={os.environ[k]}" for k in ISA_LIMITS if os.environ.get(k)) or "none",
    }


def host_type(identity: dict) -> tuple | None:
    """The key two runs must share to be compared bit for bit, or None ("unknown ISA") when the record predates the
    CPU identity. `identity` is a provenance `machine` dict or a runs-table row (same key names). The model name is
    left out on purpose: a hypervisor may mask it, and the kernels follow the fields kept here."""
    values = []
    for key in IDENTITY_KEYS:
        value = identity.get(key)
        if value is None or (isinstance(value, float) and value != value) or value in ("", "unknown", UNKNOWN_ISA):
            return None
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # a CSV column with a missing cell reads family 25 back as 25.0
        values.append(str(value).strip())
    return tuple(values)


def same_host_type(a: dict, b: dict) -> bool:
    """True only when both records carry the CPU identity and it is the same: an unknown side is another host."""
    ka, kb = host_type(a), host_type(b)
    return ka is not None and ka == kb


def describe_host(identity: dict) -> str:
    """One line for a person: 'AuthenticAMD 25/17/1, torch AVX512, flags avx2 avx512f avx512_bf16'."""
    key = host_type(identity)
    if key is None:
        return UNKNOWN_ISA
    vendor, family, model, stepping, capability, flags, limits = key
    return (f"{vendor} {family}/{model}/{stepping}, torch {capability}, flags {flags}"
            + ("" if limits == "none" else f", limited by {limits}"))


def machine() -> dict:
    return {
        **cpu_identity(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "hostname": platform.node(),
    }
