"""Shared test set-up: JAX's persistent compilation cache and small compiled trainers."""

import atexit
import os
import pathlib
import shutil
import tempfile

import jax

CACHE_DIR = os.environ.get("VACO_JAX_TEST_CACHE",
                           str(pathlib.Path(__file__).resolve().parent.parent / ".jax_cache"))
jax.config.update("jax_compilation_cache_dir", CACHE_DIR)
# The per-user cache (LLM warm starts, vaco_jax.cache) of a test session is a fresh temporary
# directory, also for subprocesses: tests never read or write the user's own.
os.environ["VACO_JAX_CACHE_DIR"] = tempfile.mkdtemp(prefix="vaco_jax_test_cache_")
atexit.register(shutil.rmtree, os.environ["VACO_JAX_CACHE_DIR"], ignore_errors=True)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


# With pytest-xdist (`-n 2 --dist loadgroup`, the default in pyproject.toml) the tests of a module
# stay on one worker, so each module's shared compiled fixtures are built once; the tests of
# SPREAD modules (independent, compile-heavy, no shared fixture) are spread over the workers.
SPREAD = {"test_learning.py"}


def pytest_collection_modifyitems(items):
    import pytest
    for item in items:
        if item.path.name not in SPREAD:
            item.add_marker(pytest.mark.xdist_group(item.path.name))
