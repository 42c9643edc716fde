"""The learning-rate grid rule every study's LR selection shares: choose the best grid point, and grow the grid one
point past a winning edge until the choice is bracketed.

Why shared: study B (async_pp, final validation loss, lower is better) and study A (sft_rl, held-out validation
accuracy, higher is better) fix the same rule before any pilot; one implementation keeps the tie-break, the
treatment of diverged runs and the edge test identical. A grid point is any float (an LR or a multiplier of a
default LR); its score is nan when the run diverged. The studies read their runs and write their documents
(studies/*/lr_select.py).
"""

from __future__ import annotations

import math

from gradfidelity.errors import UserError


def choose(scores: dict[float, float], *, higher_is_better: bool, what: str) -> float:
    """The best grid point of {point: score (nan = diverged)}: diverged points excluded; a tie goes to the lower
    median of the tied points, which for two is the smaller point (the smaller LR, the safer one). Every point
    diverged is an error naming `what` (the study, or its key): the grid is too high, and no choice can be made.

    Why the median for three or more (study A, round 5, fixed after its 400-step grid and before any evaluation-seed
    run): a grid flat at a ceiling (SFT-then-RL at val accuracy 100 at every LR) says nothing about the LR inside the
    tied range, and "the smaller" walked the choice to the lowest tied point and, past the edge, lower still, to an
    arm that barely trains. The middle of the tied range is bracketed by tied points and does not depend on where the
    grid ends. Two tied points choose as before (no committed selection of rounds 1-4 had three tied points)."""
    finite = {x: v for x, v in scores.items() if math.isfinite(v)}
    if not finite:
        raise UserError(f"{what} LR selection: every grid point diverged ({sorted(scores)}); widen the grid")
    best = max(finite.values()) if higher_is_better else min(finite.values())
    tied = sorted(x for x, v in finite.items() if v == best)
    return tied[(len(tied) - 1) // 2]


def near_tie(scores: dict[float, float], sd: float, *, higher_is_better: bool, what: str) -> tuple[float, bool]:
    """(the chosen point, whether a near-tie moved it): the best point (`choose`), unless the next smaller finite
    point scores within `sd` of it (the seed-to-seed sd, known before the run: on one selection seed a difference
    below it is noise), in which case that smaller, safer point is taken. One step only: the rule settles a near-tie
    between neighbours; it never walks down the grid. sd 0 is `choose` exactly (equal scores already go to their
    lower median, of two the smaller point)."""
    best = choose(scores, higher_is_better=higher_is_better, what=what)
    if sd < 0 or not math.isfinite(sd):
        raise UserError(f"{what} LR selection: the near-tie sd {sd!r} must be finite and >= 0")
    below = [x for x, v in scores.items() if x < best and math.isfinite(v)]
    if not below or sd == 0:
        return best, False
    lower = max(below)
    worse_by = (scores[best] - scores[lower]) if higher_is_better else (scores[lower] - scores[best])
    return (lower, True) if worse_by <= sd else (best, False)


def extension(scores: dict[float, float], factor: float, *, higher_is_better: bool, what: str) -> list[float]:
    """The points to add so that the chosen one is bracketed: none when the winner has a grid point on both sides (a
    diverged neighbour counts: it is worse), else one point `factor` past the winning edge. Applied round after
    round (each round's runs, then this again) until it returns nothing."""
    best = choose(scores, higher_is_better=higher_is_better, what=what)
    points = sorted(scores)
    if best == points[-1]:
        return [best * factor]
    if best == points[0]:
        return [best / factor]
    return []


def added(points: list[float], base: list[float]) -> tuple[list[float], list[float]]:
    """The grid points added below and above the configured grid `base`."""
    return [x for x in points if x < min(base)], [x for x in points if x > max(base)]


def next_points(scores: dict[float, float], base: list[float], factor: float, max_extensions: int, *,
                higher_is_better: bool, what: str) -> list[float]:
    """The extension of `scores` unless its side already holds `max_extensions` added points: the cap that stops a
    grid whose winner never leaves the edge (the selection then reports it as not bracketed)."""
    below, above = added(list(scores), base)
    return [x for x in extension(scores, factor, higher_is_better=higher_is_better, what=what)
            if len(below if x < min(scores) else above) < max_extensions]


class GridRounds:
    """The grid's extension rounds as a Snakemake checkpoint, for a study's rules (torch-free).

    Round k's document (the checkpoint's output for wildcard `round` = k) lists the points round k + 1 trains; its
    input is the grid runs of rounds 0..k. Snakemake re-evaluates the DAG after each round, and the selection reads
    every run up to the first round that adds nothing. Each round adds at most one point past one edge per key and a
    side holds at most `max_extensions` added points, so 2 x max_extensions rounds always suffice.

    `runs(points)`: the metrics.json of the configured grid (points None) or of the points a round lists."""

    def __init__(self, checkpoint: str, runs, max_extensions: int, check=None):
        self.checkpoint, self.runs, self.bound = checkpoint, runs, 2 * max_extensions
        self.check = check  # check(doc, path): raises where a (committed) round document is not this config's grid

    def _doc(self, checkpoints, k: int) -> dict:
        """Round k's document; raises Snakemake's IncompleteCheckpointException until that round has run."""
        import json

        path = getattr(checkpoints, self.checkpoint).get(round=str(k)).output[0]
        with open(path) as f:
            doc = json.load(f)
        if self.check is not None:
            self.check(doc, path)
        return doc

    def through(self, checkpoints, k: int) -> list[str]:
        """The grid runs of rounds 0..k: the configured grid, then each earlier round's extension."""
        runs = list(self.runs(None))
        for j in range(k):
            runs += self.runs(self._doc(checkpoints, j)["extension"])
        return runs

    def last(self, checkpoints) -> int:
        """The first round that adds nothing."""
        for k in range(self.bound + 1):
            if not self._doc(checkpoints, k)["extension"]:
                return k
        raise RuntimeError(f"{self.checkpoint}: the LR grid still extends after {self.bound} rounds")

    def final(self, checkpoints) -> dict:
        """The last round's document (its grid holds every round's scores)."""
        return self._doc(checkpoints, self.last(checkpoints))

    def round_input(self, checkpoints):
        """input function of the round checkpoint: the grid runs of rounds 0..round."""
        return lambda wildcards: self.through(checkpoints, int(wildcards.round))

    def grid_input(self, checkpoints):
        """input function of the selection: every grid run of every round (until the rounds have run, Snakemake
        stands the pending round's document in for it, and a dry run still formats the command)."""
        return lambda wildcards: self.through(checkpoints, self.last(checkpoints))


def chosen_lr(selection_path: str, study: str, match, key: str) -> float:
    """The chosen LR of the first choice of a selection document for which `match(choice)` holds; the errors name
    the file and (`key`) what was looked for: a missing file, a document that is not a selection, no such choice."""
    import json

    try:
        with open(selection_path) as f:
            doc = json.load(f)
        for c in doc["choices"]:
            if match(c):
                return float(c["lr"])
    except FileNotFoundError:
        raise UserError(f"{study}: LR selection file {selection_path} is missing (run the LR grid first)") from None
    except (KeyError, TypeError, ValueError, json.JSONDecodeError):
        raise UserError(f"{study}: {selection_path} is not an LR selection document (choices)") from None
    raise UserError(f"{study}: {selection_path} has no chosen LR for {key}")
