"""vaco_jax: fully jitted asynchronous on-policy RL (VACO and baselines) on MuJoCo-MJX."""

import os as _os
import sys as _sys


def headless_gl_backend(platform: str, environ, has_egl=None) -> str | None:
    """The OpenGL backend MuJoCo should render with, or None to leave MuJoCo's own choice.

    MuJoCo picks its backend when it is first imported. A Linux machine without a display
    (servers, CI, notebooks on a cluster) can render only through EGL (or OSMesa, chosen by
    setting `MUJOCO_GL=osmesa`), so EGL is chosen there. macOS and Windows render through their
    own windowing system (CGL, WGL) with or without `DISPLAY`, and have no EGL. A backend the user
    set is always kept. Only rendering (`vaco-evaluate --video`) uses it, but MuJoCo loads the
    chosen backend's library when it is imported: on a machine without libEGL (a GPU container
    with no OpenGL libraries, say) choosing EGL would stop `import mujoco`, and so all training.
    `has_egl()` says whether libEGL can be found (default: ctypes' library search); it is asked
    only when EGL would be chosen.
    """
    if environ.get("MUJOCO_GL") or not platform.startswith("linux"):
        return None
    if environ.get("DISPLAY") or environ.get("WAYLAND_DISPLAY"):
        return None
    if has_egl is None:
        def has_egl():
            import ctypes.util
            return ctypes.util.find_library("EGL") is not None
    return "egl" if has_egl() else None


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

# The public names, each imported from its module when first used: `import vaco_jax` (and so a
# command's `--help`) loads no JAX, and the XLA log level above is still set before JAX is imported.
_PUBLIC = {
    "objective": "algorithms", "register_objective": "algorithms", "Config": "config",
    "HParams": "hparams", "register_env": "envs", "CheckpointError": "errors",
    "ConfigError": "errors", "DivergenceError": "errors", "SweepError": "errors",
    "Options": "options", "Policy": "policy", "load_policy": "policy", "Trainer": "trainer",
    "TrainState": "trainer", "make_train": "trainer", "stack_hparams": "trainer",
    # the checkpointed loop of `vaco-train`
    "run": "driver",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    import importlib
    import importlib.util

    if name in _PUBLIC:
        value = getattr(importlib.import_module(f"vaco_jax.{_PUBLIC[name]}"), name)
        globals()[name] = value   # found directly from now on
        return value
    if not name.startswith("_") and importlib.util.find_spec(f"vaco_jax.{name}") is not None:
        return importlib.import_module(f"vaco_jax.{name}")   # `vaco_jax.envs` after `import vaco_jax`
    raise AttributeError(f"module 'vaco_jax' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
