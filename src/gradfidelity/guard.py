"""The public import path of the Trainer guard (`from gradfidelity.guard import DeepSpeedAuditCallback`), kept for
users' training scripts; the guard itself is study A's audit and lives with it (studies/ds_audit/guard.py)."""

from gradfidelity.studies.ds_audit.guard import DeepSpeedAuditCallback, DeepSpeedAuditError

__all__ = ["DeepSpeedAuditCallback", "DeepSpeedAuditError"]
