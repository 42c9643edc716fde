"""Harness glue inside the Trainer: NaN -> diverged, the study's own state saved with every Trainer checkpoint, an
evaluation at a given step, resume from the last checkpoint that passes its check, and the ranks' barriers.

Why the Trainer's checkpoints and not the harness's state-dict checkpoint: with DeepSpeed the optimizer state lives
in the engine's partitioned (and offloaded) buffers, which only the engine can save and restore; the Trainer's
checkpoint also carries the RNG states, the LR scheduler, the data position and the log history. Our extra state
(token counters, ReLIFT's buffer, the evaluations at earlier steps) is written next to it by `HarnessCallback`, one file
per rank, and a manifest (rank 0) makes a damaged or cut-off checkpoint detectable before it is trusted.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from gradfidelity.errors import UserError
from gradfidelity.harness import Run
from gradfidelity.harness.integrity import CorruptState, verify_manifest, write_manifest
from gradfidelity.harness.run import launch_rank

GF_STATE = "gf_state.json"


def gf_state_name() -> str:
    """Each rank saves its own counters (they count that rank's tokens) next to the Trainer checkpoint."""
    rank, world = launch_rank()
    return GF_STATE if world == 1 else f"gf_state_rank{rank}.json"


def distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized() and launch_rank()[1] > 1


def barrier() -> None:
    if distributed():
        torch.distributed.barrier()


class HarnessCallback(TrainerCallback):
    """NaN -> Diverged; our extra state (trainer.gf_state() plus `extras`) saved with every Trainer checkpoint."""

    def __init__(self, run: Run, trainer_ref: list, extras=None):
        self.run, self.trainer_ref, self.extras = run, trainer_ref, extras or (lambda: {})

    def on_log(self, args, state, control, logs=None, **kwargs):
        for key in ("loss", "reward"):
            if logs and key in logs:
                self.run.check_finite(logs[key], state.global_step, what=key)

    def on_save(self, args, state, control, **kwargs):
        trainer = self.trainer_ref[0]
        ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        (ckpt / gf_state_name()).write_text(json.dumps({**trainer.gf_state(), "extras": self.extras()}))
        # Every rank has written its part (the Trainer's and ours) before rank 0 lists them in the manifest, which
        # `resume` checks before trusting the checkpoint.
        barrier()
        if self.run.primary:
            write_manifest(ckpt)
        barrier()


class EvalAtSteps(TrainerCallback):
    """Evaluate at given optimizer steps of one run: the smaller RL budgets (rl.eval_steps) and the truncated
    SFT-then-RL, read off the same run. `results` maps each step (a string, as JSON keeps it) to `fn(model)`; the
    results so far are saved with every checkpoint and restored on resume (`restore`)."""

    def __init__(self, steps, fn):
        self.steps, self.fn, self.results = sorted(set(steps)), fn, {}

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step in self.steps:
            self.results[str(state.global_step)] = self.fn(model, state.global_step)

    def restore(self, saved: dict | None) -> None:
        """The evaluations a resumed run made before its checkpoint (every step at or below it)."""
        self.results = dict(saved or {})

    def check(self) -> dict:
        """Every step's result, or a loud error naming the steps that never ran."""
        missing = [k for k in self.steps if str(k) not in self.results]
        if missing:
            raise RuntimeError(f"the evaluations at RL steps {missing} did not run")
        return {str(k): self.results[str(k)] for k in self.steps}


def resume(trainer, trainer_dir: Path, run: Run) -> tuple[str | None, dict]:
    """(last Trainer checkpoint that passes its manifest check, or None; the extras saved with it).

    Newer checkpoints that fail the check (damaged, truncated, or cut off before their manifest was written) are
    moved aside by rank 0 with a log line and a note in provenance.json; the run resumes from the newest good one,
    or starts over. Every rank checks the same files, so every rank picks the same checkpoint.
    """
    ckpt = None
    found = sorted((p for p in trainer_dir.glob(f"{PREFIX_CHECKPOINT_DIR}-*") if p.is_dir()
                    and p.name.split("-")[-1].isdigit()), key=lambda p: int(p.name.split("-")[-1]), reverse=True)
    bad = []
    for candidate in found:
        try:
            verify_manifest(candidate)
        except CorruptState as exc:
            bad.append((candidate, exc.reason))
            continue
        ckpt = str(candidate)
        break
    barrier()  # every rank has checked before any directory moves
    for candidate, reason in bad:
        run.discard_checkpoint(candidate, reason, move=run.primary)
    barrier()
    if not ckpt:
        return None, {}
    state_file = Path(ckpt) / gf_state_name()
    if not state_file.exists():
        raise UserError(f"{ckpt}: checkpoint without {state_file.name}; delete {trainer_dir} to start over")
    state = json.loads(state_file.read_text())
    trainer.gf_load_state(state)
    run.resumed_from = int(Path(ckpt).name.split("-")[-1])
    return ckpt, state.get("extras", {})


class StartCheckpoint(TrainerCallback):
    """SFT-then-RL's start (sft.start_every, sft.start_max_val; round 6, issue 59): at step 0 and every `every`
    optimizer steps the SFT run scores val accuracy (`score(model, step)` returns acc_val and the token counts so
    far), and saves the model (`save(model, step)`, returning its weights' digest) while that accuracy is at most
    `max_val`. After the first step above it, nothing more is scored: the start is the last step saved, so the RL
    stage starts with room to learn.

    Why a rule on val and not a fixed step: the committed round-5 curves take off between steps 60 and 120 depending
    on the seed, so no single step leaves every seed room; val is the selection set, never an evaluation set.
    `results` (step -> score) and `start` are saved with every Trainer checkpoint and restored on resume; a resumed
    run re-reaches each step with the same weights (every random draw restored), so a start saved after the
    checkpoint it resumes from is rewritten identically."""

    def __init__(self, every: int, max_val: float, score, save):
        self.every, self.max_val, self.score, self.save = every, max_val, score, save
        self.results: dict[str, dict] = {}
        self.start: int | None = None
        self.closed = False

    def _visit(self, model, step: int) -> None:
        if self.closed or str(step) in self.results:
            return
        result = dict(self.score(model, step))
        if result["acc_val"] <= self.max_val:
            result["model_sha256"] = self.save(model, step)
            self.start = step
        self.results[str(step)] = result
        if self.start != step:
            self.closed = True

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if state.global_step == 0:
            self._visit(model, 0)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.every == 0:
            self._visit(model, state.global_step)

    def state(self) -> dict:
        return {"results": self.results, "start": self.start, "closed": self.closed}

    def restore(self, saved: dict | None) -> None:
        saved = saved or {}
        self.results, self.start = dict(saved.get("results") or {}), saved.get("start")
        self.closed = bool(saved.get("closed"))

    def check(self) -> int:
        """The start step, or a loud error when no step was scored (the run never reached its first score)."""
        if self.start is None:
            raise RuntimeError("the SFT run saved no SFT-then-RL start (sft.start_every): step 0 was never scored, "
                               f"or its val accuracy {self.results.get('0')} is above sft.start_max_val "
                               f"{self.max_val}")
        return self.start
