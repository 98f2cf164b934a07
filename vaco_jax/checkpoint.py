"""Checkpoints of a whole run with orbax: atomic, the newest k kept, refused when unusable.

A checkpoint after chunk `n` (the run's n-th evaluation) holds the *entire* vmapped train state
(parameters, optimiser state, normaliser, env state, the policy ring buffer, RNG keys, counters,
divergence records) and the metrics history so far, `{name: [num_evals, num_seeds]}`. Continuing from
it with the same config reproduces the uninterrupted run bit for bit (on the same platform and
device count).

Layout: `<run>/checkpoints/<n>/` with two orbax items: `arrays` (the state's non-empty leaves,
nested by their pytree path — `state/params/actor/MLP_0/Dense_0/kernel`, `state/buffer/versions`,
... — and the history) and `meta` (JSON: the config, library versions, every leaf's path, shape and
dtype, and a SHA-256 of every byte saved). Orbax
writes each checkpoint to a temporary directory and renames it when complete, so a crash never
leaves a half-written checkpoint that looks finished; temporary leftovers are removed on the next
start.

Restoring refuses, with a message saying why and what to do, a checkpoint that is unreadable or
whose bytes do not match their checksum (corrupt), that was written by a different config, by other
vaco_jax code (another `io.source_hash`; unless `allow_code_change`) or with other library versions
(unless `allow_version_change`), or whose state layout differs from what this code builds. Nothing
is returned unless everything matched: a checkpoint is never half loaded. Each checkpoint keeps the
run's code records (`sources`: the source hash, commit and library versions each stretch of chunks
was made with), so a run continued on other code says so.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
import warnings
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp

from vaco_jax import algorithms, envs, io
from vaco_jax.config import LEGACY_OPTION_FIELDS, Config, from_json_dict, to_json_dict
from vaco_jax.errors import CheckpointError, ConfigError
from vaco_jax.options import RESUME_MAY_CHANGE
from vaco_jax.runtime import primary_decision, to_host

FORMAT = 2
READABLE_FORMATS = (1, 2)   # 1: leaves keyed by their index in the flattened state
# A different version of any of these can change results, so resuming across them is refused:
# those every run computes with, and those of the run's env (`envs.libraries`). A checkpoint
# records the versions of all of them. (vaco_jax's own code is checked by its source hash, which
# any edit changes, not its version.)
CORE_LIBRARIES = ("jax", "jaxlib", "flax", "optax", "distrax", "brax", "numpy", "orbax-checkpoint")
CHECKED_LIBRARIES = CORE_LIBRARIES + ("mujoco", "mujoco-mjx", "playground", "gymnax")


def checked_libraries(config: Config) -> tuple[str, ...]:
    """The libraries a resume of `config`'s run checks: the core ones and its env's."""
    return CORE_LIBRARIES + envs.libraries(config.env)


@dataclasses.dataclass
class Restored:
    state: object           # the train state, placed with the shardings of the abstract target
    history: dict           # {metric: np.ndarray [num_evals, num_seeds]}, NaN after `chunk`
    chunk: int              # evaluation chunks completed
    meta: dict


def checkpoint_dir(run_dir) -> Path:
    return Path(run_dir) / "checkpoints"


class RunCheckpoints:
    """The checkpoints of one run directory.

    `save` returns once the checkpoint is complete on disk (`wait=False`: once orbax has taken the
    arrays, writing on in a background thread). The CLI overlaps writing with computing by
    dispatching the next chunk before it saves the last one.

    In a multi-process run every process makes each call, in the same order: what the directory
    holds (which checkpoint is the newest, whether it may be restored) is read by process 0 for
    all, so that every process saves and restores the same checkpoints.
    """

    def __init__(self, run_dir, *, keep: int = 2, create: bool = True):
        self.directory = checkpoint_dir(run_dir)
        if not create:
            primary_decision(lambda: self._require_directory(run_dir))
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=create,
                                               cleanup_tmp_directories=True,
                                               enable_async_checkpointing=True)
        self.manager = ocp.CheckpointManager(self.directory.absolute(), options=options,
                                             item_names=("arrays", "meta"))
        self._git_commit = io.provenance()["git_commit"]
        self._versions = _versions()

    # --- writing ---------------------------------------------------------------------------------
    def save(self, chunk: int, state, history: dict, config: Config, *,
             sources: list[dict] | None = None, wait: bool = True) -> None:
        """`sources`: the run's code records so far (`source_record`; default: this code's alone)."""
        paths, leaves, treedef = _flatten(state, FORMAT)
        # Copies: the caller goes on filling `history` while orbax may still be writing.
        host_leaves, host_history = to_host(leaves), {k: np.array(v) for k, v in history.items()}
        meta = {
            "format": FORMAT,
            "chunk": chunk,
            "num_chunks": config.num_evals,
            "config": to_json_dict(config),
            **registration_entry(config),
            "versions": self._versions,
            "leaves": [[p, list(np.shape(x)), str(np.asarray(x).dtype)]
                       for p, x in zip(paths, host_leaves)],
            "history": {name: str(x.dtype) for name, x in host_history.items()},
            "sha256": _digest(host_leaves, host_history),
            "devices": {"platform": jax.devices()[0].platform, "count": jax.device_count()},
            "git_commit": self._git_commit,
            "source": io.source_hash(),
            "sources": sources if sources is not None else [source_record(0, config)],
            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        arrays = {"state": _nest(paths, leaves, FORMAT), "history": host_history}
        self.manager.save(chunk, args=ocp.args.Composite(arrays=ocp.args.StandardSave(arrays),
                                                         meta=ocp.args.JsonSave(meta)))
        if wait:
            self.manager.wait_until_finished()

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.close()

    def _require_directory(self, run_dir) -> None:
        if not self.directory.is_dir():
            raise CheckpointError(f"cannot resume {str(run_dir)!r}: it has no checkpoints "
                                  f"(no directory {str(self.directory)!r}); start a new run with --out")

    # --- reading ---------------------------------------------------------------------------------
    def latest_chunk(self) -> int | None:
        """The newest complete checkpoint's chunk (process 0's view, on every process)."""
        self.manager.reload()
        return primary_decision(self.manager.latest_step)

    def path(self, chunk: int) -> Path:
        return self.directory / str(chunk)

    def read_meta(self, chunk: int) -> dict:
        try:
            meta = self.manager.restore(
                chunk, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
        except Exception as error:  # noqa: BLE001 — any failure to read means unusable
            raise self._unreadable(chunk, error) from error
        if not isinstance(meta, dict) or meta.get("format") not in READABLE_FORMATS:
            raise CheckpointError(f"checkpoint {str(self.path(chunk))!r} is not a vaco_jax checkpoint "
                                  f"of a format this version reads ({READABLE_FORMATS}; its metadata "
                                  f"is missing or different)")
        return meta

    def restore(self, chunk: int, abstract_state, config: Config, *,
                allow_version_change: bool = False, allow_code_change: bool = False) -> Restored:
        """Load checkpoint `chunk` into the structure/shardings of `abstract_state`, or refuse."""
        meta = self.read_meta(chunk)
        primary_decision(lambda: check_compatible(meta, config, self.path(chunk),
                                                  allow_version_change=allow_version_change,
                                                  allow_code_change=allow_code_change))
        fmt = meta["format"]
        paths, abstract_leaves, treedef = _flatten(abstract_state, fmt)
        expected = [[p, list(x.shape), str(np.dtype(x.dtype))] for p, x in zip(paths, abstract_leaves)]
        if meta["leaves"] != expected:
            saved_on, here = meta.get("devices", {}).get("count"), jax.device_count()
            if saved_on != here:
                raise CheckpointError(
                    f"checkpoint {str(self.path(chunk))!r} was written on {saved_on} devices and this "
                    f"process sees {here}: runs are padded to a multiple of the device count, so "
                    f"resume on {saved_on} devices (the same number of processes and devices each)")
            stored = {p: (s, d) for p, s, d in meta["leaves"]}
            built = {p: (s, d) for p, s, d in expected}
            differences = [f"{p}: {stored.get(p, 'absent')} in the checkpoint, "
                           f"{built.get(p, 'absent')} now"
                           for p in sorted(set(stored) | set(built)) if stored.get(p) != built.get(p)]
            raise CheckpointError(
                f"checkpoint {str(self.path(chunk))!r} holds a train state of a different layout than "
                f"this code builds (code changed since it was saved: commit {meta.get('git_commit')} "
                f"then, {self._git_commit} now): {'; '.join(differences[:5])}"
                f"{' ...' if len(differences) > 5 else ''}")

        num_seeds = config.num_seeds
        target = {
            "state": _nest(paths, abstract_leaves, fmt),
            "history": {name: np.zeros((config.num_evals, num_seeds), dtype)
                        for name, dtype in _history_dtypes(meta).items()},
        }
        try:
            arrays = self.manager.restore(
                chunk, args=ocp.args.Composite(arrays=ocp.args.StandardRestore(target))).arrays
        except Exception as error:  # noqa: BLE001
            raise self._unreadable(chunk, error) from error
        stored = dict(zip(*_flatten(arrays["state"])[:2]))
        leaves = [stored[_storage_name(i, path, fmt)] if np.prod(x.shape) else
                  jax.device_put(np.zeros(x.shape, x.dtype), x.sharding)
                  for i, (path, x) in enumerate(zip(paths, abstract_leaves))]
        history = {name: np.asarray(v) for name, v in arrays["history"].items()}
        if _digest(to_host(leaves), history) != meta["sha256"]:
            raise self._corrupt(chunk)
        return Restored(jax.tree.unflatten(treedef, leaves), history, chunk, meta)

    def check_latest(self, config: Config, *, allow_version_change: bool = False,
                     allow_code_change: bool = False) -> int:
        """The newest checkpoint's chunk, after checking it was written by `config`, (unless
        `allow_version_change`) these library versions and (unless `allow_code_change`) this
        code (cheap: reads only its metadata)."""
        chunk = self.latest_chunk()
        if chunk is None:
            raise CheckpointError(f"cannot resume: {str(self.directory)!r} holds no complete "
                                  f"checkpoint; start a new run with --out")
        meta = self.read_meta(chunk)
        primary_decision(lambda: check_compatible(meta, config, self.path(chunk),
                                                  allow_version_change=allow_version_change,
                                                  allow_code_change=allow_code_change, warn=False))
        return chunk

    def usable_latest(self, config: Config, *, allow_version_change: bool = False,
                      allow_code_change: bool = False) -> int:
        """`check_latest`, after making sure the newest checkpoint is whole, before anything is
        built: in a single-process run its bytes are read and checked against the SHA-256
        recorded when it was saved. A newest checkpoint that cannot be read or is corrupt is moved
        to `<run>/corrupt_checkpoints/<chunk>` (kept, not deleted), with a warning, and the next
        older one is used; if none is whole, nothing is moved and the newest one's error is
        raised. (A multi-process run checks the bytes when it restores, and refuses there.)"""
        allowed = dict(allow_version_change=allow_version_change,
                       allow_code_change=allow_code_change)
        chunk = self.check_latest(config, **allowed)
        if jax.process_count() > 1:
            return chunk
        newest_error, corrupt = None, []
        for candidate in sorted(self.manager.all_steps(), reverse=True):
            try:
                self._check_bytes(candidate)
            except CheckpointError as error:
                newest_error = newest_error or error
                corrupt.append((candidate, error))
                continue
            break
        else:
            raise newest_error
        if not corrupt:
            return chunk
        for bad, error in corrupt:
            aside = self.directory.parent / "corrupt_checkpoints" / str(bad)
            aside.parent.mkdir(exist_ok=True)
            if aside.exists():
                aside = aside.with_name(f"{bad}-{time.strftime('%Y%m%d-%H%M%S')}")
            self.path(bad).rename(aside)
            why = str(error).split(". Delete it")[0]
            warnings.warn(f"{why}; moved it to {str(aside)!r} and resuming from checkpoint "
                          f"{candidate}", stacklevel=2)
        self.manager.reload()
        return self.check_latest(config, **allowed)

    def _check_bytes(self, chunk: int) -> None:
        """Read checkpoint `chunk` whole (as host arrays, no train state needed) and compare it
        with its recorded SHA-256; raise `CheckpointError` if it cannot be read or differs."""
        meta = self.read_meta(chunk)
        fmt = meta["format"]
        try:
            arrays = self.manager.restore(
                chunk, args=ocp.args.Composite(arrays=ocp.args.StandardRestore())).arrays
        except Exception as error:  # noqa: BLE001
            raise self._unreadable(chunk, error) from error
        try:
            stored = dict(zip(*_flatten(arrays["state"])[:2]))
            leaves = [np.asarray(stored[_storage_name(i, path, fmt)]) if np.prod(shape) else
                      np.zeros(shape, dtype) for i, (path, shape, dtype) in enumerate(meta["leaves"])]
            history = {name: np.asarray(arrays["history"][name]).astype(dtype)
                       for name, dtype in _history_dtypes(meta).items()}
        except (KeyError, TypeError, ValueError) as error:
            raise self._unreadable(chunk, error) from error
        if _digest(leaves, history) != meta["sha256"]:
            raise self._corrupt(chunk)

    def restore_latest(self, abstract_state, config: Config, *, allow_version_change: bool = False,
                       allow_code_change: bool = False) -> Restored:
        allowed = dict(allow_version_change=allow_version_change, allow_code_change=allow_code_change)
        chunk = self.check_latest(config, **allowed)
        return self.restore(chunk, abstract_state, config, **allowed)

    def _others(self, chunk: int) -> str:
        others = [c for c in self.manager.all_steps() if c != chunk]
        return f"other checkpoints: {sorted(others)}" if others else "there is no other checkpoint"

    def _corrupt(self, chunk: int) -> CheckpointError:
        return CheckpointError(
            f"checkpoint {str(self.path(chunk))!r} is corrupt: its bytes do not match the SHA-256 "
            f"recorded when it was saved. Delete it to resume from an older checkpoint "
            f"({self._others(chunk)}), or start a new run")

    def _unreadable(self, chunk: int, error: Exception) -> CheckpointError:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return CheckpointError(
            f"checkpoint {str(self.path(chunk))!r} cannot be read (corrupt or incomplete): "
            f"{type(error).__name__}: {reason[:300]}. Delete it to resume from an older checkpoint "
            f"({self._others(chunk)}), or start a new run")


def stored_config(run_dir) -> Config:
    """The config of the run in `run_dir`, from its newest checkpoint (what `--resume` continues)."""
    checkpoints = RunCheckpoints(run_dir, create=False)
    chunk = checkpoints.latest_chunk()
    if chunk is None:
        raise CheckpointError(f"cannot resume {str(run_dir)!r}: {str(checkpoints.directory)!r} holds "
                              f"no complete checkpoint; start a new run with --out")
    meta = checkpoints.read_meta(chunk)
    try:
        config = from_json_dict(meta["config"])
    except (ConfigError, TypeError) as error:
        raise CheckpointError(f"checkpoint {str(checkpoints.path(chunk))!r} was written by another "
                              f"version of vaco_jax: {error}") from error
    envs.restore_registration(config.env, meta.get("env_registration"))   # a registered env's
    return config


def check_compatible(meta: dict, config: Config, where, *, allow_version_change: bool = False,
                     allow_code_change: bool = False, warn: bool = True) -> None:
    """Refuse a checkpoint written with another config, by other vaco_jax code unless
    `allow_code_change`, or with other library versions unless `allow_version_change` (when
    allowed, `warn` says what changed)."""
    _check_objective_code(meta, config, where, allow_code_change=allow_code_change, warn=warn)
    theirs_source, ours_source = meta.get("source", "not recorded"), io.source_hash()
    if theirs_source != ours_source:
        code = (f"source {theirs_source} in the checkpoint, {ours_source} here; git commit "
                f"{meta.get('git_commit')} then, {io.git_commit()} now")
        if not allow_code_change:
            raise CheckpointError(
                f"checkpoint {str(where)!r} was written by other vaco_jax code ({code}): the run "
                f"would continue on different code. Resume with the code it was written with, pass "
                f"--allow-code-change to continue anyway (config.json and metrics.jsonl then name "
                f"the code each part of the run was made with), or start a new run")
        if warn:
            warnings.warn(f"resuming checkpoint {str(where)!r} written by other vaco_jax code "
                          f"({code}): the continuation may differ from an uninterrupted run; "
                          f"config.json (`sources`) and each metrics.jsonl row (`source`) record "
                          f"which code made what", stacklevel=2)
    ours = _versions()
    theirs = meta.get("versions", {})
    changed = [f"{name} {theirs.get(name, 'not recorded')} in the checkpoint, {ours[name]} here"
               for name in checked_libraries(config)
               if theirs.get(name, "not recorded") != ours[name]]
    if changed and not allow_version_change:
        raise CheckpointError(
            f"checkpoint {str(where)!r} was written with different library versions "
            f"({'; '.join(changed)}); results would not continue the run exactly. Install the "
            f"versions it was written with (its config.json lists them all), pass "
            f"--allow-version-change to continue anyway, or start a new run")
    if changed and warn:
        warnings.warn(f"resuming checkpoint {str(where)!r} written with other library versions "
                      f"({'; '.join(changed)}): the continuation may differ from an uninterrupted "
                      f"run", stacklevel=2)
    # A field the checkpoint lacks was added to `Config` after it was written: the run ran as
    # that field's default does.
    ours_config, default = to_json_dict(config), to_json_dict(Config())
    stored = {**{name: default[name] for name in ours_config if name not in meta["config"]},
              **meta["config"]}
    differences = [f"`{name}` = {ours_config[name]!r} here but {stored[name]!r} in the checkpoint"
                   + (" (absent: its default)" if name not in meta["config"] else "")
                   for name in ours_config if stored[name] != ours_config[name]]
    differences += [f"`{name}` is in the checkpoint but unknown here" for name in stored
                    if name not in ours_config and name not in LEGACY_OPTION_FIELDS]
    if differences:
        raise CheckpointError(
            f"checkpoint {str(where)!r} was written by a run with a different config: "
            f"{'; '.join(differences)}. Resume with the run's own settings (pass only --resume DIR "
            f"and, optionally, {', '.join(_flag(f) for f in RESUME_MAY_CHANGE)}) or start a new run "
            f"in another directory")


def _check_objective_code(meta: dict, config: Config, where, *, allow_code_change: bool,
                          warn: bool) -> None:
    """Refuse (unless `allow_code_change`) a checkpoint whose user objective's fingerprint
    (`algorithms.objective_fingerprint`: what its traced program computes) differs from the one
    this process runs, or is unknown on either side."""
    theirs = sources_of(meta)[-1].get("objective_code") or {}
    ours = _objective_code(config) or {}
    if not theirs and not ours:   # a built-in objective: the package's source covers it
        return
    fingerprint = theirs.get("fingerprint")
    if fingerprint is not None and fingerprint == ours.get("fingerprint"):
        return
    code = (f"objective {config.algo.partition('+')[2]!r}: {_describe_code(theirs)} in the "
            f"checkpoint, {_describe_code(ours)} here")
    if not allow_code_change:
        raise CheckpointError(
            f"checkpoint {str(where)!r} was written by other code of the run's objective ({code}): "
            f"the run would continue on different code. Resume with the code it was written with, "
            f"pass --allow-code-change to continue anyway (config.json then names the code each "
            f"part of the run was made with), or start a new run")
    if warn:
        warnings.warn(f"resuming checkpoint {str(where)!r} written by other code of the run's "
                      f"objective ({code}): the continuation may differ from an uninterrupted run",
                      stacklevel=3)


def _describe_code(record: dict) -> str:
    """A user objective's code record (`algorithms.source_of`) in a few words."""
    if not record:
        return "no user objective"
    fingerprint = record.get("fingerprint") or "unknown (not recorded)"
    where = (f"{record.get('file')}, source {record.get('source')}" if record.get("source")
             else "no source file")
    return f"fingerprint {fingerprint} ({where})"


