"""C5: study C's reported statistics recomputed from the paper's summary numbers (studies/local/check.py)."""

import pytest

from gradfidelity.stats import implied_sd, seeds_for_power
from gradfidelity.studies.local.check import stats_check_table


def test_worked_example_from_study_c():
    sd = implied_sd(0.841, 2.095, 5)
    assert sd == pytest.approx(1.315, abs=5e-4)
    need = seeds_for_power(0.841, sd, 1.0)
    assert round(need["normal"]) == 423
    assert need["exact_t"] == 425
    table = stats_check_table()
    assert list(table.loc[table["fits_about_423"], "n"]) == [5]
