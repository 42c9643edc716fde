"""The typed config of study B: the whole `async_pp` section (config/<scale>/async_pp.yaml) as frozen dataclasses,
and the study's closed vocabularies (importable without torch: Snakemake reads them at parse time).

Built only by `gradfidelity.config.build` (through `load` here, after the schema check), never by hand: the schema
(workflow/schemas/async_pp.schema.yaml) is the one place for types, enums, defaults and their descriptions, so no
field below has a default. Each job gets only the sections it reads (`rules.JOB_KEYS`): a section a job is not
given is None in its `StudyConfig`, and `StudyConfig.need` names it when a job reads it, instead of falling back
to a silent default. What the schema cannot say is checked in `__post_init__`, naming the key, when the workflow
loads the config.

Words: `schedule` = where the gradient is evaluated (sync, 2bw, pipedream, pipedream_vsync); `mitigation` = the
add-on (none, error_feedback, taylor, sync_start, sync_cooldown); `head` = whether the LM head is tied to the
embedding (tied, untied); `lr` = `tuned` (the LR chosen on the sync schedule, lr_select.py), `own` (the LR chosen
on the cell's own async schedule) or a grid point `x<multiplier>` of the optimizer's default LR. The same words are
config keys, wildcard/path parts (`schedule~2bw/mitigation~taylor`), table columns and code names.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gradfidelity.errors import UserError

STUDY = "async_pp"
SCHEDULES = ("sync", "2bw", "pipedream", "pipedream_vsync")
MITIGATIONS = ("none", "error_feedback", "taylor", "sync_start", "sync_cooldown")
HEADS = ("tied", "untied")
FINEWEB_EDU = "HuggingFaceFW/fineweb-edu"  # the schema's default `data.path`
DTYPE_NAMES = ("float32", "float64")  # config `train.dtype` (model.DTYPES maps them to torch dtypes)
DELAY_READERS = ("sync_start", "sync_cooldown", "taylor")  # the mitigations whose settings live in `delay`

# The one place of every optimizer's default peak LR and momentum (the centre of the LR grid; the momentum outside
# the momentum sweep). Not config keys: the LR a cell trains at is chosen on sync from a grid of multiples of this
# default (config `lr_selection`). Sources and the other hyperparameters: optimizers.py. Muon's LR is the
# Moonlight-adjusted one (update RMS 0.2 lr at any width, as AdamW's), so it is on AdamW's scale; see optimizers.py.
DEFAULTS = {
    "adamw": {"lr": 2e-3, "momentum": 0.9},
    "muon": {"lr": 2e-3, "momentum": 0.95},
    "soap": {"lr": 3e-3, "momentum": 0.95},
    "adan": {"lr": 2e-3, "momentum": 0.98},
    "lion": {"lr": 4e-4, "momentum": 0.99},
    "mars": {"lr": 3e-3, "momentum": 0.95},
    # Muon on every matrix, the embedding and the LM head too (issue 60): at d 32 those are 47% of the parameters,
    # and in the `muon` arm they train with AdamW, so its f mixes Muon's robustness with AdamW's share
    "muon_all": {"lr": 2e-3, "momentum": 0.95},
}
OPTIMIZERS = tuple(DEFAULTS)
# The Adam-type optimizers whose second-moment decay stays fixed when the momentum (beta1) moves; AdamW's moves with
# it (`adam_beta2`). Why: optimizers.py.
FIXED_BETA2 = {"soap": 0.95, "mars": 0.99}


def adam_beta2(beta1: float) -> float:
    """AdamW's beta2 at momentum beta1: 1 - beta2 = (1 - beta1) / 2, written (1 + beta1) / 2, which is exactly 0.95
    at 0.9 in floating point."""
    return (1.0 + beta1) / 2.0


def check_betas(name: str, momentum: float, key: str = "momentum") -> None:
    """beta1 < sqrt(beta2) for an Adam-type optimizer at `momentum`, else a UserError naming `key`."""
    beta2 = adam_beta2(momentum) if name == "adamw" else FIXED_BETA2.get(name)
    if beta2 is not None and not momentum < beta2 ** 0.5:
        raise UserError(f"bad config key '{STUDY}.{key}': {name} at momentum (beta1) {momentum} has beta2 {beta2}, "
                        f"so beta1 >= sqrt(beta2) = {beta2 ** 0.5:.4f}, where Adam-type updates are unstable")


def _bad(key: str, why: str) -> UserError:
    return UserError(f"bad config key '{STUDY}.{key}': {why}")


@dataclass(frozen=True)
class LrSelection:
    multipliers: tuple[float, ...]
    seed: int
    max_extensions: int
    near_tie_sd: dict[str, float]  # optimizer -> seed-to-seed sd (nats): a near-tie within it goes to the smaller LR
    steps: int | None  # the grid runs' budget; None = train.steps (grid_budget)
    check_steps: int | None  # the budget each sync and 2bw choice is checked at (plan.check_cells); None = none
    check_optimizers: tuple[str, ...] | None  # whose choices the check reads; None = every optimizer of the grid

    def __post_init__(self):
        unknown = sorted(set(self.near_tie_sd) - set(OPTIMIZERS))
        if unknown:
            raise _bad("lr_selection.near_tie_sd", f"{unknown} are not optimizers ({list(OPTIMIZERS)})")
        bad = {o: v for o, v in self.near_tie_sd.items() if not (isinstance(v, (int, float)) and v >= 0)}
        if bad:
            raise _bad("lr_selection.near_tie_sd", f"{bad}: each sd must be a number >= 0")


@dataclass(frozen=True)
class ModelConfig:
    """The SmolLM-style decoder's shape (model.py). `vocab_size` 0 = the tokenizer's (`with_vocab`)."""

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    max_seq_len: int
    tie_embeddings: bool
    rope_theta: float
    norm_eps: float
    init_std: float

    def __post_init__(self):
        if self.d_model % self.n_heads:
            raise _bad("model.n_heads", f"d_model {self.d_model} must divide by n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise _bad("model.n_kv_heads", f"n_heads {self.n_heads} must divide by n_kv_heads {self.n_kv_heads}")
        if (self.d_model // self.n_heads) % 2:
            raise _bad("model.n_heads", f"head dim d_model / n_heads = {self.d_model // self.n_heads} must be even "
                       "for RoPE")

    @property
    def n_units(self) -> int:
        """Pipeline units: embedding, two per block (attention half, MLP half), final norm + head. Half-block
        units let a 3-layer smoke model still be cut into 8 pipeline stages."""
        return 2 * self.n_layers + 2

    def at_width(self, d_model: int) -> ModelConfig:
        """The same model at hidden size `d_model` (the width ladder): d_ff in proportion, everything else fixed."""
        return replace(self, d_model=int(d_model), d_ff=round(self.d_ff * d_model / self.d_model))

    def n_params(self, vocab_size: int, tied: bool) -> int:
        """Parameters of model.py's decoder at this shape (tests/async_pp check it against the built model): the
        embedding, per block q/o (d x d), k/v (d x kv heads x head dim), SwiGLU (3 d d_ff) and two gains, the
        final gain, and the head unless tied."""
        d, hd = self.d_model, self.d_model // self.n_heads
        block = 2 * d * d + 2 * d * self.n_kv_heads * hd + 3 * d * self.d_ff + 2 * d
        return vocab_size * d + self.n_layers * block + d + (0 if tied else vocab_size * d)

    def with_vocab(self, vocab_size: int) -> ModelConfig:
        """The tokenizer's vocabulary where the config leaves it to the tokenizer (vocab_size 0)."""
        return replace(self, vocab_size=vocab_size) if self.vocab_size == 0 else self


