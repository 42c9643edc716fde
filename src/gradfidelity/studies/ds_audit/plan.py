"""The study's plan, torch-free: which cases the fault matrix holds, which jobs run them, and where every output goes.

Why a matrix and not one case: the claim (the paper's bug description, docs/sources.md, "Study A: DeepSpeed bug")
is a statement about exactly which configurations lose data; each row is a probe of `steps` consecutive optimizer
steps compared with what that description predicts (`prediction.py`). Three families of rows:
- accumulation: every stage x offload x GA x dtype, one backward per micro-step, clipping 0;
- multi-backward: GA 1 with `calls` backward() per step, with the boundary marked (`manual`, PR #7981) and without
  (`none`, the open-instruct pattern);
- clipping: faithful norm twice the threshold, the config's `gradient_clipping` either 1.0 (`active`: which
  gradient the clip coefficient is computed on) or left out (`silent`: the version's default threshold).
Every case of a (DeepSpeed version, rank count) group runs in one job, in the same rank processes (DeepSpeed's
start-up costs seconds, a case ~0.4 s):  results/<scale>/ds_audit/matrix/deepspeed~<v>/ranks~<r>/seed0/.
"""

from __future__ import annotations

from itertools import product

from gradfidelity.studies.ds_audit.case import DSCase
from gradfidelity.studies.ds_audit.config import MatrixConfig, StudyConfig

CLIP_THRESHOLD = 1.0  # the clipping rows' threshold (0.19.x's default when silent, docs/sources.md)

# Run directories under results/<scale>/ (`results` below); {version} and {ranks} are the group job's wildcards.
GROUP_DIR = "{results}/ds_audit/matrix/deepspeed~{version}/ranks~{ranks}/seed0"
LOSS_AGG_DIR = "{results}/ds_audit/loss_agg/seed0"
# Outputs of the table, figure and claims jobs, by the name each job's CLI option and rule output carry.
TABLES = {"matrix_csv": "ds_fault_matrix.csv", "matrix_md": "ds_fault_matrix.md",
          "loss_csv": "loss_aggregation.csv", "loss_md": "loss_aggregation.md",
          "alignment_csv": "ds_norm_alignment.csv", "alignment_md": "ds_norm_alignment.md"}
FIGURES = {"matrix_png": "ds_fault_matrix.png", "loss_png": "loss_aggregation.png"}
EVIDENCE = "{results}/claims/ds_audit.json"


def cases(m: MatrixConfig) -> list[DSCase]:
    """The cases of one (version, ranks) group, in table order."""
    mb, st = m.micro_batch, m.steps
    out = [DSCase(s, o, g, t, 1, mb, 0.0, steps=st) for s in m.zero_stages for o in m.offload
           for g in m.ga for t in m.dtypes]
    mbk = m.multi_backward
    if mbk.calls > 1:
        out += [DSCase(s, o, 1, t, mbk.calls, mb, 0.0, steps=st, boundary=b) for b in mbk.boundaries
                for s in mbk.zero_stages for o in mbk.offload for t in mbk.dtypes]
    c = m.clipping
    out += [DSCase(s, o, g, t, 1, mb, CLIP_THRESHOLD if mode == "active" else None, steps=st,
                   target_norm=2 * CLIP_THRESHOLD)
            for mode in c.modes for s in c.zero_stages for o in c.offload for g in c.ga for t in c.dtypes]
    return out


def group_file(results: str, name: str, version: str = "{version}", ranks: int | str = "{ranks}") -> str:
    """A file of a group job's run directory (with the defaults: the rule's pattern, wildcards left in)."""
    return GROUP_DIR.format(results=results, version=version, ranks=ranks) + f"/{name}"


def group_metrics(results: str, version: str = "{version}", ranks: int | str = "{ranks}") -> str:
    return group_file(results, "metrics.json", version, ranks)


def group_runs(cfg: StudyConfig, results: str) -> list[str]:
    """Every group job's metrics.json: versions x ranks, versions outermost (the order the rows are read in)."""
    return [group_metrics(results, v, r) for v, r in product(cfg.matrix.versions, cfg.matrix.ranks)]


def loss_agg_file(results: str, name: str = "metrics.json") -> str:
    """A file of the loss-aggregation run's directory."""
    return LOSS_AGG_DIR.format(results=results) + f"/{name}"


def tables(root: str) -> dict[str, str]:
    """The paper tables under paper_tables/<scale> (`root`), by name."""
    return {k: f"{root}/{name}" for k, name in TABLES.items()}


def figures(root: str) -> dict[str, str]:
    """The figures under figures/<scale> (`root`), by name."""
    return {k: f"{root}/{name}" for k, name in FIGURES.items()}


def evidence(results: str) -> str:
    return EVIDENCE.format(results=results)
