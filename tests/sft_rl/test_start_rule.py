"""SFT-then-RL's start (issue 59, callbacks.StartCheckpoint): the last scored step before val accuracy first exceeds
sft.start_max_val, on hand-made score sequences, including a resume and the loud error with no start."""

from types import SimpleNamespace

import pytest

from gradfidelity.studies.sft_rl.callbacks import StartCheckpoint


def _drive(scores: dict[int, float], steps: int, every: int, max_val: float, cb: StartCheckpoint | None = None,
           first: int = 0) -> tuple[StartCheckpoint, list[int], list[int]]:
    scored, saved = [], []

    def score(model, step):
        scored.append(step)
        return {"acc_val": scores[step], "train_tokens": 10 * step, "demo_tokens": 5 * step}

    def save(model, step):
        saved.append(step)
        return f"sha{step}"

    if cb is None:
        cb = StartCheckpoint(every, max_val, score, save)
    else:
        cb.score, cb.save = score, save
    cb.on_train_begin(None, SimpleNamespace(global_step=first), None, model=None)
    for step in range(first + 1, steps + 1):
        cb.on_step_end(None, SimpleNamespace(global_step=step), None, model=None)
    return cb, scored, saved


def test_the_start_is_the_last_step_before_val_first_exceeds_the_bound():
    # a dip below the bound after the first exceedance is never scored: the rule stops at the first one
    scores = {0: 30.0, 10: 50.0, 20: 69.9, 30: 70.0, 40: 85.0, 50: 60.0, 60: 90.0}
    cb, scored, saved = _drive(scores, 60, 10, 70.0)
    assert cb.check() == 30 and saved == [0, 10, 20, 30] and scored == [0, 10, 20, 30, 40]
    assert cb.results["30"] == {"acc_val": 70.0, "train_tokens": 300, "demo_tokens": 150, "model_sha256": "sha30"}
    assert "model_sha256" not in cb.results["40"] and cb.closed


def test_a_run_that_never_exceeds_the_bound_starts_from_its_last_scored_step():
    cb, _, saved = _drive({0: 10.0, 10: 20.0, 20: 30.0}, 25, 10, 70.0)
    assert cb.check() == 20 and saved == [0, 10, 20]


def test_a_resumed_run_keeps_the_scores_made_before_its_checkpoint():
    scores = {0: 30.0, 10: 50.0, 20: 60.0, 30: 80.0}
    first, _, _ = _drive(scores, 15, 10, 70.0)      # killed after step 15, its state saved with the checkpoint
    state = first.state()
    resumed = StartCheckpoint(10, 70.0, None, None)
    resumed.restore(state)
    cb, scored, saved = _drive(scores, 40, 10, 70.0, cb=resumed, first=15)
    assert cb.check() == 20 and scored == [20, 30] and saved == [20]
    assert set(cb.results) == {"0", "10", "20", "30"}


def test_no_start_is_a_loud_error():
    cb, _, saved = _drive({0: 95.0, 10: 99.0}, 10, 10, 70.0)   # the base itself is above the bound
    assert saved == []
    with pytest.raises(RuntimeError, match="start_max_val"):
        cb.check()
