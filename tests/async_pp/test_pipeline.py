"""The real multi-process pipeline (gloo, one process per stage) against the single-process delay simulator.

float64, 3 stages, two optimizers, 2bw (m = 2 micro-batches) and pipedream (weight stashing): the final weights
must equal the simulator's to 1e-12 AND differ from the synchronous simulator's, so that a pipeline whose delay
was removed (or a simulator that ignored the schedule) fails. One process group runs all jobs (spawn is the cost).
"""

from __future__ import annotations

from dataclasses import replace

import psutil
import pytest
import torch

from gradfidelity.errors import UserError
from gradfidelity.studies.async_pp.pipeline import PipeJob, PipeSetup, run_pipeline, simulate
from tests.async_pp._cfg import model_config

pytestmark = pytest.mark.slow  # spawns processes (torch import per stage); about 20 s of CPU in all

MODEL = model_config(vocab_size=0, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, max_seq_len=16,
                     tie_embeddings=False)
SETUP = PipeSetup(model=MODEL, n_stages=3, seq_len=16, batch_size=4, train_chars=5000, val_chars=500)
JOBS = [PipeJob("2bw_adamw", "2bw", "adamw", 6, n_micro=2, warmup=2, decay=2),
        PipeJob("2bw_muon", "2bw", "muon", 6, n_micro=2),
        PipeJob("pipedream_adamw", "pipedream", "adamw", 6),
        PipeJob("pipedream_muon", "pipedream", "muon", 6),
        PipeJob("2bw_ef_lion", "2bw", "lion", 5, n_micro=2, mitigation="error_feedback"),
        PipeJob("sync_adamw", "sync", "adamw", 5, n_micro=2)]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny float64 ops: one thread avoids oversubscribing the 2 cores that the stage processes also use."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def maxdiff(a, b):
    assert set(a) == set(b)
    return max(float((a[n] - b[n]).abs().max()) for n in a)


@pytest.fixture(scope="module")
def piped():
    pids: list[int] = []
    res = run_pipeline(SETUP, JOBS, pids=pids)
    return res, pids


@pytest.mark.parametrize("job", JOBS, ids=[j.name for j in JOBS])
def test_pipeline_equals_simulator(piped, job):
    res, _ = piped
    got = res[job.name]["params"]
    assert maxdiff(got, simulate(SETUP, job)) <= 1e-12
    if job.schedule != "sync":  # the delay is real: the synchronous trajectory is far away
        assert maxdiff(got, simulate(SETUP, job, schedule="sync")) > 1e-6


def test_two_weight_versions_per_stage_for_2bw(piped):
    """2BW's double buffer: every stage holds exactly W(t-1) and W(t); the flushing sync pipeline needs one version,
    PipeDream's weight stashing more than two on its first stage (P - k micro-batches in flight)."""
    res, _ = piped
    versions = {name: [t["max_versions"] for t in res[name]["timing"]] for name in res}
    assert versions["2bw_adamw"] == versions["2bw_muon"] == [2] * SETUP.n_stages
    assert versions["sync_adamw"] == [1] * SETUP.n_stages
    assert versions["pipedream_adamw"][0] > 2


def test_clean_shutdown_after_success(piped):
    _, pids = piped
    assert len(pids) == SETUP.n_stages
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)


def test_failing_stage_stops_every_process():
    pids: list[int] = []
    setup = PipeSetup(model=MODEL, n_stages=2, seq_len=16, batch_size=4, train_chars=5000, val_chars=500)
    with pytest.raises(RuntimeError, match="injected failure"):
        run_pipeline(setup, [PipeJob("boom", "2bw", "adamw", 4, n_micro=2, fail_at=3)], pids=pids)
    assert len(pids) == 2
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)


def test_bad_pipeline_config_fails_before_spawning():
    with pytest.raises(UserError, match="tie_embeddings"):
        run_pipeline(PipeSetup(model=replace(MODEL, tie_embeddings=True), n_stages=2, seq_len=16, batch_size=4),
                     [PipeJob("x", "2bw", "adamw", 2)])
    with pytest.raises(UserError, match="stall"):
        run_pipeline(SETUP, [PipeJob("x", "2bw", "adamw", 2, n_micro=1)])


def test_the_ping_pong_measures_round_trips_and_each_stage_counts_its_messages():
    """Issue 47, item 4: the bench splits the receive wait into messages x latency and the schedule. The round trips
    come back from the process group the jobs run in, and every stage counts the messages it received: the last
    stage one activation per micro-batch, the first one gradient per micro-batch, a middle stage both."""
    latency: dict = {}
    job = PipeJob("2bw", "2bw", "adamw", 3, n_micro=2)
    res = run_pipeline(SETUP, [job], latency=latency, latency_rounds=4)
    assert len(latency["round_trip_s"]) == 4 and all(t > 0 for t in latency["round_trip_s"])
    assert latency["shape"] == [SETUP.batch_size // 2, SETUP.seq_len, MODEL.d_model]
    assert [t["recv_n"] for t in res["2bw"]["timing"]] == [3 * 2, 2 * 3 * 2, 3 * 2]


def test_the_ping_pong_refuses_jobs_whose_messages_differ_in_shape():
    with pytest.raises(UserError, match="one shape"):
        run_pipeline(SETUP, [JOBS[0], JOBS[2]], latency={}, latency_rounds=4)  # 2 micro-batches against 1
