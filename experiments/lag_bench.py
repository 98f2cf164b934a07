"""`vaco-bench` from a checkout; the command is vaco_jax.commands.lag_bench."""

import sys

from vaco_jax.commands.lag_bench import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m experiments.lag_bench"))
