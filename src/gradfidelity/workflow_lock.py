"""Stale Snakemake locks: after `kill -9` of snakemake, its lock in .snakemake/locks/ stays behind and every later
run stops with "Directory cannot be locked". The lock is removed only when no live snakemake process works in
this directory, so a second, running DAG is never unlocked under its feet."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import psutil


def live_snakemake_here(root: Path) -> list[int]:
    """PIDs of other snakemake processes whose working directory is `root`."""
    pids = []
    for proc in psutil.process_iter(["pid", "cmdline", "cwd"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            if proc.info["pid"] != os.getpid() and "snakemake" in cmd and "unlock-stale" not in cmd \
                    and proc.info["cwd"] and Path(proc.info["cwd"]).resolve() == root:
                pids.append(proc.info["pid"])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return pids


def unlock_if_stale(snakemake: str = "snakemake", root: str | os.PathLike = ".") -> str:
    root = Path(root).resolve()
    locks = list((root / ".snakemake" / "locks").glob("*")) if (root / ".snakemake" / "locks").is_dir() else []
    if not locks:
        return "no lock"
    live = live_snakemake_here(root)
    if live:
        return f"lock kept: snakemake is running here (pid {', '.join(map(str, live))})"
    subprocess.run([snakemake, "--unlock", "--quiet"], cwd=root, check=True, stdout=subprocess.DEVNULL)
    return f"removed a stale lock ({len(locks)} file(s)) left by a killed snakemake"
