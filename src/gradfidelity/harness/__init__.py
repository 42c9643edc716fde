"""Shared run harness: seeding, threads, provenance, checkpoint/resume, atomic writes, memory sampling."""

from gradfidelity.harness.results import load_runs
from gradfidelity.harness.run import Diverged, Run

__all__ = ["Diverged", "Run", "load_runs"]
