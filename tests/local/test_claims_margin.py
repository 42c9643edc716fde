"""C4 and C9 decided on their interval against the margin / band (issue 57), with the registry's own rows and
`verify.judge`: each verdict flips with made-up per-seed values, the control decides nothing any more (its spread
and the retired rule's reading stay in the detail), the paper's test is read on disjoint blocks of its n, every
record names its host types and carries what the power table needs; and on the committed cpu runs C4 reads
inconclusive and C9 reproduced.

The expected numbers are computed here with scipy (its own t interval and one-sample t test) and numpy, apart from
the study's modules; the committed runs are read from the committed runs table for the independent side."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import jsonschema
import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import stats

from gradfidelity.claims.evidence import POWER_SCHEMA, RECORD_SCHEMA
from gradfidelity.claims.verify import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, judge, load_registry
from gradfidelity.studies.local import config, plan
from gradfidelity.studies.local.aggregate import aggregate, memory_aggregate
from gradfidelity.studies.local.claims import EVIDENCE_VERSION, claims, memory_evidence, write_claims
from tests.local import test_analysis as ta

REPO = Path(__file__).resolve().parents[2]
ROWS = {row["id"]: row for row in load_registry()}
E, SCALE, S = ta.E, ta.SCALE, ta.S
BP = 2.0


def _ci(x, level):
    x = np.asarray(x, float)
    return stats.t.interval(level, len(x) - 1, loc=x.mean(), scale=stats.sem(x))


def _c4_arms(gaps_pct, control_gaps_pct=None) -> dict:
    """BP at 2.0 bits per byte on every seed, Broadcast at the given per-seed gaps %; the zero-gap control likewise."""
    n = len(gaps_pct)
    arms = {(E, 64, "bp"): {"bpb": [BP] * n},
            (E, 64, "broadcast_async"): {"bpb": [BP * (1 + g / 100) for g in gaps_pct]}}
    if control_gaps_pct is not None:
        arms[(E, 64, "bp_tm")] = {"bpb": [BP * (1 + g / 100) for g in control_gaps_pct]}
    return arms


def _c9_arms(diffs, control=None) -> dict:
    n = len(diffs)
    live = [2.0 + 0.01 * k for k in range(n)]
    arms = {(E, 64, "live_local"): {"bpb": live},
            (E, 64, "rgc_serial"): {"bpb": [a + d for a, d in zip(live, diffs, strict=True)]}}
    if control is not None:
        arms[(E, 64, "bp")] = {"bpb": live}
        arms[(E, 64, "bp_tm")] = {"bpb": [a + d for a, d in zip(live, control, strict=True)]}
    return arms


ABOVE = [1.8, 2.2, 2.0, 2.4, 1.6]  # the gap's 90% CI wholly above the 1% margin: worse beyond it
ACROSS = [0.2, 1.8, 0.5, 1.5, 1.0, 0.0, 2.0]  # mean 1.0: the interval straddles the margin
BELOW = [-0.2, 0.1, 0.0, 0.3, -0.1]  # wholly below: non-inferior


@pytest.mark.parametrize("gaps, verdict", [(ABOVE, REPRODUCED), (ACROSS, INCONCLUSIVE), (BELOW, NOT_REPRODUCED)])
def test_c4_is_decided_on_its_interval_against_the_margin(tmp_path, gaps, verdict):
    rec = ta._evidence(tmp_path, _c4_arms(gaps))["C4"]
    g = 100 * (np.array([BP * (1 + x / 100) for x in gaps]) - BP) / BP
    lo, hi = _ci(g, 0.90)
    assert ROWS["C4"]["level"] == 0.9 and rec["level"] == 0.9 and not rec["exact"]
    assert math.isclose(rec["estimate"], g.mean()) and math.isclose(rec["low"], lo) and math.isclose(rec["high"], hi)
    # the 90% interval's upper end is the paper's one-sided 95% upper bound
    assert math.isclose(rec["high"], g.mean() + stats.t.ppf(0.95, len(g) - 1) * stats.sem(g))
    assert judge(ROWS["C4"], rec, True, SCALE)[0] == verdict
    assert rec["power"]["side"] == "gt" and rec["power"]["threshold"] == 1.0 and rec["power"]["paper_effect"] == 0.841
    assert np.allclose(rec["power"]["per_seed"], g)


@pytest.mark.parametrize("diffs, verdict", [
    ([0.05, 0.11, 0.06, 0.052, 0.05], REPRODUCED),  # wholly above the band
    ([-0.03, -0.02, -0.04, -0.025, -0.035], REPRODUCED),  # wholly below it: not equivalent either
    ([0.0001, 0.0002, 0.0, 0.0001, 0.0001], NOT_REPRODUCED),  # wholly inside: equivalent
    ([0.004, 0.012, 0.002, 0.009, 0.006], INCONCLUSIVE),  # straddles the +0.005 edge
])
def test_c9_is_decided_on_its_interval_against_the_band(tmp_path, diffs, verdict):
    rec = ta._evidence(tmp_path, _c9_arms(diffs))["C9"]
    live = np.array([2.0 + 0.01 * k for k in range(len(diffs))])
    d = (live + np.array(diffs)) - live
    lo, hi = _ci(d, 0.90)
    assert ROWS["C9"]["level"] == 0.9 and ROWS["C9"]["check"] == {"kind": "outside", "range": [-0.005, 0.005]}
    assert math.isclose(rec["estimate"], d.mean()) and math.isclose(rec["low"], lo) and math.isclose(rec["high"], hi)
    assert judge(ROWS["C9"], rec, True, SCALE)[0] == verdict
    assert rec["power"]["side"] == "outside" and rec["power"]["threshold"] == [-0.005, 0.005]


def test_the_control_decides_nothing_and_stays_a_reading(tmp_path):
    """A noisy zero-gap control that the retired rule would have stopped on (its own upper bound above 1%) leaves
    C4's verdict as its interval says; the detail gives the control's sd and the variance ratio, and the old rule's
    reading (not measured) beside the new one."""
    control = [-3.0, 4.0, 1.0, -2.0, 3.0]
    rec = ta._evidence(tmp_path, _c4_arms(ABOVE, control))["C4"]
    assert not rec["gates"] and judge(ROWS["C4"], rec, True, SCALE)[0] == REPRODUCED
    g = 100 * (np.array([BP * (1 + x / 100) for x in control]) - BP) / BP
    sd_c, sd = g.std(ddof=1), np.std(ABOVE, ddof=1)
    assert f"sd {sd_c:.4g} (Broadcast vs BP sd {sd:.4g}, variance ratio {(sd / sd_c) ** 2:.3g})" in rec["detail"]
    upper_c = g.mean() + stats.t.ppf(0.95, 4) * stats.sem(g)
    assert upper_c > 1.0
    assert ("old rule: (evidence version 2, retired in round 6) one-sided 95% upper bound" in rec["detail"] and
            f"the zero-gap control fails the same test (upper bound {upper_c:.4g}%): not measured" in rec["detail"])
    # a quiet control: the old rule read the bound alone (above 1%: reproduced)
    rec = ta._evidence(tmp_path / "quiet", _c4_arms(ABOVE, [0.01, -0.02, 0.0, 0.02, -0.01]))["C4"]
    assert "the zero-gap control passes" in rec["detail"] and rec["detail"].split("old rule: ")[1].split(";")[0] \
        .endswith(": reproduced")


def test_c9_decided_where_the_control_misses_equivalence(tmp_path):
    """Round 5 read this 'not measured' (the control missed equivalence at n = 5); now the interval decides."""
    diffs, control = [0.030, 0.116, 0.089, 0.020, 0.096], [0.004, 0.012, -0.004, 0.011, 0.010]
    rec = ta._evidence(tmp_path, _c9_arms(diffs, control))["C9"]
    assert not rec["gates"] and judge(ROWS["C9"], rec, True, SCALE)[0] == REPRODUCED
    live = np.array([2.0 + 0.01 * k for k in range(5)])
    c = (live + np.array(control)) - live
    lo, hi = _ci(c, 0.90)
    assert f"90% CI [{lo:.5f}, {hi:.5f}], sd {c.std(ddof=1):.4g}" in rec["detail"]
    assert "zero-gap control misses equivalence" in rec["detail"] and rec["detail"].split("old rule: ")[1] \
        .split(";")[0].endswith("not measured at this scale")
    d = (live + np.array(diffs)) - live
    t = stats.ttest_1samp(d, 0.005, alternative="greater")
    assert f"t = {t.statistic:.3g}, p = {t.pvalue:.2g}" in rec["detail"]


def test_the_papers_test_is_read_on_disjoint_blocks_of_its_n(tmp_path):
    """Twelve seeds: two blocks of five in seed order (the last two seeds left out); each block's one-sided 95% upper
    bound against the 1% margin, with scipy."""
    rng = np.random.default_rng(3)
    gaps = list(np.round(rng.normal(0.7, 1.4, 12), 3))
    rec = ta._evidence(tmp_path, _c4_arms(gaps))["C4"]
    g = 100 * (np.array([BP * (1 + x / 100) for x in gaps]) - BP) / BP
    fails = sum(b.mean() + stats.t.ppf(0.95, 4) * stats.sem(b) > 1.0 for b in (g[:5], g[5:10]))
    assert f"{fails} of 2 disjoint blocks of 5 seeds (seed order) fail it" in rec["detail"]


def test_a_contrast_across_two_host_types_says_so(tmp_path, monkeypatch):
    monkeypatch.setitem(ta.HOST, ("broadcast_async", 0), ta.AMD)
    rec = ta._evidence(tmp_path, _c4_arms(ABOVE))["C4"]
    amd = "AuthenticAMD 25/17/1, torch AVX512, flags avx2 avx512f avx512_bf16"
    assert rec["hosts"] == sorted([amd, ta.INTEL_HOST])
    assert "host types: 2, the contrast's runs mix them" in rec["detail"]
    assert f"Broadcast (async) w64: {', '.join(sorted([amd, ta.INTEL_HOST]))}" in rec["detail"]
    assert f"BP w64: {ta.INTEL_HOST}" in rec["detail"]


def test_one_more_seed_costs_its_arms_wall_time_at_their_share_of_the_machine(tmp_path):
    """Serial Broadcast on seeds 3-5 in one-thread jobs beside another (2 cores: two at a time): C4's next seed is
    such a pair, half the sum of its two runs' wall times (median over those seeds); a job that owned the machine
    counts whole (C2: async Broadcast and BP on seeds 0-2)."""
    paths = []
    for k in range(6):
        shared = k >= 3
        paths.append(ta._run(tmp_path, E, 64, "bp", k, bpb=BP, wall=[60.0, 64.0, 62.0, 70.0, 66.0, 68.0][k],
                             shares=shared))
        method = "broadcast_serial" if shared else "broadcast_async"
        paths.append(ta._run(tmp_path, E, 64, method, k, bpb=BP * (1 + ABOVE[k % 5] / 100),
                             wall=[40.0, 44.0, 42.0, 72.0, 80.0, 76.0][k], shares=shared))
        if not shared:  # the serial method on the seeds that have both, bit-identical (pooling is checked)
            paths.append(ta._run(tmp_path, E, 64, "broadcast_serial", k, bpb=BP * (1 + ABOVE[k % 5] / 100), wall=1.0))
    ev = claims(aggregate(paths, scale=SCALE), S, SCALE)["values"]
    assert ev["C4"]["n"] == 6
    assert math.isclose(ev["C4"]["power"]["wall_s_per_seed"], np.median([(70 + 72) / 2, (66 + 80) / 2, (68 + 76) / 2]))
    assert math.isclose(ev["C2"]["power"]["wall_s_per_seed"], np.median([60 + 40, 64 + 44, 62 + 42]))
    for rec in ev.values():
        jsonschema.validate(rec["power"], POWER_SCHEMA)


def test_c3_gives_its_per_seed_log_ratios_and_its_probe_wall(tmp_path):
    paths = []
    for k, (rgc, bp) in enumerate([(0.97, 0.77), (0.99, 0.76), (0.96, 0.78)]):
        d = tmp_path / f"probe-{k}"
        d.mkdir()
        timing = {"pss_bp_gib": 0.23 + bp, "pss_rgc_async_gib": 0.45 + rgc, "pss_bp_baseline_gib": 0.23,
                  "pss_rgc_async_baseline_gib": 0.45, "wall_s": [18.0, 20.0, 19.0][k]}
        rec = {"status": "ok", "study": "local", "scale": SCALE, "seed": k,
               "cell": {"study": "local", "width": "256", "seed": str(k)}, "timing": timing,
               "metrics": {"width": 256, "n_layer": 24, "n_params": 1, "state_gib": 0.28}}
        (d / "metrics.json").write_text(json.dumps(rec))
        (d / "provenance.json").write_text(json.dumps({"seed": k, "status": "ok", "machine": ta.INTEL}))
        paths.append(str(d / "metrics.json"))
    rec = memory_evidence(memory_aggregate(paths, scale=SCALE), ["memory_table.csv"])
    assert np.allclose(rec["power"]["per_seed"], np.log(np.array([0.97, 0.99, 0.96]) / [0.77, 0.76, 0.78]))
    assert rec["power"]["wall_s_per_seed"] == 19.0 and rec["power"]["paper_effect"] is None
    assert rec["hosts"] == [ta.INTEL_HOST]


def test_write_claims_cites_the_runs_table_not_the_tidy_csv(tmp_path):
    root = tmp_path / "results" / SCALE
    agg = root / "local" / "aggregate.csv"
    agg.parent.mkdir(parents=True)
    from gradfidelity.studies.local.aggregate import write_aggregate

    write_aggregate(ta._runs(tmp_path, _c4_arms(ABOVE)), SCALE, agg)
    out = tmp_path / "local.json"
    write_claims(S, SCALE, {"aggregate": agg, "main": "paper_tables/x/local_main.csv"}, out)
    doc = json.loads(out.read_text())
    assert doc["evidence_version"] == EVIDENCE_VERSION == 5
    for rec in doc["values"].values():
        jsonschema.validate(rec, RECORD_SCHEMA)
        assert str(agg) not in rec["sources"]
    assert str(root / "runs" / "local.csv") in doc["values"]["C4"]["sources"]


def _tracked() -> set[str]:
    out = subprocess.run(["git", "ls-files", "results/cpu", "paper_tables/cpu"], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout
    return set(out.split())


@pytest.fixture(scope="module")
def committed(tmp_path_factory):
    """Study C's evidence from the committed cpu run records (the same call the claims job makes)."""
    import os

    cfg = config.load(yaml.safe_load((REPO / "config/cpu/local.yaml").read_text()))
    cwd = os.getcwd()
    os.chdir(REPO)  # run directories are cited relative to the repository, as the workflow cites them
    try:
        df = aggregate(plan.runs(cfg, "results/cpu"), scale="cpu")
        mem = memory_aggregate(plan.memory_runs(cfg, "results/cpu"), scale="cpu")
    finally:
        os.chdir(cwd)
    tables = {"runs": "results/cpu/runs/local.csv", "main": "paper_tables/cpu/local_main.csv",
              "mechanism": "paper_tables/cpu/local_mechanism.csv", "memory_table": "paper_tables/cpu/local_memory.csv"}
    return claims(df, cfg, "cpu", tables, mem)["values"]


