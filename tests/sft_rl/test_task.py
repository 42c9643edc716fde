"""The task generator is deterministic, its splits are disjoint, and the checker is exact."""

import pytest

from gradfidelity.errors import UserError
from gradfidelity.studies.sft_rl.task import (
    EVAL_SETS,
    accuracy_table,
    extract_answer,
    fact_table,
    is_correct,
    make_split,
    pretrain_corpus,
    solve,
)
from tests.sft_rl._config import task_cfg

CFG = task_cfg(n_train=200, n_eval=40)


def _reference_value(prompt: str, modulus: int) -> int:
    """Independent evaluation: parse 'a op b op c =' and fold left to right with Python's own % operator."""
    body = prompt.rstrip("=")
    value, i = int(body[0]), 1
    while i < len(body):
        op, b = body[i], int(body[i + 1])
        value = {"+": value + b, "-": value - b, "*": value * b}[op] % modulus
        i += 2
    return value


def test_splits_are_deterministic():  # same process; test_generated_sets_are_pinned checks across machines
    for split in ("train", *EVAL_SETS):
        assert make_split(CFG, split) == make_split(task_cfg(n_train=200, n_eval=40), split)
    assert pretrain_corpus(CFG) == pretrain_corpus(task_cfg(n_train=200, n_eval=40))


def test_seed_changes_problems():
    assert make_split(CFG, "train") != make_split(task_cfg(seed=99, n_train=200, n_eval=40), "train")


def test_eval_sets_are_held_out_and_shaped_as_specified():
    train = {p.prompt for p in make_split(CFG, "train")}
    for split in EVAL_SETS:
        probs = make_split(CFG, split)
        assert len(probs) == CFG.n_eval
        assert not train & {p.prompt for p in probs}
    n_ops = [sum(c in "+-*" for c in p.prompt) for p in make_split(CFG, "long")]
    assert min(n_ops) >= CFG.long_ops[0] and max(n_ops) <= CFG.long_ops[1]
    assert all("*" in p.prompt for p in make_split(CFG, "ood"))
    assert not any("*" in p.prompt for p in make_split(CFG, "train"))


@pytest.mark.parametrize("split", ["train", *EVAL_SETS])
def test_demonstrations_reach_the_true_answer(split):
    for p in make_split(CFG, split):
        assert p.answer == str(_reference_value(p.prompt, CFG.modulus))
        assert is_correct(p.solution, p.answer)
        steps = p.solution.split("#")[0].split(",")
        assert len(steps) == sum(c in "+-*" for c in p.prompt)  # one written step per operator


def test_solve_hand_example():
    p = solve(7, [("+", 5), ("-", 3), ("+", 8)], 10)
    assert (p.prompt, p.solution, p.answer) == ("7+5-3+8=", "7+5=2,2-3=9,9+8=7#7", "7")


def test_checker_is_exact():
    assert extract_answer("1+2=3#3") == "3"
    assert extract_answer("no mark") is None
    assert extract_answer("1+2=3#") == ""
    assert is_correct("1+2=3#3 ", "3")
    assert is_correct("#1#3", "3")              # the last '#' counts
    assert not is_correct("1+2=3#33", "3")      # no prefix match
    assert not is_correct("1+2=3", "3")         # no answer mark, no reward
    assert not is_correct("#4", "3")


def test_accuracy_table_macro():
    acc = accuracy_table({"id": [True, False], "long": [False, False], "ood": [True, True, True, False]})
    assert acc == pytest.approx({"acc_id": 50.0, "acc_long": 0.0, "acc_ood": 75.0, "acc_macro": 125.0 / 3})
    with pytest.raises(ValueError):
        accuracy_table({"id": [True]})


def test_bad_config_is_a_user_error():
    with pytest.raises(UserError, match="train_ops"):
        task_cfg(train_ops=[3, 2])
    with pytest.raises(UserError, match="n_trian"):
        task_cfg(n_trian=5)
    with pytest.raises(UserError, match="distinct"):
        make_split(task_cfg(n_train=300, train_ops=[1, 1]), "train")  # only 10*2*10 distinct prompts


