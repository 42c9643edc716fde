"""Peak process-tree PSS, sampled in a background thread.

The kernel keeps a peak for RSS (ru_maxrss) but none for PSS, and RSS double-counts pages shared between a parent
and its workers (torch libraries, shared-memory rings). PSS charges each shared page 1/k to each of the k processes
mapping it, so the sum of Pss over a process tree counts shared memory once (study C measures memory this way).
"""

from __future__ import annotations

import os
import resource
import threading

import psutil


def _pss_bytes(proc: psutil.Process) -> int:
    """Pss of one process in bytes (psutil reads /proc/PID/smaps_rollup); 0 once it has exited (a zombie maps
    nothing) or where its memory maps may not be read."""
    try:
        return int(proc.memory_full_info().pss)
    except (psutil.NoSuchProcess, psutil.AccessDenied):  # ZombieProcess is a NoSuchProcess
        return 0


def tree_pss_bytes(pid: int | None = None) -> int:
    """Sum of Pss over a process and all of its live descendants; 0 for a process that has exited."""
    try:
        root = psutil.Process(os.getpid() if pid is None else pid)
        procs = [root, *root.children(recursive=True)]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0
    return sum(_pss_bytes(p) for p in procs)


class PeakPSS:
    """Context manager: `with PeakPSS() as mem: ...; mem.peak_bytes`.

    Sampling every `interval` seconds can miss a spike shorter than the interval; the peak is a lower bound, and
    the record says which interval was used.
    """

    def __init__(self, pid: int | None = None, interval: float = 0.05):
        self.pid = pid or os.getpid()
        self.interval = interval
        self.peak_bytes = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="peak-pss", daemon=True)

    def sample(self) -> int:
        value = tree_pss_bytes(self.pid)
        self.peak_bytes = max(self.peak_bytes, value)
        self.samples += 1
        return value

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakPSS:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def record(self) -> dict:
        return {
            "peak_tree_pss_bytes": self.peak_bytes,
            "peak_tree_pss_gib": self.peak_bytes / 2**30,
            "pss_samples": self.samples,
            "pss_interval_s": self.interval,
            "ru_maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        }

