"""The warm start (SPEC §6): supervised fine-tuning on worked solutions, shipped, saved and reused.

`warm_start(config, train_set, test_set, cache_dir)` returns the SFT parameters and their record
(held-out greedy accuracy, digest, where they came from). Where they come from, in order:

* **shipped** (`SHIPPED_DIR`, `vaco_jax/llm/warm_starts/<preset>.npz` and `.json`): when the
  model, task and sft configuration equal a shipped warm start's recorded configuration exactly
  (and the problems drawn from it are the ones it was trained on), its parameters are loaded and
  their SHA-256 checked against the record; nothing is trained. The same key trained on two CPUs
  can give different parameters, so shipping them makes every machine start from the same model.
* **the cache** (default directory: the per-user cache, `vaco_jax.cache.user_dir("llm")`): trained
  once per configuration and stored as a msgpack file named by a hash of everything that
  determines it (`cache_key`), next to a JSON file with the configuration, the accuracy and the
  training time; later calls load it. Both files are written atomically (a crash leaves the old
  state, never half a file). `shipped=False` skips the shipped ones.

`ship(name, ...)` writes a trained warm start into `SHIPPED_DIR`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import time
from io import BytesIO
from pathlib import Path

import jax
import numpy as np
import optax
from flax import serialization, traverse_util

from vaco_jax import cache, io, runtime
from vaco_jax.errors import CheckpointError, invalid
from vaco_jax.llm.dataset import ProblemSet
from vaco_jax.llm.evaluation import greedy_accuracy
from vaco_jax.llm.model import Transformer, answer_mask, init_params, sequence_log_probs
from vaco_jax.objectives import masked_mean

FORMAT_VERSION = 1  # bump when the model code changes what saved parameters mean

# The warm starts shipped with the package, one `<name>.npz` (float32 parameters) and `<name>.json`
# (its record: configuration, data digest, SHA-256, accuracy, provenance) per preset.
SHIPPED_DIR = Path(__file__).parent / "warm_starts"

# The code that makes the warm-start data (problems → tokens → arrays) and trains on it: an edit to
# any of these is another warm start, even with the same configuration.
KEYED_MODULES = ("vaco_jax.llm.problems", "vaco_jax.llm.tokenizer", "vaco_jax.llm.dataset",
                 "vaco_jax.llm.model", "vaco_jax.llm.sft")


def _digest(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def cache_key(config) -> str:
    """Hash of everything that determines the warm-start parameters: the model, task and SFT
    configuration, the *contents* of the GSM8K files it names (a file rewritten at the same path is
    other data), and the source of `KEYED_MODULES`."""
    t = config.task
    files = {name: _digest(path) for name, path in (("gsm8k_train", t.gsm8k_train),
                                                      ("gsm8k_test", t.gsm8k_test))
             if t.source == "gsm8k" and path}
    code = {name: _digest(sys.modules[name].__file__) for name in KEYED_MODULES}
    spec = {"version": FORMAT_VERSION, "model": dataclasses.asdict(config.model),
            "task": dataclasses.asdict(t), "sft": dataclasses.asdict(config.sft),
            "files": files, "code": code}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def make_sft(config):
    """`train(key, train_set) -> (params, losses [steps])`: the whole warm start, one pure function."""
    apply = Transformer(config.model).apply
    s = config.sft
    schedule = optax.warmup_cosine_decay_schedule(0.0, s.learning_rate, s.warmup_steps,
                                                  max(s.steps, s.warmup_steps + 1))
    optimizer = optax.chain(optax.clip_by_global_norm(1.0),
                            optax.adamw(schedule, weight_decay=s.weight_decay))

    def loss_fn(params, prompts, targets):
        log_probs = sequence_log_probs(apply, params, prompts, targets)
        return -masked_mean(log_probs, answer_mask(targets))

    def train(key, train_set: ProblemSet):
        def step(carry, key):
            params, opt_state = carry
            idx = jax.random.randint(key, (s.batch_size,), 0, len(train_set))
            loss, grads = jax.value_and_grad(loss_fn)(params, train_set.prompts[idx],
                                                      train_set.targets[idx])
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), loss

        init_key, data_key = jax.random.split(key)
        params = init_params(config.model, init_key)
        (params, _), losses = jax.lax.scan(step, (params, optimizer.init(params)),
                                           jax.random.split(data_key, s.steps))
        return params, losses

    return train


def digest(params) -> str:
    """Which warm start a result came from: 16 hex digits of SHA-256 over the serialised
    parameters (`sha256`). The same cache key trained on another machine can give other
    parameters."""
    return sha256(params)[:16]


def sha256(params) -> str:
    """SHA-256 of the parameters serialised (`flax.serialization.to_bytes`): what a shipped warm
    start's record holds."""
    return _sha256(serialization.to_bytes(jax.device_get(params)))


def _bytes_digest(data: bytes) -> str:
    """`digest` of parameters already serialised (`flax.serialization.to_bytes`)."""
    return _sha256(data)[:16]


def _sha256(data: bytes) -> str:
    """The full SHA-256 of serialised parameters; `digest` is its first 16 hex digits."""
    return hashlib.sha256(data).hexdigest()


