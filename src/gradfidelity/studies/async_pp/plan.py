"""The sweep plan: which cells to train and where their run directories are (torch-free: Snakemake imports it).

A cell is (optimizer, lr, head, schedule, mitigation, depth, momentum, steps) + seed. Its directory spells every
value, `results/<scale>/async_pp/optimizer~muon/lr~tuned/head~tied/schedule~2bw/mitigation~none/depth~1/
momentum~0.95/steps~300/seed0/` (the Snakemake Paramspace `name~value` convention, and the wildcards of the one
training rule), so a cell that two sweeps share (e.g. the main sweep's AdamW at its default momentum is also a point
of the momentum sweep) is trained once and read by both.

- lr: `x<m>` = m times the optimizer's default LR (config.DEFAULTS): the LR-selection grid, on the selection seed
  `lr_selection.seed` (not one of the evaluation seeds, so the chosen LR is not fitted to the seeds the gaps are
  measured on), per arm (`arm_keys`: optimizer, momentum, schedule, depth; the sync arm of every `lr_keys` pair,
  its 2bw arm, and the PipeDream arm of each depth), grown past a winning edge in rounds (lr_select.py).
  `tuned` = the LR chosen on the sync arm (every sync cell; an async cell at `tuned` is the secondary column: the
  delay's cost at an LR the async arm did not choose). `own` = the LR chosen on the cell's own schedule (2bw or
  PipeDream at that depth): every claim's primary (issue 37; the paper does not state its practice, so each arm at
  its own best LR). A mitigation cell trains at its schedule's own LR (it is compared with that arm).
- head: `tied` (the model's `tie_embeddings`) everywhere except the depth sweep, which unties the LM head (README:
  a tied head cannot be fresh at the last stage of an asynchronous pipeline), with its own sync and 2bw references.

Sweeps (config `sweeps`); T = train.steps, f = the effective compute fraction (compute_fraction.py):
- ladder:     sync at every ladder budget, for every (optimizer, momentum, head) a claim reads (`f_keys`), plus 2bw
              at T and 2T (f(T) and its transient gate) at its own LR, and at the sync-tuned LR too for the
              optimizers of the length table (`secondary_optimizers`)   (every claim's f)
- main:       those keys for each optimizer                              (B1-B3)
- mitigation: optimizer x 2bw x {error_feedback, taylor, sync_start, sync_cooldown} at T   (B5, B9)
- momentum:   those keys for each optimizer x momentum, each with its own LR             (B4)
- depth:      optimizer x P x {pipedream, pipedream_vsync} at T, untied head (with its own keys)   (B6)
- length:     optimizer x 2bw at each length (a doubling series inside the ladder), at both LRs     (B7)
- near_tie:   an async arm whose LR was a near-tie, also at the grid's best LR, at T and 2T     (both LRs)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gradfidelity.errors import UserError
from gradfidelity.studies.async_pp.config import DEFAULTS, HEADS, MITIGATIONS, OPTIMIZERS, SCHEDULES, STUDY, StudyConfig

KEYS = ("optimizer", "lr", "head", "schedule", "mitigation", "depth", "momentum", "steps")
TUNED = "tuned"  # the LR chosen on sync
OWN = "own"  # the LR chosen on the cell's own (async) schedule
SELECTION = "lr_selection.json"  # the LR-selection document, in the study's results root
# The paper tables (<name>.csv + <name>.md under the scale's table root) and figures (<name>.png) of the study.
TABLES = ("async_pp_main", "async_pp_mitigations", "async_pp_lr_selection", "async_pp_length", "async_pp_momentum",
          "async_pp_width")
FIGURES = ("async_pp_momentum", "async_pp_depth", "async_pp_ladder", "async_pp_curves", "async_pp_width")
# The training rule's run directory and output, with these wildcards (constraints in WILDCARDS). A cell of the
# width ladder (sweeps.width) lives under `width~<d_model>/` (WIDTH_PREFIX) before the same parts; a cell at the
# model's own width has no prefix, so the width ladder left every earlier record where it was.
RUN_DIR = "/".join(f"{k}~{{{k}}}" for k in KEYS) + "/seed{seed}"
PATTERN = RUN_DIR + "/metrics.json"
WIDTH_PREFIX = "width~{width}/"
WILDCARDS = {"optimizer": "|".join(OPTIMIZERS), "lr": r"tuned|own|x[0-9.e+-]+", "head": "|".join(HEADS),
             "schedule": "|".join(SCHEDULES), "mitigation": "|".join(MITIGATIONS), "depth": r"\d+",
             "momentum": r"[0-9.]+", "steps": r"\d+", "seed": r"\d+", "width": r"\d+"}


@dataclass(frozen=True, order=True)
class Cell:
    optimizer: str
    lr: str
    head: str
    schedule: str
    mitigation: str
    depth: int
    momentum: float
    steps: int
    seed: int
    width: int = 0  # d_model of the width ladder; 0 = the model section's own

    def __post_init__(self):
        if self.optimizer not in OPTIMIZERS:
            raise UserError(f"async_pp: optimizer {self.optimizer!r} not in {list(OPTIMIZERS)}")
        if self.lr == OWN and self.schedule == "sync":
            raise UserError("async_pp: a sync cell's own LR is lr~tuned (lr~own is for async schedules)")
        if self.lr not in (TUNED, OWN):
            lr_multiplier(self.lr)
        if self.head not in HEADS:
            raise UserError(f"async_pp: head {self.head!r} not in {list(HEADS)}")

    def dir(self, root: str = "results/async_pp") -> str:
        parts = "/".join(f"{k}~{getattr(self, k)}" for k in KEYS)
        prefix = WIDTH_PREFIX.format(width=self.width) if self.width else ""
        return f"{root}/{prefix}{parts}/seed{self.seed}"

    def metrics(self, root: str = "results/async_pp") -> str:
        return f"{self.dir(root)}/metrics.json"

    def wildcards(self) -> dict[str, str]:
        """The training rule's wildcards of this cell (what `--cell` carries into the run's records); `width` only
        on the width ladder's rule."""
        return {k: str(getattr(self, k)) for k in (*KEYS, "seed", *(("width",) if self.width else ()))}


