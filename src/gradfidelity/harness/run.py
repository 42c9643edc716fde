"""The run harness: one training run = one directory with metrics.json, provenance.json and log.txt.

Why each piece exists:
- Seeds and thread counts are set on entry and recorded, because the same seed only repeats at the same thread count.
- Checkpoints hold model/optimizer state dicts *and* every RNG state plus the caller's extra state (step, history),
  so a run killed with SIGKILL and restarted ends with the same metrics as one that never stopped.
- A checkpoint carries the SHA-256 of its payload (harness/integrity.py), verified before anything is loaded. A
  damaged or truncated one is moved aside and the run starts again from step 0, with a log line and a note in
  provenance.json (`checkpoints_discarded`): a storage fault must never become a "diverged" run or a silently
  different number.
- A stale provenance.json is removed on entry, like a stale metrics.json: a reader never pairs a new result with
  an old run's record. The git state is read from the working directory of the run (the checkout that runs), not
  from the package's folder, which may belong to another checkout when a venv is shared.
- A non-finite loss ends the run with status "diverged": it is a result to report, not a crash to hide, and never a
  plausible-looking number.
- The plan's cell (study and wildcards, `--cell` from the rule) is written into metrics.json and provenance.json:
  aggregates read a run's identity from its records (harness.results.cell_of), never by parsing its path.
- metrics.json is written last and atomically; its presence means the run finished (Snakemake's output).
- Launched on several ranks (torchrun / accelerate launch set RANK and WORLD_SIZE), every rank seeds, sets its
  threads and checks for NaN, but only rank 0 owns the run directory's records (metrics.json, provenance.json,
  log.txt, checkpoint.pt); the others log to log_rank<r>.txt. Two ranks writing one metrics.json would race.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from gradfidelity.harness import identity as job_identity
from gradfidelity.harness import provenance
from gradfidelity.harness.environment import SCALE_ENV  # each run records the scale it belongs to
from gradfidelity.harness.integrity import CorruptState, load_checkpoint, move_aside, save_checkpoint
from gradfidelity.harness.io import atomic_write_json
from gradfidelity.harness.memory import PeakPSS
from gradfidelity.harness.seeding import rng_state, seed_everything, set_rng_state
from gradfidelity.harness.threads import configure_threads

CHECKPOINT = "checkpoint.pt"


class Diverged(Exception):
    """Raised by Run.check_finite; caught by Run.__exit__, which records the run as diverged."""

    def __init__(self, step: int, value: float, what: str = "loss"):
        super().__init__(f"non-finite {what} {value!r} at step {step}")
        self.step, self.value, self.what = step, value, what


def launch_rank() -> tuple[int, int]:
    """(global rank, world size) as a launcher (torchrun, accelerate launch, srun via torchrun) set them; (0, 1)
    for a process started on its own."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class Run:
    def __init__(self, out_dir: str | Path, *, study: str, config: dict, seed: int, threads: int,
                 checkpoint_every: int | None = None, sample_memory: bool = True, scale: str | None = None,
                 cell: dict | None = None):
        self.dir = Path(out_dir)
        # The plan's cell (study and wildcards) this run belongs to, written into its records: an aggregate reads a
        # run's identity from there, never from its path.
        self.cell = {"study": study, **(cell or {})}
        self.scale = scale or os.environ.get(SCALE_ENV)
        self.study, self.config, self.seed, self.threads = study, config, seed, threads
        # The identity the workflow planned this job with (its config section and data: harness/identity.py),
        # written into provenance.json and into every checkpoint: a checkpoint of another identity is never resumed.
        self.identity = job_identity.from_env()
        self.checkpoint_every = checkpoint_every
        self.status: str | None = None
        self.resumed_from: int | None = None
        self.checkpoints_discarded: list[dict] = []  # damaged checkpoints moved aside (provenance.json)
        self.rank, self.world_size = launch_rank()
        self.primary = self.rank == 0
        self._memory = PeakPSS() if sample_memory and self.primary else None
        self.log = logging.getLogger(f"gradfidelity.run.{study}")

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> Run:
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.primary:
            # a stale result, or a stale record of how it was made, must never survive a rerun
            (self.dir / "metrics.json").unlink(missing_ok=True)
            (self.dir / "provenance.json").unlink(missing_ok=True)
        self._handler = logging.FileHandler(self.dir / ("log.txt" if self.primary else f"log_rank{self.rank}.txt"))
        self._handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        self.log.addHandler(self._handler)
        self.log.setLevel(logging.INFO)
        self.thread_settings = configure_threads(self.threads)
        seed_everything(self.seed)
        self.started, self._t0 = _now(), time.perf_counter()
        if self._memory:
            self._memory.__enter__()
        self.log.info("start %s seed=%d threads=%d rank=%d/%d dir=%s", self.study, self.seed, self.threads,
                      self.rank, self.world_size, self.dir)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self._memory:
            self._memory.__exit__(None, None, None)
        suppress = False
        if isinstance(exc, Diverged):
            self.log.warning("diverged: %s", exc)
            self._write_metrics("diverged", {"diverged_at_step": exc.step, "diverged_value": repr(exc.value),
                                             "diverged_what": exc.what}, {})
            if self.primary:
                (self.dir / CHECKPOINT).unlink(missing_ok=True)
            suppress = True
        elif exc is not None:
            self.log.error("failed: %r (checkpoint kept for resume)", exc)
        if self.primary:
            self._write_provenance()
        self.log.removeHandler(self._handler)
        self._handler.close()
        return suppress

    # ------------------------------------------------------------------ training-loop helpers
    def progress(self, iterable: Iterable, **kwargs) -> Iterable:
        """A tqdm bar on a terminal; silent in logs and under Snakemake (stderr not a TTY)."""
        return tqdm(iterable, disable=not sys.stderr.isatty(), **kwargs)

    def check_finite(self, value: Any, step: int, what: str = "loss") -> None:
        v = float(value.detach()) if isinstance(value, torch.Tensor) else float(value)
        if not math.isfinite(v):
            raise Diverged(step, v, what)

    def resume(self, state: dict[str, Any]) -> tuple[int, dict]:
        """Load the checkpoint into `state` objects if one exists; return (next step, extra).

        A checkpoint whose hash does not match (damaged, truncated, or without a hash) is moved aside and the run
        starts from step 0, as if there had been none: nothing of it is loaded.
        """
        path = self.dir / CHECKPOINT
        if not path.exists():
            return 0, {}
        try:
            ckpt = load_checkpoint(path)
        except CorruptState as exc:
            self.discard_checkpoint(path, exc.reason)
            return 0, {}
        made_by, now = ckpt.get("identity_hash"), (self.identity or {}).get("hash")
        if made_by != now:
            self.discard_checkpoint(path, f"made by another job identity ({made_by} -> {now}): its config or data "
                                          "changed since")
            return 0, {}
        missing = set(state) ^ set(ckpt["state"])
        if missing:
            raise RuntimeError(f"checkpoint {path} does not match this run (keys differ: {sorted(missing)})")
        for key, obj in state.items():
            obj.load_state_dict(ckpt["state"][key])
        set_rng_state(ckpt["rng"])
        self.resumed_from = int(ckpt["step"])
        self.log.info("resumed from %s at step %d", path, self.resumed_from)
        return self.resumed_from, ckpt["extra"]

    def discard_checkpoint(self, path: Path, reason: str, move: bool = True) -> None:
        """Record (and, with `move`, rename aside) a checkpoint that failed its check; the caller restarts."""
        moved = move_aside(path).name if move else None
        self.checkpoints_discarded.append({"path": str(path), "reason": reason, "moved_to": moved})
        self.log.warning("checkpoint %s failed its check (%s): moved aside to %s; not resuming from it",
                         path, reason, moved)

    def checkpoint(self, step: int, state: dict[str, Any], extra: dict | None = None) -> None:
        if not self.primary:
            return
        save_checkpoint(self.dir / CHECKPOINT, {
            "step": step, "state": {k: v.state_dict() for k, v in state.items()},
            "rng": rng_state(), "extra": extra or {}, "identity_hash": (self.identity or {}).get("hash"),
        })

    def maybe_checkpoint(self, step: int, state: dict[str, Any], extra: dict | None = None) -> None:
        if self.checkpoint_every and step % self.checkpoint_every == 0:
            self.checkpoint(step, state, extra)

    def finish(self, metrics: dict, timing: dict | None = None) -> None:
        """Write metrics.json (status ok) and drop the checkpoint: the run is complete."""
        bad = [k for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v)]
        if bad:  # a NaN that slipped past check_finite must not become a table cell
            raise Diverged(-1, float("nan"), what=f"metric {bad[0]}")
        self._write_metrics("ok", metrics, timing or {})
        if self.primary:
            (self.dir / CHECKPOINT).unlink(missing_ok=True)

    # ------------------------------------------------------------------ records
    def _write_metrics(self, status: str, metrics: dict, timing: dict) -> None:
        self.status = status
        self.wall_s = time.perf_counter() - self._t0
        timing = {"wall_s": self.wall_s, **timing}
        self.log.info("status=%s wall=%.1fs", status, self.wall_s)
        if not self.primary:
            return
        atomic_write_json(self.dir / "metrics.json", {
            "status": status, "study": self.study, "scale": self.scale, "seed": self.seed,
            "threads": self.threads, "cell": self.cell, "metrics": metrics, "timing": timing,
        })

    def _write_provenance(self) -> None:
        record = {
            "study": self.study, "scale": self.scale, "seed": self.seed, "status": self.status, "cell": self.cell,
            "config": self.config, "config_hash": provenance.config_hash(self.config),
            **({"identity": self.identity} if self.identity else {}),
            "threads": self.thread_settings, "world_size": self.world_size, "started": self.started, "ended": _now(),
            "wall_s": time.perf_counter() - self._t0, "resumed_from_step": self.resumed_from,
            "checkpoints_discarded": self.checkpoints_discarded,
            "packages": provenance.package_versions(), "machine": provenance.machine(),
            **provenance.git_state(Path.cwd()),
        }
        if self._memory:
            record["memory"] = self._memory.record()
        atomic_write_json(self.dir / "provenance.json", record)
