"""Study A's RL-stage LR selection (lr_select.py) on hand-made grid runs: the grid grows past a winning edge (top and
bottom) until bracketed or capped, a diverged point is excluded and counts as worse, ties go to the smaller LR, the
selection reads every round, and the chosen LR is what an evaluation seed reads (tuned_lr)."""

import json
import math
import re

import pytest

from gradfidelity.errors import UserError
from gradfidelity.harness.io import atomic_write_json
from gradfidelity.studies.sft_rl.lr_select import extension_round, lr_name, select, tuned_lr, write_selection

BASE = [3e-5, 1e-4, 3e-4]
DIVERGED = math.nan


def _run(root, lr, acc, method="rl", model="tiny", *, scale="cpu", cell_lr=None, trained_lr=None, drop_lr=False):
    """A grid run's metrics.json in a fresh directory (any name: the cell is read from the records)."""
    d = root / f"run{len(list(root.iterdir()))}"
    cell = {"study": "sft_rl", "model": model, "method": method, "lr": cell_lr or lr_name(lr), "seed": "100",
            "stage": "rl"}
    if drop_lr:
        del cell["lr"]
    ok = math.isfinite(acc)
    metrics = {"acc_val": acc, "lr": lr if trained_lr is None else trained_lr} if ok else {"diverged_at_step": 3}
    atomic_write_json(d / "metrics.json", {"status": "ok" if ok else "diverged", "metrics": metrics,
                                           "study": "sft_rl", "scale": scale, "seed": 100, "threads": 1,
                                           "cell": cell, "timing": {}})
    return str(d / "metrics.json")


@pytest.fixture
def runs(tmp_path):
    d = tmp_path / "runs"
    d.mkdir()
    return d


def _choice(doc, method="rl", model="tiny"):
    return next(c for c in doc["choices"] if c["model"] == model and c["method"] == method)


def _grow(runs, paths, surface, max_extensions, factor=3.0):
    """Rounds of extension_round, each new point trained on `surface`, until no point is added."""
    added = []
    for _ in range(10):
        ext = extension_round(paths, "cpu", BASE, factor, max_extensions)["extension"]
        if not ext:
            return added
        assert [(e["model"], e["method"]) for e in ext] == [("tiny", "rl")]
        added.append(ext[0]["lr"])
        paths.append(_run(runs, ext[0]["lr"], surface(ext[0]["lr"])))
    raise AssertionError("the grid never stopped growing")


def test_the_grid_grows_past_a_winning_top_edge_until_bracketed_and_select_picks_the_new_point(runs):
    def acc(lr):  # a made-up val accuracy surface peaking at 2.7e-3, far above the configured grid
        return 60.0 - 10.0 * (math.log10(lr) - math.log10(2.7e-3)) ** 2

    paths = [_run(runs, lr, acc(lr)) for lr in BASE]
    assert _grow(runs, paths, acc, max_extensions=4) == [0.0009, 0.0027, 0.0081]  # 3 significant digits, exactly
    doc = select(paths, "cpu", BASE)
    c = _choice(doc)
    assert c["lr"] == 0.0027 and c["acc_val"] == pytest.approx(60.0)
    assert c["bracketed"] and not c["at_grid_edge"] and c["extended"] == [0.0009, 0.0027, 0.0081]
    assert [r["lr"] for r in c["grid"]] == [*BASE, 0.0009, 0.0027, 0.0081] and {r["seed"] for r in c["grid"]} == {100}
    # the cap: two points past the top edge, the winner still there, and the selection says so
    capped = paths[:5]
    assert extension_round(capped, "cpu", BASE, 3.0, 2)["extension"] == []
    c = _choice(select(capped, "cpu", BASE))
    assert c["lr"] == 0.0027 and c["at_grid_edge"] and not c["bracketed"]


def test_the_grid_grows_past_the_bottom_edge(runs):
    def acc(lr):  # peaks at 1e-5, below the configured grid
        return 50.0 - (math.log10(lr) + 5.0) ** 2

    paths = [_run(runs, lr, acc(lr)) for lr in BASE]
    assert _grow(runs, paths, acc, max_extensions=4) == [1e-05, 3.33e-06]
    c = _choice(select(paths, "cpu", BASE))
    assert c["lr"] == 1e-05 and c["bracketed"] and c["extended"] == [3.33e-06, 1e-05]
    assert lr_name(1e-05) == "1e-05" and lr_name(0.0001) == "0.0001"


