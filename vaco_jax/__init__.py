"""vaco_jax: fully jitted asynchronous on-policy RL (VACO and baselines) on MuJoCo-MJX."""

import os as _os
import sys as _sys

# MuJoCo picks its OpenGL backend when it is first imported. Without a display (servers, CI,
# notebooks on a cluster) rendering works only through EGL or OSMesa, so choose EGL unless the
# user chose a backend. Only rendering (`vaco_jax.evaluate --video`) uses it.
if not _os.environ.get("MUJOCO_GL") and not _os.environ.get("DISPLAY"):
    _os.environ["MUJOCO_GL"] = "egl"
# XLA's C++ log lines (read when jax is first imported). On CPU, every program loaded from the
# persistent compilation cache logs an error-level notice that the compiling machine's features
# (tuning flags such as +prefer-no-gather) are "not supported" by the same machine; real errors
# also raise Python exceptions. Set TF_CPP_MIN_LOG_LEVEL=0 to see every line. (Once jax is imported
# the level is fixed, and jax itself sets 1.)
if "jax" not in _sys.modules:
    _os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from vaco_jax.config import Config, HParams
from vaco_jax.errors import CheckpointError, ConfigError, DivergenceError, SweepError
from vaco_jax.options import Options
from vaco_jax.policy import Policy, load_policy
from vaco_jax.trainer import Trainer, TrainState, make_train, stack_hparams

__all__ = ["CheckpointError", "Config", "ConfigError", "DivergenceError", "HParams", "Options",
           "Policy", "SweepError", "Trainer", "TrainState", "load_policy", "make_train",
           "stack_hparams"]
