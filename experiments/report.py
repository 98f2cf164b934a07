"""`vaco-report` from a checkout; the command is vaco_jax.commands.report."""

import sys

from vaco_jax.commands.report import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m experiments.report"))
