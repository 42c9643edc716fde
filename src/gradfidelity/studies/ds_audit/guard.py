"""A guard for training scripts: audit the Trainer's actual DeepSpeed config before the first optimizer step.

    from gradfidelity.guard import DeepSpeedAuditCallback
    trainer = SFTTrainer(..., callbacks=[DeepSpeedAuditCallback()])

At `on_train_begin` (after the Trainer has built its DeepSpeed engine and filled the "auto" values, before the first
step) the callback writes the DeepSpeed config the Trainer uses, with its gradient accumulation and micro-batch
size, to a temporary file and runs `python -m gradfidelity audit-deepspeed` on it in a subprocess, with the same
interpreter and environment, so the DeepSpeed audited is the one this process imports (a pinned overlay on
PYTHONPATH included), with the Trainer's `max_grad_norm`. Exit 3 (dropped or mis-weighted micro-batches) and exit 5
(a gradient leaking across optimizer steps) raise `DeepSpeedAuditError`, one cause per line, or warn when
`strict=False`; exit 4 (cannot be decided on this CPU) and exit 6 (DeepSpeed clips at another threshold than
`max_grad_norm`, e.g. 0.19's default 1.0 when the config has no `gradient_clipping`) warn; exit 2 raises (the config
could not be audited). Past `timeout_s` the audit is stopped and a DeepSpeedAuditError names the setting.
Why a subprocess: the audit's own probe processes must not share this
process's DeepSpeed state (its engine, its process group). Users import it as `gradfidelity.guard`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

from gradfidelity.studies.ds_audit.audit import (
    EXIT_CLIP_THRESHOLD,
    EXIT_DROPS,
    EXIT_FAITHFUL,
    EXIT_LEAK,
    EXIT_UNDECIDED,
)

try:
    from transformers import TrainerCallback
except ImportError:  # pragma: no cover - transformers is a dependency of the training stack only
    TrainerCallback = object


class DeepSpeedAuditError(RuntimeError):
    """The installed DeepSpeed does not apply every micro-batch of this Trainer's config."""


def trainer_ds_config(args) -> dict | None:
    """The DeepSpeed config the Trainer runs with ("auto" values filled), or None when DeepSpeed is off."""
    hf = getattr(args, "hf_deepspeed_config", None)
    if hf is not None and getattr(hf, "config", None):
        return dict(hf.config)
    ds = getattr(args, "deepspeed", None)
    if not ds:
        return None
    if isinstance(ds, dict):
        return dict(ds)
    return json.loads(Path(ds).read_text())


