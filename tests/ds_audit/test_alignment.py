"""ds_audit.alignment: the kept/full norm ratio from a Gram matrix, against norms computed from the vectors."""

import numpy as np
import pytest

from gradfidelity.errors import UserError
from gradfidelity.stats.intervals import t_interval
from gradfidelity.studies.ds_audit.alignment import summarise, window_row, write_tables


def _gram(vectors: np.ndarray) -> np.ndarray:
    return vectors @ vectors.T


def test_ratio_equals_the_norms_of_the_vectors():
    g = np.random.default_rng(0).normal(size=(8, 50)) + 0.3  # partly aligned
    row = window_row(_gram(g))
    want = np.linalg.norm(g[0] + g[7]) / np.linalg.norm(g.sum(0))
    assert row["kept_over_full"] == pytest.approx(want, rel=1e-12)
    cos = [g[i] @ g[j] / np.linalg.norm(g[i]) / np.linalg.norm(g[j]) for i in range(8) for j in range(i + 1, 8)]
    assert row["mean_cosine"] == pytest.approx(np.mean(cos), rel=1e-12)


def test_identical_gradients_give_two_over_n_and_orthogonal_ones_sqrt():
    v = np.random.default_rng(1).normal(size=20)
    same = window_row(_gram(np.tile(v, (8, 1))))
    assert same["kept_over_full"] == pytest.approx(2 / 8) and same["mean_cosine"] == pytest.approx(1.0)
    ortho = window_row(_gram(3.0 * np.eye(8)))
    assert ortho["kept_over_full"] == pytest.approx(np.sqrt(2 / 8)) and ortho["mean_cosine"] == pytest.approx(0.0)
    assert ortho["kept_over_full"] != pytest.approx(ortho["two_over_n"])  # "about 2/N" fails for orthogonal ones


def test_degenerate_gram_is_an_error():
    with pytest.raises(UserError, match="degenerate"):
        window_row(np.zeros((4, 4)))
    with pytest.raises(UserError, match="smallest micro-batch norm 0"):  # one zero gradient: NaN cosines
        window_row(np.diag([2.0, 1.0, 0.0, 1.0]))
    with pytest.raises(UserError, match="square"):
        window_row(np.ones((2, 2)))


def test_summary_interval_is_the_projects_t_interval():
    rng = np.random.default_rng(2)
    rows = [window_row(_gram(rng.normal(size=(4, 10)) + 1.0)) for _ in range(6)]
    x = np.array([r["kept_over_full"] for r in rows])
    iv = t_interval(x, 0.9)
    s = summarise(rows, 0.9)  # at the level it is given (A3's), exactly the shared interval
    assert (s["mean"], s["low"], s["high"], s["level"], s["windows"]) == (iv.estimate, iv.low, iv.high, 0.9, 6)
    assert iv.low < s["mean"] < iv.high
    assert s["over_two_over_n"] == pytest.approx(x.mean() / 0.5)
    with pytest.raises(UserError, match=">= 2 windows"):
        summarise(rows[:1], 0.95)


def test_tables_name_the_reference_points(tmp_path):
    grams = [_gram(np.eye(4)).tolist(), _gram(np.eye(4) + 0.5).tolist()]
    summ = write_tables({"grams": grams, "model": "m", "micro_batch_size": 2}, tmp_path / "a.csv", tmp_path / "a.md",
                        level=0.95)
    md = (tmp_path / "a.md").read_text()
    assert "2/N = 0.500" in md and "sqrt(2/N) = 0.707" in md and summ["windows"] == 2
    assert (tmp_path / "a.csv").read_text().count("\n") == 3
