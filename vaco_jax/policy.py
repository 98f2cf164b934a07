"""Trained policies as files, and back: `policy.npz` in a run directory, `load_policy(run_dir)`.

A run writes `policy.npz` when it finishes and with every checkpoint, so the newest policy of a
finished run, of a run in progress and of an interrupted one is always there. It holds, for every
seed of the run, what acting needs — the actor's parameters and the observation normaliser's
statistics — as plain numpy arrays keyed by their pytree path (`actor/MLP_0/Dense_0/kernel`,
`normalizer/mean`, ..., each `[num_seeds, ...]`), plus a JSON record (`__meta__`) of the run's
config, the library versions, how far the run had got and its health: `diverged_seeds`, every
seed whose loss, gradient or parameters became non-finite (`--on-nan skip-seed` froze it at its
last good state), with the learner iteration it failed in. A NumPy `.npz` needs no pickling and
reads the same across library versions: loading only warns when versions differ and refuses
only a real mismatch (a missing, unexpected or reshaped array).

    policy = load_policy("runs/quickstart", seed=0)     # or, in memory after training:
    policy = Policy.from_state(config, state, seed=0)    # `make_train(config)`'s final state
    action = policy.act(obs)                 # deterministic: the Gaussian mean, clipped to [-1, 1]
    action = policy.act(obs, key)            # a sample, clipped
    # (a discrete policy: the likeliest choice, or a sampled one, as an integer)

The actor is rebuilt from the saved config: its `network` (a `cnn` with the observation shape
saved beside it, `observation_shape`). A policy trained with your own networks
(`Trainer(config, networks=...)`) needs its actor module back: pass `actor=trainer.actor` (of a
`Trainer` made with the same config, env and networks) to `load_policy` or `Policy.from_state`.
"""

from __future__ import annotations

import io as _io
import json
import warnings
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from vaco_jax import checkpoint, envs, io, networks, spaces
from vaco_jax.config import Config, from_json_dict, to_json_dict
from vaco_jax.errors import CheckpointError, ConfigError, invalid
from vaco_jax.trainer import nonfinite_names

FILE_NAME = "policy.npz"
FORMAT = 1
_META = "__meta__"


def flatten(tree) -> dict[str, Any]:
    """`{"a/b/c": leaf}` for every leaf of `tree` (dict keys, dataclass fields, list indices)."""
    return dict(zip(io.leaf_names(tree), jax.tree.leaves(tree)))


def save_policy(run_dir, config: Config, actor_params, normalizer, *, env_steps: int,
                evaluations: int, diverged_seeds: list[dict] = (),
                provenance: dict | None = None,
                observation_shape: tuple[int, ...] | None = None) -> Path:
    """Write `run_dir/policy.npz` atomically from per-seed `[num_seeds, ...]` host arrays.
    `diverged_seeds`: the run's diverged seeds, `{seed, index, iteration, nonfinite}` each
    (`iteration`: the 1-based learner iteration that failed); `provenance`: the run's
    `io.provenance()` (computed here when not given); `observation_shape`: the env's
    (`Trainer.observation_shape`), which a `cnn` actor is rebuilt with."""
    arrays = {f"actor/{k}": np.asarray(v) for k, v in flatten(actor_params).items()}
    arrays.update({f"normalizer/{k}": np.asarray(v) for k, v in flatten(normalizer).items()})
    meta = {"format": FORMAT, "config": to_json_dict(config), "env": config.env,
            **checkpoint.registration_entry(config),
            "num_seeds": config.num_seeds, "seeds": [config.seed + i for i in range(config.num_seeds)],
            "env_steps": env_steps, "evaluations": evaluations,
            "evaluations_planned": config.num_evals, "diverged_seeds": list(diverged_seeds),
            **({} if observation_shape is None else {"observation_shape": list(observation_shape)}),
            **(provenance if provenance is not None else io.provenance())}
    buffer = _io.BytesIO()
    np.savez(buffer, **arrays, **{_META: np.array(json.dumps(io.to_jsonable(meta)))})
    path = Path(run_dir) / FILE_NAME
    io.write_bytes_atomic(path, buffer.getvalue())
    return path


