"""Pairing by seed on runs.csv: the one look-up the tables, figures and claims of study B share.

Seed k of every cell has the same initialisation and batch order, so every statistic is computed per seed first
(gap = variant - sync on that seed, a difference or ratio of gaps, an EF recovery %, a Spearman correlation) and only
then summarised over seeds. Only `lr~tuned` and `lr~own` cells enter (the LR grid is lr_select.py's): a sync cell is
always `tuned` (sync's own LR), an async cell is read at its own LR (`own`, every claim's primary, issue 37) unless a
Spec asks for the sync-tuned one (`tuned`, the tables' secondary column).

A seed on which any run a statistic needs diverged (or is missing) is dropped from that statistic (`Paired.dropped`),
counted and named by the claims and the tables: never averaged away silently.

The effective compute fraction f (compute_fraction.py) of an async cell is read per seed off the sync ladder of
its own (optimizer, momentum, head) on the same seed (`fractions`), and every claim on it is behind the transient
gate of that key at that budget (`transient`).

EF recovery % = 100 (async - async_EF) / (async - sync), per seed, in nats (the tables' secondary column); the
claims recover lost compute instead (claims.py).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from gradfidelity.errors import UserError
from gradfidelity.studies.async_pp.config import OPTIMIZERS, StudyConfig
from gradfidelity.studies.async_pp.plan import OWN, TUNED, default_momentum, eval_cells, main_head


@dataclass(frozen=True)
class Spec:
    """One tuned-LR cell without its seed; momentum None = the optimizer's default, steps None = train.steps,
    head None = the model's (main sweeps); lr = `own` (the schedule's own LR; a sync cell's own is `tuned`) or
    `tuned` (the LR chosen on sync)."""

    optimizer: str
    schedule: str = "sync"
    mitigation: str = "none"
    depth: int = 1
    momentum: float | None = None
    steps: int | None = None
    head: str | None = None
    lr: str = OWN
    width: int = 0  # the width ladder's d_model (0: the model's own); steps None = that width's T

    @property
    def lr_label(self) -> str:
        """The cell's `lr` path part: a sync cell trains at the LR chosen on sync whatever the Spec says."""
        return TUNED if self.schedule == "sync" else self.lr

    def label(self) -> str:
        s = self.schedule + ("" if self.mitigation == "none" else f"+{self.mitigation}")
        extra = (f" P{self.depth}" if self.schedule.startswith("pipedream") else "") \
            + ("" if self.momentum is None else f" mom {self.momentum:g}") \
            + ("" if self.steps is None else f" {self.steps} steps") \
            + ("" if self.head is None else f" {self.head} head") \
            + (f" d {self.width}" if self.width else "") \
            + (" at the sync LR" if self.lr_label == TUNED and self.schedule != "sync" else "")
        return f"{self.optimizer} {s}{extra}"


@dataclass
class Paired:
    """Final losses of several cells on the seeds where every one of them finished."""

    seeds: list[int]
    loss: dict[str, np.ndarray]
    dropped: dict[int, list[str]] = field(default_factory=dict)  # seed -> the runs that diverged / are missing
    sources: list[str] = field(default_factory=list)
    sources_of: dict[str, list[str]] = field(default_factory=dict)  # cell name -> its run directories

    def __getitem__(self, name: str) -> np.ndarray:
        return self.loss[name]

    @property
    def n(self) -> int:
        return len(self.seeds)

    @property
    def diverged(self) -> int:
        return len(self.dropped)

    def dropped_note(self) -> str:
        if not self.dropped:
            return ""
        return "; dropped " + ", ".join(f"seed {s} ({', '.join(why)})" for s, why in sorted(self.dropped.items()))

    def per_seed(self, values) -> str:
        return ", ".join(f"s{s} {v:.4g}" for s, v in zip(self.seeds, values, strict=True))

    def sources_for(self, *names: str) -> list[str]:
        """The run directories of the named cells and of their sync ladders (`<name>@sync<n>`), in read order: the
        runs one comparison reads, not every run of the look-up it came from."""
        keep = [k for k in self.sources_of if k in names or k.split("@sync")[0] in names]
        return list(dict.fromkeys(d for k in keep for d in self.sources_of[k]))