@dataclass(frozen=True)
class DataConfig:
    corpus: str
    train_chars: int
    val_chars: int
    path: str
    tokenizer: str
    train_tokens: int
    val_tokens: int
    bpe_vocab: int
    val_fraction: float
    max_epochs: float

    def __post_init__(self):
        if self.corpus == "file" and self.path == FINEWEB_EDU:
            raise _bad("data.path", "corpus 'file' needs the path of a text file (the default is FineWeb-Edu's hub id)")


@dataclass(frozen=True)
class TrainConfig:
    steps: int
    batch_size: int
    seq_len: int
    warmup_frac: float
    decay_frac: float
    evals: int
    val_batches: int
    dtype: str
    checkpoint_every: int

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len


@dataclass(frozen=True)
class DelayConfig:
    sync_start_frac: float
    sync_cooldown_frac: float
    taylor_lambda: float
    taylor_adaptive: bool
    taylor_ema: float


@dataclass(frozen=True)
class MainSweep:
    optimizers: tuple[str, ...]


@dataclass(frozen=True)
class MitigationSweep:
    optimizers: tuple[str, ...]
    mitigations: tuple[str, ...]
    at_2T: bool  # also at twice train.steps (the budget rule reads B5 and B9 at T and 2T)


@dataclass(frozen=True)
class MomentumSweep:
    optimizers: tuple[str, ...]
    momenta: tuple[float, ...]


