"""`vaco-llm` from a checkout; the command is vaco_jax.commands.llm_forward_lag."""

import sys

from vaco_jax.commands.llm_forward_lag import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m experiments.llm_forward_lag"))
