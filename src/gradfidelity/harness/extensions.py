"""Per-DeepSpeed-version JIT extension cache, inside the repository.

DeepSpeed JIT-builds its CPU ops (the shared-memory comm op at `init_distributed`, DeepSpeedCPUAdam) into
$TORCH_EXTENSIONS_DIR, cached by op name only. 0.18.9 and 0.19.8 build different sources under the same name: with
one shared folder ninja rebuilds the op each time the version alternates (about a minute on 2 cores), and 0.19.8
crashes loading the op that 0.18.9 built. So every DeepSpeed-using process calls `use_deepspeed_extensions_dir()`
before importing deepspeed. The base is $TORCH_EXTENSIONS_DIR (the Makefile and the workflow set it to
<repo>/.cache/torch_extensions) or that repo path when unset.
"""

from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path


def extensions_dir(version: str) -> Path:
    base = os.environ.get("TORCH_EXTENSIONS_DIR")
    if base:
        root = Path(base)
        if root.name.startswith("deepspeed-"):  # already versioned (set by a parent process)
            root = root.parent
    else:
        repo = next((p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file()), Path.cwd())
        root = repo / ".cache" / "torch_extensions"
    return root / f"deepspeed-{version}"


def use_deepspeed_extensions_dir(version: str | None = None) -> Path:
    """Point TORCH_EXTENSIONS_DIR at the cache of the deepspeed that this process will import.

    importlib.metadata follows sys.path order, so with the 0.18.9 overlay first on PYTHONPATH it reports 0.18.9
    without importing deepspeed.
    """
    path = extensions_dir(version or metadata.version("deepspeed"))
    path.mkdir(parents=True, exist_ok=True)
    os.environ["TORCH_EXTENSIONS_DIR"] = str(path)
    return path
