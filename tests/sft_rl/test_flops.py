"""FLOPs count what each method computes, once: one real optimizer step of every method (TRL trainers, no
DeepSpeed) against a hand count made from the step's own strings and generation masks.

The hand count (independent of trainers.TokenCounter): with P = prompt characters, C = generated completion
tokens (the generation mask), D = demonstration characters + EOS (character tokenizer),
- every method generates every rollout: gen = sum over rows of (P + C), LUFFY's replaced rollout included;
- GRPO (rl, sft_then_rl) trains on every rollout: train = sum (P + C);
- LUFFY trains on G-1 rollouts and the demonstration in the G-th row of each group;
- SRFT adds one demonstration forward per prompt (not per row: the batch holds G copies of it);
- HPT adds one demonstration forward per prompt that no rollout solved (gate 0);
- ReLIFT adds the popped buffer's demonstrations (capacity 1: the first failed prompt of the step, if any);
- SFT trains on every demonstration fed (prompt + solution + EOS); SFT-then-RL adds its SFT run's FLOPs.
FLOPs = 6 x params x train + 2 x params x gen. Demonstration tokens (compute matching) are the part of train that is
prompt + demonstration: all of SFT's, the demonstration rows above, and SFT's for SFT-then-RL.
"""

import pytest
from trl import GRPOTrainer

from gradfidelity.harness.io import read_json
from gradfidelity.studies.sft_rl import models
from gradfidelity.studies.sft_rl import train as training
from gradfidelity.studies.sft_rl.task import is_correct, make_split
from tests.sft_rl._config import make_cfg

pytestmark = pytest.mark.slow

G, PROMPTS = 2, 2
CFG = {
    "models": [{"name": "t", "arch": "qwen2", "hidden_size": 16, "num_layers": 1, "num_heads": 2,
                "num_kv_heads": 1, "intermediate_size": 32}],
    "seeds": [0], "variants": ["fixed"],
    "task": {"n_train": 16, "n_eval": 2, "train_ops": [2, 2]},   # equal-length problems: the SFT count is exact
    "sft": {"steps": 1, "micro_batch_size": 1, "grad_accum": 2, "lr": 0.01},
    "rl": {"steps": 1, "prompts_per_step": PROMPTS, "num_generations": G, "max_completion_length": 12},
    "mixed": {"relift_buffer_size": 1},
    "deepspeed": {"enabled": False}, "eval_batch_size": 2,
}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("flops")
    cfg = make_cfg(CFG)
    tok = models.build_tokenizer()
    models.save_checkpoint(models.build_tiny_model(cfg.models[0], tok, seed=0), tok, root / "base" / "model")
    (root / "base" / "metrics.json").write_text('{"status": "ok", "metrics": {"flops": 0.0}}')
    sft = training.run_sft(cfg, "t", "fixed", 0, root / "base", root / "sft")
    return cfg, root, tok, sft


def test_sft_step_matches_hand_count(setup):
    cfg, _, _, sft = setup
    p = make_split(cfg.task, "train")[0]
    assert len({len(q.prompt) + len(q.solution) for q in make_split(cfg.task, "train")}) == 1
    seq = len(p.prompt) + len(p.solution) + 1  # + EOS
    assert sft["train_tokens"] == cfg.sft.grad_accum * cfg.sft.micro_batch_size * seq
    assert sft["demo_tokens"] == sft["train_tokens"]
    assert sft["flops"] == 6.0 * sft["n_params"] * sft["train_tokens"]


def _spy(monkeypatch) -> list[dict]:
    seen: list[dict] = []
    original = GRPOTrainer._generate_and_score_completions

    def spy(self, inputs):
        out = original(self, inputs)
        if self.model.training:
            seen.append({"inputs": list(inputs), "completion_ids": out["completion_ids"].clone(),
                         "completion_mask": out["completion_mask"].clone()})
        return out

    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", spy)
    return seen


