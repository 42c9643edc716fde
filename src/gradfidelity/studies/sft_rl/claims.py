"""Tidy CSV -> claim evidence A5-A9 (the contract of gradfidelity.claims.evidence: an estimate with an interval
over paired seeds at the registry's level, n, gates, sources).

Methods are compared seed by seed (same seed = same initialisation and data order = one pair); the pair of a seed
whose run diverged is dropped and the record says which run it was (`detail`) and how many (`diverged`).

The score (round 3, issue 24): `acc_counted`, the mean accuracy over the eval sets that carry signal, those on which
the fixed SFT arm beats the set's constant answer (baseline.constant_baseline): a set on which every model is below
the constant answer compares noise, and averaging it into the macro drowns the set that does. Every record's detail
says which sets counted. The gates, each against the arm's own start rather than a constant:
- `reference_learned` (every claim): the fixed SFT arm beats the base model by GATE_MARGIN points on `id`;
- `rl_learns` (A7, A8, A8-mech, A9): SFT-then-RL beats its own SFT start on `id` and its training reward rises,
  each on its interval; a comparison of RL recipes whose RL changes nothing compares their starts;
- `arms_learned` (same claims): every mixed-policy arm beats its start (the base model) on the score.
The claims: A5 paired difference fixed SFT - ds_bug SFT; A6 (round 6, issue 57) the paper's "most of the damage comes
from the optimizer bug", E[fixed - ds_bug] - E[fixed - agg_bug] > 0, one paired contrast, with round 5's |E[a]| <
E[d] (two contrasts, intersection-union) and the rounds 2-4 statistic shown beside it; A7 one paired part per
mixed-policy method (intersection-union); A8 one paired difference per mixed method under `both` at the Holm level,
the largest t deciding; A8-mech, per mixed method, how much SFT-then-RL's lead shrinks from `fixed` to `both` (the
paper's explanation of the published ordering); A9 truncated SFT-then-RL against every mixed method (accuracy,
paired) with fewer FLOPs than each (exact, counted), the FLOPs part with the budget's demonstration:rollout token
ratio beside it (round 4: a note, no longer a gate).
Round 5 (issue 46): the claims read the largest RL budget (rl.steps); each smaller budget's reading of the same
claim (the same runs evaluated at that step, aggregate.py) is shown beside it, never a verdict.
Round 6 (issue 57): every record carries `hosts`, the host types of the runs it reads (the tidy CSV's `host`, the
SFT run an SFT-then-RL run starts from included), and a contrast whose runs come from more than one host type says
so in its detail; and `power` (claims.evidence.POWER_SCHEMA): the deciding statistic's per-seed values, its
threshold, side and level, and the wall time of one more seed of the runs the claim reads. Every reading beside a
verdict (nll_id, a smaller budget) names the arms or the method it comes from: a reading decided by another method
than the verdict's says so. Where `rl_learns` fails, the RL claims' details give each seed's headroom and gain, and
the gate shows the `both` arm's RL stage beside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats

from gradfidelity.claims.evidence import (
    exact,
    gate,
    level_for,
    mean_ci,
    not_measured,
    paired_difference,
    power_not_applicable,
    power_record,
    weakest,
    with_parts,
)
from gradfidelity.claims.verdict import Verdict
from gradfidelity.stats.effects import per_seed_floor
from gradfidelity.stats.intervals import one_sided_p
from gradfidelity.studies.sft_rl import plan
from gradfidelity.studies.sft_rl.aggregate import BASE, at_budget, fifth_rise
from gradfidelity.studies.sft_rl.baseline import GATE, GATE_MARGIN, constant_baseline
from gradfidelity.studies.sft_rl.config import StudyConfig
from gradfidelity.studies.sft_rl.task import EVAL_SETS

# The registry rows' `evidence_version` this module computes (2: the counted-set score, the base-model reference
# gate, rl_learns, arms_learned, A8-mech and A9's recipe gate, issue 24; 3: A9's FLOPs part no longer gated on the
# recipe's token ratio, issue 36; 4: A6's statistic of mean effects and every claim read at the largest RL budget,
# 25,600 rollouts at cpu scale, with the smaller budget and nll_id beside it, issue 46); raised together with the
# rows whenever a metric changes, so that evidence of the old metric is never judged by the new check.
# 5: A6 on the paper's one-sided proposition; hosts and power on every record; every reading names its arms or
# method; the both arm's RL stage beside rl_learns; per-seed headroom where it fails (issue 57, issue 59).
EVIDENCE_VERSION = 5
RL_GATE, ARMS_GATE = "rl_learns", "arms_learned"
RL_CLAIMS = ("A7", "A8", "A8-mech", "A9")  # the claims gated on rl_learns (and arms_learned)
SCORE = "acc_counted"  # the claims' score: mean accuracy over the counted eval sets (counted_sets)
NLL = "nll_id"  # the continuous score read beside every claim's accuracy verdict (issue 46), never a verdict
# The paper recipe's demonstration:rollout tokens (LUFFY's 2,000 x 64 demonstrations against 500 x 128 x 8
# rollouts, about 1:4), printed beside A9's FLOPs part so a reader sees how far the budget is from it
PAPER_DEMO_ROLLOUT_RATIO = 0.25
# The paper's effect in the claim's own unit (accuracy points), for the power table: A7, SFT-then-RL's lead over every
# mixed method with both fixes (+3.8 math-average points, Qwen2.5-Math-7B, the smaller of the paper's two models);
# A8, LUFFY 50.1 minus SFT+RL 48.2 on the buggy baselines (LUFFY's README). Points of another task and model: the
# unit converts, the task does not, so it is a scale of reference for the power table, never a threshold. The
# other claims' paper values are no number in this unit (PAPER_NOTE).
PAPER_EFFECT = {"A7": 3.8, "A8": round(50.1 - 48.2, 1)}
PAPER_NOTE = {
    "A5": "the paper gives the buggy SFT's 44.1 math average, not the fixed SFT's: no effect size to convert",
    "A6": "the paper says 'most of the damage', no number",
    "A7": "paper: +3.8 math-average points (Qwen2.5-Math-7B; +22.2 on Llama-3.1-8B), another task's points",
    "A8": "paper: LUFFY 50.1 vs SFT+RL 48.2 (LUFFY's README, buggy baselines), another task's points",
    "A8-mech": "the paper names the mechanism, no number",
    "A9": "the paper says 'beats them with fewer FLOPs', no number",
}
HOST_UNRECORDED = "host not recorded (an aggregate built without the runs' provenance)"


def _ci(rec: dict | None, digits: int = 2) -> str:
    """`+est [lo, hi] (n=k)` of a record, or why there is none."""
    if rec is None or rec["estimate"] is None:
        return "n/a (no finished pair)"
    if rec.get("low") is None:
        return f"{rec['estimate']:+.{digits}f} (n={rec['n']}, no interval)"
    return f"{rec['estimate']:+.{digits}f} [{rec['low']:+.{digits}f}, {rec['high']:+.{digits}f}] (n={rec['n']})"


def _above_zero(rec: dict | None) -> bool:
    return rec is not None and rec.get("low") is not None and rec["low"] > 0


def counted_sets(df: pd.DataFrame, model: str, baseline: dict) -> tuple[list[str], str]:
    """The eval sets the score counts (the fixed SFT arm's mean accuracy beats the set's constant answer) and the
    sentence that says which counted and which did not, with both numbers of each."""
    if "error" in baseline:
        return [], f"no eval set counted: no constant-answer baseline ({baseline['error']})"
    g = df[(df.model == model) & (df.variant == "fixed") & (df.method == "sft") & (df.status == "ok")]
    if len(g) == 0:
        return [], "no eval set counted: no finished fixed SFT run to compare with the constant answers"
    sets, shown = [], {True: [], False: []}
    for s in EVAL_SETS:
        mean, const = float(g[f"acc_{s}"].astype(float).mean()), baseline["sets"][s]["acc"]
        if mean > const:
            sets.append(s)
        shown[mean > const].append(f"{s} (fixed SFT {mean:.1f} vs constant answer {const:.1f})")
    note = (f"score = mean accuracy over the counted eval sets (fixed SFT beats their constant answer): counted: "
            f"{', '.join(shown[True]) or 'none'}; not counted: {', '.join(shown[False]) or 'none'}")
    return sets, note if sets else f"no eval set counted: {note}"


def reference_gate(df: pd.DataFrame, model: str) -> tuple[dict, list[str]]:
    """The `reference_learned` gate on `model` (fixed SFT beats the base model by GATE_MARGIN on `id`) and the runs
    it reads."""
    g = df[(df.model == model) & (df.variant == "fixed") & (df.method == "sft")]
    b = df[(df.model == model) & (df.method == BASE)]
    runs = list(dict.fromkeys([*b.run, *g.run]))
    ok, b_ok = g[g.status == "ok"], b[b.status == "ok"]
    if len(b_ok) == 0:
        return gate(GATE, False, "no finished base model run: cannot show the reference model learned the task"), runs
    if len(ok) == 0:
        why = "no fixed SFT run" if len(g) == 0 else f"all {len(g)} fixed SFT runs diverged"
        return gate(GATE, False, f"{why}: cannot show the reference model learned the task"), runs
    acc, base = float(ok["acc_id"].astype(float).mean()), float(b_ok["acc_id"].astype(float).mean())
    need = base + GATE_MARGIN
    div = f", {len(g) - len(ok)} diverged" if len(ok) < len(g) else ""
    reason = (f"fixed SFT in-distribution accuracy {acc:.1f} (mean of {len(ok)} seeds{div}) vs the base model's "
              f"{base:.1f} + {GATE_MARGIN:g} = {need:.1f}")
    return gate(GATE, acc >= need, reason), runs


def _rl_stage(df: pd.DataFrame, model: str, variant: str,
              level: float) -> tuple[dict | None, dict | None, str, list[str]]:
    """`variant`'s SFT-then-RL against its own SFT start on `id` (paired) and its training reward rise (per seed the
    last fifth of the steps minus the first fifth, aggregate.fifth_rise), each with its interval at `level`: (acc,
    reward, notes, runs read)."""
    s, start = _arm(df, model, variant, "sft_then_rl", "acc_id"), _arm(df, model, variant, plan.SFT_START, "acc_id")
    p = _pair(s, start)
    acc = paired_difference(*p.values, level) if p.seeds else None
    g = df[(df.model == model) & (df.variant == variant) & (df.method == "sft_then_rl") & (df.status == "ok")]
    rises = {int(r.seed): fifth_rise(r.reward_history) for r in g.itertuples()}
    short = sorted(k for k, v in rises.items() if not np.isfinite(v))
    rise = [v for v in rises.values() if np.isfinite(v)]
    rew = mean_ci(rise, level) if rise else None
    notes = _join(p.note, f"seed(s) {', '.join(map(str, short))} with fewer than 5 RL steps of reward left out"
                  if short else "")
    return acc, rew, notes, p.sources


def rl_gate(df: pd.DataFrame, model: str) -> tuple[dict, list[str]]:
    """The `rl_learns` gate: fixed SFT-then-RL beats its own SFT start on `id` (paired) and its training reward
    rises (per seed the last fifth of the steps minus the first fifth, aggregate.fifth_rise), each interval at A7's
    level above 0; and the runs it reads. Beside it, a reading that is never the gate (issue 59): the `both` arm's
    RL stage, the same recipe and LR from its lower (buggy) SFT start, where there is room to learn."""
    level = level_for("A7")
    acc, rew, notes, sources = _rl_stage(df, model, "fixed", level)
    passed = _above_zero(acc) and _above_zero(rew)
    reason = _join(f"{'RL learns' if passed else 'RL does not learn at this scale'}: fixed sft_then_rl minus its "
                   f"SFT start (fixed/{plan.SFT_START}) on acc_id {_ci(acc)}, RL training reward rise (mean of "
                   f"the last fifth of the steps minus the first fifth) {_ci(rew, 3)}, each at level {level:g}, both "
                   "must lie above 0",
                   notes)
    if len(df[(df.model == model) & (df.variant == "both") & (df.method == "sft_then_rl")]):
        b_acc, b_rew, b_notes, _ = _rl_stage(df, model, "both", level)
        reason = _join(reason, "beside it, a reading (not the gate): the `both` arm's RL stage, both/sft_then_rl "
                       f"minus its SFT start (both/{plan.SFT_START}) on acc_id {_ci(b_acc)}, its reward rise "
                       f"{_ci(b_rew, 3)}",
                       b_notes)
    return gate(RL_GATE, passed, reason), sources


def headroom_note(df: pd.DataFrame, model: str) -> str:
    """Per seed, each table variant's SFT-then-RL start: its headroom (100 - the SFT start's acc_id) and the RL
    stage's gain over it on acc_id, with the share of the headroom the stage closes (issue 59: an RL stage that
    starts at the ceiling has nothing to learn, so `rl_learns` cannot pass there)."""
    out = []
    for variant in plan.TABLE_VARIANTS:
        p = _pair(_arm(df, model, variant, "sft_then_rl", "acc_id"),
                  _arm(df, model, variant, plan.SFT_START, "acc_id"))
        if not p.seeds:
            continue
        end, start = p.values
        room, gain = 100.0 - start, end - start
        closed = f"{gain.sum() / room.sum():.0%}" if room.sum() > 0 else "n/a (no headroom)"
        per = ", ".join(f"seed {s} {r:.1f} / {g:+.1f}" for s, r, g in zip(p.seeds, room, gain, strict=True))
        out.append(f"{variant}: {per}; mean headroom {room.mean():.1f}, mean gain {gain.mean():+.2f}, the RL stage "
                   f"closes {closed} of the headroom")
    if not out:
        return ""
    return ("rl_learns fails: per seed, the RL start's headroom (100 - SFT start acc_id) / the RL stage's gain on "
            "acc_id (sft_then_rl minus its SFT start): " + "; ".join(out))


def arms_gate(df: pd.DataFrame, cfg: StudyConfig, model: str, sets: list[str]) -> tuple[dict, list[str]]:
    """The `arms_learned` gate: every configured mixed-policy arm (fixed) beats its start on the score, paired
    over seeds at A7's level; and the runs it reads."""
    mixed = [m for m in plan.MIXED if m in cfg.methods]
    if not mixed:
        return gate(ARMS_GATE, True, "no mixed-policy method configured"), []
    if not sets:
        return gate(ARMS_GATE, False, "no eval set counted: cannot score the mixed arms against their start"), []
    shown, bad, runs = [], [], []
    for m in mixed:
        p = _pair(_arm(df, model, "fixed", m), _arm(df, model, "fixed", plan.start_method(m)))
        rec = paired_difference(*p.values, level_for("A7")) if p.seeds else None
        runs += p.sources
        line = f"{m} {_ci(rec)} vs its start" + (f" ({p.note})" if p.note else "")
        shown.append(line)
        if not _above_zero(rec):
            bad.append(line)
    if bad:
        return gate(ARMS_GATE, False, "arm did not learn: " + "; ".join(bad)), runs
    return gate(ARMS_GATE, True, "every mixed arm improved on its start (base) on the score: "
                + "; ".join(shown)), runs


