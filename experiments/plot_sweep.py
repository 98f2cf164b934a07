"""`vaco-plot-sweep` from a checkout; the command is vaco_jax.commands.plot_sweep."""

import sys

from vaco_jax.commands.plot_sweep import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m experiments.plot_sweep"))
