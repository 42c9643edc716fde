"""DeepSpeed's JIT ops: the installed version uses the user's own extension cache (so the audit and the guard reuse
what the user's training built), a pinned overlay its own subfolder; unset, the cache is torch's own default."""

import os
import time

from gradfidelity.harness import extensions


def test_installed_version_uses_the_users_cache_and_an_overlay_its_subfolder(tmp_path, monkeypatch):
    installed = extensions.base_deepspeed_version()
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert extensions.extensions_dir(installed) == tmp_path
    assert extensions.extensions_dir("0.0.1") == tmp_path / "deepspeed-0.0.1"
    # a child of a process that pointed the variable at an overlay's subfolder finds the same root
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "deepspeed-0.0.1"))
    assert extensions.extensions_dir(installed) == tmp_path
    assert extensions.use_deepspeed_extensions_dir(installed) == tmp_path
    assert os.environ["TORCH_EXTENSIONS_DIR"] == str(tmp_path)


def test_unset_cache_is_torchs_own_default_and_stays_unset(tmp_path, monkeypatch):
    from torch.utils.cpp_extension import _get_build_directory

    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    torch_root = _get_build_directory("some_op", verbose=False)  # torch's own answer: <root>/some_op
    assert extensions.extensions_root() / "some_op" == type(extensions.extensions_root())(torch_root)
    installed = extensions.base_deepspeed_version()
    extensions.use_deepspeed_extensions_dir(installed)
    assert "TORCH_EXTENSIONS_DIR" not in os.environ  # left to torch: the folder the user's other runs use
    extensions.use_deepspeed_extensions_dir("0.0.1")
    assert os.environ["TORCH_EXTENSIONS_DIR"] == str(extensions.extensions_root() / "deepspeed-0.0.1")



def test_a_build_lock_left_by_a_killed_job_is_removed_and_a_live_one_waited_for(tmp_path, monkeypatch, capsys):
    """A killed build leaves <op>/lock and torch's FileBaton then waits forever: age decides what is stale."""
    for op in ("stale_op", "live_op"):
        (tmp_path / op).mkdir()
        (tmp_path / op / "lock").touch()
    old = (tmp_path / "stale_op" / "lock").stat().st_mtime - extensions.STALE_LOCK_S - 1
    os.utime(tmp_path / "stale_op" / "lock", (old, old))
    waits = []

    def sleep(s):  # the live build finishes while we wait
        waits.append(s)
        (tmp_path / "live_op" / "lock").unlink()

    assert extensions.clear_stale_build_locks(tmp_path, sleep=sleep) == [tmp_path / "stale_op" / "lock"]
    assert waits == [extensions.LOCK_POLL_S] and not list(tmp_path.glob("*/lock"))
    err = capsys.readouterr().err
    assert "removed a stale torch extension build lock" in err and "stale_op/lock" in err
    assert "waiting for the torch extension build lock" in err and "live_op/lock" in err
    # a lock that outlives the limit while we wait is removed too: the wait is bounded
    (tmp_path / "live_op" / "lock").touch()
    now = [time.time()]

    def tick(s):
        now[0] += extensions.STALE_LOCK_S

    assert extensions.clear_stale_build_locks(tmp_path, clock=lambda: now[0], sleep=tick) == [
        tmp_path / "live_op" / "lock"]
    # the process-wide entry point clears them before DeepSpeed loads
    (tmp_path / "stale_op" / "lock").touch()
    os.utime(tmp_path / "stale_op" / "lock", (old, old))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    extensions.use_deepspeed_extensions_dir(extensions.base_deepspeed_version())
    assert not (tmp_path / "stale_op" / "lock").exists()
