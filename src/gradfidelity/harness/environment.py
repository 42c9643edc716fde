"""A job's process environment, set by the CLI before any study code runs (every workflow job is
`python -m gradfidelity <subcommand>`): the workflow holds no study's environment.

- `DS_ACCELERATOR=cpu` at the CPU scales (smoke, cpu; the workflow puts GRADFIDELITY_SCALE into every job):
  DeepSpeed would otherwise look for an accelerator it cannot use there. At the paper scale DeepSpeed detects the
  GPUs itself, and outside the workflow (a user's audit) nothing is forced. A value already set wins, and the
  variable reaches every child process (torchrun ranks, the audit's probes) before DeepSpeed is imported.
"""

from __future__ import annotations

import os

CPU_SCALES = ("smoke", "cpu")
SCALE_ENV = "GRADFIDELITY_SCALE"  # the workflow puts the scale into every job's environment (common.smk)


def prepare_job_environment(environ=os.environ) -> None:
    if environ.get(SCALE_ENV) in CPU_SCALES:
        environ.setdefault("DS_ACCELERATOR", "cpu")