def test_a_bracketed_winner_or_a_diverged_neighbour_adds_nothing(runs):
    paths = [_run(runs, 3e-5, 40.0), _run(runs, 1e-4, 50.0), _run(runs, 3e-4, 45.0)]
    doc = extension_round(paths, "cpu", BASE, 3.0, 4)
    assert doc["extension"] == [] and doc["base_lrs"] == BASE
    assert doc["grid"] == [{"model": "tiny", "method": "rl",
                            "acc_val": {"3e-05": 40.0, "0.0001": 50.0, "0.0003": 45.0}}]
    assert _choice(select(paths, "cpu", BASE))["lr"] == 1e-4 and _choice(select(paths, "cpu", BASE))["bracketed"]
    # a diverged point is excluded (never chosen) and counts as worse: its neighbour is bracketed
    one = [_run(runs, 3e-5, 40.0, "srft"), _run(runs, 1e-4, 50.0, "srft"), _run(runs, 3e-4, DIVERGED, "srft")]
    assert extension_round(one, "cpu", BASE, 3.0, 4)["extension"] == []
    c = _choice(select(one, "cpu", BASE), "srft")
    assert c["lr"] == 1e-4 and c["bracketed"] and math.isnan(c["grid"][2]["acc_val"]) and c["grid"][2]["status"] == \
        "diverged"
    # ... even where it holds the best accuracy of a run that went on to diverge: the finite 3e-5 wins at the bottom
    low = [_run(runs, 3e-5, 40.0, "luffy"), _run(runs, 1e-4, 30.0, "luffy"), _run(runs, 3e-4, DIVERGED, "luffy")]
    assert _choice(select(low, "cpu", BASE), "luffy")["lr"] == 3e-5
    assert extension_round(low, "cpu", BASE, 3.0, 4)["extension"] == [{"model": "tiny", "method": "luffy", "lr": 1e-05}]


def test_all_diverged_is_an_error_naming_the_arm(runs):
    paths = [_run(runs, lr, DIVERGED, "hpt") for lr in BASE]
    with pytest.raises(UserError, match="sft_rl tiny/hpt LR selection: every grid point diverged"):
        select(paths, "cpu", BASE)
    with pytest.raises(UserError, match="every grid point diverged"):
        extension_round(paths, "cpu", BASE, 3.0, 4)


def test_ties_go_to_the_lower_median_and_arms_are_ordered_by_model_then_rl_stage(runs):
    paths = [_run(runs, lr, 50.0, "hpt", "small") for lr in BASE] + \
            [_run(runs, 3e-5, 40.0, "rl", "small"), _run(runs, 1e-4, 55.0, "rl", "small"),
             _run(runs, 3e-4, 55.0, "rl", "small"), _run(runs, 1e-4, 10.0, "relift", "base")]
    doc = select(paths, "cpu", BASE)
    assert [(c["model"], c["method"]) for c in doc["choices"]] == [("base", "relift"), ("small", "rl"),
                                                                    ("small", "hpt")]
    assert _choice(doc, "rl", "small")["lr"] == 1e-4 and _choice(doc, "rl", "small")["bracketed"]
    # a flat grid (round 5): the lower median of the tied LRs, bracketed by tied points, not the smallest at an edge
    assert _choice(doc, "hpt", "small")["lr"] == 1e-4 and _choice(doc, "hpt", "small")["bracketed"]
    assert not _choice(doc, "relift", "base")["at_grid_edge"] and not _choice(doc, "relift", "base")["bracketed"]


def test_write_selection_and_tuned_lr_read_the_choice(runs, tmp_path):
    paths = [_run(runs, 3e-5, 40.0), _run(runs, 1e-4, 50.0), _run(runs, 3e-4, DIVERGED),
             _run(runs, 3e-5, 40.0, "sft_then_rl"), _run(runs, 1e-4, 45.0, "sft_then_rl"),
             _run(runs, 3e-4, 47.5, "sft_then_rl"), _run(runs, 9e-4, 46.0, "sft_then_rl")]
    out, csv = tmp_path / "sel" / "lr_selection.json", tmp_path / "tables" / "lr.csv"
    doc = write_selection(paths, "cpu", str(out), BASE, table_csv=str(csv), table_md=str(tmp_path / "lr.md"))
    assert json.loads(out.read_text())["choices"][0]["method"] == "rl" and doc["rule"]
    assert tuned_lr(str(out), "tiny", "rl") == 1e-4
    assert tuned_lr(str(out), "tiny", "sft_then_rl") == 3e-4
    md = (tmp_path / "lr.md").read_text()
    assert "0.0003: diverged" in md and "0.0009" in md and "| yes" in md and "bracketed" in md
    assert "3e-05: 40.0, 0.0001: 50.0, 0.0003: diverged" in csv.read_text()
    with pytest.raises(UserError, match=re.escape(f"{tmp_path / 'none.json'} is missing")):
        tuned_lr(str(tmp_path / "none.json"), "tiny", "rl")
    with pytest.raises(UserError, match=re.escape(f"{out} has no chosen LR for 'luffy' on model 'tiny'")):
        tuned_lr(str(out), "tiny", "luffy")
    with pytest.raises(UserError, match="has no chosen LR for 'rl' on model 'other'"):
        tuned_lr(str(out), "other", "rl")
    bad = tmp_path / "bad.json"
    bad.write_text('{"choices": [{"lr": 1}]}')
    with pytest.raises(UserError, match=re.escape(f"{bad} is not an LR selection document")):
        tuned_lr(str(bad), "tiny", "rl")


