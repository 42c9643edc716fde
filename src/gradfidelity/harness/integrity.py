"""State that a run reads back is checked before use: checkpoints carry a hash of their payload, and a directory
another job wrote (a Hugging Face checkpoint, a Trainer checkpoint) carries a manifest of its files' sizes and hashes.

Why: a storage fault must never become a result. Measured before this module existed: 64 flipped bytes in a
checkpoint resumed into a run reported as *diverged* (rc 0), and flipped low mantissa bits resumed into a run whose
final loss differed in the seventh digit from the uninterrupted one, silently. `torch.load` checks neither: it
only fails on bytes it cannot parse. A SHA-256 over the payload catches both, and a truncated file too.

A checkpoint file is one blob, written atomically (`io._atomic`), so the hash and the payload can never disagree
because of a kill between two writes:

    b"GFCKPT1\\n" + <64 hex digits of sha256(payload)> + b"\\n" + payload    (payload: torch.save bytes)

A manifest (`MANIFEST.sha256`) lists `<sha256>  <size>  <relative path>` per file, written after the files. A
directory without one, or whose files do not match it, is refused with the path that differs.
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import Any

from gradfidelity.errors import UserError
from gradfidelity.harness.io import _atomic, atomic_write_text

MAGIC = b"GFCKPT1\n"
MANIFEST = "MANIFEST.sha256"
_CHUNK = 1 << 20


class CorruptState(UserError):
    """A checkpoint or a prepared file whose bytes are not the ones that were written."""

    def __init__(self, path: str | os.PathLike, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = Path(path), reason


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


# ----------------------------------------------------------------------------------------------- checkpoints
def save_checkpoint(path: str | os.PathLike, obj: Any) -> Path:
    """torch.save `obj`, prefixed by the payload's SHA-256, in one atomic write."""
    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    payload = buffer.getvalue()
    header = MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n"
    return _atomic(path, lambda fh: (fh.write(header), fh.write(payload)), mode="wb")


def load_checkpoint(path: str | os.PathLike) -> Any:
    """The object saved by `save_checkpoint`, after its hash is verified (safe loader: weights_only=True).

    Raises CorruptState when the file has no header (an unverifiable checkpoint is not trusted), is truncated, or
    its payload's hash differs from the recorded one.
    """
    import torch

    path = Path(path)
    blob = path.read_bytes()
    if not blob.startswith(MAGIC):
        raise CorruptState(path, "not a gradfidelity checkpoint (no hash header): it cannot be verified")
    head_end = len(MAGIC) + 64
    if len(blob) < head_end + 1 or blob[head_end:head_end + 1] != b"\n":
        raise CorruptState(path, f"truncated checkpoint ({len(blob)} bytes, header incomplete)")
    recorded = blob[len(MAGIC):head_end].decode("ascii", errors="replace")
    payload = blob[head_end + 1:]
    actual = hashlib.sha256(payload).hexdigest()
    if actual != recorded:
        raise CorruptState(path, f"payload hash {actual[:12]}... differs from the recorded {recorded[:12]}... "
                                 f"({len(payload)} payload bytes): the file was damaged or truncated")
    return torch.load(io.BytesIO(payload), weights_only=True)


def move_aside(path: str | os.PathLike) -> Path:
    """Rename a damaged file or directory to `<name>.corrupt[-k]` (kept for inspection, never read again)."""
    path = Path(path)
    target = path.with_name(path.name + ".corrupt")
    k = 1
    while target.exists():
        k += 1
        target = path.with_name(f"{path.name}.corrupt-{k}")
    path.rename(target)
    return target


# ----------------------------------------------------------------------------------------------- manifests
def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST
                  and not p.name.endswith(".tmp"))


def write_manifest(directory: str | os.PathLike) -> Path:
    """Record every file under `directory` (size and SHA-256) in its MANIFEST.sha256, atomically."""
    directory = Path(directory)
    lines = [f"{sha256_file(p)}  {p.stat().st_size}  {p.relative_to(directory).as_posix()}"
             for p in _files(directory)]
    return atomic_write_text(directory / MANIFEST, "\n".join(lines) + "\n")


def verify_manifest(directory: str | os.PathLike) -> None:
    """Raise CorruptState naming the first listed file that is missing, of another size, or different in content."""
    directory = Path(directory)
    manifest = directory / MANIFEST
    if not manifest.is_file():
        raise CorruptState(directory, f"no {MANIFEST}: written by an interrupted job or by an older version, "
                                      "so its files cannot be verified")
    recorded = {}
    for line in manifest.read_text().splitlines():
        parts = line.split("  ", 2)
        if len(parts) != 3:
            raise CorruptState(manifest, f"malformed line {line!r}")
        recorded[parts[2]] = (parts[0], int(parts[1]))
    for rel, (digest, size) in recorded.items():
        p = directory / rel
        if not p.is_file():
            raise CorruptState(p, f"missing (listed in {MANIFEST})")
        if p.stat().st_size != size:
            raise CorruptState(p, f"{p.stat().st_size} bytes, {size} recorded in {MANIFEST} (truncated?)")
        if sha256_file(p) != digest:
            raise CorruptState(p, f"content differs from its hash in {MANIFEST} (damaged)")
