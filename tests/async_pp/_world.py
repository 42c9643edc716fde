"""The hand-made world of study B's claim tests (a helper module, not a test module): a sync loss exactly linear in
log2(steps), L(n) = 3 + 0.01 seed - 0.2 log2(n), so that an async run built to end at L(f T) has the effective compute
fraction f by construction; worlds where every claim holds (HOLDS) or is false (FALSE); the runs table of a world;
an LR-selection table; two host types' CPU identities."""

from __future__ import annotations

import copy
import math

import pandas as pd

from gradfidelity.claims.verify import load_registry
from gradfidelity.studies.async_pp.config import DEFAULTS, OPTIMIZERS, StudyConfig
from gradfidelity.studies.async_pp.plan import cells
from tests.async_pp._cfg import SMOKE, study

# Three seeds and a length sweep of three doublings inside a ladder that reaches below it (B7 needs a reference
# length below the longest whose gate passes).
_SECTION = copy.deepcopy(SMOKE)
_SECTION["sweeps"]["length"] = {"optimizers": ["muon"], "steps": [15, 30, 60]}
_SECTION["sweeps"]["ladder"] = {"steps": [5, 15, 30, 60, 120]}
# AdamW 0.9's 2bw listed as a near-tie (its second LR x1 on the evaluation seeds): _selection() makes it one
_SECTION["sweeps"]["near_tie"] = [{"optimizer": "adamw", "momentum": 0.9, "schedule": "2bw", "depth": 1,
                                   "multiplier": 1}]
CFG = study(_SECTION, seeds=3)
T = CFG.train.steps
SLOPE = 0.2
ROWS = {r["id"]: r for r in load_registry() if r["study"] == "async_pp"}
ROOT = "results/async_pp"


def _noise(opt: str, seed: int) -> float:
    """A seed- and optimizer-dependent factor (0.98, 1.0, 1.02) on the lost compute, the same at every budget."""
    return 1.0 + 0.02 * (((seed + OPTIMIZERS.index(opt)) % 3) - 1)


def sync_loss(steps: float, seed: int) -> float:
    return 3.0 + 0.01 * seed - SLOPE * math.log2(steps)


HOLDS = {  # a world where every claim B1..B9 holds; f = the share of compute the async run keeps
    "f": {"adamw": 0.3, "muon": 0.97, "soap": 0.8, "adan": 0.6, "lion": 0.5, "mars": 0.5},
    "momentum": lambda mom, default: (1 - mom) / (1 - default),  # on the lost compute: higher momentum, less lost
    "length": lambda opt, steps: 0.0,  # f does not move with the budget
    "pipedream": lambda lost, P: lost + 0.02 * P,  # lost compute grows with depth, above 2bw's at P > 2
    "ef": lambda opt, s: {"muon": 0.6 + 0.01 * (s - 1), "adamw": 0.875 + 0.002 * (s - 1)}.get(opt, 0.5),
    "mit": {"taylor": 0.9, "sync_start": 0.95, "sync_cooldown": 0.5},
}
FALSE = {  # a world where every one of them is false
    "f": {"adamw": 0.9, "muon": 0.5, "soap": 0.3, "adan": 0.3, "lion": 0.3, "mars": 0.5},
    "momentum": lambda mom, default: mom / default,
    # Muon keeps f up to 30 steps and loses 0.2 more from 60 on: the gate passes at 15 (f(15) = f(30)) and at the
    # main budget (f(60) = f(120)), and B7 sees f fall by 0.2 from 15 to 60.
    "length": lambda opt, steps: -0.2 if opt == "muon" and steps >= 60 else 0.0,
    "pipedream": lambda lost, P: lost + 0.1 / P,
    "ef": lambda opt, s: 0.2 + 0.01 * (s - 1),
    "mit": {"taylor": 1.2, "sync_start": 1.1, "sync_cooldown": 1.15},
}


def world_f(world: dict, c) -> float:
    """The f the world gives an async cell. A seed-dependent jitter of 0.0002 (s - 1) per doubling away from T keeps
    f(2T) - f(T) from being a constant series (whose interval collapses to a point) and averages to 0."""
    default = DEFAULTS[c.optimizer]["momentum"]
    lost = (1 - world["f"][c.optimizer]) * _noise(c.optimizer, c.seed) * world["momentum"](c.momentum, default)
    lost -= world["length"](c.optimizer, c.steps)
    if c.schedule.startswith("pipedream"):
        lost = world["pipedream"](lost, c.depth)
    if c.mitigation == "error_feedback":
        lost *= 1 - world["ef"](c.optimizer, c.seed)
    elif c.mitigation != "none":
        lost *= world["mit"][c.mitigation] * (1 + 0.02 * (c.seed - 1))
    return 1 - lost + 0.0002 * (c.seed - 1) * math.log2(c.steps / T)


def _loss(world: dict, c) -> float:
    if c.schedule == "sync":
        return sync_loss(c.steps, c.seed)
    return sync_loss(world_f(world, c) * c.steps, c.seed)


def _runs(world: dict, cfg: StudyConfig = CFG, loss=None) -> pd.DataFrame:
    loss = loss or (lambda c: _loss(world, c))
    return pd.DataFrame([{"optimizer": c.optimizer, "lr": c.lr, "head": c.head, "schedule": c.schedule,
                          "mitigation": c.mitigation, "depth": c.depth, "momentum": c.momentum, "steps": c.steps,
                          "seed": c.seed, "width": c.width, "status": "ok", "final_val_loss": loss(c),
                          "run_dir": c.dir(ROOT)}
                         for c in cells(cfg)])


def _selection(adamw_near_tie: bool = True, widths: bool = False) -> pd.DataFrame:
    """An LR-selection table: AdamW 0.9's 2bw a near-tie (best x1, as smoke's sweeps.near_tie lists), Muon's 2bw a
    near-tie whose best is sync's choice (read at lr~tuned), Adan's sync arm a near-tie (no second ladder). With
    `widths`, a width ladder's rows below them (as the cpu selection has them): Muon 0.95 at d 64, a near-tie on both
    schedules at another multiplier and with another sync choice."""
    row = lambda o, m, s, chosen, best, near, width=0: {  # noqa: E731
        "optimizer": o, "momentum": m, "schedule": s, "depth": 1, "width": width, "chosen_multiplier": chosen,
        "best_multiplier": best, "near_tie": near}
    rows = [row("adamw", 0.9, "sync", 1.0, 1.0, False), row("adamw", 0.9, "2bw", 0.5, 1.0, adamw_near_tie),
            row("muon", 0.95, "sync", 1.0, 1.0, False), row("muon", 0.95, "2bw", 0.5, 1.0, True),
            row("adan", 0.98, "sync", 0.5, 1.0, True)]
    if widths:
        rows += [row("muon", 0.95, "sync", 0.5, 2.0, True, 64), row("muon", 0.95, "2bw", 0.5, 2.0, True, 64)]
    return pd.DataFrame(rows)


AMD = {"cpu_model": "AMD EPYC", "cpu_vendor": "AuthenticAMD", "cpu_family": "25", "cpu_model_number": "17",
       "cpu_stepping": "1", "cpu_capability": "AVX512", "cpu_flags": "avx2 avx512f avx512_bf16",
       "cpu_isa_limits": "none"}
INTEL = {"cpu_model": "Intel Xeon", "cpu_vendor": "GenuineIntel", "cpu_family": "6", "cpu_model_number": "167",
         "cpu_stepping": "1", "cpu_capability": "AVX512", "cpu_flags": "avx2 avx512f avx512_bf16 amx",
         "cpu_isa_limits": "none"}
