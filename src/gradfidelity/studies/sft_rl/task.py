"""A verifiable reasoning task: chains of modular arithmetic with step-by-step expert demonstrations.

Why this task: the paper's comparison needs (a) prompts with an exactly checkable answer (the RL reward),
(b) an expert demonstration per prompt (the SFT target and the mixed-policy methods' off-policy data), and
(c) held-out sets of rising difficulty standing in for the math benchmarks. A chain of one-digit operations
modulo 10 has all three and a tiny model can learn it on CPU in minutes.

    prompt        "7+5-3+8="
    demonstration "7+5=2,2-3=9,9+8=7#7"      (evaluated left to right, every partial result mod 10)
    answer        "7"                         (the text after the last '#')

Evaluation sets (the benchmark stand-ins):
    id    same operators (+, -) and chain lengths as training          (in distribution)
    long  longer chains than any training prompt                       (longer / harder)
    ood   chains that contain '*', an operator that never appears in SFT or RL prompts; the base model saw
          single '*' facts during pretraining only                     (out of distribution)

Two more splits (round 3), both off unless sized:
    rl    RL prompts of their own (`task.n_rl`), drawn like train: disjoint from train, every eval set and val, so
          the RL stage is not rewarded on prompts SFT has already memorised (round 2's RL reused the SFT prompts,
          and with a mean reward of 0.75 over 4 rollouts a third of its GRPO groups had zero advantage)
    val   the LR selection's held-out set (`task.n_val`), drawn like id: disjoint from train and every eval set

Every set is generated from its own seed stream; eval problems that also occur in the train split are dropped,
and the pretraining corpus skips every evaluation and val prompt, so no evaluation problem
or its solution appears in pretraining, SFT or RL data (tests/sft_rl/test_task.py checks it for every scale's
config). Round 1's corpus did not skip them: its short worked chains solved 16% of the cpu `id` set.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from gradfidelity.errors import UserError
from gradfidelity.studies.sft_rl.config import TaskConfig

OPS = {"+": lambda a, b, m: (a + b) % m, "-": lambda a, b, m: (a - b) % m, "*": lambda a, b, m: (a * b) % m}
ANSWER_MARK = "#"
EVAL_SETS = ("id", "long", "ood")
# Different fixed offsets per split: the same task seed never produces the same stream for two splits.
_SPLIT_OFFSET = {"train": 0, "id": 1_000_003, "long": 2_000_003, "ood": 3_000_017, "pretrain": 4_000_037,
                 "rl": 5_000_011, "val": 6_000_029}
SPLITS = ("train", *EVAL_SETS, "val", "rl")


@dataclass(frozen=True)
class Problem:
    prompt: str        # "7+5-3+8="
    solution: str      # "7+5=2,2-3=9,9+8=7#7"  (the expert demonstration, no EOS)
    answer: str        # "7"


def solve(first: int, steps: list[tuple[str, int]], modulus: int) -> Problem:
    """The expert: evaluate left to right, writing every partial result."""
    prompt = str(first) + "".join(f"{op}{b}" for op, b in steps) + "="
    value, lines = first, []
    for op, b in steps:
        new = OPS[op](value, b, modulus)
        lines.append(f"{value}{op}{b}={new}")
        value = new
    return Problem(prompt, ",".join(lines) + f"{ANSWER_MARK}{value}", str(value))


def _random_problem(rng: random.Random, n_ops: int, ops: str, modulus: int, need: str | None = None) -> Problem:
    chosen = [rng.choice(ops) for _ in range(n_ops)]
    if need and need not in chosen:
        chosen[rng.randrange(n_ops)] = need
    steps = [(op, rng.randrange(modulus)) for op in chosen]
    return solve(rng.randrange(modulus), steps, modulus)


def _split_spec(cfg: TaskConfig, split: str) -> tuple[tuple[int, int], str, str | None, int]:
    if split in ("train", "id", "val", "rl"):
        n = {"train": cfg.n_train, "id": cfg.n_eval, "val": cfg.n_val, "rl": cfg.n_rl}[split]
        return cfg.train_ops, "+-", None, n
    if split == "long":
        return cfg.long_ops, "+-", None, cfg.n_eval
    if split == "ood":
        return cfg.train_ops, "+-*", "*", cfg.n_eval
    raise UserError(f"unknown split {split!r}; expected one of {SPLITS}")


def _excluded(cfg: TaskConfig, split: str) -> set[str]:
    """Prompts a split may not hold: eval sets exclude train (unchanged since round 2, so the sets stay the same);
    val excludes train and the eval sets; rl excludes all of them."""
    if split == "train":
        return set()
    out = {p.prompt for p in make_split(cfg, "train")}
    if split in ("val", "rl"):
        out |= {p.prompt for s in EVAL_SETS for p in make_split(cfg, s)}
    if split == "rl":
        out |= {p.prompt for p in make_split(cfg, "val")}
    return out


def make_split(cfg: TaskConfig, split: str) -> list[Problem]:
    """Deterministic problems of one split (same cfg -> same list, in the same order, on every machine)."""
    (lo, hi), ops, need, n = _split_spec(cfg, split)
    if n == 0:
        return []
    rng = random.Random(cfg.seed + _SPLIT_OFFSET[split])
    exclude = _excluded(cfg, split)
    out, seen = [], set()
    budget = 200 * n + 1000  # small spaces (short chains) may not hold n distinct prompts: fail loudly
    while len(out) < n and budget > 0:
        budget -= 1
        p = _random_problem(rng, rng.randint(lo, hi), ops, cfg.modulus, need)
        if p.prompt in seen or p.prompt in exclude:
            continue
        seen.add(p.prompt)
        out.append(p)
    if len(out) < n:
        raise UserError(f"sft_rl.task: split {split!r} has only {len(out)} distinct problems, asked {n}")
    return out


def pretrain_corpus(cfg: TaskConfig) -> list[dict[str, str]]:
    """The base model's task text, as prompt -> completion pairs (the loss counts the completion only).

    Two of every three lines are single operator facts of all three operators ("3*4=" -> "2"), the rest short
    worked chains ("7+5-3=" -> "7+5=2,2-3=9#9"), like a base model's web math.

    Why pairs and no bare prompts: a pilot (HISTORY.md, "Rounds 1-2") found that a loss on every token does not teach
    the facts at all. In "a+b=c" two of the three digits are random, their loss drowns the one predictable token, and
    the fact table stays at chance after 600 steps. With the loss on `c` only, the same model learns the whole
    table. Bare prompts are all random digits, so they were dropped for the same reason."""
    rng = random.Random(cfg.seed + _SPLIT_OFFSET["pretrain"])
    held_out = heldout_prompts(cfg)
    lines: list[dict[str, str]] = []
    i = 0
    while len(lines) < cfg.n_pretrain:
        i += 1
        if i % 3:
            a, b, op = rng.randrange(cfg.modulus), rng.randrange(cfg.modulus), rng.choice("+-*")
            prompt, answer = _fact(a, op, b, cfg.modulus)
            lines.append({"prompt": prompt, "completion": answer})
        else:
            lo, hi = cfg.pretrain_worked_ops
            p = _random_problem(rng, rng.randint(lo, hi), "+-", cfg.modulus)
            if p.prompt not in held_out:
                lines.append({"prompt": p.prompt, "completion": p.solution})
    return lines


def _fact(a: int, op: str, b: int, modulus: int) -> tuple[str, str]:
    return f"{a}{op}{b}=", str(OPS[op](a, b, modulus))


def fact_table(cfg: TaskConfig) -> list[tuple[str, str]]:
    """Every operator fact as (prompt, answer), e.g. ("3*4=", "2"): what pretraining must teach."""
    m = cfg.modulus
    return [_fact(a, op, b, m) for op in OPS for a in range(m) for b in range(m)]


def heldout_prompts(cfg: TaskConfig) -> set[str]:
    """Every evaluation prompt (id, long, ood) and every val prompt: what no training or pretraining text may
    contain (with n_val 0 the set, and so the pretraining text, is round 2's)."""
    return {p.prompt for s in (*EVAL_SETS, "val") for p in make_split(cfg, s)}


def extract_answer(completion: str) -> str | None:
    """The text after the last '#', up to the first whitespace; None if there is no '#'."""
    if ANSWER_MARK not in completion:
        return None
    tail = completion.rsplit(ANSWER_MARK, 1)[1].strip()
    return tail.split()[0] if tail else ""


def is_correct(completion: str, answer: str) -> bool:
    """Exact match of the extracted answer (the verifiable reward is 1.0 iff this is True)."""
    got = extract_answer(completion)
    return got is not None and got == answer


def accuracy_table(correct: dict[str, list[bool]]) -> dict[str, float]:
    """Accuracy in points (0-100) per evaluation set and their unweighted macro average."""
    missing = [s for s in EVAL_SETS if s not in correct or not correct[s]]
    if missing:
        raise ValueError(f"no results for evaluation set(s) {missing}")
    acc = {f"acc_{s}": 100.0 * sum(correct[s]) / len(correct[s]) for s in EVAL_SETS}
    acc["acc_macro"] = sum(acc[f"acc_{s}"] for s in EVAL_SETS) / len(EVAL_SETS)
    return acc