def lr_label(multiplier: float) -> str:
    return f"x{float(multiplier):g}"


def lr_multiplier(label: str) -> float:
    if not re.fullmatch(r"x[0-9.e+-]+", label):
        raise UserError(f"async_pp: lr {label!r} is neither {TUNED!r}, {OWN!r} nor x<multiplier>")
    return float(label[1:])


def default_momentum(optimizer: str) -> float:
    """The optimizer's momentum outside the momentum sweep (config.DEFAULTS, the one place it is set)."""
    if optimizer not in DEFAULTS:
        raise UserError(f"async_pp: optimizer {optimizer!r} not in {list(OPTIMIZERS)}")
    return float(DEFAULTS[optimizer]["momentum"])


def main_head(cfg: StudyConfig) -> str:
    return "tied" if cfg.model.tie_embeddings else "untied"


def sweep_optimizers(cfg: StudyConfig) -> list[str]:
    sw = cfg.sweeps
    return sorted({o for s in (sw.main, sw.mitigation, sw.momentum, sw.depth, sw.length) for o in s.optimizers},
                  key=OPTIMIZERS.index)


def lr_keys(cfg: StudyConfig) -> list[tuple[str, float]]:
    """(optimizer, momentum) pairs that get an LR of their own: every optimizer at its default momentum, and each
    point of the momentum sweep (the best LR moves with the momentum: round 2 used 0.9's LR at 0.98)."""
    keys = {(o, default_momentum(o)) for o in sweep_optimizers(cfg)}
    keys |= {(o, float(m)) for o in cfg.sweeps.momentum.optimizers for m in cfg.sweeps.momentum.momenta}
    return sorted(keys, key=lambda k: (OPTIMIZERS.index(k[0]), k[1]))


def arm_keys(cfg: StudyConfig) -> list[tuple[str, float, str, int]]:
    """(optimizer, momentum, schedule, depth) of every arm that gets an LR of its own (issue 37): each `lr_keys` pair
    on sync and on 2bw, and the PipeDream schedules of the depth sweep at each depth (its optimizers at their default
    momentum). Depth is 1 except for PipeDream."""
    keys = [(o, m, s, 1) for o, m in lr_keys(cfg) for s in ("sync", "2bw")]
    dw = cfg.sweeps.depth
    keys += [(o, default_momentum(o), s, int(P)) for o in dw.optimizers for s in dw.schedules for P in dw.depths]
    return sorted(set(keys), key=lambda k: (OPTIMIZERS.index(k[0]), k[1], SCHEDULES.index(k[2]), k[3]))


