"""Thread settings: set once per run and recorded, because results repeat exactly only at the same thread count
(reduction order in BLAS and OpenMP kernels depends on it).

torch's intra-op pool is set by torch itself; every other native pool already loaded (numpy/scipy's OpenBLAS,
libgomp) is limited through threadpoolctl, and the environment variables cover child processes and libraries
loaded later. The record lists each pool threadpoolctl sees, so a run's thread settings are visible, not assumed.
"""

from __future__ import annotations

import os

import torch
from threadpoolctl import threadpool_info, threadpool_limits

_ENV_KEYS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def configure_threads(threads: int) -> dict:
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    for key in _ENV_KEYS:  # read by child processes and by libraries initialised later
        os.environ[key] = str(threads)
    torch.set_num_threads(threads)
    threadpool_limits(limits=threads)  # process-wide and kept: a run's whole life uses this count
    return thread_record()


def thread_record() -> dict:
    return {
        "torch_num_threads": torch.get_num_threads(),
        "torch_num_interop_threads": torch.get_num_interop_threads(),
        **{key: os.environ.get(key) for key in _ENV_KEYS},
        "pools": [{"internal_api": p["internal_api"], "prefix": p["prefix"], "num_threads": p["num_threads"]}
                  for p in threadpool_info()],
    }
