"""`vaco-report` from a checkout; the command is vaco_jax.commands.lag_report."""

import sys

from vaco_jax.commands.lag_report import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m experiments.lag_report"))
