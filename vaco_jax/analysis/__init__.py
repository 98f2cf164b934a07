"""Studies as data: one run table → estimands → one estimates table per study → generic reports,
figures and one check. Lowest first (each imports only those above it, NumPy, SciPy, pandas,
rliable, Matplotlib and `vaco_jax.io`; never a study, a sweep or the trainer):

    stats      rliable's aggregates, the stratified BCa bootstrap, sign-flip and t tests, Holm
    schema     the one per-run table (`COLUMNS`), its validator, an adapter per older vocabulary
    paired     estimates of seeds paired across conditions: means, ratios, differences, pooled
    families   the ancestry check of a pre-registration, test families, Holm, verdicts
    estimands  each estimand a pure function (runs, spec) → rows of the estimates table
    check      a committed file against its regeneration, number by number
    report     estimates.csv → report.md; headline rows picked by key
    figures    lines over a setting, ranked intervals with performance profiles, learning curves
"""