@struct.dataclass
class Policy:
    """One seed's trained policy: `act(obs, key=None)` is a pure, jittable function of `obs`
    (raw observations `[..., obs_dim]`, as the env returns them)."""

    params: Any                     # the actor's parameters
    normalizer: Any                 # observation statistics (used when the run normalised)
    actor: networks.Actor = struct.field(pytree_node=False)
    config: Config = struct.field(pytree_node=False)
    meta_json: str = struct.field(pytree_node=False, default="{}")
    index: int = struct.field(pytree_node=False, default=0)   # which of the run's seeds

    @classmethod
    def from_state(cls, config: Config, state, seed: int = 0, *, actor=None) -> "Policy":
        """The policy of a train state in memory (no file): `state` is `make_train(config)`'s or
        `Trainer.init`/`run_chunk`'s, of one run or of several vmapped over their first axis
        (`seed`: which of them, 0-based). A seed that diverged is marked (`diverged`) as in a
        loaded policy. `actor`: the trainer's actor module (`Trainer.actor`), needed for your own
        networks, and for a `cnn` on an env that `config.env` does not name (an env object);
        otherwise it is rebuilt from the config."""
        runs = int(np.size(state.iteration))
        batched = np.ndim(state.iteration) > 0
        if not 0 <= seed < runs:
            raise invalid("seed", seed, f"must be in 0..{runs - 1}: the state holds {runs} "
                                        f"run{'s' if runs > 1 else ''}")
        take = (lambda x: jnp.asarray(x)[seed]) if batched else jnp.asarray
        params, normalizer = jax.tree.map(take, (state.params["actor"], state.normalizer))
        health = jax.tree.map(lambda x: int(np.asarray(take(x))), state.health)
        diverged = [] if health.nonfinite == 0 else [{
            "seed": config.seed + seed, "index": seed, "iteration": health.iteration + 1,
            "nonfinite": nonfinite_names(health.nonfinite)}]
        meta = {"format": FORMAT, "config": to_json_dict(config), "env": config.env,
                **checkpoint.registration_entry(config),
                "num_seeds": runs, "seeds": [config.seed + i for i in range(runs)],
                "env_steps": int(np.asarray(take(state.env_steps))), "diverged_seeds": diverged}
        if actor is None:
            actor = _actor(config, networks.action_space_of(params), _env_observation_shape(config))
        return cls(params, normalizer, actor, config, json.dumps(io.to_jsonable(meta)), seed)

    @property
    def env(self) -> str:
        return self.config.env

    @property
    def diverged(self) -> dict | None:
        """This seed's divergence record (`{seed, index, iteration, nonfinite}`: it was frozen at
        its last good state, before learner iteration `iteration`), or None for a healthy seed."""
        return next((record for record in self.meta.get("diverged_seeds", [])
                     if record["index"] == self.index), None)

    @property
    def meta(self) -> dict:
        """The saved record: config, seeds, env steps and evaluations done, library versions."""
        return json.loads(self.meta_json)

    @property
    def action_space(self) -> spaces.ActionSpace:
        """What the policy acts in: `Box(size)` (continuous) or `Discrete(n)`."""
        return networks.action_space_of(self.params)

    def act(self, obs, key=None):
        """The policy's mode when `key` is None, else a sample: continuous actions clipped to
        [-1, 1] (the Gaussian mean, or a sample), discrete ones as integers (the likeliest
        choice, or a sampled one)."""
        obs = networks.normalize(obs, self.normalizer, self.config.normalize_observations)
        dist = self.actor.head.distribution(self.actor.apply({"params": self.params}, obs))
        action = dist.mode() if key is None else dist.sample(seed=key)
        return self.action_space.clip(action)


