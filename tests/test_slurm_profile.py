"""The SLURM profile's requests follow the scale: a smoke run asks for no GPU and no more than a small node has; the
paper scale asks for the paper's sizes (config/paper/resources.yaml). Dry runs only: no cluster needed."""

import re
import subprocess
import sys

import psutil
import pytest

from tests._repo_copy import REPO

pytestmark = pytest.mark.slow


def _resources(scale: str, *extra: str) -> list[dict[str, str]]:
    cmd = [sys.executable, "-m", "snakemake", "-n", "--forceall", "--workflow-profile", "workflow/profiles/slurm",
           *extra, "--config", f"scale={scale}"]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    jobs = []
    for block in res.stdout.split("\nrule ")[1:] + res.stdout.split("\nlocalrule ")[1:]:
        name = block.split(":", 1)[0]
        threads = re.search(r"^    threads: (\d+)$", block, re.M)
        line = re.search(r"^    resources: (.*)$", block, re.M)
        items = dict(kv.split("=", 1) for kv in line[1].split(", ")) if line else {}
        jobs.append({"rule": name, "threads": int(threads[1]) if threads else 1, **items})
    assert jobs
    return jobs


def test_smoke_requests_no_gpu_and_fit_a_two_core_node():
    node_mb = psutil.virtual_memory().total // 2**20
    for job in _resources("smoke"):
        if job["rule"] == "all":  # a local rule: never submitted
            continue
        assert "gpu" not in job and "gres" not in job, job
        assert int(job.get("mem_mb", 0)) <= min(node_mb, 24_000), job
        assert job["threads"] <= 2 and int(job.get("cpus_per_task", 1)) <= 2, job
        assert "slurm_partition" in job and "gpu" not in job["slurm_partition"], job


def test_paper_requests_the_papers_sizes():
    by_rule = {}
    for job in _resources("paper"):
        by_rule.setdefault(job["rule"], job)
    assert by_rule["sft_rl_base"]["gpu"] == "8" and by_rule["sft_rl_base"]["slurm_partition"] == "gpu"
    assert by_rule["sft_rl_rl"]["gpu"] == "8"  # one per rank: sft_rl.ranks at the paper scale
    assert by_rule["async_pp_train"]["gpu"] == "1"
    assert by_rule["local_main"]["cpus_per_task"] == "31" and "gpu" not in by_rule["local_main"]


@pytest.mark.parametrize("scale", ["smoke", "paper"])
def test_a_resources_file_with_a_typo_fails_before_any_job(tmp_path, scale):
    """config/<scale>/resources.yaml is the one place of every rule's requests: a rule without an entry, and an entry
    for no rule (a typo that would otherwise leave the real rule with nothing), both stop the workflow naming it."""
    import shutil

    from tests._repo_copy import COPY_IGNORE

    work = tmp_path / "repo"
    shutil.copytree(REPO, work, ignore=COPY_IGNORE)
    path = work / "config" / scale / "resources.yaml"
    original = path.read_text()

    def dry_run():
        return subprocess.run([sys.executable, "-m", "snakemake", "-n", "--config", f"scale={scale}"], cwd=work,
                              capture_output=True, text=True, timeout=300)

    path.write_text(original + "  local_bnech: {mem_mb: 1000, runtime: 5}\n")
    res = dry_run()
    assert res.returncode != 0
    assert "names rules that do not exist: local_bnech" in res.stdout + res.stderr
    path.write_text(original.replace("local_bench:", "local_bnech:"))
    res = dry_run()
    assert res.returncode != 0
    assert f"config/{scale}/resources.yaml has no entry for rule 'local_bench'" in res.stdout + res.stderr
