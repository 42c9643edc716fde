"""A new cell that starts from a committed run whose model is not committed starts from its replay: the run redone
beside it and checked against the committed record before anything trains on it (issue 44). In a git clone at the
smoke scale: the base model is made and its record committed, its model deleted (as a fresh clone has it); a new SFT
cell then plans the base's replay instead of the base, the replay equals the record and the SFT trains on it. With
the committed record altered, the replay stops the run, naming both records, and the SFT is not trained."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BASE = "results/smoke/sft_rl/tiny-qwen2/base/seed0"
SFT = "results/smoke/sft_rl/tiny-qwen2/fixed/sft/seed0/metrics.json"
pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.deepspeed]


def _smk(work, *args, timeout=900):
    overlay = f"deepspeed_buggy_overlay={REPO / '.venv-ds0189'}"
    return subprocess.run([sys.executable, "-m", "snakemake", "-c2", *args, "--config", overlay], cwd=work,
                          capture_output=True, text=True, timeout=timeout)


def _git(work, *args):
    subprocess.run(["git", "-c", "user.name=test", "-c", "user.email=test@example.invalid", *args], cwd=work,
                   check=True, capture_output=True)


def test_a_new_cell_starts_from_a_checked_replay_of_a_committed_run(tmp_path):
    work = tmp_path / "repo"
    subprocess.run(["git", "clone", "-q", str(REPO), str(work)], check=True)
    res = _smk(work, f"{BASE}/metrics.json")
    assert res.returncode == 0, res.stderr[-3000:]
    _git(work, "add", "-f", f"{BASE}/metrics.json", f"{BASE}/provenance.json", f"{BASE}/benchmark.tsv")
    _git(work, "commit", "-q", "-m", "the base model's record")
    shutil.rmtree(work / BASE / "model")  # a clone has the record, never the model

    plan = _smk(work, "-n", SFT)
    assert plan.returncode == 0, plan.stderr[-3000:]
    assert "rule sft_rl_replay_base:" in plan.stdout and "rule sft_rl_base:" not in plan.stdout
    res = _smk(work, SFT)
    assert res.returncode == 0, res.stderr[-3000:]
    log = (work / "results/smoke/sft_rl/logs/tiny-qwen2_base_seed0_replay.log").read_text()
    assert "equals its committed record" in log and "same host type" in log
    assert json.loads((work / SFT).read_text())["status"] == "ok"

    # the committed record altered: the replay no longer equals it, and nothing trains on the replay
    record = json.loads((work / BASE / "metrics.json").read_text())
    record["metrics"]["acc_id"] = record["metrics"]["acc_id"] + 1.0
    (work / BASE / "metrics.json").write_text(json.dumps(record))
    _git(work, "commit", "-q", "-am", "an altered record")
    shutil.rmtree(work / BASE / "replay")
    (work / SFT).unlink()
    res = _smk(work, SFT)
    assert res.returncode != 0
    log = (work / "results/smoke/sft_rl/logs/tiny-qwen2_base_seed0_replay.log").read_text()
    assert f"differs from the committed record {BASE}/metrics.json" in log and "acc_id" in log
    assert not (work / SFT).exists() and not (work / BASE / "replay" / "metrics.json").exists()
