"""The committed cpu records, planned as a reviewer's fresh clone plans them (issue 44's must-show): no committed run
is retrained on a clean clone, one more seed plans exactly that seed's runs (and what they need upstream, and the
aggregation), and --forcerun of one committed cell reruns that cell alone. Dry runs only (Snakemake's own planner),
on a `git clone` of the committed HEAD: file times are the clone's, as a reviewer's would be.

A study whose cpu run is in parts and not finished has planned runs without a record yet (`parts.missing_runs`):
those are the next part's, and a plan may list them; a committed record may never be among the planned runs."""

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


@pytest.fixture(scope="module")
def pending(clone) -> set[str]:
    """The planned runs that have no committed record yet: the remaining parts of a study run in parts."""
    from gradfidelity.parts import missing_runs
    from gradfidelity.studies import STUDIES

    return {p for s in STUDIES for p in missing_runs(clone, "cpu", s)}


@pytest.fixture(scope="module")
def committed(clone) -> set[str]:
    out = subprocess.run(["git", "ls-files", "results/cpu"], cwd=clone, capture_output=True, text=True, check=True)
    return {p for p in out.stdout.split() if p.endswith("/metrics.json")}


def test_a_clean_clone_plans_no_training_job(clone, pending, committed):
    runs = _runs(_plan(clone, "--config", "scale=cpu"))
    assert not set(runs) & committed, sorted(set(runs) & committed)[:10]  # a committed run is never retrained
    # only a study's remaining parts, if any, and the replays of the committed starts they train from
    assert all("/replay/" in r for r in set(runs) - pending), sorted(set(runs) - pending)[:10]
    assert not (pending & committed)


def test_one_more_seed_plans_that_seeds_runs_their_start_and_the_aggregation(clone, pending):
    """Study A's base models are committed with their weights (round 6, issue 59): one more seed trains on the
    committed base of its seed (18 -> base 0) with no replay and no pretraining, on any host type."""
    seeds = list(range(19))
    jobs = _plan(clone, "--config", "scale=cpu", f'sft_rl={{"seeds": {seeds}}}')
    runs = [r for r in _runs(jobs) if r not in pending]
    assert runs and all("/seed18/" in r for r in runs), runs
    # the 4 SFT variants and the 6 RL-stage arms of seed 18, nothing upstream: the base is there, as committed
    assert sum("/seed18/" in r for r in runs) == 10
    rules = {job.rule for job in jobs}
    assert not rules & {"sft_rl_base", "sft_rl_replay_base"}, rules
    assert {"sft_rl_aggregate", "sft_rl_tables", "sft_rl_claims", "verify"} <= rules
    assert not any(r.startswith(("results/cpu/async_pp/", "results/cpu/local/")) for r in runs)


# a committed cell of study C (study B's round-6 run, which archived its round-5 records, is not committed yet)
CELL = "results/cpu/local/python_docs/w32/bp/seed0/metrics.json"


def test_forcerun_of_one_committed_cell_reruns_it_alone(clone, pending):
    """--forcerun of one committed record plans its job alone (the job writes the seed's paired records together):
    beside it only the remaining parts of a study in parts and the replays of the starts they need, and the
    analysis downstream; no other committed run."""
    jobs = _plan(clone, "--config", "scale=cpu", "--forcerun", CELL)
    trained = [job for job in jobs if [r for r in _runs([job]) if r not in pending and "/replay/" not in r]]
    assert len(trained) == 1 and CELL in trained[0].outputs, [job.outputs for job in trained][:3]
    assert all(o.startswith("results/cpu/local/python_docs/w32/") and "/seed0/" in o for o in _runs(trained))
    rules = {job.rule for job in jobs}
    assert {"local_aggregate", "local_claims", "verify"} <= rules


def _plan_text(work: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", "-n", *args], cwd=work, capture_output=True, text=True,
                          timeout=600)


def _local_cells(jobs) -> list:
    return [job for job in jobs if job.rule.startswith("local_") and any(o.endswith("/metrics.json")
                                                                        for o in job.outputs)]


