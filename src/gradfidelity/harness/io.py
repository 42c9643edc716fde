"""Atomic writes: a reader (or a resumed run) sees the old file or the new one, never half of one.

Every file is written to a temporary sibling in the same directory, flushed, fsynced and renamed over the target:
rename is atomic on POSIX within one file system, so a SIGKILL at any moment leaves no truncated output behind.
mkstemp creates the temporary file with mode 0600; before the rename it gets the mode a plain `open()` would have
given a new file (0o666 & ~umask), so outputs stay readable by the group and others as the umask allows.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gradfidelity.errors import UserError


def current_umask() -> int:
    """The process umask, read without changing it.

    os.umask can only be read by setting it, and the umask is process-wide: another thread creating a file between
    the set and the restore would get the wrong mode. Linux (>= 4.7) shows it in /proc/self/status, so read that;
    only where that line is missing fall back to set-and-restore.
    """
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def _atomic(path: str | os.PathLike, write: Callable[[Any], None], mode: str = "w") -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode) as fh:
            os.fchmod(fh.fileno(), 0o666 & ~current_umask())
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _strict(obj: Any) -> Any:
    """Replace non-finite floats by strings: JSON has no NaN, and a silent `NaN` token breaks strict readers."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return repr(obj)
    if isinstance(obj, dict):
        return {k: _strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_strict(v) for v in obj]
    return obj


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return _atomic(path, lambda fh: fh.write(text))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return _atomic(path, lambda fh: json.dump(_strict(obj), fh, indent=2, sort_keys=True, allow_nan=False))


def atomic_savefig(fig, path: str | os.PathLike, **kwargs) -> Path:
    fmt = Path(path).suffix.lstrip(".") or "png"
    return _atomic(path, lambda fh: fig.savefig(fh, format=fmt, **kwargs), mode="wb")


def atomic_write_csv(df, path: str | os.PathLike) -> Path:
    return _atomic(path, lambda fh: df.to_csv(fh, index=False))


def read_json(path: str | os.PathLike) -> Any:
    """Read a JSON input; a missing or corrupt file is a UserError naming the path."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"missing input file: {path}")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"corrupt JSON in {path}: {exc}") from None