def grid_cell(cfg: StudyConfig, optimizer: str, momentum: float, multiplier: float, schedule: str = "sync",
              depth: int = 1, width: int = 0) -> Cell:
    """One LR-grid run: the arm's schedule, the selection seed (config checks that it is not an evaluation seed),
    the grid's budget and model (PipeDream untied: a tied head cannot be fresh at its last stage); on the width
    ladder, that width's T (its LRs are chosen at the budget they are read at)."""
    head = "untied" if schedule.startswith("pipedream") else main_head(cfg)
    steps = width_steps(cfg, width) if width else grid_budget(cfg)
    return Cell(optimizer, lr_label(multiplier), head, schedule, "none", int(depth), float(momentum), steps,
                cfg.lr_selection.seed, int(width))


def width_steps(cfg: StudyConfig, width: int) -> int:
    """T at `width`: train.steps at the model's own width (0), else the width ladder's `steps`."""
    return int(cfg.train.steps) if not width else int(cfg.sweeps.width.rung(width).steps)


def ladder_of(cfg: StudyConfig, optimizer: str, width: int = 0, momentum: float | None = None,
              extend: bool = True) -> list[int]:
    """The sync ladder of `optimizer` at `width`: the configured ladder at the model's own width, with its extension
    (sweeps.ladder.extend) at the optimizer's default momentum (what B5 reads; `extend` False: without it); at
    another width the same budgets as multiples of T (sweeps.ladder.steps / train.steps), times that width's T,
    without the extension."""
    if not width:
        default = momentum is None or round(float(momentum), 6) == round(default_momentum(optimizer), 6)
        return cfg.sweeps.ladder.of(optimizer) if extend and default else sorted(cfg.sweeps.ladder.steps)
    T, Tw = cfg.train.steps, width_steps(cfg, width)
    return sorted({round(n * Tw / T) for n in cfg.sweeps.ladder.steps})


def width_arm_keys(cfg: StudyConfig) -> list[tuple[str, float, str, int, int]]:
    """(optimizer, momentum, schedule, depth, width) of the width ladder's arms: sync and 2bw of each optimizer of
    each width, at its default momentum."""
    return [(o, default_momentum(o), s, 1, w.d_model) for w in cfg.sweeps.width.widths for o in w.optimizers
            for s in ("sync", "2bw")]


def grid_budget(cfg: StudyConfig) -> int:
    """The grid runs' budget: `lr_selection.steps`, else the main budget. Why a key of its own: when the main budget
    moves (cpu, round 5: 256 -> 512 steps), keeping the committed selection is a choice the config states, not a
    grid rerun at the new budget that nobody asked for."""
    steps = cfg.lr_selection.steps
    return int(cfg.train.steps if steps is None else steps)


def grid_cells(cfg: StudyConfig, extension: list[dict] | None = None) -> list[Cell]:
    """The LR grid's first round (every arm x every configured multiplier), or the cells of an extension round
    (`extension`: [{optimizer, momentum, schedule, depth, multiplier}], lr_select.extension_round)."""
    if extension is not None:
        return sorted(grid_cell(cfg, e["optimizer"], e["momentum"], e["multiplier"], e.get("schedule", "sync"),
                                e.get("depth", 1), e.get("width", 0)) for e in extension)
    arms = [(*a, 0) for a in arm_keys(cfg)] + width_arm_keys(cfg)
    return sorted(grid_cell(cfg, o, mom, m, s, d, w) for o, mom, s, d, w in arms
                  for m in cfg.lr_selection.multipliers)


def check_cells(cfg: StudyConfig, choices: dict[tuple[str, float, str, int, int], float]) -> list[Cell]:
    """The LR check (issue 60; lr_select.check): each sync and 2bw arm's chosen multiplier (`choices`, from the
    last LR round: lr_select.round_choices) and its neighbours half and twice it, at `lr_selection.check_steps` on
    the selection seed, at the model's own width. None when the config sets no check."""
    n, which = cfg.lr_selection.check_steps, cfg.lr_selection.check_optimizers
    if n is None:
        return []
    return sorted({Cell(o, lr_label(k), main_head(cfg), sched, "none", 1, float(mom), int(n), cfg.lr_selection.seed)
                   for (o, mom, sched, _depth, width), m in choices.items()
                   if sched in ("sync", "2bw") and not width and (which is None or o in which)
                   for k in (m / 2, m, 2 * m)})


def gate_steps(steps: int) -> int:
    """The budget the transient gate compares a budget with (compute_fraction.transient_gate): twice it."""
    return 2 * int(steps)


def f_keys(cfg: StudyConfig) -> list[tuple[str, float, str]]:
    """(optimizer, momentum, head) of every f a claim reads: each trains sync at every ladder budget and 2bw at the
    main budget and at twice it (its transient gate)."""
    sw, head0 = cfg.sweeps, main_head(cfg)
    keys = {(o, default_momentum(o), head0) for s in (sw.main, sw.mitigation, sw.length) for o in s.optimizers}
    keys |= {(o, float(m), head0) for o in sw.momentum.optimizers for m in sw.momentum.momenta}
    keys |= {(o, default_momentum(o), "untied") for o in sw.depth.optimizers}
    return sorted(keys, key=lambda k: (OPTIMIZERS.index(k[0]), k[1], k[2]))