class Gaps:
    """Paired-by-seed loss look-ups on runs.csv (one row per run: the cell keys, seed, status, final_val_loss)."""

    # What claims.py puts on a claim as its gates (issue 47): "transient" (round 4's gate, the tables' reading),
    # "sync_falls" (the budget rule at T: the sync loss of each key read still falls from T to 2T) or "none" (the
    # budget rule's second reading, at 2T).
    GATE_MODES = ("transient", "sync_falls", "none")

    def __init__(self, runs: pd.DataFrame, cfg: StudyConfig):
        from gradfidelity.harness.provenance import IDENTITY_KEYS, describe_host

        self.runs, self.cfg = runs, cfg.need("seeds", "model", "train", "sweeps")
        self.gate_mode = "transient"
        self.lr_for: dict[tuple, str] = {}  # near-tie view (`at(lr_for=...)`): arm -> the lr label its cells read
        self.steps = cfg.train.steps
        # seeds 0..seeds-1 carry every cell at the model's own width; the seeds `claim_seeds` adds carry one claim's
        # cells only, and each width of the ladder its own seeds, so a statistic reads such a seed or width only
        # where all its cells are planned there (`planned`, against `_extra_planned`)
        self.base_seeds = int(cfg.seeds)
        widest = max([cfg.all_seeds, *(w.seeds for w in cfg.sweeps.width.widths)])
        self.seeds = list(range(widest))
        self._extra_planned = {self._key(c.lr, c.optimizer, c.head, c.schedule, c.mitigation, c.depth, c.momentum,
                                         c.steps, c.seed, c.width)
                               for c in eval_cells(cfg) if c.seed >= cfg.seeds or c.width}
        self.head = main_head(cfg)
        self._index: dict[tuple, tuple[float, str, str]] = {}
        self.host_of: dict[str, str] = {}  # run directory -> its host type (provenance.describe_host)
        self.identity_of: dict[str, dict] = {}  # host type -> the CPU identity columns behind it
        self.wall_of: dict[str, float] = {}  # run directory -> its wall time in seconds (nan where not recorded)
        self.cell_of: dict[str, dict] = {}  # run directory -> its cell, as runs.csv gives it (never its path)
        cols = set(runs.columns)
        for row in runs.to_dict("records"):
            lr = row.get("lr", TUNED)
            if lr not in (TUNED, OWN) and int(row["seed"]) not in self.seeds:
                continue  # the LR grid (its selection seed); an x<m> cell on the evaluation seeds is a near-tie's
            width = row.get("width", 0)
            width = 0 if width is None or (isinstance(width, float) and math.isnan(width)) else int(width)
            key = self._key(lr, row["optimizer"], row.get("head", self.head), row["schedule"], row["mitigation"],
                            row["depth"], row["momentum"], row["steps"], row["seed"], width)
            if key in self._index:
                raise UserError(f"runs table: two runs of {key}")
            loss = float(row["final_val_loss"])
            status = row["status"] if math.isfinite(loss) else "diverged"
            run_dir = row["run_dir"] if "run_dir" in cols and isinstance(row["run_dir"], str) else ""
            self._index[key] = (loss, status, run_dir)
            if run_dir:
                # the host type (a runs.csv without the CPU identity reads "unknown ISA") and what the run cost
                self.cell_of[run_dir] = {"optimizer": row["optimizer"], "lr": lr, "schedule": row["schedule"],
                                         "mitigation": row["mitigation"], "depth": int(row["depth"]),
                                         "momentum": float(row["momentum"]), "steps": int(row["steps"]),
                                         "head": row.get("head", self.head), "width": width}
                identity = {k: row.get(k) for k in IDENTITY_KEYS}
                self.host_of[run_dir] = describe_host(identity)
                self.identity_of.setdefault(self.host_of[run_dir], identity)
                wall = row.get("wall_s", math.nan)
                self.wall_of[run_dir] = float(wall) if wall is not None else math.nan

    def at(self, steps: int | None = None, gate_mode: str | None = None, lr_for: dict | None = None) -> Gaps:
        """The same runs read at another main budget (every Spec without its own steps reads `steps`) and/or with
        another gate mode: the budget rule reads each claim at T and at 2T through this view. `lr_for`
        {(optimizer, momentum, schedule, depth): lr label}: those async arms' own-LR cells are read at that label
        instead (the near-tie reading, issue 47); their mitigated cells train at the own LR only, so a claim that
        reads one finds it "not trained at the near-tie LR"."""
        view = copy.copy(self)
        if lr_for is not None:
            view.lr_for = {(o, round(float(m), 6), s, int(d)): lab for (o, m, s, d), lab in lr_for.items()}
        if steps is not None:
            view.steps = int(steps)
        if gate_mode is not None:
            if gate_mode not in self.GATE_MODES:
                raise ValueError(f"gate_mode {gate_mode!r} is not one of {self.GATE_MODES}")
            view.gate_mode = gate_mode
        return view

    @staticmethod
    def _key(lr, optimizer, head, schedule, mitigation, depth, momentum, steps, seed, width=0) -> tuple:
        return (lr, optimizer, head, schedule, mitigation, int(depth), round(float(momentum), 6), int(steps), int(seed),
                int(width))

    def steps_at(self, width: int) -> int:
        """The view's main budget at `width`: T at the model's own width, else that width's T times the same
        multiple (the budget rule's 2T view reads every width at its own 2T)."""
        if not width:
            return self.steps
        from gradfidelity.studies.async_pp.plan import width_steps

        return round(self.steps * width_steps(self.cfg, width) / self.cfg.train.steps)

    def _spec_key(self, spec: Spec, seed: int) -> tuple | None:
        """The runs-table key of `spec` on `seed`; None where the near-tie view asks for a mitigated cell, which
        trains at the own LR only."""
        mom = default_momentum(spec.optimizer) if spec.momentum is None else spec.momentum
        depth = spec.depth if spec.schedule.startswith("pipedream") else 1
        lr = spec.lr_label
        # the near-tie arms (sweeps.near_tie) train at the model's own width only: a width-ladder cell keeps its LR
        other = (self.lr_for.get((spec.optimizer, round(float(mom), 6), spec.schedule, depth))
                 if lr == OWN and not spec.width else None)
        if other is not None:
            if spec.mitigation != "none":
                return None
            lr = other
        return self._key(lr, spec.optimizer, spec.head or self.head, spec.schedule, spec.mitigation, depth,
                         mom, spec.steps or self.steps_at(spec.width), seed, spec.width)

    def _cell(self, spec: Spec, seed: int) -> tuple[float, str, str]:
        key = self._spec_key(spec, seed)
        if key is None:
            return math.nan, "not trained at the near-tie LR", ""
        return self._index.get(key, (math.nan, "missing", ""))

    def planned(self, specs, seed: int) -> bool:
        """Whether every cell of `specs` is planned on `seed`: at the model's own width always on seeds
        0..seeds-1; on a seed that `claim_seeds` adds only the cells of that claim and their references are; on the
        width ladder, each width's cells on its own seeds."""
        specs = list(specs)
        if seed < self.base_seeds and not any(spec.width for spec in specs):
            return True
        keys = [self._spec_key(spec, seed) for spec in specs]
        return all(k is not None and k in self._extra_planned for k in keys)

    def paired(self, specs: dict[str, Spec]) -> Paired:
        seeds, loss, dropped, sources = [], {k: [] for k in specs}, {}, []
        sources_of: dict[str, list[str]] = {k: [] for k in specs}
        for seed in self.seeds:
            if not self.planned(specs.values(), seed):
                continue  # a seed another claim added: not a missing run of this one
            got, bad = {}, []
            for name, spec in specs.items():
                value, status, run_dir = self._cell(spec, seed)
                if run_dir:
                    sources.append(run_dir)
                    sources_of[name].append(run_dir)
                if status != "ok" and f"{spec.label()} {status}" not in bad:
                    bad.append(f"{spec.label()} {status}")
                got[name] = value
            if bad:
                dropped[seed] = bad
                continue
            seeds.append(seed)
            for name, value in got.items():
                loss[name].append(value)
        return Paired(seeds, {k: np.asarray(v, dtype=float) for k, v in loss.items()}, dropped,
                      list(dict.fromkeys(sources)), sources_of)


