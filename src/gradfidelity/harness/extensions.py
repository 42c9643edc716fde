"""Where DeepSpeed's JIT-built CPU ops live: the user's own extension cache, with a pinned overlay kept apart.

DeepSpeed JIT-builds its CPU ops (the shared-memory comm op at `init_distributed`, DeepSpeedCPUAdam) into torch's
extension cache, keyed by op name only. Why the installed DeepSpeed uses the cache as it is: a user whose training
already built the ops (or `make setup`, which prebuilds them) must not pay a second build of minutes inside the
audit or the guard, so $TORCH_EXTENSIONS_DIR is left as the user set it, or torch's default
(`~/.cache/torch_extensions/py<ver>_<cpu|cuXY>`) when unset. Why a pinned overlay (0.18.9, see ds_audit/versions.py)
gets a subfolder `<cache>/deepspeed-<version>/`: 0.18.9 and 0.19.8 build different sources under the same name, so
one shared folder makes ninja rebuild each time the version alternates, and 0.19.8 crashes loading the op that
0.18.9 built. Every DeepSpeed-using process calls `use_deepspeed_extensions_dir()` before importing deepspeed.
In this checkout the Makefile, the workflow and the venv's .pth line set $TORCH_EXTENSIONS_DIR to
<repo>/.cache/torch_extensions.

Why stale locks are cleared: torch serialises a build with a lock file (`<op>/lock`, torch.utils.file_baton) that
it removes when done, and a process waiting for it polls forever. A job killed while it held the lock (Ctrl-C,
`kill`, a SLURM preemption) leaves it behind, and every later DeepSpeed job of the checkout then hangs silently at
`init_distributed`, burning no CPU (seen in round 4 after a stopped cpu run). The lock holds no pid, so age decides:
before DeepSpeed loads, each process waits while a lock is younger than STALE_LOCK_S (about 7 times the slowest op
build measured on 2 busy cores, 262 s), then removes it with a warning that names it. The hang is bounded and loud.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import time
from importlib import metadata
from pathlib import Path

STALE_LOCK_S = 1800.0
LOCK_POLL_S = 1.0


def base_deepspeed_version() -> str | None:
    """Version installed in the environment's own site-packages (ignores an overlay on PYTHONPATH); None if absent."""
    dists = list(metadata.distributions(name="deepspeed", path=[sysconfig.get_paths()["purelib"]]))
    return dists[0].version if dists else None


def _torch_default_root() -> Path:
    """torch.utils.cpp_extension's own default, computed without importing torch (the audit's parent never does):
    <user cache>/torch_extensions/py<major><minor><abiflags>_<cpu|cuXY>. The CUDA tag is read from torch's local
    version ("2.13.0+cpu", "+cu124"); a CUDA wheel without one is taken as cpu, which only costs a warm-up load."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    try:
        local = metadata.version("torch").partition("+")[2]
    except metadata.PackageNotFoundError:
        local = ""
    cu = local if local.startswith("cu") else "cpu"
    py = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
    return Path(cache) / "torch_extensions" / f"{py}_{cu}"


def extensions_root() -> Path:
    """The user's extension cache: $TORCH_EXTENSIONS_DIR (a versioned subfolder set by a parent is undone), else
    torch's default."""
    base = os.environ.get("TORCH_EXTENSIONS_DIR")
    if not base:
        return _torch_default_root()
    root = Path(base)
    return root.parent if root.name.startswith("deepspeed-") else root


def extensions_dir(version: str) -> Path:
    """Where DeepSpeed `version` builds and finds its ops: the cache itself for the installed version, a
    `deepspeed-<version>` subfolder for a pinned overlay."""
    root = extensions_root()
    return root if version == base_deepspeed_version() else root / f"deepspeed-{version}"


def use_deepspeed_extensions_dir(version: str | None = None) -> Path:
    """Point TORCH_EXTENSIONS_DIR at the cache of the deepspeed that this process will import.

    importlib.metadata follows sys.path order, so with the 0.18.9 overlay first on PYTHONPATH it reports 0.18.9
    without importing deepspeed. The installed version with $TORCH_EXTENSIONS_DIR unset leaves it unset: torch then
    uses its own default, exactly the folder the user's other DeepSpeed runs use.
    """
    version = version or metadata.version("deepspeed")
    path = extensions_dir(version)
    if os.environ.get("TORCH_EXTENSIONS_DIR") or path != extensions_root():
        path.mkdir(parents=True, exist_ok=True)
        os.environ["TORCH_EXTENSIONS_DIR"] = str(path)
    clear_stale_build_locks(path)
    return path


def clear_stale_build_locks(path: Path, max_age_s: float = STALE_LOCK_S, clock=time.time,
                            sleep=time.sleep) -> list[Path]:
    """Wait while a `<path>/<op>/lock` is younger than `max_age_s` (a build in progress), then remove it as left by
    a killed build (see the module docstring), with a warning on stderr; returns the removed paths."""
    removed = []
    for lock in sorted(Path(path).glob("*/lock")):
        warned = False
        while True:
            try:
                age = clock() - lock.stat().st_mtime
            except FileNotFoundError:  # the build finished and released it
                break
            if age > max_age_s:
                lock.unlink(missing_ok=True)
                removed.append(lock)
                print(f"gradfidelity: removed a stale torch extension build lock {lock} ({age:.0f} s old, over "
                      f"{max_age_s:.0f} s): left by a killed build, it would make every DeepSpeed job wait forever",
                      file=sys.stderr, flush=True)
                break
            if not warned:
                print(f"gradfidelity: waiting for the torch extension build lock {lock} ({age:.0f} s old; removed "
                      f"as stale at {max_age_s:.0f} s)", file=sys.stderr, flush=True)
                warned = True
            sleep(LOCK_POLL_S)
    return removed
