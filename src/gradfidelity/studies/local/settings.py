"""Typed settings of study C, parsed from the JSON the rules pass (`--cfg`), validated before any work.

The JSON schema (workflow/schemas/local.schema.yaml) already checks types and enums in the Snakefile; this module
turns the dict into frozen dataclasses and checks the relations a schema cannot express (n_layer divisible by
n_stages, main_width among the widths, ...), raising UserError with the key's name.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from gradfidelity.errors import UserError

# torch-free on purpose: the job process of a cell (cell.py) parses the settings and only supervises; each method
# imports torch in its own fresh process.


@dataclass(frozen=True)
class CorpusConfig:
    """`source`: embedded (generated here), download (canonical URL), path (a local copy of the real file:
    enwik8 or enwik8.zip for enwik8; a folder holding the two TinyStoriesV2-GPT4 files for tinystories), or file
    (any byte file, e.g. the user's own text: split contiguously by `split`, its MD5 recorded in meta.json and
    checked against `md5` when that is given)."""

    source: str = "embedded"
    path: str = ""
    embedded_bytes: int = 4_000_000
    widths: tuple[int, ...] = ()  # widths this corpus is trained at; empty = all of local.widths
    seeds: int = 0  # paired seeds on this corpus; 0 = local.seeds
    split: tuple[float, ...] = (0.9, 0.05, 0.05)  # source file: train/val/test fractions of the bytes, in order
    md5: str = ""  # source file: the expected MD5 of the file (empty = record it without checking)

SERIAL_LOCAL = ("live_local", "broadcast_serial", "rgc_serial")
ASYNC = ("broadcast_async", "rgc_async")
MAIN = ("bp", "bp_tm", *ASYNC)
METHODS = ("bp", "bp_tm", *SERIAL_LOCAL, *ASYNC)
CORPORA = ("enwik8", "tinystories")


@dataclass(frozen=True)
class TrainConfig:
    n_layer: int = 24
    n_head: int = 4
    block_size: int = 256
    batch_size: int = 8
    steps: int = 2000
    lr: float = 1e-3
    min_lr_frac: float = 0.1
    warmup: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    n_stages: int = 4
    readout_lag: int = 4  # steps: upstream stages see the readout as it was `readout_lag` updates ago
    snapshot_every: int = 1  # the last stage publishes a readout snapshot every k updates
    ring_slots: int = 2  # activation slots per stage boundary
    threads_per_stage: int = 1
    stall_timeout_s: float = 600.0  # an async stage whose step counter has not moved this long stops the run
    bp_threads: int = 1
    eval_batches: int = 16
    loss_every: int = 10
    checkpoint_every: int = 0
    # libgomp's wait policy, exported by the rules before torch starts. On a shared, oversubscribed machine the
    # default spin-wait turns each OpenMP barrier into a scheduler quantum (measured: 2 threads 5-9x slower than
    # 1 at width 64); PASSIVE makes waiting threads sleep. "" = the library default. Same for every method.
    omp_wait_policy: str = ""

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
class LocalSettings:
    train: TrainConfig
    widths: tuple[int, ...] = (128, 256, 384)
    main_width: int = 256
    seeds: int = 5
    methods: tuple[str, ...] = METHODS
    corpora: dict[str, CorpusConfig] = field(default_factory=dict)
    mechanism_corpora: tuple[str, ...] = ("enwik8",)
    mechanism_widths: tuple[int, ...] = (256,)
    margin_pct: float = 1.0
    equivalence_bpb: float = 0.005
    bench: dict = field(default_factory=dict)


def _dc(cls, d: dict, where: str):
    names = {f.name for f in fields(cls)}
    unknown = set(d) - names
    if unknown:
        raise UserError(f"unknown key(s) {sorted(unknown)} in '{where}' (allowed: {sorted(names)})")
    return cls(**d)


def parse(cfg: dict) -> LocalSettings:
    try:
        train = _dc(TrainConfig, dict(cfg.get("train", {})), "local.train")
        corpora = {name: _dc(CorpusConfig, dict(c), f"local.corpora.{name}")
                   for name, c in cfg.get("corpora", {}).items()}
    except TypeError as e:
        raise UserError(f"bad value in config 'local': {e}") from e
    s = LocalSettings(
        train=train, widths=tuple(cfg.get("widths", (128, 256, 384))), main_width=cfg.get("main_width", 256),
        seeds=int(cfg.get("seeds", 5)), methods=tuple(cfg.get("methods", METHODS)), corpora=corpora,
        mechanism_corpora=tuple(cfg.get("mechanism_corpora", ("enwik8",))),
        mechanism_widths=tuple(cfg.get("mechanism_widths", (256,))),
        margin_pct=float(cfg.get("margin_pct", 1.0)), equivalence_bpb=float(cfg.get("equivalence_bpb", 0.005)),
        bench=dict(cfg.get("bench", {})),
    )
    t = s.train
    if t.n_layer % t.n_stages:
        raise UserError(f"local.train.n_layer={t.n_layer} is not divisible by local.train.n_stages={t.n_stages}")
    for w in s.widths:
        if w % t.n_head:
            raise UserError(f"local.widths: {w} is not divisible by local.train.n_head={t.n_head}")
    if s.main_width not in s.widths:
        raise UserError(f"local.main_width={s.main_width} is not one of local.widths={list(s.widths)}")
    bad = [m for m in s.methods if m not in METHODS]
    if bad or "bp" not in s.methods:
        raise UserError(f"local.methods={list(s.methods)}: must include 'bp' and only {list(METHODS)}")
    for c in s.corpora:
        if c not in CORPORA:
            raise UserError(f"local.corpora.{c}: unknown corpus (allowed: {list(CORPORA)})")
    for c, cc in s.corpora.items():
        if cc.source not in ("embedded", "download", "path", "file"):
            raise UserError(f"local.corpora.{c}.source={cc.source!r} (allowed: embedded, download, path, file)")
        if cc.source in ("path", "file") and not cc.path:
            raise UserError(f"local.corpora.{c}.path is empty but source is {cc.source!r}")
    if t.readout_lag < 0 or t.snapshot_every < 1 or t.ring_slots < 1:
        raise UserError("local.train: readout_lag >= 0, snapshot_every >= 1, ring_slots >= 1 required")
    if s.seeds < 1:
        raise UserError(f"local.seeds={s.seeds} must be >= 1")
    return s
