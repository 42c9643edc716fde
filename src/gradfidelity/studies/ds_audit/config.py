"""The typed config of the study: the whole `ds_audit` section (config/<scale>/ds_audit.yaml) as frozen dataclasses.

Built only by `gradfidelity.config.build` (through `load` here, after the schema check), never by hand: the schema
(workflow/schemas/ds_audit.schema.yaml) is the one place for types, enums, defaults and their descriptions, so no
field below has a default. Each job gets only the keys it reads (`rules.JOB_KEYS`): what a job is not given is a
`X | None` field and is None there, so reading it fails loudly instead of falling back to a silent default.
What the schema cannot say is checked in `__post_init__`, naming the key, when the workflow loads the config.
"""

from __future__ import annotations

from dataclasses import dataclass

from gradfidelity.errors import UserError

STUDY = "ds_audit"


def _distinct(obj, where: str, names: tuple[str, ...]) -> None:
    """A repeated list entry would plan the same row (or run) twice and count it twice in a claim's n."""
    for name in names:
        values = getattr(obj, name)
        if values is not None and len(set(values)) != len(values):
            raise UserError(f"bad config key '{where}.{name}': repeated entries in {list(values)}")


@dataclass(frozen=True)
class MultiBackward:
    """The PR #7981 rows: GA 1 with `calls` backward() per optimizer step (calls 1: no such rows)."""

    calls: int
    zero_stages: tuple[int, ...]
    offload: tuple[str, ...]
    dtypes: tuple[str, ...]
    boundaries: tuple[str, ...]

    def __post_init__(self):
        _distinct(self, f"{STUDY}.matrix.multi_backward", ("zero_stages", "offload", "dtypes", "boundaries"))


@dataclass(frozen=True)
class Clipping:
    """The clipping rows: faithful norm twice the threshold, gradient_clipping set (active) or left out (silent)."""

    zero_stages: tuple[int, ...]
    offload: tuple[str, ...]
    ga: tuple[int, ...]
    dtypes: tuple[str, ...]
    modes: tuple[str, ...]

    def __post_init__(self):
        _distinct(self, f"{STUDY}.matrix.clipping", ("zero_stages", "offload", "ga", "dtypes", "modes"))


@dataclass(frozen=True)
class MatrixConfig:
    """The fault matrix. `versions` and `ranks` say which (version, ranks) group jobs exist: the plan reads them,
    a group job gets its own version and rank count from its wildcards (so they are None in its config)."""

    versions: tuple[str, ...] | None
    zero_stages: tuple[int, ...]
    offload: tuple[str, ...]
    ga: tuple[int, ...]
    dtypes: tuple[str, ...]
    ranks: tuple[int, ...] | None
    micro_batch: int
    steps: int
    case_timeout_s: float
    multi_backward: MultiBackward
    clipping: Clipping

    def __post_init__(self):
        where = f"{STUDY}.matrix"
        _distinct(self, where, ("versions", "zero_stages", "offload", "ga", "dtypes", "ranks"))
        for name in ("versions", "ranks"):
            if getattr(self, name) is not None and not getattr(self, name):
                raise UserError(f"bad config key '{where}.{name}': empty, so the matrix has no group to run")
        accumulation = self.zero_stages and self.offload and self.ga and self.dtypes
        m, c = self.multi_backward, self.clipping
        multi = m.calls > 1 and m.zero_stages and m.offload and m.dtypes and m.boundaries
        clipping = c.zero_stages and c.offload and c.ga and c.dtypes and c.modes
        if not (accumulation or multi or clipping):
            raise UserError(f"bad config key '{where}': no case (accumulation, multi_backward and clipping rows "
                            "are all empty)")


@dataclass(frozen=True)
class LossAggConfig:
    """The loss-aggregation audit (loss_agg.py): M micro-batches x b sequences of lengths ~ U[mean (1 - s),
    mean (1 + s)] for each spread s, `seeds` windows each, on a tiny Llama."""

    micro_batches: int
    seqs_per_micro: int
    mean_len: int
    spreads: tuple[float, ...]
    seeds: int
    vocab: int
    hidden: int
    layers: int
    threads: int

    def __post_init__(self):
        _distinct(self, f"{STUDY}.loss_aggregation", ("spreads",))  # A4 correlates over distinct spread levels


@dataclass(frozen=True)
class StudyConfig:
    """The whole section; a job's config holds only the sections it reads (the others are None)."""

    matrix: MatrixConfig | None
    loss_aggregation: LossAggConfig | None


def load(section: dict) -> StudyConfig:
    """The validated, typed section (schema defaults filled): what the workflow checks when it loads the config."""
    from gradfidelity.config import load as load_config

    return load_config(StudyConfig, section, STUDY)

