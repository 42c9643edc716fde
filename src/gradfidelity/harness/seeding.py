"""Deterministic seeding and RNG state capture, so a resumed run draws the same numbers as an uninterrupted one.

RNG states are converted to plain tensors / lists so that checkpoints load with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    # Deterministic kernels where torch has them; warn (not fail) for ops that have no deterministic variant.
    torch.use_deterministic_algorithms(True, warn_only=True)


def rng_state() -> dict:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached": float(cached)},
        "torch": torch.get_rng_state(),
    }


def set_rng_state(state: dict) -> None:
    py = state["python"]
    # weights_only loading turns the inner tuple into a list; random.setstate wants tuples.
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"]))
    torch.set_rng_state(state["torch"])
