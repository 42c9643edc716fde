"""Typed configuration of the study (config/<scale>/sft_rl.yaml, validated first by the JSON schema).

Rules pass the sub-sections a job depends on as one JSON string (workflow.job_cfg: a training job never sees
`seeds`, `methods` or a later stage's settings, so editing them reruns only the jobs they change);
`StudyConfig.from_dict` turns it into frozen dataclasses (absent sections take their defaults) and raises
UserError naming the key for anything the schema cannot express (cross-field checks).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gradfidelity.errors import UserError
from gradfidelity.studies.sft_rl import plan
from gradfidelity.studies.sft_rl.infra import VARIANTS, DeepSpeedConfig
from gradfidelity.studies.sft_rl.models import ModelConfig
from gradfidelity.studies.sft_rl.paper import DataConfig
from gradfidelity.studies.sft_rl.task import TaskConfig

METHODS = ("sft", "rl", "sft_then_rl", "sft_then_rl_truncated", "luffy", "srft", "relift", "hpt")
MIXED = plan.MIXED
RL_STAGE = plan.RL_STAGE  # methods with their own GRPO run
STAGES = ("sft", "rl")


def _build(cls, d: dict, key: str):
    unknown = set(d) - set(cls.__dataclass_fields__)
    if unknown:
        raise UserError(f"sft_rl.{key}: unknown key(s) {sorted(unknown)}")
    return cls(**d)


@dataclass(frozen=True)
class PretrainConfig:
    steps: int = 300
    batch_size: int = 32
    lr: float = 3e-3


@dataclass(frozen=True)
class SFTConfig:
    steps: int = 100              # optimizer steps
    micro_batch_size: int = 1     # LUFFY's SFT recipe: micro batch 1 ...
    grad_accum: int = 8           # ... and GA 8 (train batch 64 on 8 GPUs), docs/sources.md, Study A
    lr: float = 1e-3
    warmup_ratio: float = 0.05
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0


@dataclass(frozen=True)
class RLConfig:
    steps: int = 40
    prompts_per_step: int = 8
    num_generations: int = 4
    max_completion_length: int = 32
    lr: float = 3e-4
    temperature: float = 1.0
    loss_type: str = "dapo"             # fixed: TRL's global token mean over the generation batch
    scale_rewards: str = "group"
    max_grad_norm: float = 1.0
    truncated_fraction: float = 0.1     # 50 of 500 RL steps at paper scale


@dataclass(frozen=True)
class MixedConfig:
    luffy_gamma: float = 0.1
    srft_sft_coef: float = 0.5
    srft_pos_coef: float = 0.1
    relift_buffer_size: int = 4
    hpt_gate: int = 0


@dataclass(frozen=True)
class StudyConfig:
    models: tuple[ModelConfig, ...]
    seeds: tuple[int, ...]
    methods: tuple[str, ...]
    variants: tuple[str, ...]
    bug_stages: tuple[str, ...]
    task: TaskConfig
    pretrain: PretrainConfig
    sft: SFTConfig
    rl: RLConfig
    mixed: MixedConfig
    deepspeed: DeepSpeedConfig
    data: DataConfig = field(default_factory=DataConfig)
    threads: int = 1
    checkpoint_every: int = 0     # optimizer steps between HF checkpoints (0: none)
    eval_batch_size: int = 64
    alignment_windows: int = 16  # SFT windows whose micro-batch gradient Gram matrices ds_audit's A3 reads
    slurm: dict = field(default_factory=dict)   # mem_mb / runtime_min per training job (read by the rules)
    ranks: int = 1  # processes per SFT / RL job (torchrun, one per GPU; read by the rules, the job reads WORLD_SIZE)
    raw: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_dict(cls, d: dict) -> StudyConfig:
        required = ("models",)
        missing = [k for k in required if k not in d]
        if missing:
            raise UserError(f"sft_rl: missing key(s) {missing}")
        known = set(cls.__dataclass_fields__) - {"raw"}
        unknown = set(d) - known
        if unknown:
            raise UserError(f"sft_rl: unknown key(s) {sorted(unknown)}")
        d = {"seeds": [0], "methods": list(METHODS), "variants": list(VARIANTS), **d}
        for m in d["methods"]:
            if m not in METHODS:
                raise UserError(f"sft_rl.methods: unknown method {m!r}; expected one of {list(METHODS)}")
        for v in d["variants"]:
            if v not in VARIANTS:
                raise UserError(f"sft_rl.variants: unknown variant {v!r}; expected one of {list(VARIANTS)}")
        for s in d.get("bug_stages", ["sft"]):
            if s not in STAGES:
                raise UserError(f"sft_rl.bug_stages: unknown stage {s!r}; expected a subset of {list(STAGES)}")
        cfg = cls(
            models=tuple(ModelConfig.from_dict(m) for m in d["models"]),
            seeds=tuple(d["seeds"]), methods=tuple(d["methods"]), variants=tuple(d["variants"]),
            bug_stages=tuple(d.get("bug_stages", ["sft"])),
            task=TaskConfig.from_dict(d.get("task", {})),
            pretrain=_build(PretrainConfig, d.get("pretrain", {}), "pretrain"),
            sft=_build(SFTConfig, d.get("sft", {}), "sft"),
            rl=_build(RLConfig, d.get("rl", {}), "rl"),
            mixed=_build(MixedConfig, d.get("mixed", {}), "mixed"),
            deepspeed=DeepSpeedConfig.from_dict(d.get("deepspeed", {})),
            data=DataConfig.from_dict(d.get("data", {})),
            threads=d.get("threads", 1), checkpoint_every=d.get("checkpoint_every", 0),
            eval_batch_size=d.get("eval_batch_size", 64),
            alignment_windows=d.get("alignment_windows", 16), slurm=d.get("slurm", {}), raw=d,
        )
        if not 0 < cfg.rl.truncated_fraction < 1:
            raise UserError(f"sft_rl.rl.truncated_fraction: must be in (0, 1), got {cfg.rl.truncated_fraction}")
        if cfg.rl.loss_type not in ("dapo", "bnpo", "grpo", "dr_grpo"):
            raise UserError(f"sft_rl.rl.loss_type: expected dapo, bnpo, grpo or dr_grpo, got {cfg.rl.loss_type!r}")
        if cfg.rl.num_generations < 2:
            raise UserError("sft_rl.rl.num_generations: GRPO needs at least 2 rollouts per prompt")
        if len({m.name for m in cfg.models}) != len(cfg.models):
            raise UserError("sft_rl.models: model names must be unique")
        return cfg

    def model(self, name: str) -> ModelConfig:
        for m in self.models:
            if m.name == name:
                return m
        raise UserError(f"sft_rl.models: no model named {name!r}")

    @property
    def truncated_steps(self) -> int:
        """RL steps of the truncated SFT-then-RL (the same fraction of RL as 50 of the paper's steps)."""
        return max(1, round(self.rl.steps * self.rl.truncated_fraction))


def stage_variant(cfg: StudyConfig, variant: str, stage: str) -> str:
    """The infrastructure a stage of a `variant` cell runs on: the bugs hit only the stages in `bug_stages`
    (default: SFT, where the published baselines were damaged: LUFFY's SFT baseline ran OpenRLHF + DeepSpeed,
    see docs/sources.md, Study A); other stages run `fixed`."""
    return plan.stage_variant({"bug_stages": list(cfg.bug_stages)}, variant, stage)