@dataclass
class Fractions:
    """The effective compute fraction f = S*/T (compute_fraction.py) of async cells, per paired seed: each read off
    its own (optimizer, momentum, head) sync ladder on the same seed. `p` holds every loss (the async cells under
    their names, the ladder under `<name>@sync<n>`); `outside` names each seed whose f lies outside its ladder (nan
    there: f is never extrapolated)."""

    p: Paired
    f: dict[str, np.ndarray]
    outside: list[str]

    @property
    def n(self) -> int:
        return self.p.n

    def lost(self, name: str) -> np.ndarray:
        """1 - f: the compute the delay costs."""
        return 1.0 - self.f[name]

    def defined(self, *names: str) -> str:
        """'' when every named f is inside its ladder on every paired seed, else why not (the claims' reason)."""
        bad = [o for o in self.outside if o.split(":")[0] in names]
        return "; ".join(bad)


def fractions(g: Gaps, asyncs: dict[str, Spec], extra: dict[str, Spec] | None = None) -> Fractions:
    """f of every async cell in `asyncs` (its budget T = spec.steps or train.steps), on the seeds where it, every
    rung of its sync ladder (config sweeps.ladder) and every cell of `extra` finished. The ladder's extension
    (sweeps.ladder.extend, above 2T) is read on each seed where its run finished: it is needed only by an f above
    the ladder's top, which without it reads "outside the ladder" (never extrapolated), as before it existed."""
    from gradfidelity.studies.async_pp.compute_fraction import BELOW, effective_fraction

    specs = dict(asyncs) | dict(extra or {})
    for name, a in asyncs.items():
        for n in _ladder(g, a, extend=False):
            specs[f"{name}@sync{n}"] = _rung(a, n)
    p = g.paired(specs)
    f, outside = {}, []
    for name, a in asyncs.items():
        T = a.steps or g.steps_at(a.width)
        ladder = _ladder(g, a, extend=False)
        more = [n for n in _ladder(g, a) if n not in ladder]
        values = []
        for i, seed in enumerate(p.seeds):
            rungs, sync = list(ladder), [float(p[f"{name}@sync{n}"][i]) for n in ladder]
            for n in more:
                loss, status, run_dir = g._cell(_rung(a, n), seed)
                if status == "ok" and math.isfinite(loss):
                    rungs.append(n)
                    sync.append(loss)
                    p.sources_of.setdefault(f"{name}@sync{n}", []).append(run_dir)
                    p.sources.append(run_dir)
            frac = effective_fraction(rungs, sync, float(p[name][i]), T)
            if not math.isfinite(frac.value):
                side, edge = ("worse than", min(rungs)) if frac.where == BELOW else ("better than", max(rungs))
                outside.append(f"{name}: seed {seed}: {a.label()} ends {side} sync at {edge} steps, the ladder's "
                               "end (f is not extrapolated)")
            values.append(frac.value)
        f[name] = np.asarray(values, dtype=float)
        _drop_unread_rungs(p, name, sorted({*ladder, *more}), f[name] * T)
    return Fractions(p, f, outside)


