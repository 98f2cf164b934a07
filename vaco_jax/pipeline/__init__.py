"""One analysis pipeline for every study, in the order it runs:

    runs             sweep directories → one tidy table, one row per run
    scores           one normalisation: random = 0, a reference = 1
    estimates        retention, paired differences, break-lag: one definition each
    preregistration  families, paired tests, Holm, verdicts, the ancestry check
    tables           the one interval formatter, generic tables and figures

Each module imports only those above it in this list and `vaco_jax.study`'s statistics
(`study.stats`) and sweeps; none imports a study. Statistics never import `tables` (figures).
"""
