"""One analysis pipeline for every study, in the order it runs:

    runs             sweep directories → one tidy table, one row per run
    scores           one normalisation: random = 0, a reference = 1
    estimates        retention, paired differences, break-lag (`vaco_jax.analysis.paired`)
    preregistration  families, paired tests, Holm, verdicts, the ancestry check
                     (`vaco_jax.analysis.families`)
    compare          a committed file against its regeneration (`vaco_jax.analysis.check`)
    tables           the one interval formatter, generic tables and figures

Each module imports only those above it in this list, `vaco_jax.analysis` and `vaco_jax.study`'s
sweeps; none imports a study. Statistics never import `tables` (figures).
"""