def _rung(a: Spec, n: int) -> Spec:
    """The sync run of `a`'s key at `n` steps (its ladder's rung)."""
    return Spec(a.optimizer, momentum=a.momentum, steps=n, head=a.head, lr=TUNED, width=a.width)


def _ladder(g: Gaps, a: Spec, extend: bool = True) -> list[int]:
    """The sync budgets f of `a` reads (plan.ladder_of): the key's ladder, with its extension unless `extend` is
    False."""
    from gradfidelity.studies.async_pp.plan import ladder_of

    return ladder_of(g.cfg, a.optimizer, a.width, a.momentum, extend)


def _drop_unread_rungs(p: Paired, name: str, ladder, s_star) -> None:
    """Leave out of the sources the rungs above the one that brackets S* = f T from above on every seed: f reads the
    ladder's running minimum up to that rung (compute_fraction.sync_envelope), never a longer rung, so a longer
    rung is no run the number rests on (issue 57: at T the 1024-step rung ran on another host type than the rest)."""
    s_star = np.asarray(s_star, dtype=float)
    if not len(s_star) or not np.isfinite(s_star).all():
        return  # f off the ladder (or no seed): the whole ladder was looked at
    upper = next((n for n in ladder if n >= float(s_star.max()) * (1 - 1e-9)), ladder[-1])
    for n in ladder:
        if n > upper:
            p.sources_of[f"{name}@sync{n}"] = []
    p.sources = list(dict.fromkeys(d for dirs in p.sources_of.values() for d in dirs))


