"""Which cells of study C exist, and where their runs live (torch-free: the workflow imports it at load).

A cell is one (corpus, width, seed); the methods of a cell run back to back in one job. The jobs come in groups,
each one rule (local.smk), each with its own methods:

  main       at `main_width`, seeds 0..seeds-1: BP, the best-BP candidates and the async methods (the headline cell)
  side       at the other widths, seeds 0..side_seeds-1: `side_methods` (the width trend C7 needs BP and Broadcast)
  power      at `main_width`, seeds seeds..power_seeds-1: `power_methods` only (the paper's decision statistics, C4,
             at the seeds their power asks for, without paying for the arms no claim reads at those seeds)
  mechanism  the serial local methods on `mechanism_corpora` x `mechanism_widths`, seeds 0..mechanism_seeds-1;
             where those seeds reach the quality cells (round 6: C8 at the n its power asks), the cell's serial
             Broadcast is the quality job's, and group `mechanism_beside_quality` runs the other serial methods there
  quality    at `main_corpus` and `main_width`, seeds max(seeds, power_seeds)..quality_seeds-1: `quality_methods`
             (BP and serial Broadcast) in one-thread jobs two at a time: C4's pairs beyond the power cells. Serial
             Broadcast is the async runtime's arithmetic bit for bit (claims.py checks it on every seed that has
             both), and a quality claim reads only bits per byte, so these jobs need not own the machine; their
             tokens per second are recorded but never read (`Group.shares_machine`)
  control    thread-matched BP (the zero-gap control) at `main_corpus` and `main_width`, seeds seeds..control_seeds-1:
             C4's and C9's tests run on a null comparison at the claim's own seeds (the control rule, registry)

Each method of a cell has its own run directory `<root>/<corpus>/w<width>/<method>/seed<k>`. Two groups may hold
the same method (BP is in main, side and power), so each group's rule carries wildcard constraints that keep its
outputs apart from the others' (`Group.constraints`); `groups` refuses a config where they would overlap.
"""

from __future__ import annotations

from dataclasses import dataclass

from gradfidelity.errors import UserError
from gradfidelity.studies.local.config import MAIN, SERIAL_LOCAL, StudyConfig

POWER_METHODS_DEFAULT = ("bp", "broadcast_async")


@dataclass(frozen=True)
class Group:
    """One job group: its methods (in run order) and its cells (corpus, width, seed)."""

    name: str
    methods: tuple[str, ...]
    cells: tuple[tuple[str, int, int], ...]

    @property
    def shares_machine(self) -> bool:
        """A quality job runs beside another (one thread each): its bits per byte count, its throughput does not."""
        return self.name in SHARED_GROUPS

    def values(self, wildcard: str) -> list[int | str]:
        i = {"corpus": 0, "width": 1, "seed": 2}[wildcard]
        return sorted({c[i] for c in self.cells})

    @property
    def constraints(self) -> dict[str, str]:
        """Wildcard regexes that match exactly this group's widths and seeds (its rule's wildcard_constraints)."""
        return {w: "|".join(str(v) for v in sorted(self.values(w), key=lambda v: (-len(str(v)), str(v))))
                for w in ("width", "seed")}


def run_dir(root: str, corpus: str, width: int | str, method: str, seed: int | str) -> str:
    """One method's run directory in a cell (`root` = results/<scale>/local)."""
    return f"{root}/{corpus}/w{width}/{method}/seed{seed}"


def run_pattern(results: str) -> str:
    """The metrics.json of any run, with Snakemake's wildcards {corpus}, {width}, {method}, {seed}."""
    return run_dir(f"{results}/local", "{corpus}", "{width}", "{method}", "{seed}") + "/metrics.json"


def corpus_widths(cfg: StudyConfig) -> dict[str, tuple[int, ...]]:
    """The widths each corpus is trained at: its own list, or all of `widths` when that is empty."""
    return {name: (c.widths or cfg.widths) for name, c in cfg.corpora.items()}


def _main_methods(cfg: StudyConfig) -> tuple[str, ...]:
    return tuple(m for m in MAIN if m in cfg.methods)


GROUPS = ("main", "side", "power", "mechanism", "mechanism_beside_quality", "quality", "control")  # a rule each
SHARED_GROUPS = ("quality",)  # groups whose jobs take one thread and run two at a time
QUALITY_METHODS_DEFAULT = ("bp", "broadcast_serial")


