"""Stand-ins for check-reference's tests: hand-made run records as the harness writes them, and a Snakemake call
that writes them instead of training (it can fail a run or stop at the budget midway, like a real call)."""

import time
from pathlib import Path

from gradfidelity.harness.io import atomic_write_json
from gradfidelity.reference.rerun import BUDGET, FAILED, OK, Call, finished_runs

HOST = {"cpu_model": "AMD EPYC", "cpu_vendor": "AuthenticAMD", "cpu_family": 25, "cpu_model_number": 17,
        "cpu_stepping": 1, "cpu_capability": "AVX512", "cpu_flags": "avx2 avx512f", "cpu_isa_limits": "none"}


def write_run(root: Path, run: str, study: str, metrics: dict, machine: dict = HOST, wall: float = 10.0,
              seed: int = 0) -> Path:
    """A finished run's metrics.json and provenance.json under root/run."""
    run_dir = Path(root) / run
    atomic_write_json(run_dir / "metrics.json", {
        "status": "ok", "study": study, "scale": "cpu", "seed": seed, "threads": 1,
        "cell": {"study": study, "seed": str(seed)}, "metrics": metrics, "timing": {"wall_s": wall}})
    atomic_write_json(run_dir / "provenance.json", {
        "study": study, "scale": "cpu", "seed": seed, "status": "ok", "git_sha": "abc", "git_dirty": False,
        "git_dirty_files": [], "git_dirty_outputs": [], "machine": machine,
        "threads": {"torch_num_threads": 1, "OMP_NUM_THREADS": "1"}, "resumed_from_step": None,
        "checkpoints_discarded": [], "packages": {"torch": "2.13.0"}})
    return run_dir / "metrics.json"


class FakeSnakemake:
    """`reference.rerun.snakemake_call` without Snakemake: each call writes the record of every run it is given
    (`records`: run -> (study, metrics, wall_s)), in order, until `fail_after` or `budget_after` records have been
    written over all calls: then the call ends failed (a job failed) or at the budget, its later runs unwritten."""

    def __init__(self, records: dict[str, tuple[str, dict, float]], fail_after: int | None = None,
                 budget_after: int | None = None, machine: dict = HOST):
        self.records, self.fail_after, self.budget_after, self.machine = records, fail_after, budget_after, machine
        self.calls: list[list[str]] = []
        self.written = 0

    def __call__(self, work, call: Call, cores, extra_config, deadline=None, env=None) -> Call:
        self.calls.append(list(call.runs))
        started = time.time() - 1  # a record's mtime has a coarse clock on some file systems
        call.status = OK
        for run in call.runs:
            if self.written == self.budget_after:
                call.status = BUDGET
                break
            if self.written == self.fail_after:
                call.status = FAILED
                break
            study, metrics, wall = self.records[run]
            write_run(work, run, study, metrics, self.machine, wall)
            self.written += 1
        call.log = Path(work) / f"{call.label}.log"
        call.finished = finished_runs(Path(work), call.runs, started)
        return call