def load_policy(run_dir, seed: int = 0, *, actor=None) -> Policy:
    """The policy of the run's `seed`-th seed (0-based: seed `config.seed + seed`) from
    `run_dir/policy.npz` — of a finished run, or the newest checkpoint of one in progress.
    `actor`: the actor module it was trained with, for your own networks (`Trainer.actor`);
    otherwise rebuilt from the saved config.

    A seed that diverged loads with a warning (and `Policy.diverged` says when): its parameters
    are finite — the last good ones, from before the iteration that failed — so it acts, but it
    was trained for fewer steps than the run's other seeds and stopped where learning broke down.
    Check `policy.diverged` (or turn the warning into an error) before comparing seeds."""
    path = Path(run_dir) / FILE_NAME
    if not path.is_file():
        raise CheckpointError(f"{run_dir} has no saved policy ({FILE_NAME}); a run writes it with "
                              f"every checkpoint and when it finishes")
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    meta = json.loads(str(arrays.pop(_META)))
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path} has policy format {meta.get('format')}; this version reads "
                              f"format {FORMAT}")
    config = from_json_dict(meta["config"])
    envs.restore_registration(config.env, meta.get("env_registration"))
    if not 0 <= seed < meta["num_seeds"]:
        raise invalid("seed", seed, f"must be in 0..{meta['num_seeds'] - 1}: the run has "
                                    f"{meta['num_seeds']} seeds ({meta['seeds']})")
    current = io.library_versions()
    used = checkpoint.checked_libraries(config)   # the policy's and its env's libraries
    changed = {k: (v, current.get(k)) for k, v in meta.get("versions", {}).items()
               if k in used and current.get(k) != v}
    if changed:
        warnings.warn(f"{path} was written with other library versions "
                      f"({', '.join(f'{k} {a} -> {b}' for k, (a, b) in sorted(changed.items()))}); "
                      f"it loads by array name, but check its behaviour", stacklevel=2)

    obs_size = int(arrays["normalizer/mean"].shape[-1])
    actor_arrays = {name[len("actor/"):]: value for name, value in arrays.items()
                    if name.startswith("actor/")}
    if actor is None:
        shape = meta.get("observation_shape")
        actor = _actor(config, networks.action_space_of(_nested(actor_arrays)),
                       _env_observation_shape(config) if shape is None else tuple(shape))
    template = {
        "actor": actor.init(jax.random.PRNGKey(0), jnp.zeros((1, obs_size)))["params"],
        "normalizer": networks.init_normalizer(obs_size),
    }
    expected = flatten(template)
    missing, unexpected = sorted(set(expected) - set(arrays)), sorted(set(arrays) - set(expected))
    if missing or unexpected:
        raise CheckpointError(f"{path} does not match the policy of its config: missing arrays "
                              f"{missing}, unexpected arrays {unexpected} (a policy of your own "
                              f"networks loads with their actor: load_policy(run_dir, "
                              f"actor=trainer.actor))")
    leaves = []
    for name, leaf in expected.items():
        value = arrays[name][seed]
        if value.shape != np.shape(leaf):
            raise CheckpointError(f"{path}: array {name} has shape {value.shape}, the config's "
                                  f"policy needs {np.shape(leaf)}")
        leaves.append(jnp.asarray(value, dtype=jnp.asarray(leaf).dtype))
    restored = jax.tree.unflatten(jax.tree.structure(template), leaves)
    loaded = Policy(restored["actor"], restored["normalizer"], actor, config, json.dumps(meta), seed)
    if loaded.diverged is not None:
        warnings.warn(_divergence_warning(path, config, loaded.diverged), stacklevel=2)
    return loaded


def _actor(config: Config, action_space: spaces.ActionSpace, observation_shape):
    return networks.make_networks(config, action_space, observation_shape)[0]


def _env_observation_shape(config: Config) -> tuple[int, ...] | None:
    """The observation shape a `cnn` actor of `config` sees, from the env `config.env` names
    (None for networks that see flat observations)."""
    if config.network != "cnn":
        return None
    try:
        envs.check_name(config.env)
    except ConfigError:
        raise ConfigError(f"the policy's `cnn` actor needs the observation shape of env "
                          f"{config.env!r}, which is not a name vaco_jax knows (an env object?): "
                          f"pass the trainer's actor (actor=trainer.actor)") from None
    return envs.observation_shape(envs.make_env(config.env, config.mjx_solver))


def _nested(flat: dict[str, Any]) -> dict:
    """`{"a/b": x}` as `{"a": {"b": x}}`."""
    nested: dict = {}
    for name, value in flat.items():
        *path, leaf = name.split("/")
        node = nested
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


def _divergence_warning(path: Path, config: Config, record: dict) -> str:
    what = record["nonfinite"]
    what = ", ".join(what[:-1]) + " and " + what[-1] if len(what) > 1 else what[0]
    trained = (record["iteration"] - 1) * config.batch_size
    return (f"seed {record['seed']} (index {record['index']}) of {path} diverged: a non-finite "
            f"{what} in learner iteration {record['iteration']}; this is its last good policy, "
            f"after {trained:,} env steps, not one trained as long as the run's healthy seeds")
