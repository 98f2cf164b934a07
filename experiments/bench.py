"""`vaco-bench` from a checkout; the command is vaco_jax.commands.bench."""

import sys

from vaco_jax.commands.bench import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m experiments.bench"))
