"""Which DeepSpeed runs a probe: the installed one, or the pinned 0.18.9 overlay put first on PYTHONPATH.

Why an overlay and not a second venv: the buggy and the fixed runs then share torch and every other package, so
the only difference between them is DeepSpeed itself (see the Makefile's `.venv-ds0189`).
"""

from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path

from gradfidelity.errors import UserError
from gradfidelity.harness.extensions import base_deepspeed_version, extensions_dir

OVERLAYS = {"0.18.9": ("GRADFIDELITY_DS0189", ".venv-ds0189")}


def base_version() -> str:
    """Version installed in the environment's own site-packages (ignores any overlay on PYTHONPATH)."""
    version = base_deepspeed_version()
    if version is None:
        raise UserError("deepspeed is not installed in this environment (run `make setup`)")
    return version


def installed_version_noimport() -> str:
    """Version `import deepspeed` would give here, overlay included, read from metadata (no slow import)."""
    return metadata.version("deepspeed")


def _candidates(dirname: str) -> list[Path]:
    here = Path(__file__).resolve()
    roots = [p for p in here.parents if (p / "pyproject.toml").is_file()] + [Path.cwd()]
    return [r / dirname for r in roots]


def overlay_path(version: str) -> Path:
    """Directory to prepend to PYTHONPATH for a pinned version; UserError when it is unknown or not installed."""
    if version not in OVERLAYS:
        raise UserError(
            f"--deepspeed-version {version}: no pinned overlay for it (available: {', '.join(OVERLAYS)}; "
            f"or omit the flag to use the installed {base_version()})"
        )
    env, dirname = OVERLAYS[version]
    paths = [Path(os.environ[env])] if os.environ.get(env) else _candidates(dirname)
    for p in paths:
        if (p / "deepspeed" / "__init__.py").is_file():
            return p
    raise UserError(
        f"--deepspeed-version {version}: overlay not found (looked in {', '.join(map(str, paths))}); "
        f"run `make setup` or set {env}"
    )


def env_for(version: str | None) -> dict[str, str]:
    """Environment for a child process that must import DeepSpeed `version` (None: the installed one)."""
    env = dict(os.environ)
    env.setdefault("DS_ACCELERATOR", "cpu")
    if version is None:
        return env
    if version == base_version():
        parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and "venv-ds" not in p]
    else:
        overlay = str(overlay_path(version))
        parts = [overlay] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != overlay]
    if parts:
        env["PYTHONPATH"] = os.pathsep.join(parts)
    else:
        env.pop("PYTHONPATH", None)
    return env


def shm_op_cached(version: str) -> bool:
    """True when DeepSpeed `version`'s CPU shared-memory comm op is already built in the cache."""
    return (extensions_dir(version) / "deepspeed_shm_comm" / "deepspeed_shm_comm.so").is_file()
