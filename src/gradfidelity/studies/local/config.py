"""The typed config of study C: the whole `local` section (config/<scale>/local.yaml) as frozen dataclasses.

Built only by `gradfidelity.config.build` (through `load` after the schema check, or `load_job` for a job's
`--cfg`), never by hand: the schema (workflow/schemas/local.schema.yaml) is the one place for types, enums,
defaults and their descriptions, so no field below has a default. Each job gets only the keys it reads
(`rules.JOB_KEYS`): a key a job is not given is None in its config, so reading it fails loudly instead of falling
back to a silent default. What the schema cannot say (n_layer divisible by n_stages, main_width among the widths,
...) is checked in `__post_init__`, naming the key, when the workflow loads the config.

Torch-free on purpose: the job process of a paired cell (train.py) reads the config and only supervises; each
method imports torch in its own fresh process.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from gradfidelity.errors import UserError

STUDY = "local"
# The study's closed vocabularies (the schema's enums say the same): the methods, grouped by how they run, and the
# corpora.
SERIAL_LOCAL = ("live_local", "broadcast_serial", "rgc_serial")
ASYNC = ("broadcast_async", "rgc_async")
MAIN = ("bp", "bp_tm", *ASYNC)  # time-paired in one job: BP, the best-BP candidates and the async methods
METHODS = ("bp", "bp_tm", *SERIAL_LOCAL, *ASYNC)
CORPORA = ("enwik8", "tinystories", "python_docs")
SOURCES = ("embedded", "download", "path", "file")


@dataclass(frozen=True)
class CorpusConfig:
    """`source`: embedded (generated here), download (canonical URL), path (a local copy of the real file:
    enwik8 or enwik8.zip for enwik8; a folder holding the two TinyStoriesV2-GPT4 files for tinystories), or file
    (any byte file, e.g. the user's own text: split contiguously by `split`, its MD5 recorded in meta.json and
    checked against `md5` when that is given). `widths` empty = all of local.widths; `seeds` 0 = local.seeds: the
    plan's, None in the data job's config (`rules.DATA_KEYS`)."""

    source: str
    path: str
    embedded_bytes: int
    widths: tuple[int, ...] | None
    seeds: int | None
    split: tuple[float, ...]
    md5: str


@dataclass(frozen=True)
class Corpora:
    """The corpora to train on (the schema's two names); a corpus not configured is None."""

    enwik8: CorpusConfig | None
    tinystories: CorpusConfig | None
    python_docs: CorpusConfig | None  # the cpu scale's real text (a `source: file` only: it has no stand-in)

    def __post_init__(self):
        for name, c in self.items():
            if c.source in ("path", "file") and not c.path:
                raise UserError(f"local.corpora.{name}.path is empty but source is {c.source!r}")
            if name == "python_docs" and c.source != "file":
                raise UserError(f"local.corpora.python_docs.source is {c.source!r}: the Python-docs text is built "
                                "by `make cpu-data` and read as `source: file` (it has no embedded stand-in and no "
                                "download of its own)")

    def items(self) -> list[tuple[str, CorpusConfig]]:
        """(name, config) of the configured corpora, in the schema's order."""
        return [(f.name, getattr(self, f.name)) for f in fields(self) if getattr(self, f.name) is not None]

    def names(self) -> list[str]:
        return [name for name, _ in self.items()]

    def get(self, name: str) -> CorpusConfig | None:
        return dict(self.items()).get(name)


@dataclass(frozen=True)
class TrainConfig:
    """Model and optimisation settings shared by every method (the schema describes each key)."""

    n_layer: int
    n_head: int
    block_size: int
    batch_size: int
    steps: int
    lr: float
    min_lr_frac: float
    warmup: int
    weight_decay: float
    grad_clip: float
    n_stages: int
    readout_lag: int  # steps: upstream stages see the readout as it was `readout_lag` updates ago
    snapshot_every: int  # the last stage publishes a readout snapshot every k updates
    ring_slots: int  # activation slots per stage boundary
    threads_per_stage: int
    stall_timeout_s: float  # an async stage whose step counter has not moved this long stops the run
    bp_threads: int
    eval_batches: int
    loss_every: int
    # libgomp's wait policy, exported by the rules before torch starts. On a shared, oversubscribed machine the
    # default spin-wait turns each OpenMP barrier into a scheduler quantum (measured: 2 threads 5-9x slower than
    # 1 at width 64); PASSIVE makes waiting threads sleep. "" = the library default. Same for every method.
    omp_wait_policy: str
    checkpoint_every: int

    def __post_init__(self):
        if self.n_layer % self.n_stages:
            raise UserError(f"local.train.n_layer={self.n_layer} is not divisible by "
                            f"local.train.n_stages={self.n_stages}")

    def model(self, width: int):
        from gradfidelity.studies.local.model import ModelConfig

        return ModelConfig(n_layer=self.n_layer, d_model=width, n_head=self.n_head, block_size=self.block_size)

    @property
    def async_threads(self) -> int:
        """Compute threads of an async run: one process per stage, threads_per_stage each."""
        return self.n_stages * self.threads_per_stage

    def threads_for(self, method: str) -> int:
        """Threads of the process that runs `method` (an async run's stages set their own in the workers)."""
        if method == "bp_tm":
            return self.async_threads  # thread-matched BP: the async run's whole compute budget
        if method in ASYNC:
            return self.threads_per_stage
        return self.bp_threads  # BP and the serial local methods


@dataclass(frozen=True)
class BenchConfig:
    """The benchmark's shape (bench.py): MFU vs the matmul rate, vs a plain nanoGPT loop, the PSS ratio."""

    width: int
    n_layer: int
    batch_size: int
    block_size: int
    threads: int
    steps: int
    rounds: int
    pss_steps: int


@dataclass(frozen=True)
class MemoryConfig:
    """C3's memory probe (memory.py): `steps` training steps (1 at the cpu scale) at a size where the model's state
    counts, each method beside its own bare process tree."""

    width: int
    n_layer: int
    steps: int
    seeds: int


@dataclass(frozen=True)
class StudyConfig:
    """The whole section; a job's config holds only the keys it reads (`rules.JOB_KEYS`), the others are None."""

    widths: tuple[int, ...] | None
    main_width: int | None
    seeds: int | None
    methods: tuple[str, ...] | None
    side_seeds: int | None  # 0 = seeds
    side_methods: tuple[str, ...] | None  # empty = the main cell's methods
    power_seeds: int | None  # 0 = no power cells
    power_methods: tuple[str, ...] | None  # empty = BP and async Broadcast (C4's arms)
    quality_seeds: int | None  # 0 = no quality cells
    quality_methods: tuple[str, ...] | None
    control_seeds: int | None  # 0 = the zero-gap control only where the main cell runs it
    main_corpus: str | None
    mechanism_seeds: int | None  # 0 = seeds
    mechanism_corpora: tuple[str, ...] | None
    mechanism_widths: tuple[int, ...] | None
    margin_pct: float | None
    equivalence_bpb: float | None
    corpora: Corpora | None
    train: TrainConfig | None
    bench: BenchConfig | None
    memory: MemoryConfig | None

    def __post_init__(self):
        if self.widths is not None and self.train is not None:
            for w in self.widths:
                if w % self.train.n_head:
                    raise UserError(f"local.widths: {w} is not divisible by local.train.n_head={self.train.n_head}")
        if self.widths is not None and self.main_width is not None and self.main_width not in self.widths:
            raise UserError(f"local.main_width={self.main_width} is not one of local.widths={list(self.widths)}")
        if self.methods is not None and "bp" not in self.methods:
            raise UserError(f"local.methods={list(self.methods)}: must include 'bp' and only {list(METHODS)}")
        for key in ("side_methods", "power_methods"):
            listed = getattr(self, key)
            if listed and self.methods is not None and not set(listed) <= set(self.methods) & set(MAIN):
                raise UserError(f"local.{key}={list(listed)}: each must be a main-cell method of local.methods "
                                f"({[m for m in MAIN if m in self.methods]})")
        if self.power_seeds and self.seeds is not None and self.power_seeds <= self.seeds:
            raise UserError(f"local.power_seeds={self.power_seeds} must exceed local.seeds={self.seeds} (the power "
                            "cells are seeds seeds..power_seeds-1; 0 = none)")
        if self.quality_seeds and self.seeds is not None:
            first = max(self.seeds, self.power_seeds or 0)
            if self.quality_seeds <= first:
                raise UserError(f"local.quality_seeds={self.quality_seeds} must exceed local.seeds and "
                                f"local.power_seeds ({first}): the quality cells are seeds {first}..quality_seeds-1; "
                                "0 = none")
        if self.control_seeds and self.seeds is not None and self.control_seeds <= self.seeds:
            raise UserError(f"local.control_seeds={self.control_seeds} must exceed local.seeds={self.seeds} (the "
                            "control cells are seeds seeds..control_seeds-1; 0 = none)")
        if self.main_corpus is not None and self.corpora is not None and self.corpora.get(self.main_corpus) is None:
            raise UserError(f"local.main_corpus={self.main_corpus!r} is not one of local.corpora "
                            f"({self.corpora.names()})")
        if self.memory is not None and self.train is not None:
            if self.memory.n_layer % self.train.n_stages:
                raise UserError(f"local.memory.n_layer={self.memory.n_layer} is not divisible by "
                                f"local.train.n_stages={self.train.n_stages}")
            if self.memory.width % self.train.n_head:
                raise UserError(f"local.memory.width={self.memory.width} is not divisible by "
                                f"local.train.n_head={self.train.n_head}")

    def require(self, keys: tuple[str, ...], job: str) -> StudyConfig:
        """This config, after checking that `job` was given every key it reads (a hand-written --cfg may lack one)."""
        missing = [k for k in keys if getattr(self, k) is None]
        if missing:
            raise UserError(f"the {job} job's --cfg lacks local.{', local.'.join(missing)} (it reads "
                            f"{', '.join(keys)})")
        return self


def load(section: dict) -> StudyConfig:
    """The validated, typed section (schema defaults filled): what the workflow checks when it loads the config."""
    from gradfidelity.config import load as load_config

    return load_config(StudyConfig, section, STUDY)


def load_job(data: dict, job: str) -> StudyConfig:
    """A job's `--cfg` (its keys of the validated section, `rules.job_cfg`) as the typed config, checked to hold
    every key `job` reads (`rules.JOB_KEYS`)."""
    from gradfidelity.config import build
    from gradfidelity.studies.local.rules import JOB_KEYS

    return build(StudyConfig, data, STUDY).require(JOB_KEYS[job], job)
