"""The program builder: a stored or cached program is handed out only for what it was traced from."""

import dataclasses
import functools
import random

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


class FakeDevice:
    """A device of some process, as `program.layout` sees it (no run needs it to exist)."""

    def __init__(self, process_index: int, id: int):
        self.process_index, self.id = process_index, id

    def __repr__(self):
        return f"process {self.process_index} device {self.id}"


def test_one_runs_envs_are_split_over_the_devices_of_every_process():
    # 2 processes × 4 devices; a process left without a share of the envs holds no part of the run.
    devices = [FakeDevice(p, 4 * p + i) for p in range(2) for i in range(4)]
    logged = []

    def split(num_envs):
        placed = program.layout(1, num_envs=num_envs, devices=devices, log=logged.append)
        return placed.axis, [(d.process_index, d.id) for d in placed.mesh.devices.flat]

    assert split(4) == ("envs", [(0, 0), (0, 1), (1, 4), (1, 5)])
    assert logged == ["warning: the one run's 4 envs split evenly over 4 of the 8 devices only; "
                      "use a num_envs divisible by 8 to use them all"]
    assert split(8) == ("envs", [(p, 4 * p + i) for p in range(2) for i in range(4)])
    assert split(6) == ("envs", [(0, 0), (0, 1), (0, 2), (1, 4), (1, 5), (1, 6)])
    # No even split over both processes: the run is padded onto every device instead, and said so.
    logged.clear()
    axis, used = split(3)
    assert axis == "runs" and len(used) == 8
    assert logged == ["warning: the one run's 3 envs cannot be split evenly over the 2 processes, "
                      "so every device runs a copy of the run; use a num_envs divisible by 2"]
    # One process: as before, the most devices that divide the envs.
    one_process = [FakeDevice(0, i) for i in range(4)]
    placed = program.layout(1, num_envs=10, devices=one_process)
    assert placed.axis == "envs" and [d.id for d in placed.mesh.devices.flat] == [0, 1]


_CHOLESKY_IN_A_NEW_PROCESS = """
import sys
import numpy as np
from vaco_jax import cache
store = cache.ProgramStore(sys.argv[1])
if sys.argv[2] == "save":
    import jax
    import jax.numpy as jnp
    compiled = jax.jit(jnp.linalg.cholesky).lower(jnp.zeros((3, 3), jnp.float32)).compile()
    assert store.save("cholesky", "learn", compiled)
else:   # a new process: nothing lowered, the program loaded whole and run
    compiled = store.load("cholesky", "learn")
    a = np.array([[4.0, 2.0, 0.0], [2.0, 5.0, 1.0], [0.0, 1.0, 3.0]], np.float32)
    np.testing.assert_allclose(np.asarray(compiled(a)), np.linalg.cholesky(a), rtol=1e-6)
    print("ok")
"""


def test_a_stored_program_that_factorises_runs_in_a_process_that_lowered_nothing(tmp_path):
    # MJX's Newton solver factorises with LAPACK's Cholesky. jaxlib sets up its LAPACK kernels
    # when such an op is lowered, so a process that only loaded stored programs (a saved DM Control
    # run resumed) crashed on its first factorisation.
    import subprocess
    import sys

    def run(mode):
        return subprocess.run([sys.executable, "-c", _CHOLESKY_IN_A_NEW_PROCESS, str(tmp_path), mode],
                              capture_output=True, text=True, timeout=300)

    saved = run("save")
    assert saved.returncode == 0, saved.stderr[-2000:]
    loaded = run("load")
    assert loaded.returncode == 0 and loaded.stdout.strip() == "ok", (
        f"return code {loaded.returncode}: {loaded.stderr[-2000:]}")
