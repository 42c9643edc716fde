"""The project's statistics on scipy/statsmodels: the one t interval (`intervals`) and the paired comparisons built on
it (`paired`: non-inferiority, ratio intervals, equivalence, sample size)."""

from gradfidelity.stats.intervals import Interval, median_interval, one_sided_p, t_interval
from gradfidelity.stats.paired import (
    NonInferiority,
    RatioCI,
    equivalence_tost,
    implied_sd,
    noninferiority,
    paired_ratio_ci,
    seeds_for_power,
)

__all__ = ["Interval", "NonInferiority", "RatioCI", "equivalence_tost", "implied_sd", "median_interval",
           "noninferiority", "one_sided_p", "paired_ratio_ci", "seeds_for_power", "t_interval"]