def test_pretraining_lines_are_true_facts_and_worked_chains():
    corpus = pretrain_corpus(CFG)
    facts = [line for line in corpus if "#" not in line["completion"]]
    assert 0.6 < len(facts) / len(corpus) < 0.7                    # two lines in three
    assert {line["prompt"][1] for line in facts} == set("+-*")
    for line in corpus:
        value = str(_reference_value(line["prompt"], CFG.modulus))
        if line in facts:
            assert line["completion"] == value  # the loss falls on the result alone
        else:
            assert is_correct(line["completion"], value) and line["completion"].startswith(line["prompt"][0])


def test_fact_table_is_complete_and_true():
    table = fact_table(CFG)
    assert len(table) == len(set(table)) == 3 * CFG.modulus ** 2
    assert all(answer == str(_reference_value(prompt, CFG.modulus)) for prompt, answer in table)


def test_fact_accuracy_reads_the_greedy_next_token():
    """A stand-in model that knows the '+' facts only and answers '0' to everything else."""
    import torch

    from gradfidelity.studies.sft_rl.evaluate import fact_accuracy
    from gradfidelity.studies.sft_rl.models import build_tokenizer

    tok = build_tokenizer()

    class KnowsAddition(torch.nn.Module):
        def forward(self, input_ids):
            logits = torch.zeros(*input_ids.shape, len(tok))
            for row, ids in enumerate(input_ids.tolist()):
                a, op, b = tok.decode(ids[:3])
                answer = str((int(a) + int(b)) % 10) if op == "+" else "0"
                logits[row, -1, tok.convert_tokens_to_ids(answer)] = 1.0
            return type("Out", (), {"logits": logits})

    cfg = type("Cfg", (), {"task": CFG})
    acc = fact_accuracy(KnowsAddition(), tok, cfg)
    assert acc == pytest.approx({"fact_acc_+": 100.0, "fact_acc_-": 10.0, "fact_acc_*": 100.0 * 27 / 100})


def test_train_answers_cover_all_values():
    assert {_reference_value(p.prompt, 10) for p in make_split(CFG, "train")} == set(range(10))


# ----------------------------------------------------------------------------- pinned sets and leakage
SCALES = ("smoke", "cpu")  # the scales that generate their sets (paper scale reads LUFFY's published data)
# sha256 of the generated splits per scale (prompt, solution, answer of every problem, in order) and of the
# pretraining corpus: a change of the generator or of a scale's task config must change these on purpose.
PINNED = {
    "smoke": {"train": "1fb9f784afb742c3", "id": "acc062df8e2e67eb", "long": "efcd506b1c02c438",
              "ood": "2342553922b2db85", "val": "b8f4cf88314cb652", "rl": "45655c954d64b7ce",
              "pretrain": "8ce7b5209aaa1654"},
    # round 3: 600 problems per eval set (the first 600 of round 2's 1,000), a val and an rl split; the
    # pretraining text skips the val prompts too, so it changed
    "cpu": {"train": "d9ae7b5343883c68", "id": "603fdcfbf8e39197", "long": "881d2c2a9800d41c",
            "ood": "b463a11912139759", "val": "f20b804d1aab725e", "rl": "c34bc3a695cad26c",
            "pretrain": "de6966d95096e263"},
}


def _task_cfg(scale: str):
    import yaml

    from gradfidelity.studies.sft_rl.config import load

    root = __import__("pathlib").Path(__file__).resolve().parents[2]
    raw = yaml.safe_load((root / "config" / scale / "sft_rl.yaml").read_text())
    return load(raw).task


def _digest(cfg) -> dict[str, str]:
    import hashlib

    out = {}
    for split in ("train", *EVAL_SETS, "val", "rl"):
        if split in ("val", "rl") and not make_split(cfg, split):
            continue
        text = "\n".join(f"{p.prompt}|{p.solution}|{p.answer}" for p in make_split(cfg, split))
        out[split] = hashlib.sha256(text.encode()).hexdigest()[:16]
    corpus = "\n".join(f"{line['prompt']}|{line['completion']}" for line in pretrain_corpus(cfg))
    out["pretrain"] = hashlib.sha256(corpus.encode()).hexdigest()[:16]
    return out


