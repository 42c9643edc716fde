"""The shared LR-grid rule (gradfidelity.lr_grid) in both directions: a loss (lower is better, study B) and an
accuracy (higher is better, study A) choose the same way, grow past the same edge and stop at the same cap."""

import math

import pytest

from gradfidelity.errors import UserError
from gradfidelity.lr_grid import added, choose, extension, next_points


@pytest.mark.parametrize("higher", [False, True])
def test_choose_takes_the_best_finite_point_and_ties_go_to_the_smaller(higher):
    sign = 1.0 if higher else -1.0  # an accuracy, or a loss: the same grid read in its own direction
    assert choose({1: sign * 1.0, 2: sign * 3.0, 4: sign * 2.0}, higher_is_better=higher, what="t") == 2
    assert choose({1: sign * 3.0, 2: sign * 3.0}, higher_is_better=higher, what="t") == 1
    assert choose({1: sign * 1.0, 2: math.nan}, higher_is_better=higher, what="t") == 1  # diverged excluded
    with pytest.raises(UserError, match="my study LR selection: every grid point diverged"):
        choose({1: math.nan, 2: math.nan}, higher_is_better=higher, what="my study")


@pytest.mark.parametrize("higher", [False, True])
def test_three_or_more_tied_points_choose_their_lower_median_and_a_flat_grid_is_bracketed(higher):
    """Round 5 (study A): a grid flat at a ceiling chose its smallest point and grew below it; the lower median of
    the tied points is inside the grid, so nothing is added. Two tied points still choose the smaller."""
    sign = 1.0 if higher else -1.0
    flat = {3.33e-6: sign * 100.0, 1e-5: sign * 100.0, 3e-5: sign * 100.0, 1e-4: sign * 100.0, 3e-4: sign * 100.0}
    assert choose(flat, higher_is_better=higher, what="t") == 3e-5
    assert extension(flat, 3.0, higher_is_better=higher, what="t") == []
    four = {1: sign * 5.0, 2: sign * 5.0, 4: sign * 5.0, 8: sign * 5.0, 16: sign * 1.0}
    assert choose(four, higher_is_better=higher, what="t") == 2  # the lower of the two middles
    assert choose({1: sign * 1.0, 2: sign * 3.0, 4: sign * 3.0}, higher_is_better=higher, what="t") == 2


def test_the_direction_decides_the_winner():
    scores = {1e-4: 40.0, 3e-4: 50.0, 1e-3: 45.0}
    assert choose(scores, higher_is_better=True, what="t") == 3e-4
    assert choose(scores, higher_is_better=False, what="t") == 1e-4
    assert extension(scores, 3.0, higher_is_better=True, what="t") == []
    assert extension(scores, 3.0, higher_is_better=False, what="t") == [pytest.approx(1e-4 / 3)]


@pytest.mark.parametrize("higher", [False, True])
def test_extension_steps_past_the_winning_edge_and_a_diverged_neighbour_brackets(higher):
    sign = 1.0 if higher else -1.0
    assert extension({1: sign * 1, 2: sign * 2, 4: sign * 3}, 2.0, higher_is_better=higher, what="t") == [8]
    assert extension({1: sign * 3, 2: sign * 2, 4: sign * 1}, 2.0, higher_is_better=higher, what="t") == [0.5]
    assert extension({1: sign * 1, 2: sign * 3, 4: sign * 2}, 2.0, higher_is_better=higher, what="t") == []
    assert extension({1: sign * 1, 2: sign * 3, 4: math.nan}, 2.0, higher_is_better=higher, what="t") == []


def test_added_points_and_the_cap_per_edge():
    assert added([0.25, 0.5, 1, 2, 4, 8], [0.5, 1, 2]) == ([0.25], [4, 8])
    grown = {1: 1.0, 2: 2.0, 4: 3.0, 8: 4.0}  # one point added above the configured [1, 2, 4], winning again
    assert next_points(grown, [1, 2, 4], 2.0, 2, higher_is_better=True, what="t") == [16]
    assert next_points(grown, [1, 2, 4], 2.0, 1, higher_is_better=True, what="t") == []
    # the cap counts the winning side only: points added below do not stop growth above
    assert next_points({0.5: 0.0, **grown}, [1, 2, 4], 2.0, 1, higher_is_better=True, what="t") == []
    assert next_points({0.5: 0.0, 1: 1.0, 2: 2.0, 4: 3.0}, [1, 2, 4], 2.0, 1, higher_is_better=True, what="t") == [8]
