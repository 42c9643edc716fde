import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Caches inside the checkout, never in the home directory (same as the Makefile and common.smk).
for key, sub in {"TORCH_EXTENSIONS_DIR": "torch_extensions", "MPLCONFIGDIR": "matplotlib",
                 "HF_HOME": "huggingface", "XDG_CACHE_HOME": "xdg"}.items():
    os.environ.setdefault(key, str(REPO / ".cache" / sub))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
