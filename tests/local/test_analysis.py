"""The statistics path on hand-made runs: paired gap, one-sided bound (checked against the t formula written out
here), throughput CI, and a diverged seed that must turn the verdict into a failure instead of being averaged."""

from __future__ import annotations

import json
import math

import numpy as np
from scipy import stats

from gradfidelity.studies.local.analysis import aggregate, cell_stats, claims, main_table
from gradfidelity.studies.local.settings import parse

BPB = {"bp": [2.00, 2.10, 1.95], "broadcast_async": [2.03, 2.11, 1.99], "bp_tm": [2.00, 2.10, 1.95]}
TPS = {"bp": [100.0, 110.0, 90.0], "broadcast_async": [130.0, 150.0, 120.0], "bp_tm": [180.0, 200.0, 160.0]}


def _write(root, method, seed, status="ok"):
    d = root / "enwik8" / "w64" / method / f"seed{seed}"
    d.mkdir(parents=True)
    rec = {"status": status, "seed": seed, "metrics": {}, "timing": {}}
    if status == "ok":
        rec["metrics"] = {"val_bpb": BPB[method][seed], "corpus_source": "embedded", "n_params": 1, "n_stages": 2,
                          "steps": 1}
        rec["timing"] = {"tokens_per_s": TPS[method][seed], "train_s": 1000 / TPS[method][seed],
                         "peak_pss_gib": 0.3 if method == "bp" else 0.4, "compute_threads": 2,
                         "model_tflops_per_s": 0.0}
        if method == "broadcast_async":
            rec["timing"]["stage_busy_s"] = [3.0, 4.0]
    (d / "metrics.json").write_text(json.dumps(rec))
    return str(d / "metrics.json")


def test_paired_statistics_against_the_formula(tmp_path):
    paths = [_write(tmp_path, m, k) for m in BPB for k in range(3)]
    df = aggregate(paths)
    st = cell_stats(df, "broadcast_async", 1.0)
    gaps = 100 * (np.array(BPB["broadcast_async"]) - BPB["bp"]) / BPB["bp"]
    upper = gaps.mean() + stats.t.ppf(0.95, 2) * gaps.std(ddof=1) / math.sqrt(3)
    assert math.isclose(st["mean_gap_pct"], gaps.mean()) and math.isclose(st["upper_pct"], upper)
    assert st["non_inferior"] == (upper <= 1.0) and st["verdict"].startswith("non" if upper <= 1 else "not")
    ratios = np.array(TPS["broadcast_async"]) / TPS["bp"]
    assert math.isclose(st["ratio_vs_bp"], float(np.exp(np.log(ratios).mean())))
    assert st["ratio_low"] < st["ratio_vs_bp"] < st["ratio_high"]
    # decomposition multiplies back to the speed-up (per seed geometric means, busy times fixed at 3 and 4 s)
    assert math.isclose(st["work_ratio"] * st["parallelism"] * st["orchestration_eff"],
                        float(np.exp(np.mean(np.log(np.array(TPS["broadcast_async"]) / TPS["bp"])))))
    s = parse({"widths": [64], "main_width": 64, "seeds": 3, "train": {"n_layer": 2, "n_stages": 2, "n_head": 2},
               "mechanism_widths": [64]})
    ev = claims(df, main_table(df, s), s, "smoke")["values"]
    assert math.isclose(ev["C10"]["measured"], float(np.exp(np.mean(np.log(np.array(TPS["bp"]) / TPS["bp_tm"])))))
    assert ev["C7"]["measured"] is None and "only width" in ev["C7"]["detail"]
    assert math.isclose(ev["C2"]["measured"], st["ratio_low"])
    assert ev["C3"]["measured"] is None and ev["C3"]["detail"].startswith("not measurable")  # no RGC run here


def test_a_diverged_seed_fails_the_method(tmp_path):
    paths = [_write(tmp_path, "bp", k) for k in range(3)]
    paths += [_write(tmp_path, "broadcast_async", k, "diverged" if k == 1 else "ok") for k in range(3)]
    st = cell_stats(aggregate(paths), "broadcast_async", 1.0)
    assert st["diverged_seeds"] == 1 and st["n"] == 2
    assert st["verdict"] == "fails: diverged on 1 seed(s)" and st["joint"] is False
