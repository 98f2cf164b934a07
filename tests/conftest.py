"""Shared test set-up: JAX's persistent compilation cache and small compiled trainers."""

import os
import pathlib

import jax

CACHE_DIR = os.environ.get("VACO_JAX_TEST_CACHE",
                           str(pathlib.Path(__file__).resolve().parent.parent / ".jax_cache"))
jax.config.update("jax_compilation_cache_dir", CACHE_DIR)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
