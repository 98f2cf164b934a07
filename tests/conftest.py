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