@dataclass
class Arm:
    """One (variant, method) cell of one model across seeds: values of the finished runs by seed, and by seed the
    host types of its run and of the SFT run an SFT-then-RL run starts from."""

    label: str
    values: dict[int, float] = field(default_factory=dict)
    runs: dict[int, str] = field(default_factory=dict)
    diverged: dict[int, str] = field(default_factory=dict)
    hosts: dict[int, set[str]] = field(default_factory=dict)
    bases: dict[int, int] = field(default_factory=dict)  # seed -> the base model's seed it started from


def _host(value) -> str:
    """A tidy-CSV `host` cell, or HOST_UNRECORDED where the aggregate was built without provenance."""
    return value if isinstance(value, str) and value else HOST_UNRECORDED


def _arm(df: pd.DataFrame, model: str, variant: str, method: str, key: str = SCORE) -> Arm:
    g = df[(df.model == model) & (df.variant == variant) & (df.method == method)]
    arm = Arm(f"{variant}/{method}")
    upstream = {}
    if plan.start_method(method) == plan.SFT_START:  # the run carries its SFT start's host type too
        up = df[(df.model == model) & (df.variant == variant) & (df.method == "sft")]
        upstream = {int(r.seed): _host(getattr(r, "host", None)) for r in up.itertuples()}
    for r in g.itertuples():
        seed = int(r.seed)
        arm.runs[seed] = r.run
        arm.hosts[seed] = {_host(getattr(r, "host", None))} | ({upstream[seed]} if seed in upstream else set())
        base = getattr(r, "base_seed", None)
        if base is not None and not pd.isna(base):
            arm.bases[seed] = int(base)
        if r.status == "ok":
            arm.values[seed] = float(getattr(r, key))
        else:
            arm.diverged[seed] = r.run
    return arm


