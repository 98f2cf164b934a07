"""Learning thresholds: every algorithm learns synchronously (C = 1).

VACO and PPO-Clip learn DM Control's CartpoleBalance (MuJoCo Playground on MJX) in 300k env steps
per seed; PPO-KL, SPO and IMPALA learn Brax's inverted_pendulum in 60k (it takes VACO and PPO-Clip
about 12k). Without the `dmc` extra, VACO and PPO-Clip learn inverted_pendulum instead.

Episode limit 200 (maximum return 200), seeds 0-3 in one vmapped call (the CLI's compiled chunk),
the default config but for a learning rate of 1e-3 (the same for every algorithm). Every seed's
*final* deterministic evaluation must reach 90% of the maximum return.

Through the adapter (`gymnax:<id>`, the `gymnax` extra), VACO learns a discrete and a continuous
gymnax task, each in under a minute here with its programs compiled:
* CartPole-v1 (2 actions, episode limit 500): 204,800 steps at the default config; measured final
  returns [500, 500, 500, 500] for seeds 0-3 (and 4-7), random policy 23.1 ± 0.8 (256 episodes).
  Threshold: 90% of the maximum, 450.
* Pendulum-v1 (1 continuous action, limit 200): 819,200 steps, 64 envs, γ = 0.9, learning rate
  1e-3 annealed; measured final returns [-170.3, -274.7, -466.2, -175.0] for seeds 0-3 ([-114.8,
  -402.6, -171.4, -233.7] for 4-7), random policy -1244 ± 18. Threshold: -600 (more than half the
  way from random to 0).
"""

import numpy as np
import pytest

from vaco_jax import Config, envs, program
from vaco_jax.trainer import stack_hparams

MAX_RETURN = 200.0
DMC = envs.dmc_available()
GYMNAX = envs.gymnax_available()
ON_DMC = ("vaco", "ppo_clip")


def final_eval_returns(config: Config) -> np.ndarray:
    """Seeds 0-3 trained with the CLI's programs; the final evaluation's return per seed. (The
    evaluation and init programs are the same for every algorithm, so the persistent compilation
    cache compiles them once per env.) Every chunk's losses and TV estimate must be finite."""
    built = program.TrainProgram.build(config, 4, donate=True)
    state = built.init_state(program.seed_keys(range(4)), stack_hparams([config.hparams()] * 4))
    chunk, _ = built.compiled_chunk()
    for _ in range(config.num_evals):
        state, metrics = chunk(state)
        metrics = built.layout.unpad(metrics)
        for key in ["loss", "policy_loss", "value_loss", "tv_estimate"]:
            assert np.all(np.isfinite(metrics[key])), (config.algo, key, metrics[key])
    assert np.all(metrics["env_steps"] == config.env_steps)
    return metrics["eval_return"]


@pytest.mark.slow
@pytest.mark.parametrize("algo", [a for a in ("vaco", "ppo_clip", "ppo_kl", "spo", "impala")
                                  if not (DMC and a in ON_DMC)])
def test_algorithms_learn_inverted_pendulum_synchronously(algo):
    final = final_eval_returns(Config(env="inverted_pendulum", algo=algo, capacity=1,
                                      episode_length=200, total_steps=60_000, learning_rate=1e-3,
                                      num_evals=5))
    assert np.all(final >= 0.9 * MAX_RETURN), f"{algo}: final eval returns per seed {final}"


@pytest.mark.slow
@pytest.mark.skipif(not DMC, reason='needs the dmc extra: pip install -e ".[dmc]"')
@pytest.mark.parametrize("algo", ON_DMC)
def test_vaco_and_ppo_clip_learn_dmc_cartpole_balance(algo):
    final = final_eval_returns(Config(env="dmc:CartpoleBalance", algo=algo, capacity=1,
                                      episode_length=200, total_steps=300_000, learning_rate=1e-3,
                                      num_evals=4))
    assert np.all(final >= 0.9 * MAX_RETURN), f"{algo}: final eval returns per seed {final}"


GYMNAX_TASKS = {
    "CartPole-v1": (Config(env="gymnax:CartPole-v1", algo="vaco", episode_length=500,
                           total_steps=204_800, num_evals=5), 450.0),
    "Pendulum-v1": (Config(env="gymnax:Pendulum-v1", algo="vaco", episode_length=200,
                           num_envs=64, total_steps=819_200, learning_rate=1e-3, gamma=0.9,
                           anneal_lr=True, num_evals=5, eval_envs=16), -600.0),
}


@pytest.mark.skipif(not GYMNAX, reason='needs the gymnax extra: pip install -e ".[gymnax]"')
@pytest.mark.parametrize("task", GYMNAX_TASKS)
def test_vaco_learns_gymnax_tasks_through_the_adapter(task):
    config, threshold = GYMNAX_TASKS[task]
    final = final_eval_returns(config)
    assert np.all(final >= threshold), f"{task}: final eval returns per seed {final}"
