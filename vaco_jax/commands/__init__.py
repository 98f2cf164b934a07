"""The installed commands (pyproject.toml, `[project.scripts]`), one module each: parse the
arguments, call the library, write what it returns. They run from any directory. A module imports
only what its parser needs (`vaco_jax.config`, `.options`, `.catalog`, the presets, tyro) and the
library once the arguments are parsed, so `--help` imports no JAX.

    vaco-train             train                       one algorithm on one env, many seeds
    vaco-evaluate          evaluate                    a trained policy: returns, video, viewer
    vaco-sweep             sweep                       the MuJoCo lag sweeps (every preset, study)
    vaco-references        references                  a sweep's normalisation references
    vaco-plot-sweep        plot_sweep                  a capacity sweep's statistics and figures
    vaco-report            report                      the controlled-lag study's report
    vaco-bench             bench                       the lag-robustness benchmark and leaderboard
    vaco-llm               llm                         GRPO under forward lag (the LLM testbed)
    vaco-plot-runs         plot_runs                   training curves of vaco-train runs
    vaco-plot-diagnostics  plot_diagnostics            the lag diagnostics of vaco-train runs
    vaco-plot-llm          plot_llm                    an LLM forward-lag sweep's figure, redrawn

`python -m vaco_jax.commands.train` and `python -m vaco_jax.commands.evaluate` run the first two, and in a checkout
`python -m experiments.<module>` the others (`experiments/` holds one line per command). Each
`main` takes `prog`, the name its usage line shows: the installed command's by default.
"""