def ef_recovery(sync, asyn, ef):
    """100 (async - EF) / (async - sync), elementwise; NaN where async <= sync (nothing to recover) or NaN input."""
    sync, asyn, ef = (np.asarray(x, dtype=float) for x in (sync, asyn, ef))
    gap = asyn - sync
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(gap > 0, 100.0 * (asyn - ef) / np.where(gap > 0, gap, 1.0), np.nan)
    return float(out) if out.ndim == 0 else out


def transient(g: Gaps, optimizer: str, momentum: float | None = None, head: str | None = None,
              steps: int | None = None, level: float = 0.95, lr: str = OWN, width: int = 0) -> tuple[dict, dict]:
    """The transient gate of one (optimizer, momentum, head) at budget T (default train.steps), from its 2bw runs at
    T and 2T at the LR choice `lr` and its sync ladder (compute_fraction.transient_gate), as (gate record, numbers
    for the tables)."""
    from gradfidelity.claims.evidence import gate
    from gradfidelity.studies.async_pp.compute_fraction import transient_gate
    from gradfidelity.studies.async_pp.plan import gate_steps

    T = int(steps or g.steps_at(width))
    T2 = gate_steps(T)
    label = Spec(optimizer, momentum=momentum, head=head, width=width).label().replace(" sync", "") \
        + f" at {T} steps" + (" at the sync LR" if lr == TUNED else "")
    fr = fractions(g, {"T": Spec(optimizer, "2bw", momentum=momentum, steps=T, head=head, lr=lr, width=width),
                       "2T": Spec(optimizer, "2bw", momentum=momentum, steps=T2, head=head, lr=lr, width=width)})
    info = {"seeds": fr.n, "f_T": fr.f["T"], "f_2T": fr.f["2T"]}
    if fr.n < 2:
        return gate("transient", False, f"{label}: fewer than 2 paired seeds{fr.p.dropped_note()}"), info
    if fr.defined("T", "2T"):
        return gate("transient", False, f"{label}: not decidable, {fr.defined('T', '2T')}"), info
    sync_T, sync_2T = fr.p[f"T@sync{T}"], fr.p[f"2T@sync{T2}"]
    tg = transient_gate(fr.f["T"], fr.f["2T"], sync_T, sync_2T, level)
    info.update(passed=tg.passed, reason=tg.reason, fall=float(np.mean(sync_T - sync_2T)), tost_p=tg.tost_p)
    return gate("transient", tg.passed, f"{label}: {tg.reason + ': ' if tg.reason else ''}{tg.detail}"), info


