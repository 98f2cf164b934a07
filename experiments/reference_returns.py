"""`vaco-references` from a checkout; the command is vaco_jax.commands.reference_returns."""

import sys

from vaco_jax.commands.reference_returns import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m experiments.reference_returns"))