class DeepSpeedAuditCallback(TrainerCallback):
    """Audit the Trainer's DeepSpeed config at train begin; raise (strict) or warn on dropped micro-batches.

    Second mode, `gradient_check=True`: before the config audit, every rank compares the gradient of the first
    accumulation window, produced by this Trainer's own `training_step` and `compute_loss` on its own collated
    micro-batches, with the one-batch gradient of the same samples normalised per token (or per sequence:
    `normalise="sequence"`), `loss_check.check_window_gradient`. A mismatch (a per-micro-batch mean loss, the
    transformers gradient-accumulation normalisation class of bug) raises with the measured ratio. It needs the
    Trainer, which callbacks are not given: use `DeepSpeedAuditCallback.install(trainer, gradient_check=True)`.
    Cost: two forward-backward passes over one window, once (well under a second for the tests' tiny model; about
    two optimizer steps' compute in general), and three fp32 copies of the gradients. It works without DeepSpeed
    too (the config audit is then skipped).
    """

    def __init__(self, strict: bool = True, ranks: int = 1, steps: int = 2, timeout_s: float = 600.0,
                 gradient_check: bool = False, normalise: str = "token"):
        self.strict, self.ranks, self.steps, self.timeout_s = strict, ranks, steps, timeout_s
        self.gradient_check, self.normalise = gradient_check, normalise
        self.trainer = None
        self.result: dict | None = None
        self.window_check = None

    @classmethod
    def install(cls, trainer, **kwargs) -> DeepSpeedAuditCallback:
        """Make a callback bound to `trainer` (needed by the gradient check) and add it to the trainer."""
        cb = cls(**kwargs)
        cb.trainer = trainer
        trainer.add_callback(cb)
        return cb

    def check_gradient(self, model) -> None:
        from gradfidelity.studies.ds_audit.loss_check import check_window_gradient

        if self.trainer is None:
            raise DeepSpeedAuditError("gradient_check=True needs the Trainer: use "
                                      "DeepSpeedAuditCallback.install(trainer, gradient_check=True)")
        res = check_window_gradient(self.trainer, model, normalise=self.normalise)
        self.window_check = res
        if res.ok is False:
            self._fail(f"the loss is not normalised over the accumulation window: the window's gradient is "
                       f"{res.ratio:.4g}x the one-batch gradient of its samples.\n" + res.message(), error=True)
        elif res.ok is None:
            self._fail("gradient check undecided.\n" + res.message(), error=False)

    def _fail(self, msg: str, error: bool) -> None:
        if error and self.strict:
            raise DeepSpeedAuditError(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=3)

    def audit(self, args) -> dict | None:
        cfg = trainer_ds_config(args)
        if cfg is None:
            return None
        ga, mbs = int(args.gradient_accumulation_steps), int(args.per_device_train_batch_size)
        cfg = {**cfg, "gradient_accumulation_steps": ga, "train_micro_batch_size_per_gpu": mbs}
        cfg.pop("train_batch_size", None)  # derived by DeepSpeed from the two above and the world size
        if cfg.get("gradient_clipping") == "auto":
            cfg["gradient_clipping"] = float(args.max_grad_norm)
        with tempfile.TemporaryDirectory(prefix="gf-guard-") as tmp:
            path, out = Path(tmp) / "ds_config.json", Path(tmp) / "audit.json"
            path.write_text(json.dumps(cfg, default=str))
            cmd = [sys.executable, "-m", "gradfidelity", "audit-deepspeed", str(path), "--ranks", str(self.ranks),
                   "--steps", str(self.steps), "--gradient-accumulation-steps", str(ga), "--micro-batch-size",
                   str(mbs), "--json", str(out)]
            env = {k: v for k, v in os.environ.items()
                   if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "LOCAL_WORLD_SIZE")}
            if args.max_grad_norm is not None:
                cmd += ["--max-grad-norm", str(float(args.max_grad_norm))]
            returncode, stdout, stderr = self._run_audit(cmd, env)
            result = json.loads(out.read_text()) if out.is_file() else {}
        result.update(returncode=returncode, stdout=stdout, stderr=stderr)
        self.result = result
        return result

    def _run_audit(self, cmd: list[str], env: dict) -> tuple[int, str, str]:
        """Run the audit in its own process group; past `timeout_s`, stop the whole group (the audit's SIGTERM
        handler removes its probe processes and temporary folder) and raise a clear error instead of a bare
        TimeoutExpired that would abort training with a traceback."""
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                start_new_session=True)
        try:
            stdout, stderr = proc.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
            raise DeepSpeedAuditError(
                f"the DeepSpeed audit did not finish within timeout_s={self.timeout_s:g} s "
                "(DeepSpeedAuditCallback(timeout_s=...)).\n"
                "- Likely cause: a cold extension cache, so DeepSpeed first builds its CPU ops (minutes on few "
                "cores); `make setup` prebuilds them, or run `gradfidelity audit-deepspeed` once beforehand.\n"
                "- Or a loaded machine: raise timeout_s.") from None
        return proc.returncode, stdout, stderr

    def on_train_begin(self, args, state, control, **kwargs):
        if self.gradient_check:  # on every rank: the check averages gradients over ranks like the run does
            self.check_gradient(kwargs.get("model"))
        if not getattr(state, "is_world_process_zero", True):
            return control
        res = self.audit(args)
        if res is None:
            return control
        code = res["returncode"]
        cases = [c for c in res.get("cases", []) if c.get("verdict") != "faithful"]
        head = f"DeepSpeed {res.get('deepspeed')} audit of this run (GA {args.gradient_accumulation_steps}): "
        if code in (EXIT_DROPS, EXIT_LEAK):
            lines = []
            for c in cases:
                dropped = c["state"]["result"]["dropped"]
                what = (f"micro-batches {dropped} of each step dropped" if any(dropped) and c["verdict"] != "leaking"
                        else c["verdict"])
                lines.append(f"- {c['label']}: {what}")
            lines += [f"- cause: {r}" for r in dict.fromkeys(c["reason"] for c in cases if c.get("reason"))]
            self._fail(head + "the optimizer does not receive the gradient you asked for.\n" + "\n".join(lines),
                       error=True)
        elif code == EXIT_UNDECIDED:
            self._fail(head + "undecidable on this machine.\n- " + res["stdout"].strip().splitlines()[-1],
                       error=False)
        elif code == EXIT_CLIP_THRESHOLD:
            self._fail(head + "clipping threshold differs.\n- " + str(res.get("clip", {}).get("warning")),
                       error=False)
        elif code != EXIT_FAITHFUL:
            raise DeepSpeedAuditError(f"DeepSpeed audit could not run (exit {code}): {res['stderr'].strip()[-500:]}")
        return control
