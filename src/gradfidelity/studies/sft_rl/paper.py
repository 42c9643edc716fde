"""Paper-scale data: LUFFY-style training set (prompts with an expert solution and an answer) and the math and
out-of-domain benchmarks, loaded with `datasets` (hub id or local parquet/jsonl file). Dry-run only here.

The field names differ between releases, so they are config keys (`data.fields`), not guesses in code. Every
problem becomes the same `Problem` record as the arithmetic task (prompt, solution, answer), so the trainers,
the evaluation and the tables do not know which task they run. Benchmarks are grouped into the study's three
evaluation sets: `id` (MATH-500, Minerva, OlympiadBench, AMC: the math suite), `long` (AIME24, AIME25: the
hardest math), `ood` (ARC-c, GPQA-diamond, MMLU-Pro), as in LUFFY's evaluation suite (docs/sources.md, Study A).

Answer checking: the last \\boxed{...} of the completion against the reference answer after whitespace and
`$` stripping. LUFFY's own evaluation uses math_verify (symbolic equivalence), which is not installed here;
this checker is stricter (it can only under-count).
"""

from __future__ import annotations

from pathlib import Path

from gradfidelity.errors import UserError
from gradfidelity.studies.sft_rl.config import DataConfig
from gradfidelity.studies.sft_rl.task import Problem


def _load(spec: str):
    """A `datasets.Dataset` from a local parquet/json/jsonl file or a hub id (split train)."""
    from datasets import load_dataset

    path = Path(spec)
    if path.suffix in (".parquet", ".json", ".jsonl"):
        if not path.exists():
            raise UserError(f"sft_rl.data: {path} does not exist")
        kind = "parquet" if path.suffix == ".parquet" else "json"
        return load_dataset(kind, data_files=str(path), split="train")
    return load_dataset(spec, split="train")


def _text(value) -> str:
    """Chat-format fields (a list of {role, content}) become their last content; lists their first item."""
    if isinstance(value, list):
        if value and isinstance(value[-1], dict) and "content" in value[-1]:
            return str(value[-1]["content"])
        return _text(value[0]) if value else ""
    if isinstance(value, dict):
        for key in ("ground_truth", "content", "text"):
            if key in value:
                return str(value[key])
    return str(value)


def _problem(row: dict, fields: dict, path: str) -> Problem:
    missing = [fields[k] for k in ("prompt", "answer") if fields[k] not in row]
    if missing:
        raise UserError(f"{path}: row without field(s) {missing} (set sft_rl.data.fields)")
    sol = _text(row[fields["solution"]]) if fields.get("solution") in row else ""
    return Problem(_text(row[fields["prompt"]]), sol, _text(row[fields["answer"]]).strip())


def train_problems(cfg: DataConfig) -> list[Problem]:
    ds = _load(cfg.train)
    probs = [_problem(r, cfg.fields, cfg.train) for r in ds]
    if any(not p.solution for p in probs):
        raise UserError(f"{cfg.train}: every training row needs an expert solution ({cfg.fields['solution']})")
    return probs[:cfg.max_train] if cfg.max_train else probs


def eval_problems(cfg: DataConfig) -> dict[str, list[Problem]]:
    ds = _load(cfg.eval)
    key = cfg.fields["benchmark"]
    by_bench: dict[str, list[Problem]] = {}
    for r in ds:
        if key not in r:
            raise UserError(f"{cfg.eval}: row without benchmark field {key!r}")
        by_bench.setdefault(str(r[key]), []).append(_problem(r, cfg.fields, cfg.eval))
    out = {}
    for group, names in cfg.groups.items():
        missing = [n for n in names if n not in by_bench]
        if missing:
            raise UserError(f"{cfg.eval}: benchmark(s) {missing} of group {group!r} not found "
                            f"(have {sorted(by_bench)})")
        out[group] = [p for n in names for p in by_bench[n]]
    return out


def boxed_answer(completion: str) -> str | None:
    """Content of the last \\boxed{...} (balanced braces), or None."""
    start = completion.rfind("\\boxed{")
    if start < 0:
        return None
    i, depth, out = start + len("\\boxed{"), 1, []
    while i < len(completion):
        ch = completion[i]
        depth += ch == "{"
        depth -= ch == "}"
        if depth == 0:
            return "".join(out).strip()
        out.append(ch)
        i += 1
    return None


def is_correct_boxed(completion: str, answer: str) -> bool:
    got = boxed_answer(completion)
    norm = lambda s: s.replace("$", "").replace(" ", "")  # noqa: E731
    return got is not None and norm(got) == norm(answer)
