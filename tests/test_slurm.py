"""The paper scale's engine for real: a slice of the smoke DAG through the project's own SLURM profile, on a one-node
SLURM cluster that this test starts (workflow/slurm-ci/cluster.sh) and stops by pid at the end, even on failure.

Checked: every job went through sbatch (SLURM's own job records, by this run's job-name prefix, one COMPLETED record
per planned job with the rule in its comment), and the metrics equal those of a local run of the same targets.
Skipped, with the reason, where the cluster cannot start: not root and no slurm installed, no apt-get, or a SLURM
controller already listening on port 6817 (never touched).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pandas as pd
import psutil
import pytest

from tests._repo_copy import COPY_IGNORE, REPO

pytestmark = pytest.mark.slurm

CLUSTER = REPO / "workflow" / "slurm-ci" / "cluster.sh"
DAEMONS = ("slurmctld", "slurmd", "munged")
# One job of each study's kind that fits the time (study A's training runs take minutes each through the executor;
# its audit kind is here): C5's arithmetic, A's loss-aggregation probe, one study B cell, one study C cell (one
# job, four runs), with the data job it needs.
TARGETS = [
    "paper_tables/smoke/stats_check.csv",
    "results/smoke/ds_audit/loss_agg/seed0/metrics.json",
    "results/smoke/async_pp/optimizer~adamw/lr~x1/head~untied/schedule~sync/mitigation~none/depth~1/momentum~0.9/"
    "steps~60/seed100/metrics.json",
    "results/smoke/local/enwik8/w32/bp/seed0/metrics.json",
]


def _why_not() -> str | None:
    if shutil.which("slurmctld") is None:
        if os.geteuid() != 0:
            return "slurm-wlm is not installed and installing it needs root"
        if shutil.which("apt-get") is None:
            return "slurm-wlm is not installed and apt-get is unavailable"
    if not CLUSTER.exists():
        return f"{CLUSTER} is missing"
    return None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = _why_not()
    if why:
        pytest.skip(f"no one-node SLURM cluster here: {why}")
    state = tmp_path_factory.mktemp("slurm")
    try:
        res = subprocess.run([str(CLUSTER), "start", str(state)], capture_output=True, text=True, timeout=600)
        if res.returncode != 0 and "is taken" in res.stderr:
            pytest.skip(f"a SLURM cluster already runs here, left alone: {res.stderr.strip()}")
        assert res.returncode == 0, res.stderr
        yield state
    finally:
        pids = {n: int((state / f"{n}.pid").read_text()) for n in DAEMONS if (state / f"{n}.pid").exists()}
        subprocess.run([str(CLUSTER), "stop", str(state)], capture_output=True, text=True, timeout=120)
        alive = [f"{n} ({p})" for n, p in pids.items() if psutil.pid_exists(p)
                 and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        assert not alive, f"daemons left running: {alive}"


def _client_env(state: Path) -> dict:
    """What `cluster.sh env` exports: the cluster's slurm.conf, and its srun shim first on PATH."""
    return {**os.environ, "SLURM_CONF": str(state / "slurm.conf"),
            "PATH": f"{state / 'bin'}{os.pathsep}{os.environ['PATH']}"}


def _copy(tmp_path: Path, name: str) -> Path:
    work = tmp_path / name
    shutil.copytree(REPO, work, ignore=COPY_IGNORE)
    return work


def _snakemake(work: Path, *args: str, env=None, timeout=900) -> subprocess.CompletedProcess:
    overlay = f"deepspeed_buggy_overlay={REPO / '.venv-ds0189'}"
    cmd = [sys.executable, "-m", "snakemake", *TARGETS, *args, "--config", "scale=smoke", overlay]
    return subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=timeout, env=env)


def _metrics(work: Path) -> dict:
    runs = {str(p.relative_to(work)): json.loads(p.read_text())["metrics"]
            for p in (work / "results" / "smoke").rglob("metrics.json")}
    runs["stats_check"] = pd.read_csv(work / TARGETS[0]).to_dict("records")
    return runs


def _planned(work: Path) -> dict[str, int]:
    res = _snakemake(work, "-n", "--forceall")
    assert res.returncode == 0, res.stderr[-2000:]
    table = res.stdout.split("Job stats:", 1)[1].split("\n\n", 1)[0]
    return {m[0]: int(m[1]) for m in re.findall(r"^(\S+)\s+(\d+)$", table, re.M) if m[0] != "total"}


def test_smoke_slice_through_the_slurm_profile_equals_a_local_run(cluster, tmp_path):
    env = _client_env(cluster)
    prefix = f"gfci{uuid.uuid4().hex[:8]}"
    remote = _copy(tmp_path, "slurm")
    planned = _planned(remote)
    res = _snakemake(remote, "--workflow-profile", "workflow/profiles/slurm", "--slurm-no-account",
                     "--default-resources", "slurm_partition='debug'", "--slurm-jobname-prefix", prefix,
                     env=env, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]

    records = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%j|%T|%k"], capture_output=True, text=True,
                             env=env, timeout=60, check=True).stdout.splitlines()
    ours = [line.split("|") for line in records if line.startswith(prefix)]
    assert all(state == "COMPLETED" for _, state, _ in ours), ours
    ran = {}
    for _, _, comment in ours:
        rule = re.match(r"rule_(.+?)(?:_wildcards_.*)?$", comment)[1]
        ran[rule] = ran.get(rule, 0) + 1
    assert ran == planned, f"sbatch records {ran} differ from the planned jobs {planned}"

    local = _copy(tmp_path, "local")
    res = _snakemake(local, "-c2")
    assert res.returncode == 0, res.stderr[-3000:]
    assert _metrics(remote) == _metrics(local)


def test_an_unset_account_stops_before_any_job_is_submitted(cluster, tmp_path):
    env = _client_env(cluster)
    prefix = f"gfci{uuid.uuid4().hex[:8]}"
    work = _copy(tmp_path, "noaccount")
    res = _snakemake(work, "--workflow-profile", "workflow/profiles/slurm", "--slurm-jobname-prefix", prefix,
                     env=env, timeout=300)
    assert res.returncode != 0
    assert "no SLURM account set" in res.stdout + res.stderr
    records = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%j"], capture_output=True, text=True, env=env,
                             timeout=60, check=True).stdout.split()
    assert not [r for r in records if r.startswith(prefix)], "a job was submitted"