@dataclass
class Paired:
    seeds: list[int]
    values: list[np.ndarray]
    diverged: int
    note: str
    sources: list[str]


def host_note(*arms: Arm) -> str:
    """'' where every run of the arms comes from one host type; else the sentence that says a contrast of these arms
    mixes host types, and which arm ran where (issue 57: a host type shifts study A's runs, so such a contrast
    measures the host as well as the arms)."""
    per = {a.label: sorted(set().union(*a.hosts.values())) for a in arms if a.hosts}
    types = set().union(*map(set, per.values())) if per else set()
    if len(types) < 2:
        return ""
    return (f"the arms' runs come from {len(types)} host types, so this contrast also measures the host: "
            + "; ".join(f"{label} on {' + '.join(h)}" for label, h in per.items()))


def _pair(*arms: Arm) -> Paired:
    """The seeds every arm finished, the arms' values on them, what diverged (never dropped silently), and whether
    the arms' runs come from more than one host type (host_note)."""
    seeds = sorted(set.intersection(*(set(a.values) for a in arms)))
    bad = {}
    for a in arms:
        for s, run in a.diverged.items():
            bad.setdefault(run, f"{a.label} seed{s}")
    dropped = sorted(set().union(*(set(a.runs) for a in arms)) - set(seeds))
    note = ""
    if bad:
        note = (f"{len(bad)} diverged run(s) ({', '.join(bad.values())}): seed(s) "
                f"{', '.join(map(str, dropped))} dropped from the pairing")
    note = _join(note, host_note(*arms))
    sources = list(dict.fromkeys(run for a in arms for run in a.runs.values()))
    return Paired(seeds, [np.array([a.values[s] for s in seeds]) for a in arms], len(bad), note, sources)