def test_a_changed_step_count_plans_every_local_cell_again_naming_the_key(clone):
    """A record stands only for the config that made it (issue 56): no 100-step run is mixed with 2,000-step ones."""
    plain = _local_cells(_plan(clone, "--config", "scale=cpu"))
    assert plain == []
    res = _plan_text(clone, "--config", "scale=cpu", "local={train: {steps: 100}}")
    assert res.returncode == 0, res.stderr[-3000:]
    from gradfidelity.reference.dag import parse_dry_run

    cells = _local_cells(parse_dry_run(res.stdout))
    groups = sum(1 for line in res.stderr.splitlines()
                 if line.startswith("[gradfidelity] results/cpu/local/")
                 and line.endswith("planned again, config changed: train.steps 2000 -> 100"))
    assert len(cells) == groups > 80  # every cell of every group, and the memory probes (their config holds train)


def test_the_own_text_recipe_at_cpu_plans_the_data_and_every_cell_on_the_users_file(clone, tmp_path):
    """The README's recipe as written (the user's file in python_docs' place): the data job and each cell are
    planned with the reason, and nothing waits for the Python-docs build."""
    text = tmp_path / "mytext.txt"
    text.write_text("".join(f"line {i} of my own words, not the Python docs\n" for i in range(20000)))
    my = tmp_path / "my.yaml"
    my.write_text(f'local:\n  corpora:\n    python_docs: {{source: file, path: {text}, md5: ""}}\n')
    res = _plan_text(clone, "local", "--configfile", str(my), "--config", "scale=cpu")
    assert res.returncode == 0, res.stderr[-3000:]
    from gradfidelity.reference.dag import parse_dry_run

    jobs = parse_dry_run(res.stdout)
    rules = [job.rule for job in jobs]
    assert "local_data" in rules and "local_corpus_pydocs" not in rules
    md5 = __import__("hashlib").md5(text.read_bytes()).hexdigest()
    reason = f"data changed: corpus.text_md5 ffe3fd4a0f5469cba03458a8aed6d3b6 -> {md5}"
    assert len(_local_cells(jobs)) == sum(reason in line for line in res.stderr.splitlines()) > 80
    # The README's trimmed form (no quality or control cells): mechanism seeds 11 and 12 then run serial Broadcast
    # themselves, where committed quality records of the Python-docs text lie; those do not stand for the user's
    # text, so nothing is refused as an overlap and the cells are planned on the user's file.
    my.write_text(f'local:\n  quality_seeds: 0\n  control_seeds: 0\n'
                  f'  corpora:\n    python_docs: {{source: file, path: {text}, md5: ""}}\n')
    res = _plan_text(clone, "local", "--configfile", str(my), "--config", "scale=cpu")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    trimmed = _local_cells(parse_dry_run(res.stdout))
    assert 0 < len(trimmed) < 40 and not [j for j in trimmed if j.rule in ("local_quality", "local_control")]


def test_one_more_main_seed_of_study_c_stops_naming_the_overlap(clone):
    """Seed 5 is a power and control seed: its main-cell job would overwrite their records (issue 56)."""
    res = _plan_text(clone, "--config", "scale=cpu", "local={seeds: 6}")
    assert res.returncode != 0
    said = res.stdout + res.stderr  # Snakemake prints a load-time error on stdout
    assert "main cell python_docs w64 seed 5 has bp, bp_tm, broadcast_async" in said
    assert "local.quality_seeds" in said


def test_one_more_quality_seed_of_study_c_plans_that_seed_alone(clone, pending):
    jobs = _plan(clone, "--config", "scale=cpu", "local={quality_seeds: 119}")
    runs = [r for r in _runs(jobs) if r not in pending and r.startswith("results/cpu/local/")]
    assert sorted(runs) == [f"results/cpu/local/python_docs/w64/{m}/seed118/metrics.json"
                            for m in ("bp", "broadcast_serial")]
    assert {"local_aggregate", "local_claims", "verify"} <= {job.rule for job in jobs}


def test_one_more_seed_of_study_b_plans_that_seeds_runs_alone(clone, pending):
    if not (REPO / "results" / "cpu" / "async_pp" / "lr_selection.json").is_file():
        pytest.skip("study B's round-6 run (issue 60) has not chosen its LRs yet: every evaluation cell waits behind "
                    "the LR grid's checkpoint, so no seed's runs can be planned apart from the rest")
    jobs = _plan(clone, "--config", "scale=cpu", "async_pp={seeds: 6}")
    runs = [r for r in _runs(jobs) if r not in pending and not r.startswith("results/cpu/bench/")]
    assert runs and all("/seed5/" in r for r in runs), [r for r in runs if "/seed5/" not in r][:5]
    assert all(r.startswith("results/cpu/async_pp/") for r in runs)
    assert {"async_pp_aggregate", "async_pp_claims", "verify"} <= {job.rule for job in jobs}
