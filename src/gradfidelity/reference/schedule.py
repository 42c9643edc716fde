"""check-reference's rerun, in the order and the time it has: a speed probe per study, the sample sized to a budget,
one Snakemake call per study (drift-only studies first), and an expected time printed as soon as the first probe
has run (within the first minute on the hosts measured so far: its probe is study A's audit, 16 s committed).

Without a budget the sample is the fixed one (sample.SAMPLE_S of committed job time) and the check runs to its end.
With one (`--budget SECONDS`), the drift-only studies' probes measure this host's speed, the sample is sized so that
its expected time fits what is left of the budget, and every call stops at the budget; a study not yet probed is
assumed as slow as the slowest probed one until its own probe runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from gradfidelity.reference.dag import Job
from gradfidelity.reference.rerun import (
    BUDGET,
    DEFAULT_OVERHEAD_S,
    FAILED,
    INTERRUPTED,
    Call,
    expected_s,
    finished_runs,
    log_tail,
    minutes,
    rerun_rows,
    snakemake_call,
    speed_ratio,
)
from gradfidelity.reference.sample import SAMPLE_S, SCALE, candidates, extra_cost, run_order, select
from gradfidelity.reference.seeds import chaotic_metrics


@dataclass
class Progress:
    """What the rerun set out to do and how far it got."""
    sample: list[str] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    stopped: str | None = None  # BUDGET or INTERRUPTED: nothing ran after it
    ratios: dict[str, float] = field(default_factory=dict)  # study -> measured speed ratio
    overheads: list[float] = field(default_factory=list)  # a probe call's time beyond its run's own
    budget_s: float | None = None
    work: Path | None = None  # the scratch copy, and when the rerun began there (time.time())
    since: float = 0.0

    @property
    def overhead_s(self) -> float:
        """Snakemake's start-up per call: the least a probe call took beyond its run (data jobs make others more)."""
        return min(self.overheads) if self.overheads else DEFAULT_OVERHEAD_S

    @property
    def attempted(self) -> set[str]:
        return {r for c in self.calls for r in c.runs}

    @property
    def finished(self) -> list[str]:
        """The sampled runs with a record written since the rerun began, read from the scratch copy itself: a stop
        between two calls, or inside one, loses none."""
        return finished_runs(self.work, self.sample, self.since) if self.work is not None else []

    def incomplete(self) -> str:
        """'' when every sampled run finished and nothing stopped; else why not, in a few words."""
        why = []
        if self.stopped == BUDGET:
            why.append(f"the budget of {self.budget_s:.0f} s ran out")
        elif self.stopped == INTERRUPTED:
            why.append("interrupted (Ctrl-C or a stop signal)")
        failed = [c for c in self.calls if c.status == FAILED]
        if failed:
            why.append("a rerun job failed (" + ", ".join(f"{c.label}: {c.log}" for c in failed) + ")")
        if not why and len(self.finished) < len(self.sample):
            why.append("some runs wrote no record")
        return "; ".join(why)


def _label(run: str) -> str:
    return run.removeprefix(f"results/{SCALE}/")


