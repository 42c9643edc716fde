"""Which DeepSpeed runs a probe: the installed one, or the pinned 0.18.9 overlay put first on PYTHONPATH.

Why an overlay and not a second venv: the buggy and the fixed runs then share torch and every other package, so
the only difference between them is DeepSpeed itself (see the Makefile's `.venv-ds0189`).
"""

from __future__ import annotations

import os
import sysconfig
from importlib import metadata
from pathlib import Path

from gradfidelity.errors import UserError

OVERLAYS = {"0.18.9": ("GRADFIDELITY_DS0189", ".venv-ds0189")}


def installed_version() -> str:
    """Version of the deepspeed that `import deepspeed` would give in this process (overlay included)."""
    import deepspeed

    return deepspeed.__version__


def base_version() -> str:
    """Version installed in the environment's own site-packages (ignores any overlay on PYTHONPATH)."""
    dists = list(metadata.distributions(name="deepspeed", path=[sysconfig.get_paths()["purelib"]]))
    if not dists:
        raise UserError("deepspeed is not installed in this environment (run `make setup`)")
    return dists[0].version


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


def extensions_dir(version: str) -> Path:
    """Per-DeepSpeed-version JIT cache inside the repo (see `use_extensions_dir`)."""
    base = os.environ.get("TORCH_EXTENSIONS_DIR")
    if base:
        base_p = Path(base)
        if base_p.name.startswith("deepspeed-"):
            base_p = base_p.parent
    else:
        root = next((p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file()), Path.cwd())
        base_p = root / ".cache" / "torch_extensions"
    return base_p / f"deepspeed-{version}"


def shm_op_cached(version: str) -> bool:
    """True when DeepSpeed `version`'s CPU shared-memory comm op is already built in the cache."""
    return (extensions_dir(version) / "deepspeed_shm_comm" / "deepspeed_shm_comm.so").is_file()


def use_extensions_dir() -> Path:
    """Point TORCH_EXTENSIONS_DIR at a per-DeepSpeed-version cache inside the repo, before deepspeed is imported.

    Why: `deepspeed.init_distributed` on the CPU accelerator JIT-builds its shared-memory comm op (about a minute on
    2 cores). 0.18.9 and 0.19.8 build it from different sources under the same name, so one shared directory would
    make ninja rebuild it every time the version alternates. The base is $TORCH_EXTENSIONS_DIR (set by the Makefile
    and the workflow to <repo>/.cache/torch_extensions) or that repo path when unset.
    """
    path = extensions_dir(metadata.version("deepspeed"))
    path.mkdir(parents=True, exist_ok=True)
    os.environ["TORCH_EXTENSIONS_DIR"] = str(path)
    return path
