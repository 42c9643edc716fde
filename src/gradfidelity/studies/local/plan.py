"""Which cells of study C exist, and where their runs live (torch-free: the workflow imports it at load).

A cell is one (corpus, width, seed) of a job group: `main` (BP, the best-BP candidates and the async methods,
time-paired in one job) on every corpus at its widths, and `mechanism` (the serial local methods) on the mechanism
corpora and widths. Each method of a cell has its own run directory `<root>/<corpus>/w<width>/<method>/seed<k>`.
"""

from __future__ import annotations

from gradfidelity.studies.local.config import MAIN, SERIAL_LOCAL, StudyConfig


def run_dir(root: str, corpus: str, width: int | str, method: str, seed: int | str) -> str:
    """One method's run directory in a cell (`root` = results/<scale>/local)."""
    return f"{root}/{corpus}/w{width}/{method}/seed{seed}"


def run_pattern(results: str) -> str:
    """The metrics.json of any run, with Snakemake's wildcards {corpus}, {width}, {method}, {seed}."""
    return run_dir(f"{results}/local", "{corpus}", "{width}", "{method}", "{seed}") + "/metrics.json"


def groups(cfg: StudyConfig) -> dict[str, list[str]]:
    """The configured methods of each job group, in run order (a group without methods has no jobs)."""
    return {"main": [m for m in MAIN if m in cfg.methods],
            "mechanism": [m for m in SERIAL_LOCAL if m in cfg.methods]}


def corpus_widths(cfg: StudyConfig) -> dict[str, tuple[int, ...]]:
    """The widths each corpus is trained at: its own list, or all of `widths` when that is empty."""
    return {name: (c.widths or cfg.widths) for name, c in cfg.corpora.items()}


def cell_seeds(cfg: StudyConfig) -> dict[tuple[str, int], range]:
    """Paired seeds of one (corpus, width) main cell: the corpus's own count (or `seeds`), capped by `side_seeds`
    away from the main width."""
    out = {}
    for name, c in cfg.corpora.items():
        for w in corpus_widths(cfg)[name]:
            side = (cfg.side_seeds or cfg.seeds) if w != cfg.main_width else cfg.seeds
            out[(name, w)] = range(min(c.seeds or cfg.seeds, side))
    return out


def mechanism_seeds(cfg: StudyConfig) -> range:
    return range(cfg.mechanism_seeds or cfg.seeds)


def runs(cfg: StudyConfig, results: str) -> list[str]:
    """Every training run's metrics.json: the main cells, then the mechanism cells."""
    pattern, main, serial = run_pattern(results), groups(cfg)["main"], groups(cfg)["mechanism"]
    seeds = cell_seeds(cfg)
    out = [pattern.format(corpus=c, width=w, method=m, seed=k)
           for c in cfg.corpora.names() for w in corpus_widths(cfg)[c] for k in seeds[(c, w)] for m in main]
    out += [pattern.format(corpus=c, width=w, method=m, seed=k)
            for c in cfg.mechanism_corpora for w in cfg.mechanism_widths for k in mechanism_seeds(cfg)
            for m in serial]
    return out
