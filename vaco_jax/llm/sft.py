"""The warm start (SPEC §6): supervised fine-tuning on worked solutions, saved and reused.

`warm_start(config, train_set, test_set, cache_dir)` (default directory: the per-user cache,
`vaco_jax.cache.user_dir("llm")`) returns the SFT parameters and their held-out
greedy accuracy. The parameters are trained once per (model, task, sft) configuration and stored as
a msgpack file named by a hash of everything that determines them (`cache_key`), next to a JSON file
with the configuration, the accuracy and the training time; later calls load them instead of
training. Both files are written atomically (a crash leaves the old state, never half a file).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import time
from pathlib import Path

import jax
import optax
from flax import serialization

from vaco_jax import cache, io, runtime
from vaco_jax.errors import invalid
from vaco_jax.llm.dataset import ProblemSet
from vaco_jax.llm.evaluation import greedy_accuracy
from vaco_jax.llm.model import Transformer, answer_mask, init_params, sequence_log_probs
from vaco_jax.objectives import masked_mean

FORMAT_VERSION = 1  # bump when the model code changes what saved parameters mean

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
    parameters. The same cache key trained on another machine can give other parameters."""
    return _bytes_digest(serialization.to_bytes(jax.device_get(params)))


def _bytes_digest(data: bytes) -> str:
    """`digest` of parameters already serialised (`flax.serialization.to_bytes`)."""
    return hashlib.sha256(data).hexdigest()[:16]


def warm_start(config, train_set: ProblemSet, test_set: ProblemSet, cache_dir=None,
               log=print, compiler_options=None):
    """SFT parameters and info (`base_accuracy`, `final_loss`, `seconds`, `cached`, and `digest`:
    which parameters these are, `digest(params)`), cached on disk.

    In a multi-process run (`vaco_jax.runtime`) process 0 alone loads or trains and writes; the
    others wait for it at a barrier and then load what it wrote, so one warm start is trained, not
    one per process, and the shared cache has one writer. Every process must see the same cache
    directory (a shared filesystem)."""
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
    info = {**json.loads(info_path.read_text()), "digest": _bytes_digest(data)}   # of what was read
    log(f"warm start: loaded {params_path} (held-out accuracy {info['base_accuracy']:.3f}, "
        f"parameters {info['digest']})")
    return params, {**info, "cached": True, "path": str(params_path)}


def _train(config, train_set, test_set, params_path: Path, info_path: Path, log, compiler_options):
    """Train the warm start, measure its held-out greedy accuracy, write both files."""
    log(f"warm start: training {config.sft.steps} SFT steps (cache miss: {params_path})")
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
            "digest": _bytes_digest(data),
            "config": {"model": config.model, "task": config.task, "sft": config.sft},
            **io.provenance()}
    io.write_bytes_atomic(params_path, data)
    io.write_json_atomic(info_path, info)   # written last: its presence marks a complete entry
    log(f"warm start: {seconds:.0f} s, loss {info['first_loss']:.3f} -> {info['final_loss']:.3f}, "
        f"held-out accuracy {accuracy:.3f}, parameters {info['digest']}; saved {params_path}")
    return params, {**io.to_jsonable(info), "cached": False, "path": str(params_path)}
