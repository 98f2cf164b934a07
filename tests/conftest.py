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


# pytest-xdist (`-n 2`, the default in pyproject.toml): a module's tests run on one worker, so its
# shared compiled fixtures are built once, while the tests of SPREAD modules (independent and
# compile-heavy, no shared fixture) are scheduled one by one, first, over both workers.
# (xdist's own --dist loadgroup cannot be used: it renames node ids, which pytest 9 ignores.)
SPREAD = {"test_learning.py"}


def _spread(nodeid: str) -> bool:
    return pathlib.PurePath(nodeid.split("::", 1)[0]).name in SPREAD


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: not _spread(item.nodeid))   # stable: SPREAD tests first


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return nodeid if _spread(nodeid) else nodeid.split("::", 1)[0]

    config.option.loadscopereorder = False   # keep the collection order: SPREAD tests first
    return ByModule(config, log)
