"""State a run reads back is checked before use: damaged checkpoints restart the run (never a "diverged" run or a
silently different number), prepared data and Hugging Face checkpoints are verified, provenance must exist."""

import json
import logging
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from gradfidelity.errors import UserError
from gradfidelity.harness import Run
from gradfidelity.harness.integrity import (
    MANIFEST,
    CorruptState,
    load_checkpoint,
    save_checkpoint,
    verify_manifest,
    write_manifest,
)
from gradfidelity.harness.results import runs_table

FIXTURE = Path(__file__).with_name("_train_fixture.py")
STEPS = 24


def _fixture(out, *extra):
    return subprocess.run([sys.executable, str(FIXTURE), str(out), str(STEPS), *extra], timeout=300)


def _metrics(out):
    return json.loads((Path(out) / "metrics.json").read_text())


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    out = tmp_path_factory.mktemp("straight")
    assert _fixture(out).returncode == 0
    return _metrics(out)


def _flip_middle(path: Path, n: int = 64) -> None:
    blob = bytearray(path.read_bytes())
    mid = len(blob) // 2
    blob[mid:mid + n] = bytes(b ^ 0xFF for b in blob[mid:mid + n])
    path.write_bytes(bytes(blob))


def _flip_low_mantissa_bits(path: Path) -> None:
    """The subtle fault: low bits of ~1,000 float32s flip, every value stays finite and plausible. Written back
    with the original header, so only the hash can tell."""
    blob = path.read_bytes()
    head = blob.index(b"\n", len(b"GFCKPT1\n")) + 1
    payload = bytearray(blob[head:])
    start = len(payload) // 3
    for i in range(start, start + 4000, 4):  # the lowest byte of consecutive little-endian float32s
        payload[i] ^= 0x01
    path.write_bytes(blob[:head] + bytes(payload))


