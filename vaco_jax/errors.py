"""Every error vaco_jax raises on purpose, on the ground floor (imports nothing of the package).

Each is raised before anything compiles or before anything written is touched, and its message
names what is wrong and what to do.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Literal


class ConfigError(ValueError):
    """A config field or option has a value that cannot be run with (raised before compilation)."""


class CheckpointError(ValueError):
    """A checkpoint cannot be used (missing, corrupt, or from another config or library versions)."""


class SweepError(RuntimeError):
    """A sweep directory holds results that do not match the requested sweep."""


class DivergenceError(RuntimeError):
    """A seed's loss, gradient or parameters became non-finite (and the run was told to stop)."""


def did_you_mean(value, choices) -> str:
    """"; did you mean 'x'?" naming the choices closest to `value` (difflib), or "" when none is
    close: appended to an error that lists what is allowed."""
    import difflib

    close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=3, cutoff=0.6)
    if not close:
        return ""
    return "; did you mean " + " or ".join(repr(c) for c in close) + "?"


def invalid(field: str, value, allowed: str) -> ConfigError:
    """The one wording of a bad field: `config field `name` = value is invalid: what is allowed`."""
    return ConfigError(f"config field `{field}` = {value!r} is invalid: {allowed}")


def invalid_option(option: str, value, allowed: str) -> ConfigError:
    """The wording of a bad process option (`vaco_jax.options`): not a config field of the run."""
    return ConfigError(f"option `{option}` = {value!r} is invalid: {allowed}")


def check_types(instance) -> None:
    """Refuse a dataclass field whose value has the wrong type (the Python API does not go through
    the command line's parsing); field types this does not know are left to specific checks."""
    hints = typing.get_type_hints(type(instance))
    for field in dataclasses.fields(instance):
        _check_type(field.name, getattr(instance, field.name), hints[field.name])


def _check_type(name: str, value, hint) -> None:
    origin = typing.get_origin(hint)
    if hint is bool:
        ok, allowed = isinstance(value, bool), "must be True or False"
    elif hint is int:
        ok, allowed = isinstance(value, int) and not isinstance(value, bool), "must be an integer"
    elif hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        allowed = "must be a number"
    elif hint is str:
        ok, allowed = isinstance(value, str), "must be a string"
    elif origin is Literal:
        ok, allowed = value in typing.get_args(hint), f"allowed values are {typing.get_args(hint)}"
    elif origin is tuple and typing.get_args(hint)[0] is str:
        ok = isinstance(value, tuple) and all(isinstance(v, str) for v in value)
        allowed = "must be a tuple of strings"
    elif origin is tuple and typing.get_args(hint)[0] is float:
        ok = isinstance(value, tuple) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
        allowed = "must be a tuple of numbers"
    elif origin is tuple:
        ok = isinstance(value, tuple) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value)
        allowed = "must be a tuple of integers"
    else:
        return
    if not ok:
        raise invalid(name, value, allowed)