def base_note(seeds: list[int], values, *arms: Arm, level: float = 0.95) -> str:
    """The base model as a random effect (issue 59), a reading: where the seeds start from two or more committed
    bases (each with 2+ seeds), the deciding statistic's mean per base and the difference of the last base's mean
    from the first's with its Welch interval (scipy). The claim's own interval pools the seeds of every base as one
    sample, so it carries the bases' spread only as far as their seeds sample it: two bases cannot estimate the base's
    own variance apart from the seeds', which this reading makes visible instead. '' with one base."""
    bases = {}
    for a in arms:
        bases.update(a.bases)
    groups: dict[int, list[float]] = {}
    for seed, v in zip(seeds, np.asarray(values, dtype=float), strict=True):
        if seed in bases:
            groups.setdefault(bases[seed], []).append(float(v))
    if len(groups) < 2 or min(map(len, groups.values())) < 2:
        return ""
    first, last = min(groups), max(groups)
    test = stats.ttest_ind(groups[last], groups[first], equal_var=False)
    ci = test.confidence_interval(level)
    per = ", ".join(f"base {b} {np.mean(v):+.2f} (n {len(v)})" for b, v in sorted(groups.items()))
    return (f"base to base (a reading, the base a random effect): per base {per}; base {last} - base {first} "
            f"{np.mean(groups[last]) - np.mean(groups[first]):+.2f} [{ci.low:+.2f}, {ci.high:+.2f}] (Welch, "
            f"{level:.0%}); the interval above pools the seeds of the {len(groups)} bases as one sample, so it "
            "holds the bases' spread only as far as their seeds sample it")


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def _missing(*arms: Arm) -> str:
    return _join(*(f"no {a.label} runs (method or variant not configured)" for a in arms if not a.runs))


def power_of(statistic: str, per_seed, level: float, note: str = "") -> dict:
    """The `power` block (claims.evidence.power_record) of a claim decided on the t interval of the mean of
    `per_seed` against 0 from above (every A check but A9's exact FLOPs part is `> 0`); the wall time per seed, the
    unit and the paper's effect are the claim's, filled in by `_finish`."""
    return power_record(statistic, per_seed, 0.0, "gt", level, note=note)


def se_and_half_width(values, level: float) -> tuple[float, float, float]:
    """(sd, standard error, half-width of the two-sided t interval at `level`) of the mean of `values` (scipy): the
    deciding contrast's own noise, the number a reader holds its estimate against."""
    x = np.asarray(values, dtype=float)
    sd, se = float(np.std(x, ddof=1)), float(stats.sem(x))
    return sd, se, float(stats.t.ppf(0.5 + level / 2, len(x) - 1) * se)


def _difference(cid: str, a: Arm, b: Arm, what: str, *, gates, sources) -> dict:
    """Paired difference a - b over seeds (points) at the registry's level for `cid`."""
    if _missing(a, b):
        return not_measured(_missing(a, b), gates=gates, sources=sources)
    p = _pair(a, b)
    detail = _join(f"{what}, paired over seeds {p.seeds}: {a.label} mean "
                   f"{p.values[0].mean() if p.seeds else math.nan:.2f} - {b.label} mean "
                   f"{p.values[1].mean() if p.seeds else math.nan:.2f}", p.note,
                   base_note(p.seeds, p.values[0] - p.values[1], a, b, level=level_for(cid)) if p.seeds else "")
    if not p.seeds:
        return not_measured(_join("no seed with both runs finished", detail), gates=gates,
                            sources=p.sources + sources, diverged=p.diverged)
    rec = paired_difference(p.values[0], p.values[1], level_for(cid), detail=detail, gates=gates,
                            sources=p.sources + sources, diverged=p.diverged)
    rec["power"] = power_of(f"{a.label} - {b.label}", p.values[0] - p.values[1], level_for(cid))
    return rec


def _weakest(records: dict[str, dict]) -> dict:
    """claims.evidence.weakest, its power block saying that it is the deciding comparison of an intersection-union
    (every comparison must clear the threshold; the power table reads each part's own block where the registry
    names the parts)."""
    out = weakest(records)
    if "power" in out:
        names = ", ".join(f"{k} ({r['power']['statistic']})" if "power" in r else k for k, r in records.items())
        out["power"] = dict(out["power"], note=f"the deciding comparison of an intersection-union over {names}: "
                                               "every one must clear the threshold")
    return out


def _t_stat(rec: dict) -> float:
    """mean / standard error of a paired-difference record, from its interval (inf for a zero-width one)."""
    if rec["estimate"] is None:
        return -math.inf
    if rec.get("low") is None:
        return -math.inf  # one pair: no interval, cannot be the deciding comparison
    half = (rec["high"] - rec["low"]) / 2
    if half <= 0:
        return math.copysign(math.inf, rec["estimate"]) if rec["estimate"] else 0.0
    return rec["estimate"] / half  # proportional to mean / se (same n and level for every method)


def _holm(pvalues: dict[str, float]) -> dict[str, float]:
    """Holm-adjusted p-values (step-down, monotone), keyed like the input."""
    order = sorted(pvalues, key=pvalues.get)
    k, out, running = len(order), {}, 0.0
    for i, name in enumerate(order):
        running = max(running, min(1.0, (k - i) * pvalues[name]))
        out[name] = running
    return out


def _one_sided_p(rec: dict, diffs: np.ndarray) -> float:
    """One-sided p-value of 'difference > 0': the one-sample t test of the paired differences behind `rec`.

    Where the record has no interval (one pair) the test cannot speak (p = 1); where the interval has zero width
    (identical differences) the test degenerates and the sign decides, as the interval does."""
    if rec["estimate"] is None or rec.get("low") is None or len(diffs) < 2:
        return 1.0
    if rec["high"] - rec["low"] <= 0:
        return 0.0 if rec["estimate"] > 0 else 1.0
    return one_sided_p(diffs, "greater")


