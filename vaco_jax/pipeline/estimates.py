"""The paired estimates (retention, paired differences, Welch's difference) live in
`vaco_jax.analysis.paired`; this name stays for the code that imports it from here (each rule is
defined once, there). The break rule's level and verdict live in `vaco_jax.analysis.families`;
the break lag of the lag studies and the v1 leaderboard is here."""

import numpy as np

from vaco_jax.analysis.families import BREAK_LEVEL, break_verdict  # noqa: F401
from vaco_jax.analysis.paired import (  # noqa: F401
    ESTIMATE, POOLED, REPS, _select, cells, difference_of_ratios, estimate, mean_of, means, paired,
    paired_differences, ratio, ratio_of, ratios, retention, welch_difference, with_pooled)


def break_lag(lags, retentions, highs, level: float = BREAK_LEVEL) -> tuple[str, str]:
    """(break lag, confidently broken): the smallest lag of `lags` whose retention is below
    `level`, and the smallest whose interval's upper end is; "none" if no lag is, "undefined" if
    no retention is defined."""
    order = np.argsort(lags)
    lags, retentions, highs = (np.asarray(x)[order] for x in (lags, retentions, highs))
    if np.isnan(np.asarray(retentions, np.float64)).all():
        return "undefined", "undefined"

    def first(mask):
        return str(int(lags[mask][0])) if mask.any() else "none"
    return first(retentions < level), first(highs < level)
