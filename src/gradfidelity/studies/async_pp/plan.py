"""The sweep plan: which cells to train, where their run directories are, and how they are grouped into jobs.

A cell is (optimizer, schedule, mitigation, depth, momentum, steps) + seed. Its directory spells every value,
`results/async_pp/optimizer~muon/schedule~2bw/mitigation~none/depth~1/momentum~0.95/steps~300/seed0/` (the
Snakemake Paramspace `name~value` convention), so a cell that two sweeps share (e.g. the main sweep's AdamW at its
default momentum is also a point of the momentum sweep) is trained once and read by both.

Sweeps (config `sweeps`):
- main:     optimizer x {sync, 2bw, 2bw+error_feedback, 2bw+taylor, 2bw+sync_start, 2bw+sync_cooldown}
- momentum: optimizer x momentum x {sync, 2bw}
- depth:    optimizer x P x {pipedream, pipedream_vsync} (compared with the depth-free sync and 2bw cells)
- length:   optimizer x steps x {sync, 2bw}
Jobs: each Snakemake job trains `cells_per_job` cells of one optimizer and seed in one process (python + torch
start-up costs seconds per job on 2 cores); every cell still gets its own run directory and metrics.json.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from gradfidelity.errors import UserError
from gradfidelity.studies.async_pp.names import MITIGATIONS, OPTIMIZERS, SCHEDULES

KEYS = ("optimizer", "schedule", "mitigation", "depth", "momentum", "steps")


@dataclass(frozen=True, order=True)
class Cell:
    optimizer: str
    schedule: str
    mitigation: str
    depth: int
    momentum: float
    steps: int
    seed: int

    def dir(self, root: str = "results/async_pp") -> str:
        parts = "/".join(f"{k}~{getattr(self, k)}" for k in KEYS)
        return f"{root}/{parts}/seed{self.seed}"

    def metrics(self, root: str = "results/async_pp") -> str:
        return f"{self.dir(root)}/metrics.json"


def default_momentum(cfg: dict, optimizer: str) -> float:
    """The optimizer's momentum outside the momentum sweep: config `optimizers.<name>.momentum`."""
    try:
        return float(cfg["optimizers"][optimizer]["momentum"])
    except (KeyError, TypeError):
        raise UserError(f"async_pp.optimizers.{optimizer}.momentum is missing") from None


def _variant(v: str) -> tuple[str, str]:
    """'2bw+error_feedback' -> ('2bw', 'error_feedback'); 'sync' -> ('sync', 'none')."""
    schedule, _, mitigation = v.partition("+")
    mitigation = mitigation or "none"
    if schedule not in SCHEDULES or mitigation not in MITIGATIONS:
        raise UserError(f"async_pp.sweeps.main.variants: {v!r} is not schedule[+mitigation] with schedule in "
                        f"{list(SCHEDULES)} and mitigation in {list(MITIGATIONS)}")
    return schedule, mitigation


def cells(cfg: dict) -> list[Cell]:
    """Every cell of every sweep, deduplicated and sorted."""
    steps = int(cfg["train"]["steps"])
    seeds = range(int(cfg["seeds"]))
    sw = cfg["sweeps"]
    out: set[Cell] = set()

    def add(opt, schedule, mitigation="none", depth=1, momentum=None, n_steps=steps):
        if opt not in OPTIMIZERS:
            raise UserError(f"async_pp.sweeps: optimizer {opt!r} not in {list(OPTIMIZERS)}")
        mom = default_momentum(cfg, opt) if momentum is None else float(momentum)
        depth = int(depth) if schedule.startswith("pipedream") else 1
        for s in seeds:
            out.add(Cell(opt, schedule, mitigation, depth, mom, int(n_steps), s))

    for opt in sw["main"]["optimizers"]:
        for v in sw["main"]["variants"]:
            add(opt, *_variant(v))
    for opt in sw["momentum"]["optimizers"]:
        for mom in sw["momentum"]["momenta"]:
            for schedule in ("sync", "2bw"):
                add(opt, schedule, momentum=mom)
    n_units = 2 * int(cfg["model"]["n_layers"]) + 2
    if max(sw["depth"]["depths"]) > n_units:
        raise UserError(f"async_pp.sweeps.depth.depths: P = {max(sw['depth']['depths'])} exceeds the model's "
                        f"{n_units} pipeline units (2 * model.n_layers + 2)")
    for opt in sw["depth"]["optimizers"]:
        for schedule in ("sync", "2bw"):
            add(opt, schedule)
        for P in sw["depth"]["depths"]:
            for schedule in sw["depth"]["schedules"]:
                add(opt, schedule, depth=P)
    for opt in sw["length"]["optimizers"]:
        for n in sw["length"]["steps"]:
            for schedule in ("sync", "2bw"):
                add(opt, schedule, n_steps=n)
    return sorted(out)


@dataclass(frozen=True)
class Group:
    name: str
    cells: tuple[Cell, ...]

    def cells_json(self) -> str:
        return json.dumps([asdict(c) for c in self.cells], sort_keys=True)


def groups(cfg: dict) -> list[Group]:
    """Cells of one (optimizer, seed), cheapest first, chunked by `cells_per_job`."""
    per = int(cfg.get("cells_per_job", 1))
    by_key: dict[tuple[str, int], list[Cell]] = {}
    for c in cells(cfg):
        by_key.setdefault((c.optimizer, c.seed), []).append(c)
    out = []
    for (opt, seed), cs in sorted(by_key.items()):
        for i in range(0, len(cs), per):
            out.append(Group(f"{opt}_seed{seed}_{i // per}", tuple(cs[i:i + per])))
    return out


def cell_from_dict(d: dict) -> Cell:
    try:
        return Cell(**d)
    except TypeError as exc:
        raise UserError(f"async_pp cell {d}: {exc}") from None
