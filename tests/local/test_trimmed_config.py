"""A trimmed study-C plan (two methods, one width) is a valid plan: it plans its runs with no error about rules that
only a fuller plan creates (config/cpu/resources.yaml keeps the entries of every job group)."""

import subprocess
import sys
from pathlib import Path

import pytest

from gradfidelity.reference.dag import parse_dry_run

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_two_methods_and_one_width_plan_their_runs():
    override = 'local={"methods": ["bp", "broadcast_async"], "widths": [64], "mechanism_corpora": []}'
    res = subprocess.run([sys.executable, "-m", "snakemake", "-n", "results/cpu/runs/local.csv", "--forcerun",
                          "results/cpu/runs/local.csv", "--config", "scale=cpu", override], cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "names rules that do not exist" not in res.stdout + res.stderr
    rules = {job.rule for job in parse_dry_run(res.stdout)}
    # no rule of a group that has no cells in this plan (the others run only where a record is not committed yet)
    assert not {"local_side", "local_mechanism", "local_quality", "local_control"} & rules
    # the runs the trimmed plan reads: the runs table's inputs (committed ones are not retrained, so not outputs)
    table = [job for job in parse_dry_run(res.stdout) if job.rule == "runs_table"]
    runs = [r for r in table[0].inputs if r.endswith("/metrics.json")]
    assert runs and all("/w64/" in r or "/memory/" in r for r in runs)
    assert {r.split("/")[-3] for r in runs if "/w64/" in r} == {"bp", "broadcast_async"}
