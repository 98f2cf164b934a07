"""What a traced program is made of, as one hash: the live code it calls and the values it reads.

A compiled program kept on disk (`cache.ProgramStore`) may only be handed to a process that would
trace the same program. Names and versions do not say that: an env registered again under the
same name with other constructor arguments, an edited reward module, a module reloaded by a
notebook, another entry in the algorithm registry or a module constant changed at run time all
trace something else. `fingerprint` hashes what is there instead:

* objects (an env and the envs it wraps, the algorithm): their class, and every attribute by value
  (numbers, strings, arrays by their bytes, MJX models field by field, other objects by their
  attributes or, failing that, their pickled bytes);
* code: a function by its compiled code, defaults, closure and the globals it names, as they are
  now (a module it names, by the module's attributes it names); a class by everything it defines;
  a module held by an object (e.g. a Brax env's physics pipeline) by its functions, classes and
  constants. Code that a version pins (the standard library, and installed libraries unless named
  in `packages`) counts by name: the library versions key the store already.

Code is hashed as it is loaded, not as it is on disk, so a module edited after it was imported, or
reloaded by a notebook's autoreload, is hashed as the process runs it. What cannot be hashed by
value (an object with neither attributes nor a pickle, a class defined in a notebook, whose code
may read anything) makes the fingerprint unstorable: it then still tells objects apart within the
process (by their identity), but must not be used to share programs between processes.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import inspect
import pickle
import re
import sys
import sysconfig
import types
from pathlib import Path

import numpy as np

# Hashed by name: their versions key a stored program (`io.library_versions`), or they are tools
# whose code does not shape one.
VERSIONED = frozenset({
    "jax", "jaxlib", "numpy", "scipy", "flax", "optax", "distrax", "chex", "mujoco", "orbax",
    "tensorflow_probability", "ml_collections", "etils", "absl", "typing_extensions", "rlax",
})
_IMMUTABLE = (type(None), bool, int, float, complex, str, bytes, enum.Enum)
_MODULE_SKIPS = frozenset({"__builtins__", "__loader__", "__spec__", "__file__", "__cached__",
                           "__path__", "__doc__"})


@dataclasses.dataclass(frozen=True)
class Fingerprint:
    digest: str       # 24 hex digits
    storable: bool    # every part hashed by value: equal digests mean the same program
    unknown: tuple[str, ...] = ()   # what could not be hashed by value (types), when not storable


def fingerprint(*roots, packages=()) -> Fingerprint:
    """The fingerprint of `roots` (objects, functions, classes). `packages`: top-level packages
    whose code is hashed by value although installed (e.g. the env's: `brax`, `mujoco_playground`)."""
    walker = _Walker(frozenset(packages))
    for root in roots:
        walker.value(root, strict=True)
    return Fingerprint(walker.digest.hexdigest()[:24], not walker.unknown, tuple(walker.unknown))


def stablehlo_text(lowered) -> str:
    """A lowered program's StableHLO without source locations, its functions renamed in order of
    appearance (`rename_symbols`)."""
    return rename_symbols(lowered.as_text(debug_info=False))


def rename_symbols(text: str) -> str:
    """StableHLO text with its symbols renamed in order of appearance (`@f0`, `@f1`, ...): a
    comment, a docstring, a moved line or a renamed helper keeps it. It still depends on how JAX
    split the program into private functions, which can depend on what the process lowered
    before: `module_digest` does not."""
    names: dict[str, str] = {}
    return _SYMBOL.sub(lambda m: names.setdefault(m.group(0), f"@f{len(names)}"), text)


def module_digest(text: str) -> str:
    """A hash (16 hex digits) of what a StableHLO module computes, whatever its functions are
    called, in which order they are printed, and whether JAX emitted one private helper or two
    identical copies of it (which depends on what the process lowered before). Each function is
    hashed by its signature and body with every call replaced by the callee's hash (a Merkle
    hash over the call graph); the module, by its attributes and its public functions' hashes."""
    header, _, rest = text.partition("\n")
    functions = {name: (visibility, body) for visibility, name, body in _FUNCTION.findall(rest)}
    digests: dict[str, str] = {}

    def digest(name: str) -> str:
        if name not in digests:
            body = _SYMBOL.sub(lambda m: (f"@{digest(m.group(0)[1:])}" if m.group(0)[1:] in functions
                                          else m.group(0)), functions[name][1])
            digests[name] = hashlib.sha256(body.encode()).hexdigest()
        return digests[name]

    public = [digest(name) for name, (visibility, _) in functions.items() if visibility == "public"]
    module = _SYMBOL.sub("@module", header, count=1)
    return hashlib.sha256(repr((module, public)).encode()).hexdigest()[:16]


_SYMBOL = re.compile(r"@[A-Za-z_][\w.$-]*")
# A top-level function of a module: `  func.func <visibility> @<name>(...) ... {` to `  }`.
_FUNCTION = re.compile(r"^  func\.func (public|private) @([A-Za-z_][\w.$-]*)(.*?)^  \}$",
                       re.M | re.S)


def top_level_package(obj) -> str:
    """The top-level package of the module that defines `obj` (an object's class, a function...)."""
    module = getattr(obj if isinstance(obj, (type, types.FunctionType)) else type(obj),
                     "__module__", "") or ""
    return module.split(".")[0]


@functools.cache
def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple(str(Path(paths[name]).resolve()) for name in ("stdlib", "purelib", "platlib"))


@functools.cache
def _installed(module_name: str) -> bool:
    """Is `module_name` standard library, VERSIONED, or installed in site-packages?"""
    top = module_name.split(".")[0]
    if top in VERSIONED or top in sys.builtin_module_names or top in sys.stdlib_module_names:
        return True
    path = getattr(sys.modules.get(module_name), "__file__", None)
    return bool(path) and str(Path(path).resolve()).startswith(_library_dirs())


class _Walker:
    def __init__(self, packages: frozenset):
        self.digest = hashlib.sha256()
        self.packages = packages
        self.unknown: list[str] = []
        self._seen: dict = {}    # id (or module name) -> visit number
        self._alive: list = []   # keeps the ids of visited objects unique during the walk

    def _emit(self, *parts) -> None:
        self.digest.update(repr(parts).encode() + b"\0")

    def _by_value(self, module_name: str | None) -> bool:
        """Is code of `module_name` hashed by value (else by name)?"""
        module_name = module_name or ""
        return module_name.split(".")[0] in self.packages or not _installed(module_name)

    def _first_visit(self, key, obj) -> bool:
        if key in self._seen:
            self._emit("ref", self._seen[key])
            return False
        self._seen[key] = len(self._seen)
        self._alive.append(obj)
        return True

    def value(self, x, *, strict: bool) -> None:
        """Hash `x`. `strict`: what cannot be hashed by value makes the fingerprint unstorable
        (else, for globals a function names such as a logger, its type stands for it)."""
        if isinstance(x, _IMMUTABLE):
            self._emit("v", type(x).__name__, repr(x))
        elif isinstance(x, (np.ndarray, np.generic)):
            self._emit("array", x.dtype.str, np.shape(x))
            self.digest.update(np.ascontiguousarray(x).tobytes())
        elif _is_jax_array(x):
            self.value(np.asarray(x), strict=strict)
        elif not self._first_visit(id(x), x):   # a cycle, or met before: referred to
            return
        elif isinstance(x, (list, tuple)):
            self._emit(type(x).__name__, len(x))
            for item in x:
                self.value(item, strict=strict)
        elif isinstance(x, (set, frozenset)):   # in sorted order: set order varies by process
            self._emit(type(x).__name__, sorted(self._sub_digest(item, strict) for item in x))
        elif isinstance(x, dict):
            self._emit("dict", len(x))
            for key, item in sorted(x.items(), key=lambda kv: repr(kv[0])):
                self.value(key, strict=strict)
                self.value(item, strict=strict)
        elif isinstance(x, types.ModuleType):
            self._module(x)
        elif isinstance(x, type):
            self._class(x, strict=strict)
        elif isinstance(x, types.FunctionType):
            self._function(x)
        elif isinstance(x, types.MethodType):
            self._emit("method")
            self.value(x.__func__, strict=strict)
            self.value(x.__self__, strict=strict)
        elif isinstance(x, functools.partial):
            self._emit("partial")
            for part in (x.func, x.args, x.keywords):
                self.value(part, strict=strict)
        elif isinstance(x, (staticmethod, classmethod)):
            self._emit(type(x).__name__)
            self.value(x.__func__, strict=strict)
        elif isinstance(x, property):
            self._emit("property")
            for accessor in (x.fget, x.fset, x.fdel):
                self.value(accessor, strict=strict)
        elif isinstance(x, (types.BuiltinFunctionType, types.WrapperDescriptorType,
                            types.MethodDescriptorType, types.GetSetDescriptorType,
                            types.MemberDescriptorType, types.MethodWrapperType)):
            self._emit("builtin", getattr(x, "__module__", None), getattr(x, "__qualname__", None))
        elif callable(x) and hasattr(x, "__wrapped__"):   # jax.jit and other wrappers
            self._emit("wrapped", type(x).__qualname__)
            self.value(x.__wrapped__, strict=strict)
        else:
            self._object(x, strict=strict)

    def _sub_digest(self, item, strict: bool) -> str:
        sub = _Walker(self.packages)
        sub.value(item, strict=strict)
        self.unknown.extend(sub.unknown)
        return sub.digest.hexdigest()

    def _object(self, x, *, strict: bool) -> None:
        cls = type(x)
        self._class(cls, strict=strict)
        if dataclasses.is_dataclass(x):
            fields = {f.name: getattr(x, f.name) for f in dataclasses.fields(x)}
        elif hasattr(x, "__dict__") or _slots(cls):
            fields = dict(getattr(x, "__dict__", {}))
            fields.update({slot: getattr(x, slot) for slot in _slots(cls) if hasattr(x, slot)})
        else:
            try:   # e.g. a compiled MuJoCo model: its pickle holds every array
                payload = pickle.dumps(x)
            except Exception:  # noqa: BLE001 -- unpicklable: not known by value
                self._unknown(x, strict)
                return
            self._emit("pickle", len(payload))
            self.digest.update(payload)
            return
        self._emit("fields", sorted(fields))
        for name in sorted(fields):
            self.value(fields[name], strict=strict)

    def _class(self, cls: type, *, strict: bool) -> None:
        self._emit("class", cls.__module__, cls.__qualname__)
        if not self._by_value(cls.__module__) or not self._first_visit(("class", id(cls)), cls):
            return
        if strict and (cls.__module__ == "__main__" or _source_file(cls) is None):
            self._unknown(cls, strict)   # e.g. defined in a notebook: its globals are not known
        for base in cls.__mro__[1:]:
            self._emit("base", base.__module__, base.__qualname__)
            if base is not object:
                self._class(base, strict=strict)
        for name in sorted(vars(cls)):
            if name not in ("__dict__", "__weakref__", "__doc__", "__module__"):
                self._emit("name", name)
                self.value(vars(cls)[name], strict=False)

    def _module(self, module: types.ModuleType) -> None:
        """A module held as a value: its own functions, classes and constants."""
        self._emit("module", module.__name__)
        if not self._by_value(module.__name__) or module.__name__ == "__main__":
            return
        if not self._first_visit(("module", module.__name__), module):
            return
        for name, item in sorted(vars(module).items()):
            if name in _MODULE_SKIPS:
                continue
            self._emit("name", name)
            if isinstance(item, types.ModuleType):
                self._emit("module", item.__name__)
            elif isinstance(item, (type, types.FunctionType) + _IMMUTABLE):
                self.value(item, strict=False)
            else:   # run-time state (caches, counters): not what a program is traced from
                self._emit("state", type(item).__qualname__)

    def _function(self, fn: types.FunctionType) -> None:
        self._emit("function", fn.__module__, fn.__qualname__)
        if not self._by_value(fn.__module__):
            return
        self._code(fn.__code__)
        self.value(fn.__defaults__, strict=True)
        self.value(fn.__kwdefaults__, strict=True)
        for cell in fn.__closure__ or ():
            try:
                contents = cell.cell_contents
            except ValueError:   # an empty cell (a name not bound yet)
                contents = None
            self.value(contents, strict=True)
        names = _names(fn.__code__)
        for name in sorted(names & fn.__globals__.keys()):   # the globals it reads, as they are now
            item = fn.__globals__[name]
            self._emit("global", name)
            if isinstance(item, types.ModuleType):   # `module.attr`: the attributes it names
                self._emit("module", item.__name__)
                if self._by_value(item.__name__):
                    for attr in sorted(names & vars(item).keys()):
                        self._emit("attribute", attr)
                        self.value(vars(item)[attr], strict=False)
            else:
                self.value(item, strict=False)

    def _code(self, code: types.CodeType) -> None:
        # Not its file name or line numbers: moving a checkout changes neither the program nor this.
        self._emit("code", code.co_argcount, code.co_kwonlyargcount, code.co_flags, code.co_names,
                   code.co_varnames, code.co_freevars, code.co_cellvars)
        self.digest.update(code.co_code)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                self._code(const)
            else:
                self.value(const, strict=True)

    def _unknown(self, x, strict: bool) -> None:
        kind = x if isinstance(x, type) else type(x)
        self._emit("unknown", kind.__module__, kind.__qualname__)
        if strict:
            self.unknown.append(f"{kind.__module__}.{kind.__qualname__}")
            self._emit("identity", id(x))   # tells objects apart within this process only


def _names(code: types.CodeType) -> set[str]:
    """The global and attribute names `code` (and the code nested in it) mentions."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _slots(cls: type) -> list[str]:
    slots = []
    for klass in cls.__mro__:
        declared = klass.__dict__.get("__slots__", ())
        slots.extend([declared] if isinstance(declared, str) else declared)
    return [s for s in slots if s not in ("__dict__", "__weakref__")]


def _source_file(cls: type) -> str | None:
    try:
        path = inspect.getsourcefile(cls)
    except (TypeError, OSError):
        return None
    return path if path and Path(path).is_file() else None


def _is_jax_array(x) -> bool:
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)