def _truncate(path: Path) -> None:
    blob = path.read_bytes()
    path.write_bytes(blob[: len(blob) * 2 // 3])


@pytest.mark.parametrize("damage", [_flip_middle, _flip_low_mantissa_bits, _truncate],
                         ids=["64-bytes-flipped", "mantissa-bits", "truncated"])
@pytest.mark.slow
def test_a_damaged_checkpoint_restarts_the_run_with_a_log_line(tmp_path, straight, damage):
    out = tmp_path / "run"
    assert _fixture(out, "--die-at", "14").returncode < 0  # SIGKILL after step 14: checkpoint of step 12 left
    ckpt = out / "checkpoint.pt"
    assert load_checkpoint(ckpt)["step"] == 12
    damage(ckpt)
    with pytest.raises(CorruptState):
        load_checkpoint(ckpt)

    assert _fixture(out).returncode == 0
    m = _metrics(out)
    assert m["status"] == "ok"  # never "diverged": a storage fault is not a scientific result
    assert m["metrics"] == straight["metrics"]  # restarted from step 0: the same numbers as the straight run
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["resumed_from_step"] is None
    [discarded] = prov["checkpoints_discarded"]
    assert discarded["moved_to"] == "checkpoint.pt.corrupt" and (out / "checkpoint.pt.corrupt").exists()
    log = (out / "log.txt").read_text()
    assert "failed its check" in log and "checkpoint.pt.corrupt" in log
    row = runs_table([out / "metrics.json"]).iloc[0]
    assert row["checkpoints_discarded"] == 1


@pytest.mark.slow
def test_an_intact_checkpoint_still_resumes(tmp_path, straight):
    out = tmp_path / "run"
    assert _fixture(out, "--die-at", "14").returncode < 0
    assert _fixture(out).returncode == 0
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["resumed_from_step"] == 12 and prov["checkpoints_discarded"] == []
    assert _metrics(out)["metrics"] == straight["metrics"]


def test_a_checkpoint_without_a_hash_is_not_trusted(tmp_path):
    path = tmp_path / "old.pt"
    torch.save({"step": 3}, path)  # the format before hashes: cannot be verified
    with pytest.raises(CorruptState, match="no hash header"):
        load_checkpoint(path)
    save_checkpoint(path, {"step": 3, "w": torch.arange(4.0)})
    assert load_checkpoint(path)["step"] == 3


def test_run_resume_moves_a_bad_checkpoint_aside_in_process(tmp_path, caplog):
    (tmp_path / "checkpoint.pt").write_bytes(b"GFCKPT1\n" + b"0" * 64 + b"\nnot a torch file")
    model = torch.nn.Linear(2, 2)
    with caplog.at_level(logging.WARNING), Run(tmp_path, study="t", config={}, seed=0, threads=1) as run:
        assert run.resume({"model": model}) == (0, {})
        run.finish({"x": 1.0})
    assert any("failed its check" in r.message for r in caplog.records)
    assert not (tmp_path / "checkpoint.pt").exists()


# ----------------------------------------------------------------------------------------------- manifests
def test_manifest_catches_a_changed_a_truncated_and_a_missing_file(tmp_path):
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "a.bin").write_bytes(b"x" * 100)
    (d / "sub").mkdir()
    (d / "sub" / "b.json").write_text("{}")
    write_manifest(d)
    verify_manifest(d)
    (d / "a.bin").write_bytes(b"y" + b"x" * 99)
    with pytest.raises(CorruptState, match="a.bin.*damaged"):
        verify_manifest(d)
    (d / "a.bin").write_bytes(b"x" * 50)
    with pytest.raises(CorruptState, match="a.bin.*truncated"):
        verify_manifest(d)
    (d / "a.bin").write_bytes(b"x" * 100)
    (d / "sub" / "b.json").unlink()
    with pytest.raises(CorruptState, match="b.json.*missing"):
        verify_manifest(d)
    (d / MANIFEST).unlink()
    with pytest.raises(CorruptState, match="no MANIFEST"):
        verify_manifest(d)


def test_a_damaged_hf_checkpoint_is_refused_naming_the_file(tmp_path):
    from gradfidelity.studies.sft_rl import models

    cfg = models.ModelConfig(name="tiny", arch="qwen2", hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                             intermediate_size=32, max_position=256, hub_id=None)
    tok = models.build_tokenizer()
    models.save_checkpoint(models.build_tiny_model(cfg, tok, seed=0), tok, tmp_path / "model")
    models.load_checkpoint(tmp_path / "model")  # intact: loads
    _flip_middle(tmp_path / "model" / "model.safetensors", n=8)
    with pytest.raises(UserError, match=r"model\.safetensors.*damaged.*Delete"):
        models.load_checkpoint(tmp_path / "model")


# ----------------------------------------------------------------------------------------------- provenance
def _finished_run(path: Path, seed: int = 0) -> Path:
    with Run(path, study="t", config={}, seed=seed, threads=1, scale="smoke") as run:
        run.finish({"x": 1.0})
    return path / "metrics.json"


def test_a_deleted_provenance_fails_the_runs_table(tmp_path):
    metrics = _finished_run(tmp_path / "r")
    assert isinstance(runs_table([metrics]), pd.DataFrame)
    (tmp_path / "r" / "provenance.json").unlink()
    with pytest.raises(UserError, match=r"r/provenance\.json is missing"):
        runs_table([metrics])


def test_a_stale_provenance_is_removed_when_a_run_starts_and_refused_by_readers(tmp_path):
    out = tmp_path / "r"
    _finished_run(out, seed=1)
    with pytest.raises(RuntimeError):
        with Run(out, study="t", config={}, seed=2, threads=1):
            assert not (out / "provenance.json").exists()  # removed on entry with the stale metrics.json
            raise RuntimeError("killed")
    _finished_run(out, seed=3)
    prov = json.loads((out / "provenance.json").read_text())
    prov["seed"] = 1  # as if an old run's record had survived next to a new result
    (out / "provenance.json").write_text(json.dumps(prov))
    with pytest.raises(UserError, match="stale record"):
        runs_table([out / "metrics.json"])


def test_runs_table_keeps_the_runs_own_outputs_apart_and_reads_older_records(tmp_path, monkeypatch):
    """A run whose only changed tracked files are outputs reads clean, with the outputs in their own column; an
    older provenance (no git_dirty_outputs) is split from its git_dirty_files; one without the list keeps its
    flag."""
    repo = tmp_path / "checkout"
    (repo / "src").mkdir(parents=True)
    (repo / "results" / "cpu").mkdir(parents=True)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "src" / "a.py").write_text("x = 1\n")
    (repo / "results" / "cpu" / "bench.json").write_text("{}\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    (repo / "results" / "cpu" / "bench.json").write_text('{"ms": 1}\n')
    monkeypatch.chdir(repo)
    row = runs_table([_finished_run(tmp_path / "r0")]).iloc[0]
    assert (row["git_dirty"], row["git_dirty_files"], row["git_dirty_outputs"]) == (
        False, "", "results/cpu/bench.json")
    (repo / "src" / "a.py").write_text("x = 2\n")
    row = runs_table([_finished_run(tmp_path / "r1")]).iloc[0]
    assert (row["git_dirty"], row["git_dirty_files"], row["git_dirty_outputs"]) == (
        True, "src/a.py", "results/cpu/bench.json")

    prov_path = tmp_path / "r1" / "provenance.json"
    old = json.loads(prov_path.read_text())
    del old["git_dirty_outputs"]
    old.update(git_dirty=True, git_dirty_files=["paper_tables/cpu/t.csv", "results/cpu/bench.json"])
    prov_path.write_text(json.dumps(old))
    row = runs_table([tmp_path / "r1" / "metrics.json"]).iloc[0]
    assert (row["git_dirty"], row["git_dirty_files"], row["git_dirty_outputs"]) == (
        False, "", "paper_tables/cpu/t.csv results/cpu/bench.json")
    del old["git_dirty_files"]
    prov_path.write_text(json.dumps(old))
    row = runs_table([tmp_path / "r1" / "metrics.json"]).iloc[0]
    assert (row["git_dirty"], row["git_dirty_files"], row["git_dirty_outputs"]) == (True, "", "")


def test_git_state_is_read_from_the_working_directory_of_the_run(tmp_path, monkeypatch):
    repo = tmp_path / "other_checkout"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "f").write_text("x")
    subprocess.run([*git, "add", "f"], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    sha = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    monkeypatch.chdir(repo)
    _finished_run(tmp_path / "r")
    assert json.loads((tmp_path / "r" / "provenance.json").read_text())["git_sha"] == sha
