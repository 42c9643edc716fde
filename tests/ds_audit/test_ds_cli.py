"""`gradfidelity audit-deepspeed` exit codes: 2 for unusable configs (no DeepSpeed needed), and the issue's must-show
cases with the real DeepSpeed of each pinned version: ZeRO-2 + offload GA 4 -> [1, 0, 0, 1] exit 3 under 0.18.9,
[1, 1, 1, 1] exit 0 under the installed 0.19.x."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gradfidelity.cli import main

EXAMPLE = Path(__file__).resolve().parents[2] / "src/gradfidelity/studies/ds_audit/examples/ds_z2_offload_ga4.json"


def _audit(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gradfidelity", "audit-deepspeed", *map(str, args)],
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("content", ["{ not json", "[1, 2]", json.dumps({"gradient_accumulation_steps": "auto"}),
                                     json.dumps({"zero_optimization": {"stage": 7}})])
def test_unusable_config_exits_2_with_one_line(tmp_path, capsys, content):
    cfg = tmp_path / "ds.json"
    cfg.write_text(content)
    assert main(["audit-deepspeed", str(cfg)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("gradfidelity audit-deepspeed: error:")


def test_unknown_version_exits_2(capsys):
    assert main(["audit-deepspeed", str(EXAMPLE), "--deepspeed-version", "0.1.0"]) == 2
    assert "no pinned overlay" in capsys.readouterr().err


@pytest.mark.slow
def test_malformed_config_subprocess_no_traceback(tmp_path):
    cfg = tmp_path / "ds.json"
    cfg.write_text('{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2, ')
    proc = _audit(cfg)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def _write(tmp_path, cfg: dict) -> Path:
    p = tmp_path / "ds.json"
    p.write_text(json.dumps(cfg))
    return p


@pytest.mark.slow
@pytest.mark.deepspeed
def test_buggy_deepspeed_drops_middle_micro_batches_every_step(tmp_path):
    out = tmp_path / "a.json"
    proc = _audit(EXAMPLE, "--deepspeed-version", "0.18.9", "--json", out)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "DeepSpeed 0.18.9" in proc.stdout and "PR #7967" in proc.stdout and "audit took" in proc.stdout
    for s in (1, 2, 3):
        assert f"step {s}: contributions [1, 0, 0, 1]" in proc.stdout
    res = json.loads(out.read_text())
    assert res["exit_code"] == 3 and res["cases"][0]["state"]["result"]["dropped"] == [[1, 2]] * 3


@pytest.mark.slow
@pytest.mark.deepspeed
def test_fixed_deepspeed_counts_every_micro_batch():
    proc = _audit(EXAMPLE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for s in (1, 2, 3):
        assert f"step {s}: contributions [1, 1, 1, 1]" in proc.stdout


@pytest.mark.slow
@pytest.mark.deepspeed
def test_four_ranks_run():
    proc = _audit(EXAMPLE, "--deepspeed-version", "0.18.9", "--ranks", "4", "--steps", "1")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "step 1: contributions " + str([1, 0, 0, 1] * 4) in proc.stdout


@pytest.mark.slow
@pytest.mark.deepspeed
def test_cpu_artefact_is_not_a_false_alarm(tmp_path):
    """ZeRO-2, no offload, contiguous_gradients false, two ranks, 0.18.9: undecidable on CPU, with the reason."""
    cfg = _write(tmp_path, {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4,
                            "zero_optimization": {"stage": 2, "contiguous_gradients": False}})
    proc = _audit(cfg, "--ranks", "2", "--deepspeed-version", "0.18.9", "--steps", "1")
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "cannot be decided on this machine" in proc.stdout and "split_half_float_double" in proc.stdout
    assert "switch offload_optimizer off" not in proc.stdout


@pytest.mark.slow
@pytest.mark.deepspeed
def test_ga1_batch_size_only_config_is_faithful_unless_multi_backward_is_asked(tmp_path):
    cfg = _write(tmp_path, {"train_batch_size": 8,
                            "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
                            "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}})
    proc = _audit(cfg, "--deepspeed-version", "0.18.9", "--steps", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "gradient_accumulation_steps: derived" in proc.stdout
    assert "optimizer: not audited" in proc.stdout  # the optimizer block is listed, not silently dropped
    proc = _audit(cfg, "--deepspeed-version", "0.18.9", "--steps", "2", "--backward-per-step", "4",
                  "--boundary", "manual")
    assert proc.returncode == 3 and "PR #7981" in proc.stdout


@pytest.mark.slow
@pytest.mark.deepspeed
def test_a_gradient_leaking_across_steps_exits_5_naming_the_leak(tmp_path):
    """The issue's must-show: ZeRO-2 + offload, 4 backward() calls per step, no boundary, the installed 0.19.x."""
    cfg = _write(tmp_path, {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                            "gradient_clipping": 1.0,
                            "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})
    proc = _audit(cfg, "--backward-per-step", "4", "--boundary", "none", "--json", tmp_path / "out.json")
    assert proc.returncode == 5, proc.stdout + proc.stderr
    assert "gradient LEAKS across optimizer steps" in proc.stdout and "mark the boundary" in proc.stdout
    res = json.loads((tmp_path / "out.json").read_text())
    assert res["exit_code"] == 5 and [c["verdict"] for c in res["cases"]][-1] == "leaking"
    proc = _audit(cfg, "--backward-per-step", "4", "--boundary", "manual")  # the same loop, boundary marked
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.deepspeed
def test_the_versions_default_clipping_is_a_warning_unless_asked_for(tmp_path):
    cfg = _write(tmp_path, {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2,
                            "zero_optimization": {"stage": 2}})
    proc = _audit(cfg, "--steps", "1")
    assert proc.returncode == 6, proc.stdout + proc.stderr
    assert "DeepSpeed applies clipping at 1, but the threshold asked for is none" in proc.stdout
    assert _audit(cfg, "--steps", "1", "--max-grad-norm", "1.0").returncode == 0  # the Trainer's default 1.0
    assert _audit(cfg, "--steps", "1", "--max-grad-norm", "0.3").returncode == 6


@pytest.mark.slow
@pytest.mark.deepspeed
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_stops_the_audit_cleanly(tmp_path, sig, code):
    """A long audit (estimated at 1.5x the warning threshold, so warned up front) stopped by a signal once its probe
    runs: no traceback, no probe process left, no gf-audit-* folder left in TMPDIR."""
    from gradfidelity.studies.ds_audit.audit import WARN_ABOVE_S
    from gradfidelity.studies.ds_audit.case import SECONDS_PER_BACKWARD

    ga = math.ceil(1.5 * WARN_ABOVE_S / (2 * SECONDS_PER_BACKWARD))  # --steps 1: accumulation + clipping, GA each
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    cfg = _write(tmp_path, {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": ga,
                            "gradient_clipping": 1.0, "zero_optimization": {"stage": 1}})
    proc = subprocess.Popen([sys.executable, "-m", "gradfidelity", "audit-deepspeed", str(cfg), "--steps", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(tmp)})
    deadline = time.monotonic() + 300
    while not list(tmp.glob("gf-audit-*/events.rank0.jsonl")):  # the rank has started its first case
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    children = psutil.Process(proc.pid).children(recursive=True)
    assert children
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, out + err
    assert "warning:" in out and "probe backward calls per rank" in out
    assert "Traceback" not in err and "interrupted" in err
    assert not list(tmp.iterdir())
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive
