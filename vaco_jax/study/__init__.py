"""The study layer, over the core (`config`, `trainer`, `program`): what the paper's experiments run
and how their results become statistics and figures (SPEC §7).

    presets     studies (algorithm × variant pairs, δ values) and scales (`tiny` … `paper`)
    sweep       planning a sweep into cells, running them resumably, the tidy results table
    references  per-env reference returns (random policy, synchronous PPO-Clip) for normalisation
    stats       rliable interval estimates, probability of improvement, hand-checked formulas
    analysis    from the tidy table to per-study tables (normalised returns, diverged runs)
    plotting    the sweep's figures (matplotlib)

The core never imports this package; the commands (`vaco_jax.commands`) import only from it and the
core's public modules.
"""
