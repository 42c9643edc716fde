"""The task generator is deterministic, its splits are disjoint, and the checker is exact."""

import pytest

from gradfidelity.errors import UserError
from gradfidelity.studies.sft_rl.task import (
    EVAL_SETS,
    TaskConfig,
    accuracy_table,
    extract_answer,
    is_correct,
    make_split,
    pretrain_corpus,
    solve,
)

CFG = TaskConfig(n_train=200, n_eval=40)


def _reference_value(prompt: str, modulus: int) -> int:
    """Independent evaluation: parse 'a op b op c =' and fold left to right with Python's own % operator."""
    body = prompt.rstrip("=")
    value, i = int(body[0]), 1
    while i < len(body):
        op, b = body[i], int(body[i + 1])
        value = {"+": value + b, "-": value - b, "*": value * b}[op] % modulus
        i += 2
    return value


def test_splits_are_deterministic():
    for split in ("train", *EVAL_SETS):
        assert make_split(CFG, split) == make_split(TaskConfig(n_train=200, n_eval=40), split)
    assert pretrain_corpus(CFG) == pretrain_corpus(TaskConfig(n_train=200, n_eval=40))


def test_seed_changes_problems():
    assert make_split(CFG, "train") != make_split(TaskConfig(seed=99, n_train=200, n_eval=40), "train")


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
        TaskConfig.from_dict({"train_ops": [3, 2]})
    with pytest.raises(UserError, match="unknown"):
        TaskConfig.from_dict({"n_trian": 5})
    with pytest.raises(UserError, match="distinct"):
        make_split(TaskConfig(n_train=300, train_ops=(1, 1)), "train")  # only 10*2*10 distinct prompts


def test_train_answers_cover_all_values():
    assert {_reference_value(p.prompt, 10) for p in make_split(CFG, "train")} == set(range(10))