# The claims whose seeds `claim_seeds` can raise above `seeds` (issue 60), and what each reads besides its
# references (`_claim_cells`): B1-abs AdamW's main key, B4 the momentum sweep, B9-<m> mitigation m.
CLAIM_SEEDS = ("B1-abs", "B4", "B9-error_feedback", "B9-taylor", "B9-sync_start", "B9-sync_cooldown")


def cells(cfg: StudyConfig) -> list[Cell]:
    """Every cell of every sweep and the LR grid's first round, deduplicated and sorted (the grid's extension rounds
    and the LR check follow from runs: rules.study_runs)."""
    return sorted(set(grid_cells(cfg)) | set(eval_cells(cfg)))


def eval_cells(cfg: StudyConfig) -> list[Cell]:
    """The cells on the evaluation seeds: every sweep on seeds 0..seeds-1, and on the seeds `claim_seeds` adds,
    the cells of that claim alone with their references."""
    out = set(_sweep_cells(cfg, range(cfg.seeds)))
    for w in cfg.sweeps.width.widths:  # the width ladder: each optimizer's f at that width, on its own seeds
        add = _adder(cfg, out, range(w.seeds), w.d_model)
        for opt in w.optimizers:
            _add_f_key(cfg, add, opt, default_momentum(opt), main_head(cfg), w.d_model)
    for claim, n in sorted((cfg.claim_seeds or {}).items()):
        if claim not in CLAIM_SEEDS:
            raise UserError(f"bad config key 'async_pp.claim_seeds': {claim!r} is not one of {list(CLAIM_SEEDS)}")
        out |= set(_claim_cells(cfg, claim, range(cfg.seeds, int(n))))
    return sorted(out)


def _adder(cfg: StudyConfig, out: set, seeds, width: int = 0):
    T, head0 = cfg.train.steps, main_head(cfg)

    def add(opt, schedule, mitigation="none", depth=1, momentum=None, n_steps=T, head=head0, lrs=(OWN,)):
        mom = default_momentum(opt) if momentum is None else float(momentum)
        depth = int(depth) if schedule.startswith("pipedream") else 1
        if schedule.startswith("pipedream") and head == "tied":
            raise UserError("async_pp: pipedream cells need an untied head (the depth sweep unties it)")
        for s in seeds:
            for lr in (TUNED,) if schedule == "sync" else lrs:
                out.add(Cell(opt, lr, head, schedule, mitigation, depth, mom, int(n_steps), s, width))

    return add


def _add_f_key(cfg: StudyConfig, add, opt: str, mom: float, head: str, width: int = 0, extend: bool = True) -> None:
    """A key's f: sync at every ladder budget (the extension too unless `extend` is False), 2bw at T and 2T (at
    both LRs where the length table shows it; at the own LR only on the width ladder)."""
    T = width_steps(cfg, width)
    both = set(secondary_optimizers(cfg)) if not width else set()
    # the sync-tuned LR (secondary) where the length table shows it: each optimizer at its default momentum
    lrs = (OWN, TUNED) if opt in both and mom == default_momentum(opt) and head == main_head(cfg) else (OWN,)
    for n in ladder_of(cfg, opt, width, mom, extend):
        add(opt, "sync", momentum=mom, n_steps=n, head=head)
    for n in (T, gate_steps(T)):
        add(opt, "2bw", momentum=mom, n_steps=n, head=head, lrs=lrs)


def _budgets(cfg: StudyConfig, at_2T: bool) -> tuple[int, ...]:
    """The budget rule (claims.py) reads every claim at T and 2T: the mitigations and depths too, where asked."""
    T = cfg.train.steps
    return (T, gate_steps(T)) if at_2T else (T,)


