"""Study A's base models are committed with their weights (round 6, issue 59): every host type starts its SFT runs
from the same base, checked against the digest its record names, instead of pretraining (or replaying) its own."""

import json
from pathlib import Path

import pytest
import yaml

from gradfidelity.errors import UserError
from gradfidelity.studies.sft_rl import config, models, plan, rules
from tests.sft_rl._config import make_cfg

REPO = Path(__file__).resolve().parents[2]
ROOT = "results/cpu/sft_rl"


def _cpu():
    return config.load(yaml.safe_load((REPO / "config/cpu/sft_rl.yaml").read_text()))


def test_every_committed_base_is_its_records_weights_and_starts_sft_without_a_replay(monkeypatch):
    cfg = _cpu()
    monkeypatch.chdir(REPO)
    bases = plan.used_bases(cfg)
    assert bases == [0, 1]
    for b in bases:
        run = plan.base_dir(ROOT, cfg.models[0].name, b)
        record = json.loads(Path(run, "metrics.json").read_text())
        assert record["status"] == "ok" and record["seed"] == b
        # the committed weights are the ones the record names: a digest check, not a replay
        assert models.weights_digest(Path(run, "model")) == record["metrics"]["model_sha256"]
        models.check_weights(Path(run, "model"), record["metrics"]["model_sha256"], f"{run}/metrics.json")
        # a committed record whose model is here is started from as it is (no <run>/replay/)
        assert rules.start_of(run, committed=lambda path: True) == f"{run}/metrics.json"
    # seeds alternate between the bases; the selection seed starts from base 0
    assert [plan.base_seed(cfg, k) for k in range(4)] == [0, 1, 0, 1] and plan.base_seed(cfg, 100) == 0


def test_weights_that_are_not_the_records_are_refused(tmp_path):
    """A changed byte in the weights fails the check with both digests named; a record made before round 6 (no
    digest) is checked on its manifest alone."""
    tok = models.build_tokenizer()
    cfg = make_cfg({})
    models.save_checkpoint(models.build_tiny_model(cfg.models[0], tok, 0), tok, tmp_path / "model")
    digest = models.weights_digest(tmp_path / "model")
    models.check_weights(tmp_path / "model", digest, "rec")
    models.check_weights(tmp_path / "model", None, "rec")
    weights = tmp_path / "model" / models.WEIGHTS
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    with pytest.raises(UserError, match=f"not the model_sha256 {digest}"):
        models.check_weights(tmp_path / "model", digest, "rec")
