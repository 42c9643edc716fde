"""A paired cell runs each method in a fresh process of its own: each run records the PSS of its idle interpreter
and a training peak above it, the async run honours 2 threads per stage, and nothing is left behind."""

from __future__ import annotations

import json

import psutil
import pytest

from gradfidelity.studies.local.cell import run_cell
from gradfidelity.studies.local.data import prepare_embedded

CFG = {"widths": [16], "main_width": 16, "seeds": 1, "corpora": {"enwik8": {"source": "embedded"}},
       "train": {"n_layer": 2, "n_stages": 2, "n_head": 2, "block_size": 16, "batch_size": 2, "steps": 4,
                 "warmup": 1, "eval_batches": 1, "loss_every": 1, "readout_lag": 1, "threads_per_stage": 2}}


@pytest.mark.slow
def test_cell_runs_each_method_in_a_fresh_process(tmp_path):
    prepare_embedded("enwik8", tmp_path / "data", 50_000)
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    run_cell(["bp", "broadcast_async"], CFG, "enwik8", 16, 0, tmp_path / "data", tmp_path / "runs")
    for method in ("bp", "broadcast_async"):
        rec = json.loads((tmp_path / "runs" / "enwik8" / "w16" / method / "seed0" / "metrics.json").read_text())
        assert rec["status"] == "ok"
        t = rec["timing"]
        assert 0 < t["idle_pss_gib"] < t["peak_pss_gib"]
        prov = json.loads((tmp_path / "runs" / "enwik8" / "w16" / method / "seed0" / "provenance.json").read_text())
        assert prov["config"]["cell"] == {"corpus": "enwik8", "width": 16, "method": method}
    assert rec["timing"]["stage_threads"] == [2, 2]
    left = [c for c in psutil.Process().children(recursive=True) if c.pid not in before
            and "resource_tracker" not in " ".join(c.cmdline())]  # multiprocessing's helper, not a method
    assert not left, "a method process was left behind"