def groups(cfg: StudyConfig) -> dict[str, Group]:
    """The job groups that have methods and cells, in plan order; refuses groups whose outputs would overlap."""
    main_methods = _main_methods(cfg)
    side_methods = tuple(m for m in main_methods if m in (cfg.side_methods or main_methods))
    power_methods = tuple(m for m in main_methods if m in (cfg.power_methods or POWER_METHODS_DEFAULT))
    main, side, power = [], [], []
    for name, c in cfg.corpora.items():
        own = c.seeds or 0
        for w in corpus_widths(cfg)[name]:
            if w == cfg.main_width:
                main += [(name, w, k) for k in range(own or cfg.seeds)]
                if not own:  # a corpus with a seed count of its own gets no power cells
                    power += [(name, w, k) for k in range(cfg.seeds, cfg.power_seeds or 0)]
            else:
                n = cfg.side_seeds or cfg.seeds
                side += [(name, w, k) for k in range(min(own, n) if own else n)]
    mech = [(c, w, k) for c in cfg.mechanism_corpora for w in cfg.mechanism_widths
            for k in range(cfg.mechanism_seeds or cfg.seeds)]
    mc, first = cfg.main_corpus, max(cfg.seeds, cfg.power_seeds or 0)
    in_plan = cfg.main_width in corpus_widths(cfg).get(mc, ())
    quality = [(mc, cfg.main_width, k) for k in range(first, cfg.quality_seeds or 0)] if in_plan else []
    # a trimmed `methods` without one of them has no quality cells (half a pair would answer nothing)
    wanted = tuple(cfg.quality_methods or QUALITY_METHODS_DEFAULT)
    quality_methods = wanted if set(wanted) <= set(cfg.methods) else ()
    control = [(mc, cfg.main_width, k) for k in range(cfg.seeds, cfg.control_seeds or 0)] if in_plan else []
    control_methods = ("bp_tm",) if "bp_tm" in cfg.methods else ()
    # A mechanism seed that is also a quality seed already has serial Broadcast (the quality job ran it, the same
    # run a mechanism job would make): its mechanism job runs only the serial methods the quality job did not.
    mech_methods = tuple(m for m in SERIAL_LOCAL if m in cfg.methods)
    shared = set(quality) if quality_methods else set()
    beside = [c for c in mech if c in shared]
    beside_methods = tuple(m for m in mech_methods if m not in quality_methods)
    out = {g.name: g for g in (Group("main", main_methods, tuple(main)), Group("side", side_methods, tuple(side)),
                               Group("power", power_methods, tuple(power)),
                               Group("mechanism", mech_methods, tuple(c for c in mech if c not in shared)),
                               Group("mechanism_beside_quality", beside_methods, tuple(beside)),
                               Group("quality", quality_methods, tuple(quality)),
                               Group("control", control_methods, tuple(control)))
           if g.methods and g.cells}
    _check_disjoint(list(out.values()))
    return out


def _check_disjoint(gs: list[Group]) -> None:
    """Two groups that share a method must differ in their widths or their seeds, or one run would have two rules."""
    for i, a in enumerate(gs):
        for b in gs[i + 1:]:
            if not set(a.methods) & set(b.methods):
                continue
            if any(not set(a.values(w)) & set(b.values(w)) for w in ("width", "seed")):
                continue
            raise UserError(f"local: the {a.name} and {b.name} cells overlap (widths {a.values('width')} vs "
                            f"{b.values('width')}, seeds {a.values('seed')} vs {b.values('seed')}); check "
                            "local.seeds, local.power_seeds, local.side_seeds and the corpora's own seeds")


def runs(cfg: StudyConfig, results: str) -> list[str]:
    """Every training run's metrics.json, group by group (cells in plan order, then methods)."""
    pattern = run_pattern(results)
    return [pattern.format(corpus=c, width=w, method=m, seed=k)
            for g in groups(cfg).values() for (c, w, k) in g.cells for m in g.methods]


def memory_run_pattern(results: str) -> str:
    """The metrics.json of a memory probe (C3), with the wildcards {width}, {seed}."""
    return f"{results}/local/memory/w{{width}}/seed{{seed}}/metrics.json"


def memory_runs(cfg: StudyConfig, results: str) -> list[str]:
    """Every memory probe's metrics.json (one per probe seed; memory.py)."""
    return [memory_run_pattern(results).format(width=cfg.memory.width, seed=k) for k in range(cfg.memory.seeds)]