def warm_start_config(config) -> dict:
    """What a warm start is trained from, as JSON: the model, task and sft configuration."""
    return io.to_jsonable({"model": config.model, "task": config.task, "sft": config.sft})


def data_digest(train_set: ProblemSet, test_set: ProblemSet) -> str:
    """SHA-256 of the problems as arrays: a shipped warm start is used only with the data it was
    trained and measured on (an edit to the problem generator is other data, same configuration)."""
    h = hashlib.sha256()
    for array in (*jax.tree.leaves(train_set), *jax.tree.leaves(test_set)):
        array = np.asarray(array)
        h.update(f"{array.dtype}{array.shape}".encode())
        h.update(array.tobytes())
    return h.hexdigest()


def warm_start(config, train_set: ProblemSet, test_set: ProblemSet, cache_dir=None,
               log=print, compiler_options=None, shipped: bool = True):
    """SFT parameters and info (`base_accuracy`, `final_loss`, `seconds`; `digest` and `sha256`:
    which parameters these are, `digest(params)` and the full hash it begins; `origin`: `shipped`,
    `cache` or `trained`; `path`: the file they were read from or saved to; `cached`: not trained
    by this call).

    The shipped warm start whose configuration this is, unless `shipped=False`; else the one in
    `cache_dir` (default: the per-user cache), trained and saved there when absent.

    In a multi-process run (`vaco_jax.runtime`) process 0 alone loads or trains and writes the
    cache; the others wait for it at a barrier and then load what it wrote, so one warm start is
    trained, not one per process, and the shared cache has one writer. Every process must see the
    same cache directory (a shared filesystem)."""
    if shipped:
        found = load_shipped(config, train_set, test_set, log=log)
        if found is not None:   # every process reads the package's file: no barrier needed
            return found
    cache_dir = Path(cache_dir) if cache_dir is not None else cache.user_dir("llm")
    key = cache_key(config)
    params_path, info_path = cache_dir / f"sft-{key}.msgpack", cache_dir / f"sft-{key}.json"
    if runtime.is_primary():
        loaded = _load(config, params_path, info_path, log)
        if loaded is None:
            loaded = _train(config, train_set, test_set, params_path, info_path, log,
                            compiler_options)
    runtime.barrier("llm warm start written")
    if not runtime.is_primary():
        loaded = _load(config, params_path, info_path, log)
        if loaded is None:
            raise invalid("cache_dir", str(cache_dir),
                          f"process 0 wrote the warm start to {str(params_path)!r}, which this "
                          f"process cannot read: every process must see the same cache directory "
                          f"(a shared filesystem)")
    return loaded


def _load(config, params_path: Path, info_path: Path, log):
    """The cached warm start, or None when it is not (completely) there."""
    if not (params_path.exists() and info_path.exists()):
        return None
    template = jax.eval_shape(lambda: init_params(config.model, jax.random.PRNGKey(0)))
    data = params_path.read_bytes()
    params = serialization.from_bytes(template, data)
    info = {**json.loads(info_path.read_text()), "digest": _bytes_digest(data),   # of what was read
            "sha256": _sha256(data)}
    log(f"warm start: loaded from the cache, {io.portable_path(params_path)} (held-out accuracy "
        f"{info['base_accuracy']:.3f}, parameters {info['digest']}, sha256 {info['sha256']})")
    return params, {**info, "cached": True, "origin": "cache",
                    "path": io.portable_path(params_path)}


def _train(config, train_set, test_set, params_path: Path, info_path: Path, log, compiler_options):
    """Train the warm start, measure its held-out greedy accuracy, write both files."""
    log(f"warm start: training {config.sft.steps} SFT steps (cache miss: "
        f"{io.portable_path(params_path)})")
    start = time.perf_counter()
    train = jax.jit(make_sft(config), compiler_options=compiler_options)
    params, losses = train(jax.random.PRNGKey(config.sft.seed), train_set)
    losses = jax.device_get(losses)
    seconds = time.perf_counter() - start
    accuracy = float(jax.jit(greedy_accuracy, static_argnums=(2, 3),
                             compiler_options=compiler_options)(
        params, test_set, config.model, config.task.answer_len))
    data = serialization.to_bytes(jax.device_get(params))
    info = {"base_accuracy": accuracy, "final_loss": float(losses[-10:].mean()),
            "first_loss": float(losses[0]), "seconds": seconds, "key": params_path.stem[4:],
            "digest": _bytes_digest(data), "sha256": _sha256(data),
            "config": {"model": config.model, "task": config.task, "sft": config.sft},
            **io.provenance()}
    io.write_bytes_atomic(params_path, data)
    io.write_json_atomic(info_path, info)   # written last: its presence marks a complete entry
    log(f"warm start: trained in {seconds:.0f} s, loss {info['first_loss']:.3f} -> "
        f"{info['final_loss']:.3f}, held-out accuracy {accuracy:.3f}, parameters {info['digest']}, "
        f"sha256 {info['sha256']}; cached at {io.portable_path(params_path)}")
    return params, {**io.to_jsonable(info), "cached": False, "origin": "trained",
                    "path": io.portable_path(params_path)}


