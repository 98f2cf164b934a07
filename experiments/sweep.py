"""`vaco-sweep` from a checkout; the command is vaco_jax.commands.sweep."""

import sys

from vaco_jax.commands.sweep import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m experiments.sweep"))
