"""The one check of a committed file against its regeneration lives in `vaco_jax.analysis.check`;
this name stays for the code that imports it from here (the rule is defined once, there)."""

from vaco_jax.analysis.check import (  # noqa: F401
    ABS_TOL, FIGURES, NUMBER, REL_TOL, csv_difference, difference, text_difference)
