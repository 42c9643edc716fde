"""A guard for training scripts: audit the Trainer's actual DeepSpeed config before the first optimizer step.

    from gradfidelity.guard import DeepSpeedAuditCallback
    trainer = SFTTrainer(..., callbacks=[DeepSpeedAuditCallback()])

At `on_train_begin` (after the Trainer has built its DeepSpeed engine and filled the "auto" values, before the first
step) the callback writes the DeepSpeed config the Trainer uses, with its gradient accumulation and micro-batch
size, to a temporary file and runs `python -m gradfidelity audit-deepspeed` on it in a subprocess, with the same
interpreter and environment, so the DeepSpeed audited is the one this process imports (a pinned overlay on
PYTHONPATH included). Exit 3 (dropped or mis-weighted micro-batches) raises `DeepSpeedAuditError` naming the dropped
micro-batches and the cause, or warns when `strict=False`; exit 4 (cannot be decided on this CPU) warns; exit 2
raises (the config could not be audited). Why a subprocess: the audit's own probe processes must not share this
process's DeepSpeed state (its engine, its process group). Users import it as `gradfidelity.guard`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

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
    """Audit the Trainer's DeepSpeed config at train begin; raise (strict) or warn on dropped micro-batches."""

    def __init__(self, strict: bool = True, ranks: int = 1, steps: int = 2, timeout_s: float = 600.0):
        self.strict, self.ranks, self.steps, self.timeout_s = strict, ranks, steps, timeout_s
        self.result: dict | None = None

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
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=self.timeout_s, env=env)
            result = json.loads(out.read_text()) if out.is_file() else {}
        result.update(returncode=proc.returncode, stdout=proc.stdout, stderr=proc.stderr)
        self.result = result
        return result

    def on_train_begin(self, args, state, control, **kwargs):
        if not getattr(state, "is_world_process_zero", True):
            return control
        res = self.audit(args)
        if res is None:
            return control
        code = res["returncode"]
        if code == 3:
            lost = [f"{c['label']}: micro-batches {c['state']['result']['dropped']} of each step dropped"
                    if any(c["state"]["result"]["dropped"]) else f"{c['label']}: {c['verdict']}"
                    for c in res.get("cases", []) if c.get("deciding") and c.get("verdict") != "faithful"]
            reasons = sorted({c["reason"] for c in res.get("cases", []) if c.get("deciding") and c.get("reason")})
            self._fail(f"DeepSpeed {res.get('deepspeed')} does not apply every micro-batch of this run "
                       f"(GA {args.gradient_accumulation_steps}): " + "; ".join(lost) + ". " + " ".join(reasons),
                       error=True)
        elif code == 4:
            self._fail("DeepSpeed audit undecidable on this machine: " + res["stdout"].strip().splitlines()[-1],
                       error=False)
        elif code != 0:
            raise DeepSpeedAuditError(f"DeepSpeed audit could not run (exit {code}): {res['stderr'].strip()[-500:]}")
        return control
