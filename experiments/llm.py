"""`vaco-llm` from a checkout; the command is vaco_jax.commands.llm."""

import sys

from vaco_jax.commands.llm import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m experiments.llm"))
