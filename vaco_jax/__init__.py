"""vaco_jax: fully jitted asynchronous on-policy RL (VACO and baselines) on MuJoCo-MJX."""

import os as _os
import sys as _sys



def headless_gl_backend(platform: str, environ) -> str | None:
    """The OpenGL backend MuJoCo should render with, or None to leave MuJoCo's own choice.

    MuJoCo picks its backend when it is first imported. A Linux machine without a display
    (servers, CI, notebooks on a cluster) can render only through EGL (or OSMesa, chosen by
    setting `MUJOCO_GL=osmesa`), so EGL is chosen there. macOS and Windows render through their
    own windowing system (CGL, WGL) with or without `DISPLAY`, and have no EGL. A backend the user
    set is always kept. Only rendering (`vaco_jax.evaluate --video`) uses it.
    """
    if environ.get("MUJOCO_GL") or not platform.startswith("linux"):
        return None
    if environ.get("DISPLAY") or environ.get("WAYLAND_DISPLAY"):
        return None
    return "egl"


_backend = headless_gl_backend(_sys.platform, _os.environ)
if _backend is not None:
    _os.environ["MUJOCO_GL"] = _backend
# XLA's C++ log lines (read when jax is first imported). On CPU, every program loaded from the
# persistent compilation cache logs an error-level notice that the compiling machine's features
# (tuning flags such as +prefer-no-gather) are "not supported" by the same machine; real errors
# also raise Python exceptions. Set TF_CPP_MIN_LOG_LEVEL=0 to see every line. (Once jax is imported
# the level is fixed, and jax itself sets 1.)
if "jax" not in _sys.modules:
    _os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from vaco_jax.algorithms import objective, register_objective
from vaco_jax.config import Config, HParams
from vaco_jax.envs import register_env
from vaco_jax.errors import CheckpointError, ConfigError, DivergenceError, SweepError
from vaco_jax.options import Options
from vaco_jax.policy import Policy, load_policy
from vaco_jax.trainer import Trainer, TrainState, make_train, stack_hparams

__all__ = ["CheckpointError", "Config", "ConfigError", "DivergenceError", "HParams", "Options",
           "Policy", "SweepError", "Trainer", "TrainState", "load_policy", "make_train",
           "objective", "register_env", "register_objective", "run", "stack_hparams"]


def __getattr__(name: str):
    # `run` (the checkpointed loop of `python -m vaco_jax.train`) is imported when first used:
    # its module brings orbax, tyro and the loggers, which `import vaco_jax` need not load.
    if name == "run":
        from vaco_jax.train import run

        return run
    raise AttributeError(f"module 'vaco_jax' has no attribute {name!r}")
