"""Learning thresholds: every algorithm learns inverted_pendulum synchronously (C = 1).

Episode limit 200 (maximum return 200), 60k env steps per seed, 4 seeds in one vmapped call, the
default config but for a learning rate of 1e-3 (the same for every algorithm). Each run compiles and
trains in about 45 s on a 2-core CPU. Every seed's *final* deterministic evaluation must reach 90% of
the maximum return.
"""

import jax
import numpy as np
import pytest

from vaco_jax import Config, Trainer

MAX_RETURN = 200.0


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["vaco", "ppo_clip", "ppo_kl", "spo", "impala"])
def test_every_algorithm_learns_inverted_pendulum_synchronously(algo):
    config = Config(env="inverted_pendulum", algo=algo, capacity=1, episode_length=200,
                    total_steps=60_000, learning_rate=1e-3, num_evals=5)
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    _, metrics = jax.jit(jax.vmap(Trainer(config).train))(keys)
    final = np.asarray(metrics["eval_return"][:, -1])
    assert np.all(final >= 0.9 * MAX_RETURN), f"{algo}: final eval returns per seed {final}"
