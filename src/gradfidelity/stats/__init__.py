"""Paired statistics for method-vs-baseline comparisons (study C's prespecified rules), on scipy/statsmodels."""

from gradfidelity.stats.paired import (
    NonInferiority,
    RatioCI,
    equivalence_tost,
    implied_sd,
    noninferiority,
    paired_ratio_ci,
    seeds_for_power,
)

__all__ = ["NonInferiority", "RatioCI", "equivalence_tost", "implied_sd", "noninferiority", "paired_ratio_ci",
           "seeds_for_power"]
