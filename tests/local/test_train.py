"""A paired cell runs each method in a fresh process of its own: each run records the PSS of its idle interpreter
and a training peak above it, the async run honours 2 threads per stage, each run's records carry its cell, and
nothing is left behind."""

from __future__ import annotations

import json

import psutil
import pytest

from gradfidelity.harness.results import cell_of, load_run_records
from gradfidelity.studies.local.data import prepare_embedded
from gradfidelity.studies.local.train import run_job
from tests.local._config import section

CFG = {"train": section(train={"n_layer": 2, "n_stages": 2, "n_head": 2, "block_size": 16, "batch_size": 2,
                               "steps": 4, "warmup": 1, "eval_batches": 1, "loss_every": 1, "readout_lag": 1,
                               "threads_per_stage": 2})["train"]}


@pytest.mark.slow
def test_cell_runs_each_method_in_a_fresh_process(tmp_path):
    from gradfidelity.studies.local.config import load_job

    prepare_embedded("enwik8", tmp_path / "data", 50_000)
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    cell = {"corpus": "enwik8", "seed": "0", "width": "16"}  # the rule's wildcards, as strings
    run_job(load_job(CFG, "train").train, CFG, ["bp", "broadcast_async"], cell, tmp_path / "data",
            str(tmp_path / "runs" / "{method}" / "s0"))
    for method in ("bp", "broadcast_async"):
        rec = load_run_records([tmp_path / "runs" / method / "s0" / "metrics.json"])[0]
        assert rec["status"] == "ok"
        t = rec["timing"]
        assert 0 < t["idle_pss_gib"] < t["peak_pss_gib"]
        assert cell_of(rec) == {"study": "local", **cell, "method": method}
        prov = json.loads((tmp_path / "runs" / method / "s0" / "provenance.json").read_text())
        assert prov["cell"] == cell_of(rec) and prov["config"] == CFG
    assert rec["timing"]["stage_threads"] == [2, 2]
    left = [c for c in psutil.Process().children(recursive=True) if c.pid not in before
            and "resource_tracker" not in " ".join(c.cmdline())]  # multiprocessing's helper, not a method
    assert not left, "a method process was left behind"
