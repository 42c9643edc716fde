"""The SFT path really runs on DeepSpeed ZeRO-2 + CPU offload, and the gradient it applies is the bug's.

One SGD step (lr 1, no clipping) through the study's own run_sft (TRL SFTTrainer -> Accelerate -> DeepSpeed), in a
subprocess per DeepSpeed version (0.18.9 through the overlay, as the Snakemake rules do). The parameter change
is minus the applied gradient; the reference is plain torch on the micro-batches the Trainer recorded:
    fixed   = global token mean over all 8 micro-batches
    agg_bug = mean over micro-batches of each one's token mean
    ds_bug  = the global-mean terms of micro-batches 0 and 7 only (the accumulation bug keeps g0 + g(N-1))
    both    = the per-micro-batch-mean terms of micro-batches 0 and 7 only
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from gradfidelity.harness import integrity
from gradfidelity.studies.sft_rl.models import load_checkpoint

REPO = Path(__file__).resolve().parents[2]
OVERLAY = REPO / ".venv-ds0189"
pytestmark = [pytest.mark.slow, pytest.mark.deepspeed]


def _run_probe(variants: str, out: Path, overlay: bool) -> None:
    env = dict(os.environ, DS_ACCELERATOR="cpu", HF_HUB_OFFLINE="1",
               TORCH_EXTENSIONS_DIR=str(REPO / ".cache" / "torch_extensions"))
    env.pop("MASTER_PORT", None)
    if overlay:
        env["PYTHONPATH"] = str(OVERLAY) + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.run([sys.executable, "-m", "gradfidelity", "sft-rl-probe", "--variant", variants,
                           "--out", str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _reference(model, batches, mode: str, keep: list[int]) -> dict[str, torch.Tensor]:
    """Plain-torch gradient of the SFT loss (shifted next-token cross entropy on label tokens)."""
    model.zero_grad(set_to_none=True)
    counts = [int((b["labels"][:, 1:] != -100).sum()) for b in batches]
    for i in keep:
        b = batches[i]
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits[:, :-1]
        nll = F.cross_entropy(logits.reshape(-1, logits.size(-1)), b["labels"][:, 1:].reshape(-1),
                              ignore_index=-100, reduction="sum")
        loss = nll / sum(counts) if mode == "global" else nll / counts[i] / len(batches)
        loss.backward()
    return {k: p.grad.detach().clone() for k, p in model.named_parameters()}


def _flat(d: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([d[k].flatten() for k in sorted(d)])


@pytest.fixture(scope="module")
def probes(tmp_path_factory):
    if not (OVERLAY / "deepspeed").exists():
        pytest.fail(f"deepspeed 0.18.9 overlay missing at {OVERLAY} (run make setup)")
    out = tmp_path_factory.mktemp("probe")
    _run_probe("fixed,agg_bug", out, overlay=False)
    _run_probe("ds_bug,both", out, overlay=True)
    return out


def test_buggy_runs_ran_on_deepspeed_0189_with_offload(probes):
    for variant, version in (("ds_bug", "0.18.9"), ("both", "0.18.9"), ("fixed", "0.19.8"), ("agg_bug", "0.19.8")):
        prov = json.loads((probes / variant / "provenance.json").read_text())
        assert prov["packages"]["deepspeed"] == version
        assert prov["config"]["deepspeed"]["offload_optimizer"] == "cpu"
        assert prov["config"]["deepspeed"]["zero_stage"] == 2
        metrics = json.loads((probes / variant / "metrics.json").read_text())["metrics"]
        assert metrics["deepspeed_version"] == version and metrics["grad_accum"] == 8


def test_applied_gradient_matches_each_variant_reference(probes):
    model, _ = load_checkpoint(probes / "base" / "model")
    applied, refs = {}, {}
    for variant in ("fixed", "agg_bug", "ds_bug", "both"):
        probe = integrity.load_checkpoint(probes / variant / "probe.pt")
        assert len(probe["batches"]) == 8
        applied[variant] = -_flat(probe["delta"])          # SGD lr 1: delta = -gradient
        mode = "micro" if variant in ("agg_bug", "both") else "global"
        keep = [0, 7] if variant in ("ds_bug", "both") else list(range(8))
        refs[variant] = _flat(_reference(model, probe["batches"], mode, keep))
    scale = refs["fixed"].abs().max()
    for variant in applied:
        err = (applied[variant] - refs[variant]).abs().max() / scale
        assert err < 1e-4, f"{variant}: max relative deviation {err:.2e} from its reference"
    # the bug is visible: the applied gradient is not the fixed one on the same batch
    ds_vs_fixed = (applied["ds_bug"] - refs["fixed"]).abs().max() / scale
    assert ds_vs_fixed > 0.05
    agg_vs_fixed = (applied["agg_bug"] - refs["fixed"]).abs().max() / scale
    assert agg_vs_fixed > 1e-3  # unequal sequence lengths: per-micro-batch mean re-weights tokens