# --- the code a run was made with ------------------------------------------------------------------

def source_record(from_chunk: int, config: Config | None = None) -> dict:
    """This code, as it makes a run's chunks from `from_chunk` (0-based) on: the package's source
    hash (`io.source_hash`), its git commit and the checked libraries' versions, and for a run of
    `config` with a user objective that objective's code and fingerprint
    (`algorithms.source_of`)."""
    record = {"from_chunk": from_chunk, "source": io.source_hash(), "git_commit": io.git_commit(),
              "versions": _versions()}
    code = _objective_code(config) if config is not None else None
    return record if code is None else {**record, "objective_code": code}


def _objective_code(config: Config) -> dict | None:
    return algorithms.source_of(algorithms.parse(config.algo).objective)


def sources_of(meta: dict) -> list[dict]:
    """The code records of the run up to a checkpoint, oldest first: one more with every resume on
    other code or libraries (a checkpoint that kept none has its own record, from chunk 0)."""
    if "sources" in meta:
        return meta["sources"]
    return [{"from_chunk": 0, "source": meta.get("source", "not recorded"),
             "git_commit": meta.get("git_commit"), "versions": meta.get("versions", {})}]


def continued_sources(sources: list[dict], from_chunk: int, config: Config | None = None
                      ) -> list[dict]:
    """`sources` continued by this code from chunk `from_chunk` on (unchanged if it is the same)."""
    here = source_record(from_chunk, config)
    code = lambda record: (record.get("source"), record.get("versions"),  # noqa: E731
                           (record.get("objective_code") or {}).get("fingerprint"))
    if code(sources[-1]) == code(here):
        return list(sources)
    return [*sources, here]


def source_at(sources: list[dict], chunk_index: int) -> str:
    """The source hash of the code that made chunk `chunk_index` (0-based)."""
    return [r for r in sources if r["from_chunk"] <= chunk_index][-1]["source"]


# --- helpers ---------------------------------------------------------------------------------------

def _flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def _flatten(tree, fmt: int = FORMAT):
    """(leaf paths, leaves, treedef); paths as `io.leaf_names` (format 1: `jax.tree_util.keystr`)."""
    with_paths, treedef = jax.tree_util.tree_flatten_with_path(tree)
    paths = (io.leaf_names(tree) if fmt >= 2 else
             [jax.tree_util.keystr(p) for p, _ in with_paths])
    return paths, [x for _, x in with_paths], treedef


def _storage_name(index: int, path: str, fmt: int) -> str:
    return path if fmt >= 2 else f"{index:05d}"


def _nest(paths, leaves, fmt: int) -> dict:
    """The `state` item: non-empty leaves in nested dicts, one level per part of their path
    (format 1: a flat dict keyed by index)."""
    tree: dict = {}
    for index, (path, x) in enumerate(zip(paths, leaves)):
        if not np.prod(np.shape(x)):
            continue
        *parents, name = _storage_name(index, path, fmt).split("/")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[name] = x
    return tree


def _digest(leaves, history: dict) -> str:
    """SHA-256 over dtype, shape and bytes of every state leaf and history array, in order."""
    digest = hashlib.sha256()
    items = [(str(i), x) for i, x in enumerate(leaves)] + sorted(history.items())
    for name, x in items:
        x = np.ascontiguousarray(x)
        digest.update(f"{name}|{x.dtype.str}|{x.shape}|".encode())
        digest.update(x.tobytes())
    return digest.hexdigest()


def _history_dtypes(meta: dict) -> dict:
    return {name: np.dtype(dtype) for name, dtype in meta["history"].items()}


def registration_entry(config: Config) -> dict:
    """`{"env_registration": ...}` for a run of a registered env (`envs.registration_record`), as
    checkpoints, `config.json` and `policy.npz` record it; else `{}`."""
    record = envs.registration_record(config.env)
    return {} if record is None else {"env_registration": record}


def _versions() -> dict:
    versions = io.library_versions()
    return {name: versions.get(name, "not recorded") for name in CHECKED_LIBRARIES}
