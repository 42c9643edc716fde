"""The sizing pilot (sft_rl/pilot.py) refuses evaluation steps it cannot honour before any work (its real path ran
the round-4 pilot: the study's HISTORY.md, "Round 4 (issue 36)")."""

import pytest

from gradfidelity.studies.sft_rl.pilot import run_pilot
from tests.sft_rl._config import make_cfg


@pytest.mark.parametrize("steps", [[], [0, 10], [-5]])
def test_pilot_refuses_evaluation_steps_below_one(tmp_path, steps):
    with pytest.raises(ValueError, match="evaluation steps must be >= 1"):
        run_pilot(make_cfg({}), "sft_then_rl", tmp_path, 1e-4, steps, 100, tmp_path / "pilot.json")
    assert not (tmp_path / "pilot.json").exists()