def _runs_table_bpb() -> pd.Series:
    runs = pd.read_csv(REPO / "results/cpu/runs/local.csv")
    return runs.set_index("run_id").metric_val_bpb


def test_committed_runs_c4_reads_not_reproduced(committed):
    """Recomputed from the runs table: async Broadcast where it ran, serial on the other seeds, against BP. Round 6
    ran the n the power table asked (118): the interval's upper end is below the 1% margin (non-inferior)."""
    bpb, root = _runs_table_bpb(), "results/cpu/local/python_docs/w64"
    n = committed["C4"]["n"]
    assert n == len([r for r in bpb.index if r.startswith(f"{root}/bp/seed")]) == 118
    gaps = []
    for k in range(n):
        method = "broadcast_async" if f"{root}/broadcast_async/seed{k}" in bpb.index else "broadcast_serial"
        gaps.append(100 * (bpb[f"{root}/{method}/seed{k}"] - bpb[f"{root}/bp/seed{k}"]) / bpb[f"{root}/bp/seed{k}"])
    lo, hi = _ci(gaps, 0.90)
    rec = committed["C4"]
    assert math.isclose(rec["estimate"], np.mean(gaps), rel_tol=1e-9)
    assert math.isclose(rec["low"], lo, rel_tol=1e-9) and math.isclose(rec["high"], hi, rel_tol=1e-9)
    assert 0 < lo and hi < 1.0 and judge(ROWS["C4"], rec, True, "cpu")[0] == NOT_REPRODUCED
    assert "old rule: " in rec["detail"] and "disjoint blocks of 5 seeds (seed order) fail it" in rec["detail"]
    # the n an 80% chance of a decision needs at the measured mean and sd: the interval's upper end below 1% (the
    # near side) or its lower end above it, each a noncentral t tail (scipy), summed
    mean, sd = np.mean(gaps), np.std(gaps, ddof=1)

    def decided(m):
        c, nc = stats.t.ppf(0.95, m - 1), (1.0 - mean) * math.sqrt(m) / sd
        return stats.nct.sf(c, m - 1, nc) + stats.nct.cdf(-c, m - 1, nc)
    need = next(m for m in range(2, 1000) if decided(m) >= 0.8)
    assert f"{decided(n):.0%} at n {n}; an 80% chance needs n {need} ({need - n} more seeds" in rec["detail"]
    assert rec["power"]["wall_s_per_seed"] > 0 and rec["power"]["level"] == 0.9