@dataclass(frozen=True)
class DepthSweep:
    optimizers: tuple[str, ...]
    depths: tuple[int, ...]
    schedules: tuple[str, ...]
    at_2T: bool  # also at twice train.steps (the budget rule reads B6 at T and 2T)


@dataclass(frozen=True)
class LengthSweep:
    optimizers: tuple[str, ...]
    steps: tuple[int, ...]


@dataclass(frozen=True)
class LadderExtension:
    optimizers: tuple[str, ...]
    steps: tuple[int, ...]


@dataclass(frozen=True)
class Ladder:
    steps: tuple[int, ...]
    extend: LadderExtension

    def of(self, optimizer: str) -> list[int]:
        """The sync budgets of `optimizer`: the ladder, and its extension where it names the optimizer."""
        more = self.extend.steps if optimizer in self.extend.optimizers else ()
        return sorted({*self.steps, *more})


@dataclass(frozen=True)
class NearTieArm:
    """An async arm whose LR choice was a near-tie, and the grid's best multiplier it also trains at."""

    optimizer: str
    momentum: float
    schedule: str
    depth: int
    multiplier: float

    def __post_init__(self):
        if self.schedule.startswith("pipedream") != (self.depth > 1):
            raise _bad("sweeps.near_tie", f"{self}: depth > 1 is PipeDream's, and PipeDream's depth is > 1")


@dataclass(frozen=True)
class WidthRung:
    """One width of the width ladder: the model at `d_model`, trained for `steps` (its T) on `seeds` seeds."""

    d_model: int
    steps: int
    optimizers: tuple[str, ...]
    seeds: int


@dataclass(frozen=True)
class WidthSweep:
    tokens_per_parameter: float | None
    widths: tuple[WidthRung, ...]

    def rung(self, d_model: int) -> WidthRung:
        for w in self.widths:
            if w.d_model == d_model:
                return w
        raise UserError(f"async_pp: width {d_model} is not in sweeps.width.widths "
                        f"{[w.d_model for w in self.widths]}")


@dataclass(frozen=True)
class Sweeps:
    main: MainSweep
    mitigation: MitigationSweep
    momentum: MomentumSweep
    depth: DepthSweep
    length: LengthSweep
    ladder: Ladder
    near_tie: tuple[NearTieArm, ...]
    width: WidthSweep


@dataclass(frozen=True)
class BenchModel:
    """The fields of the model section the pipeline benchmark overrides (its head is always untied)."""

    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    max_seq_len: int


@dataclass(frozen=True)
class BenchPipeline:
    n_stages: int
    n_micro: int
    steps: int
    batch_size: int
    seq_len: int
    optimizer: str  # the schema has no default: every config names it
    model: BenchModel
    repeats: int


@dataclass(frozen=True)
class Bench:
    steps: int
    repeats: int
    optimizers: tuple[str, ...]
    pipeline: BenchPipeline