def sync_falls(g: Gaps, optimizer: str, momentum: float | None = None, head: str | None = None,
               steps: int | None = None, level: float = 0.95, width: int = 0) -> dict:
    """The budget rule's precondition for one (optimizer, momentum, head) at T (issue 47): its sync loss still falls
    from T to 2T (the `level` t interval of the paired fall sync(T) - sync(2T) above 0). On a flat ladder every f is
    read off a plateau, so the two budgets' verdicts would agree for no reason."""
    from gradfidelity.claims.evidence import gate
    from gradfidelity.stats.intervals import t_interval
    from gradfidelity.studies.async_pp.plan import gate_steps

    T = int(steps or g.steps_at(width))
    T2 = gate_steps(T)
    label = Spec(optimizer, momentum=momentum, head=head, width=width).label() + f" from {T} to {T2} steps"
    p = g.paired({"T": Spec(optimizer, momentum=momentum, steps=T, head=head, lr=TUNED, width=width),
                  "2T": Spec(optimizer, momentum=momentum, steps=T2, head=head, lr=TUNED, width=width)})
    if p.n < 2:
        return gate("sync_falls", False, f"{label}: fewer than 2 paired seeds{p.dropped_note()}")
    fall = t_interval(p["T"] - p["2T"], level)
    ok = fall.low is not None and fall.low > 0.0
    # a failed gate says which: a ladder at its floor (the mean fall is not above 0) or a fall too scattered over
    # the seeds to show (a mean fall above 0 whose interval reaches 0: more seeds could show it)
    why = "" if ok else (" (does not fall: saturated)" if fall.estimate <= 0.0 else
                         " (not shown to fall: the mean falls, but its interval reaches 0 at this n)")
    return gate("sync_falls", ok, f"{label}: the loss falls {fall.estimate:.4f} [{fall.low:.4f}, {fall.high:.4f}]"
                                  f"{why}")


# ------------------------------------------------------------------------------------ host types and run costs
# Issue 57: at T = 512 study B's base arms and ladder ran on one host type and its mitigations, PipeDream and near-tie
# arms on another, so one contrast could read runs of two host types unseen. Every claim now lists the host types of
# its runs, and a comparison across two says so with the drift measured between them (check-reference's
# results/<scale>/reference/drift_*.csv) beside it.
DRIFT_METRIC = "final_val_loss"  # the metric every f is read from


def run_dirs(sources: list[str], g: Gaps) -> list[str]:
    """The run directories among a record's sources (the tables and runs.csv left out)."""
    return [s for s in sources if s in g.host_of]


def hosts(g: Gaps, dirs: list[str]) -> list[str]:
    """The host types (provenance.describe_host) of the runs, sorted."""
    return sorted({g.host_of[d] for d in dirs if d in g.host_of})


def arm_text(g: Gaps, run_dir: str) -> str:
    """The arm a run belongs to (its cell in runs.csv), without its budget and seed: 'muon 2bw+taylor lr~own',
    'adamw pipedream P4 lr~x4', 'muon sync mom 0.9 lr~tuned'."""
    c = g.cell_of[run_dir]
    opt, schedule, mit = c["optimizer"], c["schedule"], c["mitigation"]
    text = f"{opt} {schedule}{'' if mit == 'none' else '+' + mit}"
    if schedule.startswith("pipedream"):
        text += f" P{c['depth']}"
    if opt in OPTIMIZERS and c["momentum"] != default_momentum(opt):
        text += f" mom {c['momentum']:g}"
    if c.get("width"):
        text += f" d {c['width']}"
    return f"{text} lr~{c['lr']}"


def _steps_text(steps: set[int]) -> str:
    s = sorted(steps)
    if not s:
        return ""
    return f" ({s[0]} steps)" if len(s) == 1 else f" ({', '.join(map(str, s))} steps)" if len(s) == 2 \
        else f" ({s[0]}-{s[-1]} steps)"


def runs_by_host(g: Gaps, dirs: list[str]) -> dict[str, str]:
    """{host type: its arms with their budgets, e.g. 'adamw sync lr~tuned (32-512 steps), adamw 2bw lr~own (512)'}."""
    arms: dict[str, dict[str, set[int]]] = {}
    for d in dirs:
        if d in g.host_of:
            arms.setdefault(g.host_of[d], {}).setdefault(arm_text(g, d), set()).add(g.cell_of[d]["steps"])
    return {host: ", ".join(arm + _steps_text(steps) for arm, steps in by_arm.items())
            for host, by_arm in sorted(arms.items())}