def test_committed_runs_c9_reads_reproduced(committed):
    bpb, root = _runs_table_bpb(), "results/cpu/local/python_docs/w64"
    rec = committed["C9"]
    assert rec["n"] == 13
    d = [bpb[f"{root}/rgc_serial/seed{k}"] - bpb[f"{root}/live_local/seed{k}"] for k in range(rec["n"])]
    lo, hi = _ci(d, 0.90)
    assert math.isclose(rec["low"], lo, rel_tol=1e-9) and math.isclose(rec["high"], hi, rel_tol=1e-9)
    assert lo > 0.005 and judge(ROWS["C9"], rec, True, "cpu")[0] == REPRODUCED


def test_committed_claims_cite_committed_files_and_name_their_hosts(committed):
    """Every measured claim names its runs' host types: one named, or - where a contrast mixes host types - their
    count, each of them, and that no drift between them is measured."""
    tracked = _tracked()
    for cid, rec in committed.items():
        jsonschema.validate(rec, RECORD_SCHEMA)
        assert "power" in rec and "hosts" in rec, cid
        for src in rec["sources"]:
            assert src in tracked or f"{src}/metrics.json" in tracked, f"{cid}: {src} is not committed"
        if rec["estimate"] is None:
            continue
        assert rec["hosts"], cid
        if len(rec["hosts"]) == 1:
            assert f"host type: {rec['hosts'][0]}" in rec["detail"], cid
        else:
            assert f"host types: {len(rec['hosts'])}, the contrast's runs mix them, and no drift" in rec["detail"], cid
            assert all(h in rec["detail"] for h in rec["hosts"]), cid


