"""The verdicts a claim can get: one type, so no module spells a verdict as a string of its own.

A `str` enum: a verdict is written into CSV, Markdown and JSON as its plain text ("reproduced"), and compares equal
to that text, so files written before the type existed read the same.
"""

from __future__ import annotations

from enum import StrEnum


class Verdict(StrEnum):
    REPRODUCED = "reproduced"
    NOT_REPRODUCED = "not reproduced"
    INCONCLUSIVE = "inconclusive"
    NOT_MEASURED = "not measured at this scale"
    ARITHMETIC_OK = "arithmetic checked"  # a recomputation of the paper's own numbers, never a reproduction
    ARITHMETIC_BAD = "arithmetic mismatch"


REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = Verdict.REPRODUCED, Verdict.NOT_REPRODUCED, Verdict.INCONCLUSIVE
NOT_MEASURED, ARITHMETIC_OK, ARITHMETIC_BAD = Verdict.NOT_MEASURED, Verdict.ARITHMETIC_OK, Verdict.ARITHMETIC_BAD
VERDICTS = tuple(Verdict)
MEASURED_VERDICTS = (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, NOT_MEASURED)