@pytest.mark.parametrize("scale", SCALES)
def test_generated_sets_are_pinned(scale):
    assert _digest(_task_cfg(scale)) == PINNED[scale]


@pytest.mark.parametrize("scale", SCALES)
def test_no_eval_problem_in_pretraining_sft_or_rl_data(scale):
    cfg = _task_cfg(scale)
    train = make_split(cfg, "train") + make_split(cfg, "rl")  # the SFT demonstrations and the RL prompts
    train_prompts, train_text = {p.prompt for p in train}, {p.prompt + p.solution for p in train}
    corpus = pretrain_corpus(cfg)
    assert len(corpus) == cfg.n_pretrain
    corpus_prompts = {line["prompt"] for line in corpus}
    corpus_text = "\n".join(line["prompt"] + line["completion"] for line in corpus)
    for split in (*EVAL_SETS, "val"):
        for p in make_split(cfg, split):
            assert p.prompt not in train_prompts and p.prompt + p.solution not in train_text, (split, p)
            assert p.prompt not in corpus_prompts, (split, p)
            assert p.solution not in corpus_text, (split, p)  # no worked solution, anywhere in the corpus


def test_leakage_check_can_fail():
    """The round-1 corpus (eval prompts not skipped) fails the same check: the test is not vacuous."""
    import random

    from gradfidelity.studies.sft_rl import task

    cfg = _task_cfg("smoke")
    rng = random.Random(cfg.seed + task._SPLIT_OFFSET["pretrain"])
    old = []
    for i in range(cfg.n_pretrain):
        if i % 3 == 0:
            rng.randrange(cfg.modulus), rng.randrange(cfg.modulus), rng.choice("+-*")
            continue
        lo, hi = cfg.train_ops if i % 3 == 1 else cfg.pretrain_worked_ops
        old.append(task._random_problem(rng, rng.randint(lo, hi), "+-", cfg.modulus).prompt)
    assert set(old) & task.heldout_prompts(cfg)


def test_rl_and_val_splits_are_disjoint_from_every_other_split():
    """RL prompts of their own (round 3): none is an SFT prompt, an eval prompt or a val prompt; val is disjoint from
    train and the eval sets, and the pretraining text skips it (it is the LR selection's held-out set)."""
    from gradfidelity.studies.sft_rl import task

    cfg = task_cfg(n_train=200, n_eval=40, n_rl=150, n_val=40, n_pretrain=600)
    prompts = {s: {p.prompt for p in make_split(cfg, s)} for s in task.SPLITS}
    assert len(prompts["rl"]) == 150 and len(prompts["val"]) == 40
    for other in ("train", *EVAL_SETS, "val"):
        assert not prompts["rl"] & prompts[other], other
    for other in ("train", *EVAL_SETS):
        assert not prompts["val"] & prompts[other], other
    assert prompts["val"] <= task.heldout_prompts(cfg)
    assert not prompts["val"] & {line["prompt"] for line in pretrain_corpus(cfg)}
    # drawn like train / id: same operators and chain lengths
    assert all(set(p) <= set("0123456789+-=") for s in ("rl", "val") for p in prompts[s])


def test_unsized_rl_and_val_splits_leave_round_two_unchanged():
    """n_rl = n_val = 0: no such split, and the eval sets and the pretraining text are exactly round 2's."""
    cfg = task_cfg(n_train=200, n_eval=40, n_pretrain=600)
    assert make_split(cfg, "rl") == [] and make_split(cfg, "val") == []
    sized = task_cfg(n_train=200, n_eval=40, n_pretrain=600, n_rl=50, n_val=20)
    for split in ("train", *EVAL_SETS):
        assert make_split(cfg, split) == make_split(sized, split)