def wall_per_seed(g: Gaps, dirs: list[str]) -> float | None:
    """What one more seed of every cell the runs belong to costs, in seconds of single-run wall time (each cell's
    mean wall time over its committed seeds, summed over the cells); None where no run recorded its wall time."""
    by_cell: dict[tuple, list[float]] = {}
    for d in dirs:
        wall = g.wall_of.get(d, math.nan)
        if math.isfinite(wall):
            by_cell.setdefault(tuple(sorted(g.cell_of[d].items())), []).append(wall)
    return float(sum(np.mean(w) for w in by_cell.values())) if by_cell else None


def _label_matches(label: str, identity: dict) -> bool:
    """Whether a drift file's host label ('AVX512 (AMD)', 'AVX512 (Intel 6/167)', 'AVX2') names this host type:
    the same torch capability, and where the label names a vendor (and family/model), the same ones."""
    label = str(label).strip()
    capability, _, rest = label.partition(" (")
    if capability != str(identity.get("cpu_capability")):
        return False
    if not rest:
        return True
    words = rest.rstrip(")").split()
    vendor = str(identity.get("cpu_vendor", ""))
    if not words or words[0] not in vendor:
        return False
    fam = lambda v: str(int(float(v))) if str(v).replace(".", "", 1).isdigit() else str(v)  # noqa: E731
    return len(words) < 2 or words[1] == f"{fam(identity.get('cpu_family'))}/{fam(identity.get('cpu_model_number'))}"


def drift_between(drift: pd.DataFrame | None, a: dict, b: dict, study: str = "async_pp") -> dict | None:
    """The measured drift of the final validation loss between two host types (CPU identities a, b): the runs of
    `study` that a drift measurement reran on the one and the other (its `capability_a`/`capability_b` labels name
    them). {runs, max_abs (nats), max_rel, files}; None when no measurement names this pair."""
    if drift is None or drift.empty or not {"capability_a", "capability_b"} <= set(drift.columns):
        return None
    rows = drift[(drift["study"] == study) & (drift["metric"] == DRIFT_METRIC)]
    # a label without a vendor ('AVX2' against 'AVX512') measured one host at two ISA levels: it speaks for two host
    # types only where they differ in nothing else
    same_cpu = all(str(a.get(k)) == str(b.get(k)) for k in ("cpu_vendor", "cpu_family", "cpu_model_number"))

    def names_pair(r) -> bool:
        if not same_cpu and not all(" (" in str(r[c]) for c in ("capability_a", "capability_b")):
            return False
        return (_label_matches(r["capability_a"], a) and _label_matches(r["capability_b"], b)) \
            or (_label_matches(r["capability_a"], b) and _label_matches(r["capability_b"], a))

    rows = rows[[names_pair(r) for r in rows.to_dict("records")]]
    if rows.empty:
        return None
    diff = pd.to_numeric(rows["difference"], errors="coerce").abs()
    rel = pd.to_numeric(rows["rel_difference"], errors="coerce").abs()
    return {"runs": int(rows["run"].nunique()), "max_abs": float(diff.max()), "max_rel": float(rel.max()),
            "files": sorted(set(rows.get("source", pd.Series(["?"] * len(rows))).astype(str)))}


def read_drift(paths: list[str]) -> pd.DataFrame | None:
    """The drift measurements given (check-reference's drift_*.csv), in one table with each row's file name."""
    frames = []
    for path in paths:
        df = pd.read_csv(path)
        missing = {"study", "run", "metric", "difference", "rel_difference"} - set(df.columns)
        if missing:
            raise UserError(f"{path}: not a drift measurement (no column(s) {sorted(missing)})")
        frames.append(df.assign(source=path.rsplit("/", 1)[-1]))
    return pd.concat(frames, ignore_index=True) if frames else None
