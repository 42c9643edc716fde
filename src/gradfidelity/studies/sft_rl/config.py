"""The study's typed configuration: one frozen dataclass tree, built by `gradfidelity.config.build`.

Why this shape:
- The schema (workflow/schemas/sft_rl.schema.yaml) is the one place of every type, enum, range and default, so no
  field here has a default; `load` validates a whole section against it (filling its defaults) and builds the tree.
  What the schema cannot express (a lower bound not above its upper bound, unique model names, luffy data needing
  its files) is checked in `__post_init__`, raising UserError naming the key, when the workflow loads the config.
- A job gets only the sub-sections it reads (rules.JOB_KEYS: editing any other key does not rerun it). `load_job`
  builds exactly those, from the section the workflow already validated and filled; every other section is None,
  so a job that reads a section it was not given fails loudly instead of running on a default.
Torch-free: the workflow and the plan import it at parse time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from gradfidelity import config as shared
from gradfidelity.errors import UserError

STUDY = "sft_rl"


@dataclass(frozen=True)
class ModelConfig:
    """One entry of `models`: a tiny model built here, or (hub_id set) a paper model loaded by hub id, whose other
    fields are then ignored."""

    name: str
    arch: str                 # qwen2 | llama
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    max_position: int
    hub_id: str | None

    def __post_init__(self):
        if self.hub_id is None and self.hidden_size % self.num_heads:
            raise UserError(f"sft_rl.models[{self.name}]: hidden_size must be divisible by num_heads")


@dataclass(frozen=True)
class TaskConfig:
    """`task`: sizes and difficulty of each split of the arithmetic task (task.py)."""

    seed: int
    modulus: int
    n_train: int
    n_eval: int
    train_ops: tuple[int, int]            # inclusive range of operators per chain (train and `id`)
    long_ops: tuple[int, int]             # the `long` set
    n_pretrain: int                       # prompt -> completion lines of pretraining text
    pretrain_worked_ops: tuple[int, int]  # worked examples in the pretraining text are this short
    n_rl: int                             # RL prompts of their own (0: RL reuses the train split)
    n_val: int                            # the LR selection's held-out set (0: none)

    def __post_init__(self):
        for key in ("train_ops", "long_ops", "pretrain_worked_ops"):
            lo, hi = getattr(self, key)
            if not 1 <= lo <= hi:
                raise UserError(f"sft_rl.task.{key}: need 1 <= lo <= hi, got {[lo, hi]}")


@dataclass(frozen=True)
class DataConfig:
    """`data`: `arithmetic` (the generated task) or `luffy` (paper scale, paper.py). The column names differ between
    releases, so they are keys (`fields`), not guesses in code."""

    source: str
    train: str                            # hub id or local file of the training set
    eval: str                             # hub id or local file holding every benchmark
    fields: dict[str, str]
    groups: dict[str, tuple[str, ...]]    # benchmarks per evaluation set id / long / ood
    max_train: int                        # 0: all

    def __post_init__(self):
        if self.source == "luffy" and not (self.train and self.eval):
            raise UserError("sft_rl.data: source luffy needs data.train and data.eval")
        if set(self.groups) != {"id", "long", "ood"}:
            raise UserError(f"sft_rl.data.groups: need exactly id, long, ood; got {sorted(self.groups)}")


@dataclass(frozen=True)
class PretrainConfig:
    steps: int
    batch_size: int
    lr: float


@dataclass(frozen=True)
class SFTConfig:
    steps: int                # optimizer steps
    micro_batch_size: int     # LUFFY's SFT recipe: micro batch 1 ...
    grad_accum: int           # ... and GA 8 (train batch 64 on 8 GPUs), docs/sources.md, Study A
    lr: float
    warmup_ratio: float
    max_grad_norm: float
    weight_decay: float
    # SFT-then-RL's start (issue 59): the last step, of 0, start_every, 2 start_every, ..., before val accuracy first
    # exceeds start_max_val, so its RL stage has room to learn on every seed (0: the SFT run's end, as before)
    start_every: int
    start_max_val: float


@dataclass(frozen=True)
class RLConfig:
    steps: int
    prompts_per_step: int
    num_generations: int
    max_completion_length: int
    lr: float
    temperature: float
    loss_type: str            # fixed: TRL's dapo, the global token mean over the generation batch
    scale_rewards: str
    max_grad_norm: float
    truncated_fraction: float  # 50 of 500 RL steps at paper scale
    length_groups: int         # 0: TRL's padded log-prob forward; k: k length-sorted micro-batches, each trimmed
    eval_steps: tuple[int, ...]  # smaller RL budgets read off the same runs (each is also evaluated at each step)

    def __post_init__(self):
        bad = [k for k in self.eval_steps if not 0 < k < self.steps]
        if bad or len(set(self.eval_steps)) != len(self.eval_steps):
            raise UserError(f"sft_rl.rl.eval_steps: {list(self.eval_steps)} must be distinct steps between 1 and "
                            f"rl.steps - 1 = {self.steps - 1}")


@dataclass(frozen=True)
class MixedConfig:
    luffy_gamma: float
    srft_sft_coef: float
    srft_pos_coef: float
    relift_buffer_size: int
    hpt_gate: int


@dataclass(frozen=True)
class LRSelectionConfig:
    """`lr_selection`: the RL-stage LR of every arm chosen by one rule on a selection seed (lr_select.py)."""

    lrs: tuple[float, ...]
    seed: int
    factor: float
    max_extensions: int

    @property
    def enabled(self) -> bool:
        return bool(self.lrs)


@dataclass(frozen=True)
class CompareWithConfig:
    """`compare_with`: earlier records of this study (a folder of run directories) whose RL stage ended at `rl_steps`,
    each compared with the live run of the same cell evaluated at that step (earlier.py). Empty records: none."""

    records: str
    rl_steps: int

    @property
    def enabled(self) -> bool:
        return bool(self.records)


@dataclass(frozen=True)
class DeepSpeedConfig:
    """`deepspeed`: the engine every training stage runs on (infra.ds_config turns it into DeepSpeed's JSON).

    optimizer torch_adamw: the Trainer's torch AdamW as DeepSpeed's client optimizer (no JIT build; the bug is in the
    gradient path, not in the optimizer); ds_cpu_adam: DeepSpeedCPUAdam as in OpenRLHF's --adam_offload.
    bucket_size: DeepSpeed's default 5e8 suits 7B models; 0.18.9 allocates a fresh bucket every micro-step and under
    the harness's deterministic mode torch fills every torch.empty (2 GB at 5e8): > 1 s per micro-step on a CPU, so
    tiny models use a small bucket (no effect on the bug)."""

    enabled: bool
    zero_stage: int
    offload_optimizer: str    # cpu | none
    optimizer: str
    bucket_size: int


@dataclass(frozen=True)
class StudyConfig:
    """The `sft_rl` section. Every field but `models` is None in a job that was not given it (rules.JOB_KEYS)."""

    models: tuple[ModelConfig, ...] | None
    seeds: tuple[int, ...] | None
    base_seeds: tuple[int, ...] | None  # the base models' pretraining seeds (plan.base_seed: which seed starts where)
    methods: tuple[str, ...] | None
    variants: tuple[str, ...] | None
    bug_stages: tuple[str, ...] | None
    task: TaskConfig | None
    pretrain: PretrainConfig | None
    sft: SFTConfig | None
    rl: RLConfig | None
    mixed: MixedConfig | None
    compare_with: CompareWithConfig | None
    lr_selection: LRSelectionConfig | None
    deepspeed: DeepSpeedConfig | None
    data: DataConfig | None
    threads: int | None
    checkpoint_every: int | None   # optimizer steps between Trainer checkpoints (0: none)
    eval_batch_size: int | None
    alignment_windows: int | None  # SFT windows whose micro-batch gradient Gram matrices ds_audit's A3 reads
    ranks: int | None              # processes per SFT / RL job (read by the rules; the job reads WORLD_SIZE)

    def __post_init__(self):
        if self.models is not None and len({m.name for m in self.models}) != len(self.models):
            raise UserError("sft_rl.models: model names must be unique")
        sel = self.lr_selection
        if sel is not None and sel.enabled:
            if self.seeds is not None and sel.seed in self.seeds:
                raise UserError(f"sft_rl.lr_selection.seed: {sel.seed} is an evaluation seed (sft_rl.seeds); the "
                                "LR is chosen on a seed of its own")
            if self.task is not None and self.data is not None and self.data.source == "arithmetic" \
                    and self.task.n_val == 0:
                raise UserError("sft_rl.lr_selection.lrs: the selection scores val accuracy; set sft_rl.task.n_val")
        cmp = self.compare_with
        if cmp is not None and cmp.enabled and self.rl is not None and cmp.rl_steps not in self.budgets:
            raise UserError(f"sft_rl.compare_with.rl_steps: {cmp.rl_steps} is not one of this config's RL budgets "
                            f"{self.budgets} (rl.eval_steps and rl.steps): the live runs have no evaluation there")

    def model(self, name: str) -> ModelConfig:
        for m in self.models:
            if m.name == name:
                return m
        raise UserError(f"sft_rl.models: no model named {name!r}")

    @property
    def truncated_steps(self) -> int:
        """RL steps of the truncated SFT-then-RL (the same fraction of RL as 50 of the paper's steps)."""
        return self.truncated_at(self.rl.steps)

    def truncated_at(self, budget: int) -> int:
        """RL steps of the truncated SFT-then-RL at an RL budget of `budget` steps (rl.truncated_fraction of it)."""
        return max(1, round(budget * self.rl.truncated_fraction))

    @property
    def budgets(self) -> list[int]:
        """Every RL budget (in optimizer steps) the study reads, smallest first: rl.eval_steps and rl.steps. A budget
        below rl.steps is its runs evaluated at that step: constant LR on one RNG stream, and greedy evaluation draws
        no random number, so the first k steps of the long run are the k-step run."""
        return sorted({*self.rl.eval_steps, self.rl.steps})

    def eval_steps_of(self, method: str) -> list[int]:
        """The steps at which a run of an RL-stage `method` is evaluated inside the run, besides its end: every smaller
        budget, and for SFT-then-RL each budget's truncation step (the truncated arm at that budget)."""
        steps = set(self.rl.eval_steps)
        if method == "sft_then_rl":
            steps |= {self.truncated_at(b) for b in self.budgets}
        return sorted(steps)  # a truncation step may be the last step itself (a run of a step or two)

    def record(self) -> dict:
        """The sections this config holds, as plain data (what a run records in provenance.json)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


def load(section: dict) -> StudyConfig:
    """A whole `sft_rl` section: checked against the schema (which fills its defaults), then built. The workflow
    calls it when it loads, so a bad key or a failed cross-field check stops it before any job."""
    return shared.load(StudyConfig, section, STUDY)


def load_job(section: dict, keys: Iterable[str]) -> StudyConfig:
    """A job's part of a section (`keys`: rules.JOB_KEYS[job]), as the rule passes it: the workflow validated the whole
    section and filled its defaults, so the part is built as it is; the sections the job is not given are None."""
    keys = set(keys)
    missing, extra = sorted(keys - set(section)), sorted(set(section) - keys)
    if missing or extra:
        raise UserError(f"sft_rl --cfg: this job reads exactly {sorted(keys)} (rules.JOB_KEYS); "
                        f"missing {missing}, not read {extra}")
    return shared.build(StudyConfig, section, STUDY)
