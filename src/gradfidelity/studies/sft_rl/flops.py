"""Post-training FLOPs: 6 x params x trained tokens + 2 x params x generated tokens (README, "FLOPs").

The trainers count the tokens each rank processed (trainers.TokenCounter); with several ranks they are summed over
the process group before FLOPs are computed, so a multi-rank run counts every rank's work once.
"""

from __future__ import annotations

import torch

from gradfidelity.studies.sft_rl.callbacks import distributed


def summed_over_ranks(*counts: int) -> list[int]:
    """Token counts of every rank added up (a collective: every rank must call it at the same point)."""
    if not distributed():
        return [int(c) for c in counts]
    t = torch.tensor(counts, dtype=torch.int64)
    torch.distributed.all_reduce(t)
    return t.tolist()


def flops(n_params: int, train_tokens: int, gen_tokens: int) -> float:
    """Training ~6 x params x tokens (forward + backward), generation ~2 x params x tokens."""
    return 6.0 * n_params * train_tokens + 2.0 * n_params * gen_tokens
