"""The committed cpu records, planned as a reviewer's fresh clone plans them (issue 44's must-show): no training job
on a clean clone, one more seed plans exactly that seed's runs (and what they need upstream, and the aggregation),
and --forcerun of one committed cell reruns that cell alone. Dry runs only (Snakemake's own planner), on a `git
clone` of the committed HEAD: file times are the clone's, as a reviewer's would be."""

import subprocess
import sys
from pathlib import Path

import pytest

from gradfidelity.reference.dag import parse_dry_run

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    work = tmp_path_factory.mktemp("clone") / "repo"
    subprocess.run(["git", "clone", "-q", str(REPO), str(work)], check=True)
    return work


def _plan(work: Path, *args: str) -> list:
    res = subprocess.run([sys.executable, "-m", "snakemake", "-n", *args], cwd=work, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return parse_dry_run(res.stdout)


def _runs(jobs) -> list[str]:
    """The outputs of the jobs that train or measure: a run's metrics.json under results/cpu/<study>/ or a bench."""
    return sorted(out for job in jobs for out in job.outputs
                  if (out.startswith("results/cpu/") and out.endswith("/metrics.json")) or "/bench/" in out)


def test_a_clean_clone_plans_no_training_job(clone):
    jobs = _plan(clone, "--config", "scale=cpu")
    assert _runs(jobs) == [], _runs(jobs)[:10]


def test_one_more_seed_plans_that_seeds_runs_their_start_and_the_aggregation(clone):
    jobs = _plan(clone, "--config", "scale=cpu", 'sft_rl={"seeds": [0, 1, 2, 3, 4, 5, 6, 7, 8]}')
    runs = _runs(jobs)
    assert runs and all("/seed8/" in r or "/replay/" in r for r in runs), runs
    # the 4 SFT variants and the 6 RL-stage arms of seed 8, and the base model's replay (its model is not committed)
    assert sum("/seed8/" in r for r in runs) == 10
    assert [r for r in runs if "/replay/" in r] == ["results/cpu/sft_rl/tiny-qwen2/base/seed0/replay/metrics.json"]
    rules = {job.rule for job in jobs}
    assert {"sft_rl_aggregate", "sft_rl_tables", "sft_rl_claims", "verify"} <= rules
    assert not any(r.startswith(("results/cpu/async_pp/", "results/cpu/local/")) for r in runs)


CELL = ("results/cpu/async_pp/optimizer~muon/lr~own/head~untied/schedule~2bw/mitigation~none/depth~1/momentum~0.9/"
        "steps~256/seed0/metrics.json")


@pytest.mark.xfail(strict=True, reason="until study C's runs carry committed records (issue 48's cpu run): B's "
                   "prepared data follow C's corpus, whose rebuild replans C's runs that have no record yet")
def test_forcerun_of_one_committed_cell_reruns_it_alone(clone):
    jobs = _plan(clone, "--config", "scale=cpu", "--forcerun", CELL)
    assert _runs(jobs) == [CELL]
    rules = {job.rule for job in jobs}
    assert {"async_pp_aggregate", "async_pp_tables", "async_pp_claims", "verify"} <= rules