def _hand_count(method: str, step: dict, tok) -> tuple[int, int, int]:
    rows = step["inputs"]
    comp = [int(m.sum()) for m in step["completion_mask"]]
    texts = [tok.decode(ids[m.bool()].tolist(), skip_special_tokens=True)
             for ids, m in zip(step["completion_ids"], step["completion_mask"], strict=True)]
    P = [len(x["prompt"]) for x in rows]
    D = [len(x["solution"]) + 1 for x in rows]
    solved = [sum(is_correct(texts[i], rows[i]["answer"]) for i in range(g, g + G)) for g in range(0, len(rows), G)]
    gen = sum(p + c for p, c in zip(P, comp, strict=True))
    rollouts = gen
    firsts = list(range(0, len(rows), G))
    if method in ("rl", "sft_then_rl"):
        train, demo = rollouts, 0
    elif method == "luffy":
        off = [i for i in range(len(rows)) if i % G == G - 1]
        train = rollouts - sum(comp[i] for i in off) + sum(D[i] for i in off)
        demo = sum(P[i] + D[i] for i in off)
    elif method == "srft":
        demo = sum(P[i] + D[i] for i in firsts)
        train = rollouts + demo
    elif method == "hpt":
        demo = sum(P[i] + D[i] for k, i in enumerate(firsts) if solved[k] == 0)
        train = rollouts + demo
    elif method == "relift":
        failed = [i for k, i in enumerate(firsts) if solved[k] == 0]
        demo = P[failed[0]] + D[failed[0]] if failed else 0
        train = rollouts + demo
    else:
        raise AssertionError(method)
    return train, gen, demo


@pytest.mark.parametrize("method", ["rl", "sft_then_rl", "luffy", "srft", "hpt", "relift"])
def test_rl_step_matches_hand_count(setup, monkeypatch, method):
    cfg, root, tok, sft = setup
    seen = _spy(monkeypatch)
    init = root / ("sft" if method == "sft_then_rl" else "base")
    m = training.run_rl(cfg, "t", "fixed", method, 0, init, root / method)
    assert len(seen) == 1 and len(seen[0]["inputs"]) == PROMPTS * G
    train, gen, demo = _hand_count(method, seen[0], tok)
    assert (m["train_tokens"], m["gen_tokens"]) == (train, gen)
    assert m["demo_tokens"] == demo + (sft["demo_tokens"] if method == "sft_then_rl" else 0)
    assert m["lr"] == cfg.rl.lr and len(m["zero_adv_history"]) == cfg.rl.steps
    upstream = sft["flops"] if method == "sft_then_rl" else 0.0
    p = m["n_params"]
    assert m["flops"] == pytest.approx(upstream + 6.0 * p * train + 2.0 * p * gen, rel=1e-12)
    assert read_json(root / method / "metrics.json")["status"] == "ok"


def test_hpt_and_srft_demo_forward_is_once_per_prompt(setup, monkeypatch):
    """The G-fold copy is gone: SRFT's extra training tokens are PROMPTS demonstrations, not PROMPTS x G."""
    cfg, root, tok, _ = setup
    seen = _spy(monkeypatch)
    m = training.run_rl(cfg, "t", "fixed", "srft", 0, root / "base", root / "srft_once")
    rows = seen[0]["inputs"]
    rollouts = sum(len(x["prompt"]) + int(c.sum()) for x, c in zip(rows, seen[0]["completion_mask"], strict=True))
    demos_once = sum(len(rows[i]["prompt"]) + len(rows[i]["solution"]) + 1 for i in range(0, len(rows), G))
    assert m["train_tokens"] - rollouts == demos_once


def test_lr_grid_run_is_scored_on_val_alone(setup):
    """An LR-selection run (an explicit lr) trains at that lr and reports `acc_val` only: it never evaluates the eval
    sets (nor the truncated step), so the selection cannot read them."""
    _, root, _, _ = setup
    cfg = make_cfg({**CFG, "task": {**CFG["task"], "n_val": 4}})
    m = training.run_rl(cfg, "t", "fixed", "sft_then_rl", 100, root / "sft", root / "grid", lr=1e-3)
    assert m["lr"] == 1e-3 and 0.0 <= m["acc_val"] <= 100.0
    assert not any(k.startswith(("acc_id", "acc_long", "acc_ood", "nll_")) for k in m) and "truncated" not in m