# --- shipped warm starts ------------------------------------------------------------------------
def shipped_record(config, directory=None) -> Path | None:
    """The record (`<name>.json` in `directory`, default `SHIPPED_DIR`) of the shipped warm start
    trained from exactly this model, task and sft configuration by this `FORMAT_VERSION`, or None."""
    wanted = warm_start_config(config)
    for path in sorted(Path(directory or SHIPPED_DIR).glob("*.json")):
        record = json.loads(path.read_text())
        if record.get("format_version") == FORMAT_VERSION and record.get("config") == wanted:
            return path
    return None


def load_shipped(config, train_set: ProblemSet, test_set: ProblemSet, directory=None, log=print):
    """The shipped warm start of this configuration, `(params, info)` as `warm_start` returns, or
    None when none is shipped for it (or it was trained on other problems: the generator changed).
    A file whose parameters do not hash to its record's SHA-256 is refused (`CheckpointError`)."""
    record_path = shipped_record(config, directory)
    if record_path is None:
        return None
    record, name = json.loads(record_path.read_text()), record_path.stem
    data = data_digest(train_set, test_set)
    if record["data"] != data:
        log(f"warm start: the shipped {name!r} one is not used: it was trained on other problems "
            f"than this code draws from its configuration (data {record['data'][:16]}, now "
            f"{data[:16]})")
        return None
    params_path = record_path.with_suffix(".npz")
    params = _read_npz(config, params_path)
    found = sha256(params)
    if found != record["sha256"]:
        raise CheckpointError(
            f"the shipped warm start {str(params_path)!r} is not the one its record names: its "
            f"parameters hash to sha256 {found}, the record {record_path.name} says "
            f"{record['sha256']}. Restore the file (reinstall vaco_jax, or `git checkout` it), or "
            f"train your own (`--train-warm-start`)")
    info = {k: record[k] for k in ("base_accuracy", "final_loss", "first_loss", "seconds", "key")}
    info.update(digest=found[:16], sha256=found, cached=True, origin="shipped", preset=name,
                path=io.portable_path(params_path))
    log(f"warm start: shipped {name}, sha256 {found} (held-out accuracy "
        f"{info['base_accuracy']:.3f}, parameters {info['digest']}; {info['path']}): no supervised "
        f"training")
    return params, info


def _read_npz(config, path: Path):
    """Parameters of `config.model` from an `.npz` of float32 arrays named by their '/'-joined path
    (`ship`); a file that is not that is refused (`CheckpointError`)."""
    template = jax.eval_shape(lambda: init_params(config.model, jax.random.PRNGKey(0)))
    expected = traverse_util.flatten_dict(serialization.to_state_dict(template), sep="/")
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
    except Exception as error:  # noqa: BLE001 -- any unreadable file: say which and why
        raise CheckpointError(f"the shipped warm start {str(path)!r} cannot be read ({error}): "
                              f"restore it (reinstall vaco_jax, or `git checkout` it)") from error
    shapes = {name: (a.shape, str(a.dtype)) for name, a in arrays.items()}
    wanted = {name: (s.shape, str(s.dtype)) for name, s in expected.items()}
    if shapes != wanted:
        raise CheckpointError(f"the shipped warm start {str(path)!r} holds other arrays than the "
                              f"model's parameters (name: (shape, dtype)): {shapes}, expected "
                              f"{wanted}")
    return serialization.from_state_dict(template, traverse_util.unflatten_dict(arrays, sep="/"))


def ship(name: str, config, params, info: dict, train_set: ProblemSet, test_set: ProblemSet,
         directory=None) -> Path:
    """Write `params` (a warm start of `config`, with `info` as `warm_start` returns it, measured on
    `test_set`) as the shipped warm start `name`: `<name>.npz` and its record `<name>.json` in
    `directory` (default `SHIPPED_DIR`). Returns the record's path."""
    directory = Path(directory or SHIPPED_DIR)
    params = jax.device_get(params)
    flat = traverse_util.flatten_dict(serialization.to_state_dict(params), sep="/")
    dtypes = {str(np.asarray(a).dtype) for a in flat.values()}
    if dtypes != {"float32"}:
        raise ValueError(f"a shipped warm start holds float32 parameters, not {sorted(dtypes)}")
    directory.mkdir(parents=True, exist_ok=True)
    buffer = BytesIO()
    np.savez_compressed(buffer, **{k: np.asarray(v) for k, v in flat.items()})
    io.write_bytes_atomic(directory / f"{name}.npz", buffer.getvalue())
    full = sha256(params)
    record = {"preset": name, "format_version": FORMAT_VERSION, "config": warm_start_config(config),
              "data": data_digest(train_set, test_set), "sha256": full, "digest": full[:16],
              **{k: info[k] for k in ("base_accuracy", "final_loss", "first_loss", "seconds",
                                      "key")},
              "trained": {k: info[k] for k in ("versions", "python", "device", "host", "git_commit",
                                               "source") if k in info}}
    io.write_json_atomic(directory / f"{name}.json", record)
    return directory / f"{name}.json"