def _claims_for(df: pd.DataFrame, cfg: StudyConfig, model: str, baseline: dict, tables: dict,
                score: str = SCORE) -> dict:
    """Every claim's record on `model`, scored on the counted sets' accuracy (SCORE, the verdicts'), or on `NLL`
    turned in sign (the nll_id reading beside it, issue 46: > 0 reads as on accuracy)."""
    sets, sets_note = counted_sets(df, model, baseline)
    value = -df[NLL].astype(float) if score == NLL else (
        df[[f"acc_{s}" for s in sets]].astype(float).mean(axis=1) if sets else math.nan)
    df = df.assign(**{SCORE: value})
    ref, ref_runs = reference_gate(df, model)
    rl, rl_runs = rl_gate(df, model)
    arms_ok, arms_runs = arms_gate(df, cfg, model, sets)
    gates, rl_gates = [ref], [ref, rl, arms_ok]
    main, abl = [str(p) for p in tables["main"]], [str(p) for p in tables["ablation"]]
    src_abl, src_main = ref_runs + abl, ref_runs + rl_runs + arms_runs + main
    fixed, ds_bug, agg_bug = (_arm(df, model, v, "sft") for v in ("fixed", "ds_bug", "agg_bug"))
    # A6 (round 6, issue 57): the paper's "most of the damage comes from the optimizer bug", E[d] - E[a] > 0,
    # decided only on runs made after that proposition was committed (rule_before_runs)
    a6_gates = [*gates, rule_before_runs(df, [fixed, ds_bug, agg_bug], A6_RULE_COMMITTED, "A6's proposition")]
    if not sets:
        vals = {cid: not_measured(sets_note, gates={"A5": gates, "A6": a6_gates}.get(cid, rl_gates),
                                  sources=src_abl if cid in ("A5", "A6") else src_main)
                for cid in ("A5", "A6", "A7", "A8", "A8-mech", "A9")}
        return _finish(vals, model, "", df, score)
    vals: dict = {}

    vals["A5"] = _difference("A5", fixed, ds_bug, "SFT score, fixed minus ds_bug", gates=gates, sources=src_abl)
    vals["A6"] = _a6(fixed, ds_bug, agg_bug, a6_gates, src_abl)

    mixed = [m for m in plan.MIXED if m in cfg.methods]
    # A7: SFT-then-RL against every mixed-policy method, one paired part each (the registry's parts)
    s_fixed = _arm(df, model, "fixed", "sft_then_rl")
    parts = {}
    for m in plan.MIXED:
        if m not in cfg.methods:
            parts[f"vs_{m}"] = not_measured(f"{m} not in sft_rl.methods", sources=main)
        else:
            parts[f"vs_{m}"] = _difference("A7", s_fixed, _arm(df, model, "fixed", m),
                                           f"fixed: sft_then_rl minus {m}", gates=[], sources=main)
    mixed_fixed = [_arm(df, model, "fixed", m) for m in mixed]
    vals["A7"] = _with_parts(parts, weakest(parts)["detail"], rl_gates, src_main, s_fixed, *mixed_fixed)

    s_both = _arm(df, model, "both", "sft_then_rl")
    mixed_both = {m: _arm(df, model, "both", m) for m in mixed}
    vals["A8"] = _a8(s_both, mixed_both, rl_gates, src_main)
    vals["A8-mech"] = _a8_mech(df, cfg, model, s_fixed, s_both, rl_gates, src_main, main)
    vals["A9"] = _a9(df, model, mixed, rl_gates, src_main, main)
    if not rl["passed"]:
        room = headroom_note(df, model)
        for cid in RL_CLAIMS:
            vals[cid]["detail"] = _join(vals[cid]["detail"], room)
    return _finish(vals, model, sets_note, df, score)


def _verdict_word(rec: dict) -> str:
    """What a `> 0` check reads on a record's interval, in words, for a proposition shown beside the verdict."""
    if rec.get("low") is None:
        return "undecided (no interval)"
    return "holds" if rec["low"] > 0 else "fails" if rec["high"] <= 0 else "undecided (its interval holds 0)"


def _noise(x: np.ndarray, level: float) -> str:
    sd, se, half = se_and_half_width(x, level)
    return f"per-seed sd {sd:.2f}, SE {se:.2f}, {level * 100:g}% half-width {half:.2f}"


# When A6's round-6 proposition was committed (7763ec9): runs that started before it were seen when it was chosen,
# so they give A6 a reading, never a verdict (issue 57: a rule is fixed before the run that decides it).
A6_RULE_COMMITTED = "2026-12-06T01:53:47+00:00"


def rule_before_runs(df: pd.DataFrame, arms: list[Arm], committed: str, rule: str) -> dict:
    """The gate that a claim's runs all started after its rule was committed (`committed`, ISO time): the rows of
    `arms`' runs must carry a start time (the aggregate's `started`, from provenance.json) later than it. A run
    without one, or one that started before, fails the gate, naming how many."""
    runs = {run for a in arms for run in a.runs.values()}
    started = df[df.run.isin(runs)].drop_duplicates("run").set_index("run")["started"]
    when = pd.to_datetime(started, utc=True, errors="coerce")
    rule_time = pd.Timestamp(committed)
    before, unknown = int((when <= rule_time).sum()), int(when.isna().sum())
    passed = bool(len(runs)) and before == 0 and unknown == 0
    reason = (f"all {len(runs)} runs started after {rule} was committed ({committed})" if passed else
              f"{before} of {len(runs)} runs started before {rule} was committed ({committed}) and "
              f"{unknown} record no start time: the proposition was chosen after they were seen, so they give a "
              f"reading, not a verdict; runs made after it decide")
    return {"name": "rule_before_runs", "passed": passed, "reason": reason}


def _a6(fixed: Arm, ds_bug: Arm, agg_bug: Arm, gates: list, src_abl: list[str]) -> dict:
    """A6, round 6 (issue 57): the paper's proposition, "most of the damage comes from the optimizer bug": with
    d = fixed - ds_bug and a = fixed - agg_bug per seed (each bug's damage to the SFT score), E[d] - E[a] > 0, one
    paired contrast (= agg_bug - ds_bug), decided on its t interval. An aggregation bug that helps (E[a] < 0) does
    no damage, so all of it comes from the optimizer bug: the paper's wording holds there, and the claim does not
    ask that the help be smaller than the damage. That stricter proposition, |E[a]| < E[d] (round 5: both E[d] -
    E[a] > 0 and E[d] + E[a] > 0, the weaker deciding, claims.evidence.weakest), is shown beside it, and so is the
    rounds 2-4 statistic (mean per-seed |a| - |d|, check < 0) with its floor (mean |fixed_i - fixed_j|: it does not
    fall with n, stats.effects). The detail gives the deciding contrast's own noise: its per-seed sd, its standard
    error and the half-width of its interval (the number its estimate is held against). "Damage" presupposes that
    the optimizer bug does harm, E[d] > 0, which A5 tests."""
    if _missing(fixed, ds_bug, agg_bug):
        return not_measured(_missing(fixed, ds_bug, agg_bug), gates=gates, sources=src_abl)
    p = _pair(fixed, ds_bug, agg_bug)
    if len(p.seeds) < 2:
        return not_measured(_join(f"fewer than 2 seeds with all three SFT arms finished ({p.seeds})", p.note),
                            n=len(p.seeds), gates=gates, sources=p.sources + src_abl, diverged=p.diverged)
    f, ds, agg = p.values
    d, a = f - ds, f - agg
    level = level_for("A6")
    kw = {"gates": gates, "sources": p.sources + src_abl, "diverged": p.diverged}
    rec = mean_ci(d - a, level, **kw)
    rec["power"] = power_of("E[d] - E[a] = agg_bug/sft - ds_bug/sft", d - a, level,
                            note="the paper's proposition (most of the damage from the optimizer bug), one contrast")
    other = weakest({"d - a": mean_ci(d - a, level), "d + a": mean_ci(d + a, level)})
    iu = {"d - a": d - a, "d + a": d + a}
    weak = other["detail"].removeprefix("deciding comparison: ").split(";")[0]
    old = mean_ci(np.abs(a) - np.abs(d), level)
    rec["detail"] = _join(
        f"the paper's proposition, most of the damage comes from the optimizer bug: E[d] - E[a] > 0, with d = "
        f"fixed - ds_bug and a = fixed - agg_bug per seed over {p.seeds}: E[d] {d.mean():+.2f}, E[a] "
        f"{a.mean():+.2f}; deciding contrast E[d] - E[a] (= agg_bug - ds_bug) {_ci(rec)}, its "
        f"{_noise(d - a, level)}",
        f"beside it, round 5's stricter proposition |E[a]| < E[d] (E[d] - E[a] > 0 and E[d] + E[a] > 0, the weaker "
        f"deciding), a reading: {_verdict_word(other)}; d - a {_ci(mean_ci(d - a, level))}, d + a "
        f"{_ci(mean_ci(d + a, level))}, {weak} deciding, its {_noise(iu[weak], level)}",
        f"the rounds 2-4 statistic (mean per-seed |a| - |d|, check < 0), a reading: {_ci(old)}, against its floor "
        f"{per_seed_floor(f):.2f} (mean |fixed_i - fixed_j|, i != j, which does not fall with n; per-seed mean|a| "
        f"{np.mean(np.abs(a)):.2f}, mean|d| {np.mean(np.abs(d)):.2f})", p.note,
        base_note(p.seeds, d - a, fixed, ds_bug, agg_bug, level=level))
    return rec


