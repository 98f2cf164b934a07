"""The statistics every study uses now live in `vaco_jax.analysis.stats`; this name stays for the
code that imports it from here (each rule is defined once, there)."""

from vaco_jax.analysis.stats import (  # noqa: F401
    AGGREGATES, EXACT_SIGN_FLIPS, METRICS, TIE_TOLERANCE, Bootstrap, aggregate, area_under_curve,
    curve_estimates, holm, improvement_probability, interval_estimates, iqm, normalize,
    paired_t_interval, performance_profiles, probability_of_improvement, sign_flip_interval,
    sign_flip_test, stratified_bca, stratified_bootstrap)
