"""The paired estimates (retention, paired differences, break-lag, Welch's difference) live in
`vaco_jax.analysis.paired`; this name stays for the code that imports it from here (each rule is
defined once, there)."""

from vaco_jax.analysis.paired import (  # noqa: F401
    BREAK_LEVEL, ESTIMATE, POOLED, REPS, _select, break_lag, cells, difference_of_ratios, estimate,
    mean_of, means, paired, paired_differences, ratio, ratio_of, ratios, retention, welch_difference,
    with_pooled)
