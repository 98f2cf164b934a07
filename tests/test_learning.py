"""Learning thresholds: every algorithm learns inverted_pendulum synchronously (C = 1).

Episode limit 200 (maximum return 200), 60k env steps per seed, seeds 0-3 in one vmapped call (the
CLI's compiled chunk), the default config but for a learning rate of 1e-3 (the same for every
algorithm). Every seed's *final* deterministic evaluation must reach 90% of
the maximum return.
"""

import numpy as np
import pytest

from vaco_jax import Config, program
from vaco_jax.trainer import stack_hparams

MAX_RETURN = 200.0


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["vaco", "ppo_clip", "ppo_kl", "spo", "impala"])
def test_every_algorithm_learns_inverted_pendulum_synchronously(algo):
    config = Config(env="inverted_pendulum", algo=algo, capacity=1, episode_length=200,
                    total_steps=60_000, learning_rate=1e-3, num_evals=5)
    # The CLI's programs: the evaluation (and init) are the same for every algorithm, so the
    # persistent compilation cache compiles them once for all five tests.
    built = program.TrainProgram.build(config, 4, donate=True)
    state = built.init_state(program.seed_keys(range(4)), stack_hparams([config.hparams()] * 4))
    chunk, _ = built.compiled_chunk()
    for _ in range(config.num_evals):
        state, metrics = chunk(state)
    final = built.layout.unpad(metrics)["eval_return"]
    assert np.all(final >= 0.9 * MAX_RETURN), f"{algo}: final eval returns per seed {final}"
