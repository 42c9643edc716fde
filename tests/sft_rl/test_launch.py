"""The multi-rank launch path (issue: a paper-scale SFT job must start one process per GPU, not one in all).

- The paper-scale dry run starts every SFT and RL job under torchrun with `sft_rl.ranks` processes and requests as
  many GPUs; the CPU scales start one process.
- The harness lets only rank 0 write a run directory's records.
- The real thing, here on CPU: two processes over gloo run the gradient probe (TRL SFTTrainer -> Accelerate ->
  DeepSpeed ZeRO-2 + CPU offload, one SGD step at lr 1) on both DeepSpeed versions. The least-squares weight of
  each of the 2 x 8 micro-batches in the applied gradient must be the fault matrix's 2-rank pattern: all ones on
  0.19.8, and [1, 0, 0, 0, 0, 0, 0, 1] on each rank on 0.18.9 (docs/sources.md, Study A).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from gradfidelity.harness import Run, integrity
from gradfidelity.studies.sft_rl.models import load_checkpoint
from gradfidelity.studies.sft_rl.rules import gpus, launcher
from tests.sft_rl._config import make_cfg

REPO = Path(__file__).resolve().parents[2]
OVERLAY = REPO / ".venv-ds0189"
GA, RANKS = 8, 2


def test_launcher_starts_torchrun_only_for_several_ranks():
    assert launcher("PY", 1) == "PY -m gradfidelity"
    assert launcher("PY", 8) == "PY -m torch.distributed.run --standalone --nproc_per_node 8 -m gradfidelity"
    eight = make_cfg({"ranks": 8})
    assert gpus(eight, "paper") == 8 and gpus(eight, "cpu") == 0 and gpus(make_cfg({}), "paper") == 1


def test_paper_dry_run_launches_every_rank():
    res = subprocess.run([sys.executable, "-m", "snakemake", "-n", "-p", "--forceall", "--config", "scale=paper",
                          "--", "sft_rl"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = [ln for ln in res.stdout.splitlines() if " sft-rl-sft " in ln or " sft-rl-rl " in ln]
    assert lines, res.stdout[-3000:]
    assert all("-m torch.distributed.run --standalone --nproc_per_node 8 -m gradfidelity" in ln for ln in lines)
    assert "gpu=8" in res.stdout  # one GPU per rank, requested by the rule itself


def test_smoke_dry_run_starts_one_process():
    res = subprocess.run([sys.executable, "-m", "snakemake", "-n", "-p", "--forceall", "--config", "scale=smoke",
                          "--", "sft_rl"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert " sft-rl-sft " in res.stdout and "torch.distributed.run" not in res.stdout


@pytest.mark.parametrize("rank", [0, 1])
def test_only_rank_zero_writes_the_run_records(tmp_path, monkeypatch, rank):
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", "2")
    with Run(tmp_path, study="t", config={"a": 1}, seed=0, threads=1, scale="smoke") as run:
        assert run.primary == (rank == 0) and run.world_size == 2
        run.finish({"x": 1.0})
    written = {p.name for p in tmp_path.iterdir()}
    if rank == 0:
        assert {"metrics.json", "provenance.json", "log.txt"} <= written
        assert json.loads((tmp_path / "provenance.json").read_text())["world_size"] == 2
    else:
        assert written == {"log_rank1.txt"}


# ----------------------------------------------------------------------------- two real ranks over gloo
def _torchrun_probe(variant: str, out: Path, overlay: bool) -> None:
    env = dict(os.environ, DS_ACCELERATOR="cpu", HF_HUB_OFFLINE="1",
               TORCH_EXTENSIONS_DIR=str(REPO / ".cache" / "torch_extensions"))
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(key, None)
    if overlay:
        env["PYTHONPATH"] = str(OVERLAY) + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(RANKS),
           "-m", "gradfidelity", "sft-rl-probe", "--variant", variant, "--out", str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]


def _weights(out: Path, variant: str) -> torch.Tensor:
    """Least-squares weight of each micro-batch (rank-major) in the applied gradient, in units of its global-token-
    mean term: applied = sum_k w_k grad(NLL_k) / (tokens of all 2 x 8 micro-batches)."""
    probe = integrity.load_checkpoint(out / variant / "probe.pt")
    assert probe["world_size"] == RANKS
    others = integrity.load_checkpoint(out / variant / "batches_rank1.pt")
    batches = probe["batches"] + others["batches"]
    assert len(probe["batches"]) == len(others["batches"]) == GA
    model, _ = load_checkpoint(out / "base" / "model")
    names = sorted(probe["delta"])
    applied = -torch.cat([probe["delta"][k].flatten() for k in names])  # SGD lr 1: delta = -gradient
    total = sum(int((b["labels"][:, 1:] != -100).sum()) for b in batches)
    columns = []
    for b in batches:
        model.zero_grad(set_to_none=True)
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits[:, :-1]
        nll = F.cross_entropy(logits.reshape(-1, logits.size(-1)), b["labels"][:, 1:].reshape(-1),
                              ignore_index=-100, reduction="sum")
        (nll / total).backward()
        params = dict(model.named_parameters())
        columns.append(torch.cat([params[k].grad.flatten() for k in names]))
    g = torch.stack(columns, dim=1).double()
    w = torch.linalg.lstsq(g, applied.double().unsqueeze(1)).solution.squeeze(1)
    resid = (g @ w - applied.double()).norm() / applied.double().norm()
    assert resid < 1e-4, f"{variant}: the applied gradient is not a combination of the micro-batch gradients"
    return w


@pytest.mark.slow
@pytest.mark.deepspeed
def test_two_ranks_show_the_fault_matrix_pattern(tmp_path):
    if not (OVERLAY / "deepspeed").exists():
        pytest.fail(f"deepspeed 0.18.9 overlay missing at {OVERLAY} (run make setup)")
    _torchrun_probe("fixed", tmp_path, overlay=False)
    _torchrun_probe("ds_bug", tmp_path, overlay=True)
    per_rank = [1.0] + [0.0] * (GA - 2) + [1.0]
    expected = {"fixed": torch.ones(GA * RANKS, dtype=torch.float64),
                "ds_bug": torch.tensor(per_rank * RANKS, dtype=torch.float64)}
    for variant, version in (("fixed", "0.19.8"), ("ds_bug", "0.18.9")):
        w = _weights(tmp_path, variant)
        assert torch.allclose(w, expected[variant], atol=1e-3), f"{variant}: weights {w.numpy().round(3)}"
        prov = json.loads((tmp_path / variant / "provenance.json").read_text())
        metrics = json.loads((tmp_path / variant / "metrics.json").read_text())["metrics"]
        assert prov["world_size"] == RANKS and prov["packages"]["deepspeed"] == version
        assert metrics["ranks"] == RANKS and metrics["global_batch"] == GA * RANKS
        # FLOPs count the tokens of both ranks (counted per rank, summed over the process group)
        batches = [b for f in ("probe.pt", "batches_rank1.pt")
                   for b in integrity.load_checkpoint(tmp_path / variant / f)["batches"]]
        assert metrics["train_tokens"] == sum(int(b["attention_mask"].sum()) for b in batches)
        assert (tmp_path / variant / "log_rank1.txt").exists()