def test_a_run_that_is_not_a_grid_run_is_refused(runs):
    no_lr = _run(runs, 1e-4, 50.0, drop_lr=True)
    with pytest.raises(UserError, match=re.escape(f"{no_lr}: not an LR-grid run")):
        select([_run(runs, 3e-5, 40.0), no_lr], "cpu", BASE)
    wrong = _run(runs, 1e-4, 50.0, trained_lr=3e-4)
    with pytest.raises(UserError, match=re.escape(f"{wrong}: trained at lr 0.0003, but its cell says '0.0001'")):
        select([wrong], "cpu", BASE)
    sft = _run(runs, 1e-4, 50.0, "sft")
    with pytest.raises(UserError, match=re.escape(f"{sft}: not an RL-stage LR-grid run")):
        select([sft], "cpu", BASE)
    twice = [_run(runs, 1e-4, 50.0), _run(runs, 1e-4, 51.0)]
    with pytest.raises(UserError, match=re.escape(f"{twice[1]}: a second run of tiny/rl at lr 0.0001")):
        select(twice, "cpu", BASE)
    with pytest.raises(UserError, match="not 'smoke'"):
        select([_run(runs, 1e-4, 50.0)], "smoke", BASE)


def _start(root, acc_val, name):
    d = root / name
    atomic_write_json(d / "metrics.json", {"status": "ok", "metrics": {"acc_val": acc_val}, "study": "sft_rl",
                                           "scale": "cpu", "seed": 0, "threads": 1, "cell": {}, "timing": {}})
    return str(d / "metrics.json")


def test_the_selection_reads_each_arm_against_its_start_and_says_when_the_gain_is_evaluation_noise(runs, tmp_path):
    """An arm whose best LR scores within evaluation noise of its start is said to be; one well above it is not.
    The noise is the normal 95% half-width of a difference of two binomial accuracies (checked against scipy)."""
    from scipy import stats

    from gradfidelity.studies.sft_rl.lr_select import eval_noise

    paths = [_run(runs, lr, acc, "luffy") for lr, acc in zip(BASE, (33.0, 35.0, 30.0), strict=True)] + \
            [_run(runs, lr, acc, "hpt") for lr, acc in zip(BASE, (40.0, 52.0, 45.0), strict=True)]
    starts = {"tiny/luffy": _start(tmp_path, 33.6, "base"), "tiny/hpt": _start(tmp_path, 33.6, "base2")}
    doc = write_selection(paths, "cpu", str(tmp_path / "sel.json"), BASE, table_csv=str(tmp_path / "t.csv"),
                          table_md=str(tmp_path / "t.md"), starts=starts, n_val=500)
    luffy, hpt = _choice(doc, "luffy"), _choice(doc, "hpt")
    se = math.sqrt((0.35 * 0.65 + 0.336 * 0.664) / 500)
    assert luffy["noise"] == pytest.approx(100 * stats.norm.ppf(0.975) * se, rel=1e-5)
    assert luffy["gain"] == pytest.approx(1.4) and luffy["within_noise"]
    assert hpt["gain"] == pytest.approx(18.4) and not hpt["within_noise"]
    md = (tmp_path / "t.md").read_text()
    assert "+1.4 (noise 5.9: within noise)" in md and "beyond noise" in md and "500 val problems" in md
    assert eval_noise(50.0, 50.0, 100) > eval_noise(50.0, 50.0, 400)  # more problems, less noise
    with pytest.raises(UserError, match="--n-val"):
        select(paths, "cpu", BASE, starts)


def test_sft_then_rls_start_is_read_at_the_sft_runs_start_not_its_end(runs, tmp_path):
    """Round 6 (issue 59): the SFT-then-RL grid trains from the selection seed's SFT start, so its gain is read
    against that start's val accuracy (67.2 here), not the SFT run's end (98.4)."""
    paths = [_run(runs, lr, acc, "sft_then_rl") for lr, acc in zip(BASE, (80.0, 92.2, 88.2), strict=True)]
    d = tmp_path / "sft"
    atomic_write_json(d / "metrics.json", {"status": "ok", "metrics": {"acc_val": 98.4, "start": {"acc_val": 67.2,
                                                                                                   "step": 110}},
                                           "study": "sft_rl", "scale": "cpu", "seed": 100, "threads": 1, "cell": {},
                                           "timing": {}})
    doc = write_selection(paths, "cpu", str(tmp_path / "sel.json"), BASE, starts={"tiny/sft_then_rl": str(
        d / "metrics.json")}, n_val=500)
    c = _choice(doc, "sft_then_rl")
    assert c["start_acc_val"] == 67.2 and c["gain"] == pytest.approx(92.2 - 67.2) and not c["within_noise"]