def _finish(vals: dict, model: str, sets_note: str, df: pd.DataFrame, score: str) -> dict:
    """Each record's detail prefixed with the model and followed by the score's note, its sources once each, its
    `hosts`, and its power blocks completed with the claim's wall time per seed, unit and paper effect. A claim
    decided by its parts (intersection-union) carries a power block per part, none of its own: the power table plans
    each part, and the claim needs the n of its most demanding part."""
    runs = RunIndex.of(df)
    for cid, v in vals.items():
        v["sources"] = list(dict.fromkeys(v["sources"]))
        v["hosts"] = runs.hosts(v["sources"])
        v["detail"] = f"{model}: " + _join(v["detail"], sets_note, f"host types of its runs: {'; '.join(v['hosts'])}"
                                           if v["hosts"] else "")
        for part in (v.get("parts") or {}).values():
            part["hosts"] = runs.hosts(part["sources"])
        wall = runs.wall_per_seed(v["sources"])
        unit = "nats of nll_id, sign turned (> 0 reads as on accuracy)" if score == NLL else "accuracy points"
        blocks = [b for b in [v.get("power"), *(p.get("power") for p in (v.get("parts") or {}).values())] if b]
        for b in blocks:
            if "not_applicable" in b:
                continue
            b.update(wall_s_per_seed=wall, unit=unit,
                     paper_effect=PAPER_EFFECT.get(cid) if score != NLL else None)
            b["note"] = _join(b.get("note", ""), PAPER_NOTE.get(cid, ""), WALL_NOTE)
    return vals


WALL_NOTE = ("wall_s_per_seed: one more seed of the runs the claim and its gates read (SFT and RL-stage runs, the SFT "
             "run an SFT-then-RL run starts from included, the shared base model not), each run's committed wall "
             "time, summed per seed and averaged over the seeds")


@dataclass
class RunIndex:
    """Per run directory of the tidy CSV: its host type, wall time (None if not timed), seed (None for the shared
    base model) and the SFT run it starts from (SFT-then-RL and its truncation)."""

    host: dict[str, str]
    wall: dict[str, float | None]
    seed: dict[str, int | None]
    upstream: dict[str, str]

    @classmethod
    def of(cls, df: pd.DataFrame) -> RunIndex:
        host, wall, seed, upstream = {}, {}, {}, {}
        for r in df.itertuples():
            w = getattr(r, "wall_s", None)
            host[r.run] = _host(getattr(r, "host", None))
            wall[r.run] = float(w) if w is not None and np.isfinite(float(w)) else None
            seed[r.run] = None if r.method == BASE else int(r.seed)
        sft = {(r.model, r.variant, int(r.seed)): r.run for r in df[df.method == "sft"].itertuples()}
        for r in df[df.method.map(plan.start_method) == plan.SFT_START].itertuples():
            if (r.model, r.variant, int(r.seed)) in sft:
                upstream[r.run] = sft[(r.model, r.variant, int(r.seed))]
        return cls(host, wall, seed, upstream)

    def _runs(self, sources: list[str]) -> list[str]:
        runs = [s for s in sources if s in self.host]
        return list(dict.fromkeys(runs + [self.upstream[r] for r in runs if r in self.upstream]))

    def hosts(self, sources: list[str]) -> list[str]:
        """The host types of the runs among `sources` and of the SFT runs they start from, sorted."""
        return sorted({self.host[r] for r in self._runs(sources)})

    def wall_per_seed(self, sources: list[str]) -> float | None:
        """Mean over seeds of the summed wall time of that seed's runs among `sources` (and their SFT starts); None
        where any of them has no wall time (a record made before runs were timed)."""
        per_seed: dict[int, float] = {}
        for r in self._runs(sources):
            if self.seed[r] is None:
                continue  # the shared base model: trained once for every seed
            if self.wall[r] is None:
                return None
            per_seed[self.seed[r]] = per_seed.get(self.seed[r], 0.0) + self.wall[r]
        return float(np.mean(list(per_seed.values()))) if per_seed else None


