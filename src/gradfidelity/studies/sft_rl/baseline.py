"""The constant-answer baseline: what a model scores by always giving each evaluation set's most frequent answer.

Why: a model that answers by rote can still score (round 1's smoke SFT model scored below "always 4"), so every
table shows this row, and an eval set counts in the claims' score only where the fixed SFT model beats its constant
answer (claims.counted_sets: below it the set compares noise). The `reference_learned` gate is against the model's
own start instead (round 3, issue 24: the untrained base model passed the constant-answer gate): the fixed SFT model
must beat the base model by GATE_MARGIN points on `id` (claims.reference_gate).
Computed from the task generator (or the paper-scale eval files), not from any run.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from gradfidelity.errors import UserError
from gradfidelity.studies.sft_rl.config import StudyConfig
from gradfidelity.studies.sft_rl.task import EVAL_SETS, make_split

GATE = "reference_learned"
GATE_MARGIN = 10.0  # points above the base model the fixed SFT model must reach (in-distribution set)
CONSTANT = "constant_answer"


def constant_baseline(cfg: StudyConfig) -> dict:
    """Accuracy (points) of the best constant answer per eval set: always answering the set's most frequent
    answer. The reference a model must clearly beat before its scores say anything about training.

    {"sets": {set: {"answer", "acc", "n"}}, "acc_macro": float} or {"error": why} when the eval data cannot be
    read (paper-scale data absent here)."""
    try:
        if cfg.data.source == "arithmetic":
            problems = {s: make_split(cfg.task, s) for s in EVAL_SETS}
            norm = str
        else:
            from gradfidelity.studies.sft_rl import paper

            problems = paper.eval_problems(cfg.data)
            norm = lambda s: s.replace("$", "").replace(" ", "")  # noqa: E731  (the checker's normalisation)
    except (UserError, OSError, ValueError, ImportError) as exc:
        return {"error": f"eval data unavailable ({exc})"}
    sets = {}
    for s in EVAL_SETS:
        answers = Counter(norm(p.answer) for p in problems[s])
        answer, count = answers.most_common(1)[0]
        sets[s] = {"answer": answer, "acc": 100.0 * count / len(problems[s]), "n": len(problems[s])}
    return {"sets": sets, "acc_macro": float(np.mean([sets[s]["acc"] for s in EVAL_SETS]))}
