import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Caches inside the checkout, never in the home directory (same as the Makefile and common.smk).
for key, sub in {"TORCH_EXTENSIONS_DIR": "torch_extensions", "MPLCONFIGDIR": "matplotlib",
                 "HF_HOME": "huggingface", "XDG_CACHE_HOME": "xdg"}.items():
    os.environ.setdefault(key, str(REPO / ".cache" / sub))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _restore_environment():
    """Tests that run DeepSpeed in-process set MASTER_PORT, RANK, TORCH_EXTENSIONS_DIR, ...: undo that after each
    test, so that a later test (and the subprocesses it starts) never inherits another test's rendezvous."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def records_in_place(monkeypatch):
    """A fake checkout that lists runs without writing their records: the reference sample treats every listed run
    as in place (a real checkout has them; the case where they were moved aside is tests/test_reference.py's)."""
    import gradfidelity.reference.sample as sample

    monkeypatch.setattr(sample, "_moved_runs", lambda repo, study: [])