def test_the_width_figure_says_its_quality_panel_is_async_seeds_only(tmp_path, monkeypatch):
    """Round 5's quality panel showed the async seeds' mean gap beside C4's pooled one, unlabelled: the panel now
    says it is the async seeds only, with each point's n, and draws C4's Broadcast apart with its own n."""
    from gradfidelity.studies.local import figures
    from gradfidelity.studies.local.stats import main_table

    paths = []
    for k in range(6):
        paths.append(ta._run(tmp_path, E, 64, "bp", k, bpb=BP, shares=k >= 3))
        paths.append(ta._run(tmp_path, E, 64, "broadcast_serial", k, bpb=BP * (1 + ABOVE[k % 5] / 100), shares=k >= 3))
        if k < 3:
            paths.append(ta._run(tmp_path, E, 64, "broadcast_async", k, bpb=BP * (1 + ABOVE[k % 5] / 100)))
    drawn = {}
    monkeypatch.setattr(figures, "save_figure", lambda fig, path, caption=None: drawn.update(fig=fig, caption=caption))
    figures.width_figure(main_table(aggregate(paths, scale=SCALE), S), tmp_path / "w.png")
    quality = drawn["fig"].axes[1]
    labels = [t.get_text() for t in quality.get_legend().get_texts()]
    assert "Broadcast (async), enwik8, async seeds only" in labels
    assert "C4's Broadcast (async + serial seeds), enwik8, n=6" in labels
    assert "n=3" in [t.get_text() for t in quality.texts] and "async" in quality.get_title()
    assert "async runs' own seeds only" in drawn["caption"]