class Schedule:
    """The rerun's state between calls: what has run, this host's speed, the deadline."""

    def __init__(self, work: Path, tables: dict[str, pd.DataFrame], plans: dict[str, list[Job]], cores: int,
                 extra_config: tuple[str, ...], budget_s: float | None, start: float, env: dict | None = None):
        self.work, self.tables, self.plans, self.cores, self.env = work, tables, plans, cores, env
        self.extra_config = extra_config
        self.deadline = None if budget_s is None else start + budget_s
        self.order, self.cost_of = candidates(tables, plans)
        self.firsts = {study: runs[0] for study, runs in self.order.items()}
        self.study_of = {r: s for s, df in tables.items() for r in df["run_id"]}
        self.wall = {r.run_id: float(r.wall_s) for df in tables.values() for r in df.itertuples()}
        # a second's margin: file times come from a coarser clock than time.time(); the scratch copy holds no
        # record of the sample before the rerun (scratch_copy leaves them out), so nothing older can slip in
        self.progress = Progress(budget_s=budget_s, work=work, since=time.time() - 1.0)
        self.sized = budget_s is None  # the sample is known: the fixed one, or once sized to the budget

    # ------------------------------------------------------------------ calls
    def call(self, label: str, runs: list[str]) -> Call | None:
        """One Snakemake call; None (and `stopped`) when the budget is already spent or the check was stopped."""
        p = self.progress
        if p.stopped:
            return None
        if self.deadline is not None and time.monotonic() >= self.deadline:
            p.stopped = BUDGET
            return None
        call = snakemake_call(self.work, Call(label, runs), self.cores, self.extra_config, self.deadline, self.env)
        p.calls.append(call)
        if call.status in (BUDGET, INTERRUPTED):
            p.stopped = call.status
        elif call.status == FAILED:
            print(f"check-reference: the {label} call failed ({len(call.finished)} of {len(runs)} runs finished); "
                  f"its log: {call.log}\n{log_tail(call)}", flush=True)
        return call

    def probe(self, study: str) -> None:
        """Rerun the study's cheapest cell alone and measure this host's speed ratio on it."""
        run = self.firsts[study]
        call = self.call(f"{study}-probe", [run])
        if call is None or run not in call.finished:
            return
        own = float(rerun_rows(self.work, [run])["wall_s"].iloc[0])
        ratio = speed_ratio(self.wall.get(run, 0.0), own)
        if ratio == ratio:  # not NaN
            self.progress.ratios[study] = ratio
        self.progress.overheads.append(max(call.elapsed_s - own, 0.0))
        print(f"check-reference: {study}'s probe {_label(run)} ran {own:.0f} s here, {self.wall.get(run, 0):.0f} s "
              f"committed: speed ratio {ratio:.2g}" + (f"; {self.estimate_text()}" if self.sized else ""), flush=True)

    # ------------------------------------------------------------------ time
    def ratios(self) -> dict[str, float]:
        """study -> speed ratio: measured, else the slowest measured (1 before any probe)."""
        measured = self.progress.ratios
        fallback = max(measured.values()) if measured else 1.0
        return {s: measured.get(s, fallback) for s in self.order}

    def left(self, runs: list[str]) -> tuple[dict[str, float], int]:
        """(study -> committed seconds of the jobs `runs` still need, the Snakemake calls they need)."""
        done = set().union(*(self.cost_of[r][0] for r in self.progress.attempted if r in self.cost_of))
        costs: dict[str, float] = {}
        for run in runs:
            if run in self.progress.attempted:
                continue
            for key, cost in self.cost_of[run][1].items():
                if key not in done:
                    done.add(key)
                    costs[key[0]] = costs.get(key[0], 0.0) + cost
        studies = {self.study_of[r] for r in runs if r not in self.progress.attempted}
        probes = {s for s in studies if self.firsts[s] in runs and self.firsts[s] not in self.progress.attempted}
        return costs, len(studies) + len(probes)

    def expected_left_s(self) -> float:
        costs, calls = self.left(self.progress.sample)
        return expected_s(costs, self.ratios(), self.cores, calls, self.progress.overhead_s)

    def estimate_text(self) -> str:
        measured = self.progress.ratios
        ratios = ", ".join(f"{s} {r:.2g}" + ("" if s in measured else " assumed") for s, r in self.ratios().items())
        sample = self.progress.sample
        left = len([r for r in sample if r not in self.progress.attempted])
        return (f"expected time for the {left} runs left of {len(sample)}: about {minutes(self.expected_left_s())} "
                f"(speed ratios {ratios}; {self.cores} jobs at a time)")

    def sized_sample(self, runs_of: dict | None) -> list[str]:
        """The sample whose expected time fits what is left of the budget (every study's cheapest cell whatever)."""
        ratios = self.ratios()
        left = max(self.deadline - time.monotonic(), 0.0)
        calls = len(self.order) + sum(1 for s in self.order if s not in self.progress.ratios)
        spent = sum(extra_cost(self.cost_of, r, set(), ratios) for r in self.progress.attempted if r in self.cost_of)
        job_s = max(left - calls * self.progress.overhead_s, 0.0) * max(self.cores, 1) + spent
        return select(self.tables, self.plans, job_s, runs_of, scale=ratios, strict=True)


def rerun_in_calls(schedule: Schedule, runs_of: dict | None) -> Progress:
    """The rerun, in order: the drift-only studies' probes, the sample (fixed, or sized to the budget), then per
    study (drift-only first) one call for its runs left, a chaotic study's probe first. Stops at the budget or at
    Ctrl-C; a failed call does not stop the others."""
    s, p = schedule, schedule.progress
    studies = run_order(s.order)
    p.sample = (select(s.tables, s.plans, SAMPLE_S, runs_of) if s.deadline is None
                else [s.firsts[x] for x in studies])
    total = sum(s.wall.get(r, 0.0) for r in p.sample)
    costs, calls = s.left(p.sample)
    at_committed = expected_s(costs, {x: 1.0 for x in s.order}, s.cores, calls, DEFAULT_OVERHEAD_S)
    print("check-reference: " + (f"the fixed sample: {len(p.sample)} committed cpu runs, their own committed wall "
                                 f"time {total:.0f} s, about {minutes(at_committed)} at the committed hosts' speed"
                                 if s.deadline is None else f"sizing the sample to a budget of {p.budget_s:.0f} s")
          + "; measuring this host's speed on one short run of each study first: "
          + ", ".join(f"{_label(s.firsts[x])} ({s.wall.get(s.firsts[x], 0):.0f} s committed)" for x in studies),
          flush=True)
    for study in studies:
        if not chaotic_metrics(study):
            s.probe(study)
    if p.stopped:
        return p
    if s.deadline is not None:
        p.sample, s.sized = s.sized_sample(runs_of), True
        expected = s.expected_left_s()
        left = s.deadline - time.monotonic()
        print(f"check-reference: {len(p.sample)} runs fit the budget ({minutes(left)} left, {s.estimate_text()})"
              + ("" if expected <= left else ": even every study's cheapest cell needs more, so the check stops at "
                 "the budget and compares what finished"), flush=True)
    elif not p.ratios:  # no probe measured anything (no drift-only study, or its probe failed)
        print(f"check-reference: {s.estimate_text()}", flush=True)
    for run in p.sample:
        print(f"  {run}", flush=True)
    for study in studies:
        if s.firsts[study] in p.sample and s.firsts[study] not in p.attempted:
            s.probe(study)
        rest = [r for r in p.sample if s.study_of[r] == study and r not in p.attempted]
        if rest:
            s.call(study, rest)
        if p.stopped:
            break
    return p