@dataclass(frozen=True)
class StudyConfig:
    """The whole section; a job's config holds only the sections it reads (`rules.JOB_KEYS`; the others are
    None)."""

    seeds: int | None
    threads_per_run: int | None
    claim_seeds: dict | None  # claim -> seeds, where its power asks for more than `seeds` (plan.CLAIM_SEEDS)
    lr_selection: LrSelection | None
    paper_only: dict | None
    model: ModelConfig | None
    data: DataConfig | None
    train: TrainConfig | None
    delay: DelayConfig | None
    sweeps: Sweeps | None
    bench: Bench | None

    def __post_init__(self):
        if self.seeds is not None and self.lr_selection is not None and self.lr_selection.seed < self.all_seeds:
            raise _bad("lr_selection.seed", f"{self.lr_selection.seed} is one of the evaluation seeds "
                       f"0..{self.all_seeds - 1}: the LR would be chosen on the runs it is judged on")
        if self.model is not None and self.sweeps is not None and self.sweeps.depth.depths \
                and max(self.sweeps.depth.depths) > self.model.n_units:
            raise _bad("sweeps.depth.depths", f"P = {max(self.sweeps.depth.depths)} exceeds the model's "
                       f"{self.model.n_units} pipeline units (2 * model.n_layers + 2)")

        if self.sweeps is not None and self.train is not None:
            self._check_ladder()
        if self.sweeps is not None and self.model is not None and self.train is not None:
            self._check_widths()
        if self.lr_selection is not None and self.lr_selection.check_steps is not None and self.train is not None \
                and self.lr_selection.check_steps <= (self.lr_selection.steps or self.train.steps):
            raise _bad("lr_selection.check_steps", f"{self.lr_selection.check_steps} is not above the grid's budget "
                       f"{self.lr_selection.steps or self.train.steps}: the check reads the choice at a longer one")
        if self.sweeps is not None:
            for o in self.sweeps.momentum.optimizers:
                for m in self.sweeps.momentum.momenta:
                    check_betas(o, m, "sweeps.momentum.momenta")

    def _check_ladder(self) -> None:
        """The sync ladder must hold every budget an async run is compared at (the main budget T, 2T for its
        transient gate, each length: the gate reads the sync loss there) and reach below the smallest of them (an
        async run that loses compute needs a shorter sync budget to be read off)."""
        ladder, T = sorted(self.sweeps.ladder.steps), self.train.steps
        needed = sorted({T, 2 * T, *self.sweeps.length.steps})
        missing = [n for n in needed if n not in ladder]
        if missing:
            raise _bad("sweeps.ladder.steps", f"{ladder} lacks {missing}: it must hold the main budget train.steps "
                       f"= {T}, twice it (the transient gate) and every sweeps.length.steps")
        if ladder[0] >= needed[0]:
            raise _bad("sweeps.ladder.steps", f"the shortest sync budget {ladder[0]} is not below the smallest async "
                       f"budget {needed[0]}: an async run that loses any compute would fall below the ladder")
        low = [n for n in self.sweeps.ladder.extend.steps if n <= ladder[-1]]
        if low:
            raise _bad("sweeps.ladder.extend.steps", f"{low} do not lie above the ladder's top {ladder[-1]}")

    @property
    def all_seeds(self) -> int:
        """The evaluation seeds of any cell: `seeds`, or more where `claim_seeds` asks for them."""
        return max([self.seeds or 0, *(self.claim_seeds or {}).values()])

    def _check_widths(self) -> None:
        """Each width is another width than the model's, fits its heads, and (where the vocabulary is known before
        the run: a file corpus's bpe_vocab, or model.vocab_size) holds tokens_per_parameter within 1%."""
        ws, tied = self.sweeps.width, self.model.tie_embeddings
        vocab = self.model.vocab_size or (self.data.bpe_vocab if self.data is not None and self.data.corpus == "file"
                                          else 0)
        for i, w in enumerate(ws.widths):
            key = f"sweeps.width.widths[{i}]"
            if w.d_model == self.model.d_model:
                raise _bad(key, f"d_model {w.d_model} is the model's own width (the base rung of the ladder)")
            if w.d_model % self.model.n_heads or (w.d_model // self.model.n_heads) % 2:
                raise _bad(key, f"d_model {w.d_model} must divide by n_heads {self.model.n_heads} into an even "
                           "head dim (RoPE)")
            if ws.tokens_per_parameter and vocab:
                n = self.model.at_width(w.d_model).n_params(vocab, tied)
                want = ws.tokens_per_parameter * n / self.train.tokens_per_step
                if abs(w.steps - want) > 0.01 * want:
                    raise _bad(f"{key}.steps", f"{w.steps} steps of {self.train.tokens_per_step} tokens is "
                               f"{w.steps * self.train.tokens_per_step / n:.2f} tokens a parameter at d {w.d_model} "
                               f"({n} parameters), not tokens_per_parameter {ws.tokens_per_parameter:g}: "
                               f"{round(want)} steps")
            unknown = [o for o in w.optimizers if o not in OPTIMIZERS]
            if unknown:
                raise _bad(f"{key}.optimizers", f"{unknown} are not optimizers")

    def need(self, *sections: str) -> StudyConfig:
        """Self, once every named section is there: a job names what it reads, and a rule that did not pass it
        fails here, naming it, rather than at the first attribute of a None."""
        missing = [s for s in sections if getattr(self, s) is None]
        if missing:
            raise UserError(f"{STUDY} config: this job needs the section(s) {missing} (rules.JOB_KEYS)")
        return self


def load(section: dict) -> StudyConfig:
    """The validated, typed section (schema defaults filled): what the workflow checks when it loads the config."""
    from gradfidelity.config import load as load_config

    return load_config(StudyConfig, section, STUDY)


def load_job(section: dict) -> StudyConfig:
    """A job's `--cfg` (the sections `rules.JOB_KEYS` gives it, cut from the validated section) as a typed
    config; the sections it was not given are None."""
    from gradfidelity.config import build

    return build(StudyConfig, section, STUDY)
