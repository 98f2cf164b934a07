"""`vaco-references` from a checkout; the command is vaco_jax.commands.references."""

import sys

from vaco_jax.commands.references import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m experiments.references"))