def _a8(s_both: Arm, mixed_both: dict[str, Arm], gates: list, src_main: list[str]) -> dict:
    """A8: under both bugs, some mixed-policy method ahead of SFT-then-RL: one paired difference per method at the
    registry's Holm level (its first step, alpha / 4, the four mixed methods); the method with the largest t
    statistic decides (some method's interval above 0 <=> its interval is; all below 0 <=> its is)."""
    if not mixed_both:
        return not_measured("no mixed-policy method configured", gates=gates, sources=src_main)
    recs = {m: _difference("A8", a, s_both, f"both: {m} minus sft_then_rl", gates=gates, sources=src_main)
            for m, a in mixed_both.items()}
    measured = {m: r for m, r in recs.items() if r["estimate"] is not None}
    if not measured:
        return dict(weakest(recs), gates=gates)
    diffs = {m: np.subtract(*_pair(mixed_both[m], s_both).values) for m in measured}
    pv = _holm({m: _one_sided_p(r, diffs[m]) for m, r in measured.items()})
    best = max(measured, key=lambda m: _t_stat(measured[m]))

    def show(m, r):
        if r["estimate"] is None:
            return f"{m} not measured ({r['detail']})"
        ci = f" [{r['low']:.2f}, {r['high']:.2f}]" if r.get("low") is not None else ""
        return f"{m} {r['estimate']:+.2f}{ci} Holm p {pv[m]:.3g}"
    others = "; ".join(show(m, r) for m, r in recs.items())
    rec = recs[best]
    div = len({run for a in [s_both, *mixed_both.values()] for run in a.diverged.values()})
    out = dict(rec, detail=_join(f"deciding method: {best} (largest t)", rec["detail"],
                                 f"all methods at level {level_for('A8')}: {others}"))
    out["power"] = dict(rec["power"], note=f"the method with the largest t of {len(measured)} ({best}); the claim "
                        "holds when some method's interval at the Holm level lies above 0")
    if div:
        out["diverged"] = div
    return out


def _a8_mech(df: pd.DataFrame, cfg: StudyConfig, model: str, s_fixed: Arm, s_both: Arm, gates: list,
             src_main: list[str], main: list[str]) -> dict:
    """A8-mech: the paper's mechanism, SFT-then-RL's lead over each mixed method shrinks under `both`: per method
    and seed (sft_then_rl - m)|fixed - (sft_then_rl - m)|both, the mean with its t interval (one part each)."""
    parts, arms, per_seed = {}, [s_fixed, s_both], {}
    for m in plan.MIXED:
        if m not in cfg.methods:
            parts[f"vs_{m}"] = not_measured(f"{m} not in sft_rl.methods", sources=main)
            continue
        m_fixed, m_both = _arm(df, model, "fixed", m), _arm(df, model, "both", m)
        arms += [m_fixed, m_both]
        if _missing(s_fixed, m_fixed, s_both, m_both):
            parts[f"vs_{m}"] = not_measured(_missing(s_fixed, m_fixed, s_both, m_both), sources=main)
            continue
        p = _pair(s_fixed, m_fixed, s_both, m_both)
        if not p.seeds:
            parts[f"vs_{m}"] = not_measured(_join("no seed with all four runs finished", p.note),
                                            sources=p.sources + main, diverged=p.diverged)
            continue
        sf, mf, sb, mb = p.values
        detail = _join(f"(sft_then_rl - {m}) under fixed minus under both, paired over seeds {p.seeds}: lead "
                       f"fixed {np.mean(sf - mf):+.2f}, lead both {np.mean(sb - mb):+.2f}", p.note,
                       base_note(p.seeds, (sf - mf) - (sb - mb), s_fixed, s_both, m_fixed, m_both,
                                 level=level_for("A8-mech")))
        per_seed[f"vs_{m}"] = (tuple(p.seeds), tuple(np.round((sf - mf) - (sb - mb), 9)))  # float-error blind
        parts[f"vs_{m}"] = mean_ci((sf - mf) - (sb - mb), level_for("A8-mech"), detail=detail,
                                   sources=p.sources + main, diverged=p.diverged)
        parts[f"vs_{m}"]["power"] = power_of(
            f"(fixed/sft_then_rl - fixed/{m}) - (both/sft_then_rl - both/{m})", (sf - mf) - (sb - mb),
            level_for("A8-mech"))
    detail = weakest(parts)["detail"]
    if len(per_seed) > 1 and len(set(per_seed.values())) == 1:
        # issue 46: four identical parts read as four findings; they are one number, and the reason is tested
        detail = _join(f"the parts {', '.join(per_seed)} are one number, {_ci(next(iter(parts.values())))}: the mixed "
                       "arms under `both` reuse their `fixed` runs (a mixed arm starts from the base model with GA 1, "
                       "so neither bug acts on it; its run on the buggy infrastructure is bit-identical, "
                       "tests/sft_rl/test_reuse.py), so each part is SFT-then-RL's own lead, fixed - both", detail)
    return _with_parts(parts, detail, gates, src_main, *arms)


def _token_ratio(df: pd.DataFrame, model: str) -> str:
    """The fixed sft_then_rl run's demonstration:rollout token ratio (mean over the finished seeds) against the paper
    recipe's, for the reader of A9's FLOPs part: context, not a gate (issue 36 dropped compute matching; A9 compares
    FLOPs as the claim is written)."""
    g = df[(df.model == model) & (df.variant == "fixed") & (df.method == "sft_then_rl") & (df.status == "ok")]
    if len(g) == 0:
        return "no finished fixed sft_then_rl run to read the demonstration:rollout token ratio from"
    demo, gen = g.demo_tokens.astype(float).to_numpy(), g.gen_tokens.astype(float).to_numpy()
    ratio = float(np.mean(np.divide(demo, gen, out=np.full_like(demo, math.inf), where=gen > 0)))
    return (f"demonstration:rollout token ratio {ratio:.3g} (fixed sft_then_rl, mean of {len(g)} seeds) against the "
            f"paper recipe's {PAPER_DEMO_ROLLOUT_RATIO:g} (2,000 x 64 demonstrations vs 500 x 128 x 8 rollouts)")


def _a9(df: pd.DataFrame, model: str, mixed: list[str], gates: list, src_main: list[str], main: list[str]) -> dict:
    """A9: truncated SFT-then-RL beats every mixed-policy method (intersection-union over methods, paired) with
    fewer FLOPs than each (exact: FLOPs are counted, not sampled; the largest per-seed ratio over methods), with the
    budget's demonstration:rollout token ratio beside it (_token_ratio)."""
    trunc = _arm(df, model, "fixed", "sft_then_rl_truncated")
    arms = [trunc] + [_arm(df, model, "fixed", m) for m in mixed]
    if not mixed or _missing(trunc):
        miss = "no mixed-policy method configured" if not mixed else _missing(trunc)
        parts = {"accuracy": not_measured(miss, sources=main), "flops": not_measured(miss, sources=main)}
        return _with_parts(parts, _join(*(f"{k}: {v['detail']}" for k, v in parts.items())), gates, src_main,
                           *arms)
    accs = {f"vs_{m}": _difference("A9", trunc, _arm(df, model, "fixed", m),
                                   f"fixed: truncated sft_then_rl minus {m}", gates=[], sources=main)
            for m in mixed}
    parts = {"accuracy": _weakest(accs), "flops": _a9_flops(df, model, mixed, main, _token_ratio(df, model))}
    return _with_parts(parts, _join(*(f"{k}: {v['detail']}" for k, v in parts.items())), gates, src_main, *arms)


