"""Shared test set-up: JAX's persistent compilation cache and the order tests are handed out."""

import atexit
import os
import pathlib
import shutil
import tempfile

import jax
import pytest

# First, before any test module imports brax or mujoco: vaco_jax chooses MuJoCo's headless GL
# backend (MUJOCO_GL) at import, which MuJoCo reads when it is first imported.
import vaco_jax  # noqa: F401

CACHE_DIR = os.environ.get("VACO_JAX_TEST_CACHE",
                           str(pathlib.Path(__file__).resolve().parent.parent / ".jax_cache"))
jax.config.update("jax_compilation_cache_dir", CACHE_DIR)
# The per-user cache (LLM warm starts, vaco_jax.cache) of a test session is a fresh temporary
# directory, also for subprocesses: tests never read or write the user's own.
os.environ["VACO_JAX_CACHE_DIR"] = tempfile.mkdtemp(prefix="vaco_jax_test_cache_")
atexit.register(shutil.rmtree, os.environ["VACO_JAX_CACHE_DIR"], ignore_errors=True)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


# pytest-xdist (`-n 2`, the default in pyproject.toml) hands out work in scopes, each run by one
# worker so its shared compiled fixtures are built once: a module, or for BY_FUNCTION modules a
# test function (all its parameters: test_learning's envs share their evaluation programs).
# Scopes go out heaviest first, in the order of HEAVY_FIRST (roughly their seconds on two cores:
# 230, 220, 150, 140, 140, 115, 100, 75, 70, 70, 50, 45, 45, 40), so the two workers finish
# together.
# (xdist's own --dist loadgroup cannot be used: it renames node ids, which pytest 9 ignores.)
BY_FUNCTION = {"test_learning.py"}
HEAVY_FIRST = [
    "test_learning.py::test_algorithms_learn_inverted_pendulum_synchronously",
    "test_scale_out.py", "test_multiprocess.py", "test_trainer.py",
    "test_notebooks.py", "test_learning.py::test_vaco_and_ppo_clip_learn_dmc_cartpole_balance",
    "test_sweep.py", "test_stale_objectives.py", "test_lag_bench.py", "test_user_objectives.py",
    "test_shards.py", "test_baselines.py",
    "test_learning.py::test_vaco_learns_gymnax_tasks_through_the_adapter",
    "test_benchmarks.py", "test_cli.py", "test_update_log.py", "test_custom_envs.py", "test_dmc.py",
    "test_policy.py", "test_discrete.py", "test_checkpoint.py", "test_llm_grpo.py", "test_envs.py",
    "test_llm_model.py",
]


def scope(nodeid: str) -> str:
    path, _, rest = nodeid.partition("::")
    module = pathlib.PurePath(path).name
    return f"{module}::{rest.split('[', 1)[0]}" if module in BY_FUNCTION else module


def _rank(nodeid: str) -> int:
    name = scope(nodeid)
    return HEAVY_FIRST.index(name) if name in HEAVY_FIRST else len(HEAVY_FIRST)


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: _rank(item.nodeid))   # stable: a module's tests keep their order


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ByScope(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope(nodeid)

    config.option.loadscopereorder = False   # keep the collection order: heaviest scopes first
    return ByScope(config, log)


@pytest.fixture
def stub_warm_start(monkeypatch):
    """`stub(model_config, seed=0)`: the LLM sweep's warm start (`experiment.sft.warm_start`)
    becomes freshly initialised parameters of that seed, with the record a loaded one has."""
    from vaco_jax.llm import experiment, model

    def stub(model_config, seed=0):
        def warm_start(*args, **kwargs):
            params = model.init_params(model_config, jax.random.PRNGKey(seed))
            return params, {"base_accuracy": 0.45, "final_loss": 1.0, "seconds": 0.0,
                            "cached": True, "key": "x", "digest": experiment.sft.digest(params),
                            "sha256": experiment.sft.sha256(params), "origin": "cache",
                            "path": "x.msgpack"}
        monkeypatch.setattr(experiment.sft, "warm_start", warm_start)

    return stub