def _claim_cells(cfg: StudyConfig, claim: str, seeds) -> list[Cell]:
    """The cells `claim` reads on `seeds`, with the f keys they are read against (their ladders without the
    extension: no claim of `CLAIM_SEEDS` reads f above 2T, and a rung of 4T costs more than the rest of a key)."""
    out: set[Cell] = set()
    add, sw, head0 = _adder(cfg, out, seeds), cfg.sweeps, main_head(cfg)
    if claim == "B1-abs":
        _add_f_key(cfg, add, "adamw", default_momentum("adamw"), head0, extend=False)
    elif claim == "B4":
        for o in sw.momentum.optimizers:
            for m in sw.momentum.momenta:
                _add_f_key(cfg, add, o, float(m), head0, extend=False)
    else:  # B9-<mitigation>
        mit = claim.split("-", 1)[1]
        if mit not in sw.mitigation.mitigations:
            raise UserError(f"bad config key 'async_pp.claim_seeds': {claim} reads mitigation {mit!r}, which "
                            f"sweeps.mitigation.mitigations {list(sw.mitigation.mitigations)} does not train")
        for opt in sw.mitigation.optimizers:
            _add_f_key(cfg, add, opt, default_momentum(opt), head0, extend=False)
            for n in _budgets(cfg, sw.mitigation.at_2T):
                add(opt, "2bw", mit, n_steps=n)
    return sorted(out)


def _sweep_cells(cfg: StudyConfig, seeds) -> list[Cell]:
    T = cfg.train.steps
    sw = cfg.sweeps
    head0 = main_head(cfg)
    out: set[Cell] = set()
    add = _adder(cfg, out, seeds)
    for opt, mom, head in f_keys(cfg):
        _add_f_key(cfg, add, opt, mom, head)
    for opt in sw.mitigation.optimizers:
        for mit in sw.mitigation.mitigations:
            for n in _budgets(cfg, sw.mitigation.at_2T):
                add(opt, "2bw", mit, n_steps=n)
    for opt in sw.depth.optimizers:  # config checks that every P fits the model's pipeline units
        for P in sw.depth.depths:
            for schedule in sw.depth.schedules:
                for n in _budgets(cfg, sw.depth.at_2T):
                    add(opt, schedule, depth=P, head="untied", n_steps=n)
    for opt in sw.length.optimizers:
        for n in sw.length.steps:
            add(opt, "2bw", n_steps=n, lrs=(OWN, TUNED))
    # a near-tie arm also at the grid's best LR, at T and 2T (its claims are read at both LRs, issue 47)
    for arm in sw.near_tie:
        head = "untied" if arm.schedule.startswith("pipedream") else head0
        for n in (T, gate_steps(T)):
            add(arm.optimizer, arm.schedule, depth=arm.depth, momentum=arm.momentum, n_steps=n, head=head,
                lrs=(lr_label(arm.multiplier),))
    return sorted(out)


def secondary_optimizers(cfg: StudyConfig) -> list[str]:
    """The optimizers whose 2bw runs also train at the sync-tuned LR (the secondary reading of f, issue 37): those
    of the length table (main and length sweeps, at their default momentum), at T, 2T and every length."""
    sw = cfg.sweeps
    return list(dict.fromkeys([*sw.main.optimizers, *sw.length.optimizers]))


def metrics(cfg: StudyConfig, root: str) -> list[str]:
    """Every cell's metrics.json under `root` (results/<scale>/async_pp): the training rule's outputs."""
    return [c.metrics(root) for c in cells(cfg)]


def grid_metrics(cfg: StudyConfig, root: str) -> list[str]:
    """The LR grid's metrics.json files: the LR selection's inputs."""
    return [c.metrics(root) for c in grid_cells(cfg)]


def table_paths(tables_root: str) -> list[str]:
    return [f"{tables_root}/{name}.{ext}" for name in TABLES for ext in ("csv", "md")]


def figure_paths(figures_root: str) -> list[str]:
    return [f"{figures_root}/{name}.png" for name in FIGURES]


def cell_from_wildcards(w) -> Cell:
    """The cell of the training rule's wildcards (a dict or Snakemake's Wildcards object)."""
    get = w.get if isinstance(w, dict) else (lambda k, default=None: getattr(w, k, default))
    try:
        return Cell(get("optimizer"), get("lr"), get("head"), get("schedule"), get("mitigation"), int(get("depth")),
                    float(get("momentum")), int(get("steps")), int(get("seed")), int(get("width", 0) or 0))
    except (TypeError, ValueError, AttributeError, KeyError) as exc:
        raise UserError(f"async_pp cell {w}: {exc}") from None


def cell_from_run(cell: dict) -> Cell:
    """The cell of a run's recorded identity (`harness.results.cell_of(record)`: the study and the training rule's
    wildcards, written by the harness): how the aggregations know which cell a run is, never from its path."""
    if cell.get("study") != STUDY:
        raise UserError(f"a run of study {cell.get('study')!r} is not an {STUDY} run: {cell}")
    return cell_from_wildcards({k: v for k, v in cell.items() if k != "study"})
