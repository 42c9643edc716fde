"""A serial local run killed after a checkpoint and resumed ends with exactly the weights of an uninterrupted run:
the per-stage optimizers and the readout snapshot history are part of the checkpoint."""

from __future__ import annotations

import pytest
import torch

from gradfidelity.harness import Run
from gradfidelity.studies.local.data import batch_offsets, embedded_enwik8
from gradfidelity.studies.local.methods import flat, train_serial
from gradfidelity.studies.local.model import build_model
from tests.local._config import train

T = train(n_layer=4, n_head=2, block_size=16, batch_size=2, steps=8, warmup=2, n_stages=2, readout_lag=2, bp_threads=1,
          eval_batches=1, loss_every=1, checkpoint_every=3)
DATA = torch.frombuffer(bytearray(embedded_enwik8(20_000)), dtype=torch.uint8)


class _Killed(Exception):
    pass


def _train(out, kill_at: int | None = None):
    model = build_model(T.model(16), seed=1)
    offsets = batch_offsets(len(DATA), T.block_size, T.batch_size, T.steps, seed=1)
    with Run(out, study="local", config={}, seed=1, threads=1, checkpoint_every=T.checkpoint_every,
             sample_memory=False) as run:
        if kill_at is not None:
            real = run.check_finite

            def check(value, step, what="loss"):
                if step == kill_at:
                    raise _Killed
                real(value, step, what)

            run.check_finite = check
        res = train_serial("rgc_serial", model, T, DATA, offsets, run)
        run.finish({"losses": res["losses"]})
    return model, res


def test_resume_matches_uninterrupted(tmp_path):
    ref, ref_res = _train(tmp_path / "ref")
    with pytest.raises(_Killed):
        _train(tmp_path / "cut", kill_at=5)
    assert (tmp_path / "cut" / "checkpoint.pt").exists()
    resumed, res = _train(tmp_path / "cut")
    assert torch.equal(flat(resumed.parameters()), flat(ref.parameters()))
    assert res["losses"] == ref_res["losses"]
    assert res["steps_timed"] == T.steps - 3  # it really resumed from the step-3 checkpoint
