"""DeepSpeedAuditCallback with TRL's SFTTrainer on DeepSpeed ZeRO-2 + CPU offload, GA 4 (trl_guard_script.py in a
child process, its DeepSpeed chosen by PYTHONPATH): 0.18.9 raises before the first optimizer step, 0.19.8 trains."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("trl_guard_script.py")
ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path, overlay: bool) -> str:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if overlay:
        env["PYTHONPATH"] = str(ROOT / ".venv-ds0189")
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.slow
@pytest.mark.deepspeed
def test_guard_raises_under_buggy_deepspeed(tmp_path):
    out = _run(tmp_path, overlay=True)
    assert "GUARD_RAISED DeepSpeed 0.18.9" in out and "[[1, 2], [1, 2]]" in out
    assert out.strip().endswith("optimizer steps: 0")


@pytest.mark.slow
@pytest.mark.deepspeed
def test_guard_lets_fixed_deepspeed_train(tmp_path):
    assert "TRAINED 2" in _run(tmp_path, overlay=False)


def test_guard_timeout_is_a_clear_error_and_stops_the_audit():
    """Past timeout_s the audit's process group is stopped and the error names the setting and the likely cause,
    instead of a bare subprocess.TimeoutExpired aborting training with a traceback."""
    import time

    import psutil

    from gradfidelity.guard import DeepSpeedAuditCallback, DeepSpeedAuditError

    cb = DeepSpeedAuditCallback(timeout_s=1.0)
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); " \
           "time.sleep(60)"
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    t0 = time.monotonic()
    with pytest.raises(DeepSpeedAuditError) as exc:
        cb._run_audit([sys.executable, "-c", code], dict(os.environ))
    assert time.monotonic() - t0 < 40
    msg = str(exc.value)
    assert "timeout_s=1 s" in msg and "extension cache" in msg and "Traceback" not in msg
    time.sleep(0.5)
    left = [p for p in psutil.process_iter(["cmdline"]) if p.pid not in before
            and "time.sleep(60)" in " ".join(p.info["cmdline"] or [])]
    assert not left  # the audit's own child (a probe rank) went with it


def _audited(code: int, cases=(), clip_warning=None):
    from types import SimpleNamespace

    from gradfidelity.guard import DeepSpeedAuditCallback

    cb = DeepSpeedAuditCallback()
    res = {"returncode": code, "deepspeed": "0.19.8", "cases": list(cases), "stdout": "x\nlast line", "stderr": "",
           "clip": {"warning": clip_warning}}
    cb.audit = lambda args: res
    args, state = SimpleNamespace(gradient_accumulation_steps=1), SimpleNamespace(is_world_process_zero=True)
    return lambda: cb.on_train_begin(args, state, None)


def test_guard_raises_on_a_leak_one_cause_per_line():
    from gradfidelity.guard import DeepSpeedAuditError

    leak = {"label": "4 backward() calls per micro-step, no set_gradient_accumulation_boundary call",
            "verdict": "leaking", "reason": "a gradient of one optimizer step is carried into the next: mark it",
            "state": {"result": {"dropped": [[0], [0], [0]]}}}
    with pytest.raises(DeepSpeedAuditError) as exc:
        _audited(5, [leak])()
    lines = str(exc.value).splitlines()
    assert lines[1] == f"- {leak['label']}: leaking" and lines[2] == f"- cause: {leak['reason']}"


def test_guard_warns_when_deepspeed_clips_at_another_threshold():
    with pytest.warns(RuntimeWarning, match="clipping threshold differs.\n- DeepSpeed applies clipping at 1"):
        _audited(6, clip_warning="DeepSpeed applies clipping at 1, but the threshold asked for is 0.3")()
