"""The DeepSpeed fault matrix, its configuration: which (version, ZeRO stage, offload, GA, dtype, ranks, pattern)
cells exist. The bug description's prediction per cell is in `prediction.py`, the table rows in `rows.py`.

Why a matrix and not one case: the claim (the paper's bug description, docs/sources.md, "Study A: DeepSpeed bug")
is a statement about exactly which configurations lose data; each row is a probe of `steps` consecutive optimizer
steps compared with what that description predicts. Three families of rows:
- accumulation: every stage x offload x GA x dtype, one backward per micro-step, clipping 0;
- multi-backward: GA 1 with `calls` backward() per step, with the boundary marked (`manual`, PR #7981) and without
  (`none`, the open-instruct pattern);
- clipping: faithful norm twice the threshold, the config's `gradient_clipping` either 1.0 (`active`: which
  gradient the clip coefficient is computed on) or left out (`silent`: the version's default threshold).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gradfidelity.errors import UserError
from gradfidelity.studies.ds_audit.ds_step import DSCase

CLIP_THRESHOLD = 1.0  # the clipping rows' threshold (0.19.x's default when silent, docs/sources.md)


def _tuples(d: dict) -> dict:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}


@dataclass(frozen=True)
class MultiBackward:
    calls: int = 4
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    offload: tuple[str, ...] = ("none", "cpu")
    dtypes: tuple[str, ...] = ("fp32",)
    boundaries: tuple[str, ...] = ("manual", "none")


@dataclass(frozen=True)
class Clipping:
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    offload: tuple[str, ...] = ("none", "cpu")
    ga: tuple[int, ...] = (1, 8)
    dtypes: tuple[str, ...] = ("fp32",)
    modes: tuple[str, ...] = ("active", "silent")


@dataclass(frozen=True)
class MatrixConfig:
    versions: tuple[str, ...] = ("0.18.9", "0.19.8")
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    offload: tuple[str, ...] = ("none", "cpu")
    ga: tuple[int, ...] = (1, 2, 3, 4, 8)
    dtypes: tuple[str, ...] = ("fp32", "bf16")
    ranks: tuple[int, ...] = (1, 2)
    micro_batch: int = 2
    steps: int = 3
    case_timeout_s: float = 120.0
    multi_backward: MultiBackward = field(default_factory=MultiBackward)
    clipping: Clipping = field(default_factory=Clipping)

    @classmethod
    def from_dict(cls, d: dict) -> MatrixConfig:
        d = dict(d)
        subs = {"multi_backward": MultiBackward, "clipping": Clipping}
        built = {}
        for key, sub in subs.items():
            part = d.pop(key, {})
            unknown = set(part) - set(sub.__dataclass_fields__)
            if unknown:
                raise UserError(f"ds_audit.matrix.{key}: unknown keys {sorted(unknown)}")
            built[key] = sub(**_tuples(part))
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise UserError(f"ds_audit.matrix: unknown keys {sorted(unknown)}")
        return cls(**_tuples(d), **built)

    def cases(self) -> list[DSCase]:
        """The cases of one (version, ranks) group, in table order."""
        mb, st = self.micro_batch, self.steps
        out = [DSCase(s, o, g, t, 1, mb, 0.0, steps=st) for s in self.zero_stages for o in self.offload
               for g in self.ga for t in self.dtypes]
        m = self.multi_backward
        if m.calls > 1:
            out += [DSCase(s, o, 1, t, m.calls, mb, 0.0, steps=st, boundary=b) for b in m.boundaries
                    for s in m.zero_stages for o in m.offload for t in m.dtypes]
        c = self.clipping
        out += [DSCase(s, o, g, t, 1, mb, CLIP_THRESHOLD if mode == "active" else None, steps=st,
                       target_norm=2 * CLIP_THRESHOLD)
                for mode in c.modes for s in c.zero_stages for o in c.offload for g in c.ga for t in c.dtypes]
        return out
