"""`vaco-plot-llm` from a checkout; the command is vaco_jax.commands.plot_llm."""

import sys

from vaco_jax.commands.plot_llm import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m experiments.plot_llm"))
