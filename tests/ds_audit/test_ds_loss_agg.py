"""Loss aggregation: the weighted-token-sum gradients against independently written losses."""

import numpy as np
import pytest
import torch

from gradfidelity.studies.ds_audit.config import LossAggConfig
from gradfidelity.studies.ds_audit.loss_agg import (
    METHODS,
    build_model,
    gradients,
    per_token_losses,
    token_weights,
)

CFG = LossAggConfig(micro_batches=3, seqs_per_micro=2, mean_len=8, spreads=(0.0, 0.5, 0.9), seeds=1, vocab=16,
                    hidden=16, layers=1, threads=1)


def _flat_grad(model, loss):
    model.zero_grad(set_to_none=True)
    loss.backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double()


def test_weights_sum_to_one_and_match_formulas():
    lengths = np.array([[3, 9], [5, 5], [2, 12]])  # (M, b) tokens per sequence
    w = token_weights(lengths)
    for m in METHODS:
        assert np.concatenate(w[m]).sum() == pytest.approx(1.0)
    tok = lengths - 1
    # per-micro-batch mean: a token of micro-batch m weighs 1 / (M * tokens of m)
    assert w["per_microbatch_mean"][0][0] == pytest.approx(1 / (3 * tok[0].sum()))
    # per-sequence mean: 1 / (S * tokens of s)
    assert w["per_sequence_mean"][1][0] == pytest.approx(1 / (6 * tok[0, 1]))


def _direct_loss(name, model, lengths):
    """The three objectives written the way a training loop writes them (fresh graph each call)."""
    per_seq = per_token_losses(model, lengths, CFG, seed=0)  # list of (n_s - 1,) in micro-batch order
    b = lengths.shape[1]
    if name == "global_token_mean":
        return torch.cat(per_seq).mean()
    if name == "per_microbatch_mean":  # what OpenRLHF computed per micro-batch, then DeepSpeed's 1/GA average
        return torch.stack([torch.cat(per_seq[b * m: b * m + b]).mean() for m in range(lengths.shape[0])]).mean()
    return torch.stack([s.mean() for s in per_seq]).mean()


def test_gradients_equal_the_losses_written_directly():
    lengths = np.array([[3, 9], [5, 5], [2, 12]])
    model = build_model(CFG, seed=0)
    got = gradients(model, per_token_losses(model, lengths, CFG, seed=0), token_weights(lengths))
    for name in METHODS:
        ref = _flat_grad(model, _direct_loss(name, model, lengths))
        torch.testing.assert_close(got[name], ref, rtol=1e-5, atol=1e-7)


def test_equal_lengths_make_all_means_coincide():
    lengths = np.full((3, 2), 7)
    model = build_model(CFG, seed=1)
    got = gradients(model, per_token_losses(model, lengths, CFG, seed=1), token_weights(lengths))
    for m in METHODS[1:]:
        torch.testing.assert_close(got[m], got["global_token_mean"], rtol=1e-6, atol=1e-9)


def test_unequal_lengths_weights_by_hand():
    """Sequences of 2, 2 | 14, 14 | 8, 8 tokens -> 1, 1 | 13, 13 | 7, 7 predictions, T = 42, M = 3. The
    per-micro-batch mean gives a token of micro-batch 0 the weight 1 / (3 * 2) = 7 / 42 (7x the global 1 / 42), of
    micro-batch 1 1 / (3 * 26) = 1 / 78, of micro-batch 2 1 / (3 * 14) = 1 / 42; the per-sequence mean gives
    1 / (6 * n_s). The gradient is that weighted sum of the per-micro-batch loss sums, written out by hand."""
    lengths = np.array([[2, 2], [14, 14], [8, 8]])
    w = token_weights(lengths)
    want_mb = {0: 1 / 6, 1: 1 / 78, 2: 1 / 42}
    for j, arr in enumerate(w["per_microbatch_mean"]):
        np.testing.assert_allclose(arr, want_mb[j // 2])
    np.testing.assert_allclose([a[0] for a in w["per_sequence_mean"]], [1 / 6, 1 / 6, 1 / 78, 1 / 78, 1 / 42, 1 / 42])
    np.testing.assert_allclose(np.concatenate(w["global_token_mean"]), 1 / 42)
    model = build_model(CFG, seed=2)
    got = gradients(model, per_token_losses(model, lengths, CFG, seed=2), w)
    seq = per_token_losses(model, lengths, CFG, seed=2)
    by_hand = sum(want_mb[m] * torch.cat(seq[2 * m: 2 * m + 2]).sum() for m in range(3))
    torch.testing.assert_close(got["per_microbatch_mean"], _flat_grad(model, by_hand), rtol=1e-5, atol=1e-7)
    ref = got["global_token_mean"]
    assert float((got["per_microbatch_mean"] - ref).norm() / ref.norm()) > 0.01


def test_the_job_writes_its_rows_and_cell_into_the_run_directory(tmp_path):
    """`ds-audit-loss-agg` as the rule calls it: only its section in --cfg, --run-dir, --cell (the rule's wildcards)."""
    import json

    from gradfidelity.cli import main
    from gradfidelity.harness.results import cell_of, load_run_records

    section = {"loss_aggregation": {"micro_batches": 2, "seqs_per_micro": 1, "mean_len": 6, "spreads": [0.0, 0.5],
                                    "seeds": 1, "vocab": 16, "hidden": 16, "layers": 1, "threads": 1}}
    assert main(["ds-audit-loss-agg", "--cfg", json.dumps(section), "--run-dir", str(tmp_path / "run"),
                 "--cell", "{}"]) == 0
    (rec,) = load_run_records([tmp_path / "run/metrics.json"])
    assert cell_of(rec) == {"study": "ds_audit"}
    assert len(rec["metrics"]["rows"]) == 2 * len(METHODS)



def test_a_job_not_given_its_section_fails_naming_it(tmp_path, capsys):
    from gradfidelity.cli import main

    assert main(["ds-audit-loss-agg", "--cfg", "{}", "--run-dir", str(tmp_path / "run")]) == 2
    assert "ds_audit.loss_aggregation" in capsys.readouterr().err and not (tmp_path / "run").exists()
