"""One paired cell (corpus, width, seed): each method in a fresh process of its own, back to back.

Torch-free on purpose: this job process only parses the settings and supervises; every method starts from a clean
interpreter (multiprocessing spawn), imports torch there, and measures its own peak PSS (runner.py explains why).
Method order is reversed on odd seeds, so that load drift does not always favour the same side.
"""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

from gradfidelity.errors import UserError


def run_dir(root: Path, corpus: str, width: int, method: str, seed: int) -> Path:
    return Path(root) / corpus / f"w{width}" / method / f"seed{seed}"


def _method_process(method: str, cfg: dict, corpus: str, width: int, seed: int, data_dir: Path, out: Path) -> None:
    from gradfidelity.studies.local.runner import run_method
    from gradfidelity.studies.local.settings import parse

    run_method(method, parse(cfg), cfg, corpus, width, seed, data_dir, out)


def run_cell(methods: list[str], cfg: dict, corpus: str, width: int, seed: int, data_dir: Path, root: Path) -> None:
    order = list(methods) if seed % 2 == 0 else list(reversed(methods))
    ctx = mp.get_context("spawn")
    for method in order:
        out = run_dir(root, corpus, width, method, seed)
        p = ctx.Process(target=_method_process, name=f"gf-local-{method}",
                        args=(method, cfg, corpus, width, seed, Path(data_dir), out))
        p.start()
        p.join()
        if p.exitcode != 0:
            raise UserError(f"study C: {method} on {corpus} w{width} seed {seed} failed (exit code {p.exitcode}); "
                            f"its traceback is in this job's log, its run directory is {out}")