def _a9_flops(df: pd.DataFrame, model: str, mixed: list[str], main: list[str], ratio_note: str) -> dict:
    tf = _arm(df, model, "fixed", "sft_then_rl_truncated", "flops")
    ratios, lines, srcs, div, missing, ns = [], [], [], 0, [], []
    for m in mixed:
        p = _pair(tf, _arm(df, model, "fixed", m, "flops"))
        srcs += p.sources
        div = max(div, p.diverged)
        if not p.seeds:
            missing.append(_join(f"{m}: no seed with both runs finished", p.note))
            continue
        r = p.values[0] / p.values[1]
        ratios += list(r)
        ns.append(len(p.seeds))
        lines.append(f"{m} " + ", ".join(f"{x:.4g}" for x in r) + (f" ({p.note})" if p.note else ""))
    if missing:
        return not_measured(_join(*missing), sources=srcs + main, diverged=div)
    if min(min(ratios), 1.0) <= 0 or not np.isfinite(ratios).all():
        return not_measured("non-positive FLOPs recorded", sources=srcs + main)
    flops = exact(float(max(ratios)), n=min(ns), sources=srcs + main,
                  detail=_join("largest per-seed ratio truncated sft_then_rl FLOPs / mixed method FLOPs over every "
                               "mixed method (FLOPs are counted, not sampled; every run must hold): "
                               + "; ".join(lines), ratio_note))
    flops["power"] = power_not_applicable("largest per-seed FLOPs ratio fixed/sft_then_rl_truncated / each mixed "
                                          "method", "FLOPs are counted, not sampled: no n changes an exact part")
    if div:
        flops["diverged"] = div
    return flops


def _with_parts(parts: dict, detail: str, gates: list, sources: list[str], *arms: Arm) -> dict:
    """A record decided by its parts; `diverged` counts each diverged run behind any part once."""
    rec = with_parts(parts, detail=detail, gates=gates,
                     sources=[s for p in parts.values() for s in p["sources"]] + sources)
    div = len({run for a in arms for run in a.diverged.values()})
    if div:
        rec["diverged"] = div
    return rec


def _label(rec: dict | None) -> str:
    """The arms or the method a record compares (its power block's statistic), '' where it has none."""
    return ((rec or {}).get("power") or {}).get("statistic", "")


def _named(r: dict, ref: dict | None, digits: int) -> str:
    """One record's number, named by the arms or method it compares; where the verdict's record `ref` compares
    others (A8's largest t can fall on another method on another score or budget), it says so."""
    if r["estimate"] is None:
        return Verdict.NOT_MEASURED
    if r.get("exact"):
        return f"{r['estimate']:.4g} (n={r['n']})"
    label, theirs = _label(r), _label(ref)
    text = f"{label} {_ci(r, digits)}" if label else _ci(r, digits)
    if label and theirs and label != theirs:
        text += f" (another comparison than the verdict's, {theirs})"
    return text


def _reading(rec: dict, ref: dict | None, digits: int, exact: bool = True) -> str:
    """A record (or each of its parts) as a reading beside the verdict `ref`, every number named by its arms or
    method; `exact=False` leaves out the exact parts (FLOPs), which are the same on every score."""
    if rec.get("parts"):
        refs = (ref or {}).get("parts") or {}
        return "; ".join(f"{k} {_named(v, refs.get(k), digits)}" for k, v in rec["parts"].items()
                         if exact or not v.get("exact"))
    if rec.get("exact") and not exact:
        return ""
    return _named(rec, ref, digits)


def _nll_reading(rec: dict, nll: dict) -> str:
    """The same statistic on nll_id (sign turned), for the reader beside the accuracy verdict `rec`: the claim's own
    estimate and interval, or each part's, named by the arms or method each compares; exact parts (FLOPs) are the
    same on both scores and left out."""
    text = _reading(nll, rec, 3, exact=False)
    if not text:
        return ""
    return "on nll_id, a reading (not a verdict; nats, sign turned so that > 0 reads as on accuracy): " + text


def claims(df: pd.DataFrame, cfg: StudyConfig, scale: str, tables: dict, baseline: dict | None = None) -> dict:
    """Evidence records on the first configured model (the paper's headline model); with several models the
    others' estimates are appended to each detail (they are not judged).

    `tables`: {"main": [paths], "ablation": [paths]}, the tables each claim cites as its sources."""
    baseline = constant_baseline(cfg) if baseline is None else baseline
    full, model = at_budget(df, cfg.rl.steps), cfg.models[0].name
    out = _claims_for(full, cfg, model, baseline, tables)
    if NLL in df.columns:
        nll = _claims_for(full, cfg, model, baseline, tables, score=NLL)
        for cid, rec in out.items():
            rec["detail"] = _join(rec.get("detail", ""), _nll_reading(rec, nll[cid]))
    if len(cfg.budgets) > 1:
        out["A9"]["detail"] = _join(out["A9"]["detail"], "the truncated arm trains 10% of the RL budget, the mixed "
                                    "arms all of it: a larger budget widens the FLOPs gap, so doubling the mixed "
                                    "arms' FLOPs makes the FLOPs part easier to pass (the smaller budget's reading is "
                                    "shown beside)")
    for budget in cfg.budgets[:-1]:  # the smaller budgets: the same claims on the same runs read earlier
        early = _claims_for(at_budget(df, budget), cfg, model, baseline, tables)
        rollouts = budget * cfg.rl.prompts_per_step * cfg.rl.num_generations
        for cid, rec in out.items():
            if cid in ("A5", "A6"):  # SFT only: the same numbers at every budget
                continue
            gated = "; ".join(f"{g['name']} {'passes' if g['passed'] else 'fails'}" for g in early[cid]["gates"])
            rec["detail"] = _join(rec.get("detail", ""), f"at {rollouts:,} rollouts ({budget} RL steps), a reading "
                                  f"(not a verdict): {_reading(early[cid], rec, 2)} (its gates at that budget: "
                                  f"{gated})")
    for m in cfg.models[1:]:
        for cid, v in _claims_for(at_budget(df, cfg.rl.steps), cfg, m.name, baseline, tables).items():
            out[cid]["detail"] += f"; other model {m.name}: {_reading(v, out[cid], 2)}"
    return {"study": "sft_rl", "scale": scale, "evidence_version": EVIDENCE_VERSION, "values": out}
