"""Evaluation of a trained model: greedy exact-match accuracy per evaluation set, the demonstrations' teacher-forced
NLL (the low-noise secondary endpoint), and the base model's fact-table accuracy.

Greedy decoding draws no random numbers, so evaluating inside a run (the truncated SFT-then-RL at step k) leaves
the training's random stream untouched. The problems come from the generated task or (paper scale) the LUFFY-style
benchmarks, both as `task.Problem`, so evaluation does not know which task it runs.
"""

from __future__ import annotations

import torch

from gradfidelity.errors import UserError
from gradfidelity.studies.sft_rl import paper
from gradfidelity.studies.sft_rl.config import StudyConfig
from gradfidelity.studies.sft_rl.task import EVAL_SETS, Problem, accuracy_table, fact_table, is_correct, make_split


@torch.no_grad()
def evaluate(model, tok, problems: list[Problem], batch_size: int, check=is_correct) -> list[bool]:
    """Greedy decoding (deterministic, draws no random numbers), exact-match answers."""
    was_training = model.training
    model.eval()
    max_new = max(len(p.solution) for p in problems) + 4
    out: list[bool] = []
    tok.padding_side = "left"
    for i in range(0, len(problems), batch_size):
        chunk = problems[i:i + batch_size]
        enc = tok([p.prompt for p in chunk], add_special_tokens=False, padding=True, return_tensors="pt")
        gen = model.generate(**enc, max_new_tokens=max_new, do_sample=False, pad_token_id=tok.pad_token_id,
                             eos_token_id=tok.eos_token_id)
        texts = tok.batch_decode(gen[:, enc["input_ids"].size(1):], skip_special_tokens=True)
        out += [check(t, p.answer) for t, p in zip(texts, chunk, strict=True)]
    model.train(was_training)
    return out


def eval_problems(cfg: StudyConfig) -> dict[str, list[Problem]]:
    if cfg.data.source == "arithmetic":
        return {s: make_split(cfg.task, s) for s in EVAL_SETS}
    return paper.eval_problems(cfg.data)


def checker(cfg: StudyConfig):
    """Exact match of the final answer: after '#' (arithmetic) or in the last \\boxed{} (paper data)."""
    return is_correct if cfg.data.source == "arithmetic" else paper.is_correct_boxed


@torch.no_grad()
def demo_nll(model, tok, problems: list[Problem], batch_size: int) -> float:
    """Held-out teacher-forced NLL (nats per token) of the demonstrations (solution + EOS) given their prompts:
    the low-noise secondary endpoint (no sampling, no exact-match threshold), a token mean over the whole set."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    eos, pad = tok.eos_token_id, tok.pad_token_id
    for i in range(0, len(problems), batch_size):
        chunk = problems[i:i + batch_size]
        prompts = tok([p.prompt for p in chunk], add_special_tokens=False)["input_ids"]
        demos = tok([p.solution for p in chunk], add_special_tokens=False)["input_ids"]
        seqs = [a + b + [eos] for a, b in zip(prompts, demos, strict=True)]
        length = max(len(x) for x in seqs)
        ids = torch.full((len(seqs), length), pad, dtype=torch.long)
        attn = torch.zeros_like(ids)
        target = torch.zeros_like(ids, dtype=torch.bool)  # tokens of the demonstration (+ EOS)
        for j, (x, a) in enumerate(zip(seqs, prompts, strict=True)):
            ids[j, :len(x)] = torch.tensor(x)
            attn[j, :len(x)] = 1
            target[j, len(a):len(x)] = True
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
        logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
        mask = target[:, 1:]
        total += float(-(logp * mask).sum())
        count += int(mask.sum())
    model.train(was_training)
    return total / max(count, 1)


def evaluate_all(model, tok, cfg: StudyConfig) -> dict[str, float]:
    """Exact-match accuracy per eval set (points) and the demonstrations' NLL per set (nats/token); with a val set
    (task.n_val > 0) also `acc_val`, the LR selection's score, which no table or claim reads."""
    check = checker(cfg)
    sets = eval_problems(cfg)
    out = accuracy_table({s: evaluate(model, tok, probs, cfg.eval_batch_size, check) for s, probs in sets.items()})
    nll = {f"nll_{s}": demo_nll(model, tok, probs, cfg.eval_batch_size) for s, probs in sets.items()}
    nll["nll_macro"] = sum(nll.values()) / len(nll)
    if cfg.data.source == "arithmetic" and cfg.task.n_val > 0:
        out.update(evaluate_val(model, tok, cfg))
    return {**out, **nll}


def evaluate_val(model, tok, cfg: StudyConfig) -> dict[str, float]:
    """Accuracy (points) on the `val` set alone: what an LR-selection run reports (it never sees the eval sets)."""
    if cfg.data.source != "arithmetic" or cfg.task.n_val == 0:
        raise UserError("sft_rl: the LR selection scores the val set; set sft_rl.task.n_val (arithmetic task)")
    val = make_split(cfg.task, "val")
    return {"acc_val": 100.0 * sum(evaluate(model, tok, val, cfg.eval_batch_size, checker(cfg))) / len(val)}


def fact_accuracy(model, tok, cfg: StudyConfig) -> dict[str, float]:
    """Greedy accuracy (points) on the whole operator-fact table, per operator: did pretraining teach the facts?
    (A diagnostic of the base model; every fact prompt has the same length, so one unpadded forward suffices.)"""
    import torch

    facts = fact_table(cfg.task)
    ids = torch.tensor([tok(p, add_special_tokens=False)["input_ids"] for p, _ in facts])
    model.eval()
    with torch.no_grad():
        guess = model(input_ids=ids).logits[:, -1].argmax(-1).tolist()
    right: dict[str, list[bool]] = {}
    for (prompt, answer), g in zip(facts, guess, strict=True):
        right.setdefault(prompt[1], []).append(tok.decode([g]) == answer)
    return {f"fact_acc_{op}": 100.0 * sum(r) / len(r) for op, r in right.items()}
