"""The program builder: a stored or cached program is handed out only for what it was traced from."""

import dataclasses
import functools
import random

import jax
import numpy as np
import pytest
from brax import envs as brax_envs

from vaco_jax import cache, envs, program
from vaco_jax.trainer import stack_hparams

from test_trainer import TINY


class ScaledReach(envs.ToyReach):
    """toy_reach with its rewards scaled, for registering with Brax under an MJX env's name."""

    def __init__(self, reward_scale: float = 1.0, backend: str = "mjx"):
        self.reward_scale = reward_scale

    def step(self, state, action):
        state = super().step(state, action)
        return state.replace(reward=self.reward_scale * state.reward)


@pytest.fixture
def hopper_registered_as():
    """`register(reward_scale)`: Brax's "hopper" is `ScaledReach(reward_scale)` until the test ends."""
    original = brax_envs._envs["hopper"]
    yield lambda scale: brax_envs.register_environment(
        "hopper", functools.partial(ScaledReach, reward_scale=scale))
    brax_envs.register_environment("hopper", original)


def test_an_env_registered_again_under_its_name_gets_its_own_program(hopper_registered_as,
                                                                      tmp_path):
    # A user registers an env name twice with other constructor arguments. The program is one no
    # earlier session has in JAX's cache (only a program compiled in this process is stored).
    config = dataclasses.replace(TINY, env="hopper", actor_hidden=(random.randrange(17, 500), 16))
    # Parameters that (nearly) do not move: the envs then differ only in the rewards' scale.
    frozen = stack_hparams([dataclasses.replace(config, learning_rate=1e-20).hparams()])
    store = cache.ProgramStore(tmp_path)

    def build(fresh_process: bool):
        if fresh_process:
            program._build.cache_clear()
        return program.TrainProgram.build(config, 1, store=store)

    def eval_return(built):
        state = built.init_state(program.seed_keys([0]), frozen)
        return float(built.compiled_chunk()[0](state)[1]["eval_return"][0])

    hopper_registered_as(1.0)
    unscaled = build(fresh_process=True)
    unscaled_return = eval_return(unscaled)
    hopper_registered_as(2.0)
    scaled = build(fresh_process=True)     # not the stored program of the other env
    assert not scaled.loaded
    assert eval_return(scaled) == pytest.approx(2 * unscaled_return, rel=1e-5)
    hopper_registered_as(1.0)
    again = build(fresh_process=False)     # nor, in this process, the program built last
    assert again is not scaled and again.loaded   # the first env's, from the store
    assert eval_return(again) == unscaled_return
    program._build.cache_clear()
