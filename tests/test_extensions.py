"""DeepSpeed's JIT ops: the installed version uses the user's own extension cache (so the audit and the guard reuse
what the user's training built), a pinned overlay its own subfolder; unset, the cache is torch's own default."""

import os

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
