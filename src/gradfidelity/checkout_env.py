"""Keep every cache of the checkout's tools inside the checkout, from the first line any of them runs.

Why: Snakemake opens its source cache (`~/.cache/snakemake/.../snakemake-runtime-cache`) while it builds the
workflow, before the Snakefile (and common.smk's own settings) run, so a direct `.venv/bin/snakemake ...` wrote to
the user's home. `make setup` installs `gradfidelity-checkout.pth` into the venv's site-packages; Python's `site`
module runs its one line at the start of every interpreter of that venv (snakemake, gradfidelity, pytest, the
jobs), which calls `apply()`. Values the user set are kept (setdefault), as in the Makefile and common.smk.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# variable -> folder under <checkout>/.cache (the same as the Makefile's exports and common.smk's)
CACHES = {"XDG_CACHE_HOME": "xdg", "MPLCONFIGDIR": "matplotlib", "TORCH_EXTENSIONS_DIR": "torch_extensions",
          "HF_HOME": "huggingface", "TRITON_CACHE_DIR": "triton"}
PTH_NAME = "gradfidelity-checkout.pth"
PTH_LINE = "import gradfidelity.checkout_env as _gf_env; _gf_env.apply()\n"


def checkout_root() -> Path:
    """The checkout that holds this interpreter's venv (`<checkout>/.venv`)."""
    return Path(sys.prefix).resolve().parent


def apply(root: Path | None = None) -> None:
    cache = (root or checkout_root()) / ".cache"
    for key, sub in CACHES.items():
        os.environ.setdefault(key, str(cache / sub))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
