"""Redraw an LLM forward-lag sweep's figure (forward_lag.png) from its results, without training.

    vaco-plot-llm results/llm/forward-lag-10seeds                          # in place
    vaco-plot-llm results/llm/forward-lag-10seeds --out /tmp/forward_lag.png

Reads the directory's summary.json and config.json (as `vaco-llm` writes them) and draws greedy
and sampled held-out accuracy, the clip and filter fractions against N, and the accuracy over
training (`vaco_jax.llm.experiment.plot`); redrawn in place, it also writes the pre-registered
tests of VACO against PPO-Clip to <directory>/primary.csv (`vaco_jax.llm.experiment.primary_tests`).
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None, prog: str = "vaco-plot-llm") -> int:
    parser = argparse.ArgumentParser(prog=prog,
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", help="a sweep's results directory (summary.json, config.json)")
    parser.add_argument("--out", default="",
                        help="the figure's path (default <directory>/forward_lag.png; a second figure, "
                             "<name>_objectives.png, beside it when more than four objectives ran)")
    args = parser.parse_args(argv)
    from vaco_jax.llm import experiment   # after parsing: --help imports nothing heavy

    try:
        paths = experiment.replot(args.directory, args.out or None)
    except (FileNotFoundError, KeyError) as error:
        print(f"error: {args.directory} holds no finished sweep ({error})", file=sys.stderr)
        return 2
    print("\n".join(f"wrote {path}" for path in paths))
    return 0
