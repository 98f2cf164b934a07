"""Evaluate a trained policy again, and watch it: what `vaco-evaluate RUN` does (the command's
parsing is `vaco_jax.commands.evaluate`).

`vaco-evaluate` loads the run's `policy.npz` (`vaco_jax.policy`; a finished run, or the newest checkpoint of one
in progress), runs `--episodes` episodes of the run's env with the deterministic policy (the
Gaussian mean; `--stochastic` samples) under the run's time limit, prints the returns and writes
them as JSON: `RUN/evaluation_seed<i>_step<policy's env steps>_episodes<n>_key<k>.json`
(`_stochastic` added when sampling), so an evaluation with other settings, or of a later policy,
never replaces an earlier one (the same settings give the same returns); `--json` names another
file. Episodes follow the same rule as training-time evaluation
(`vaco_jax.evaluation.episode_returns`).

`--video` renders the first episode and writes it with imageio (`.gif` needs only Pillow, `.mp4`
the `video` extra, `pip install -e ".[video]"`, which brings an ffmpeg binary). Every env renders
or is refused before any episode runs (`renderer`):
  * an MJX env (Brax's, DM Control's): MuJoCo's own renderer, headless on the CPU (OpenGL through
    EGL; `vaco_jax` selects it when no display is set and `MUJOCO_GL` is unset; `MUJOCO_GL=osmesa`
    also works where Mesa's OSMesa is installed), from the model's tracking camera when it has one;
  * a gymnax env that gymnax's `Visualizer` draws (classic control, which also needs pygame;
    Catch, MinAtar, Pong, PointRobot, MetaMaze, FourRooms): its figure, frame by frame;
  * an env of your own with a `render(states, *, width, height)` method: the frames it returns
    (`[n, height, width, 3]` uint8, one per state; `states` is the episode's list of `State`s,
    the reset's first).
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from vaco_jax import evaluation, io
from vaco_jax.envs import (TOY_ENVS, GymnaxEnv, PlaygroundEnv, ToyBandit, ToyReach, make_env,
                           user_env)
from vaco_jax.errors import invalid
from vaco_jax.policy import Policy


def returns(policy: Policy, key, *, episodes: int, stochastic: bool = False, env=None):
    """Undiscounted returns `[episodes]` of `policy` on its env (the training-time rule)."""
    env = env if env is not None else make_env(policy.config.env, policy.config.mjx_solver)
    act_key, reset_key = jax.random.split(key)

    def run(policy, key):
        def act(state, t):
            return policy.act(state.obs, jax.random.fold_in(act_key, t) if stochastic else None)
        return evaluation.episode_returns(env, act, key, num_episodes=episodes,
                                          episode_length=policy.config.episode_length)

    return np.asarray(jax.jit(run)(policy, reset_key))


def rollout_states(policy: Policy, key, *, steps: int, stochastic: bool = False, env=None,
                   keep=None):
    """The env's states `[n, ...]` (one pytree, stacked) of one episode, its initial state first,
    up to `steps` steps: the states up to and including the one that ended it; `keep(state)`, if
    given, of each instead (e.g. `joint_positions`: an MJX state's joint positions only)."""
    keep = keep if keep is not None else (lambda state: state)
    env = env if env is not None else make_env(policy.config.env, policy.config.mjx_solver)

    def step(carry, t):
        state, alive = carry
        action = policy.act(state.obs, jax.random.fold_in(key, t) if stochastic else None)
        stepped = env.step(state, action)
        alive = alive & (stepped.done < 0.5)
        return (stepped, alive), (keep(stepped), alive)

    def run(key):
        state = env.reset(key)
        _, (states, alive) = jax.lax.scan(step, (state, jnp.bool_(True)), jnp.arange(steps))
        return keep(state), states, alive

    first, states, alive = jax.device_get(jax.jit(run)(key))
    # Keep the steps up to and including the one that ended the episode.
    length = int(np.argmin(alive)) + 1 if not alive.all() else steps
    return jax.tree.map(lambda a, b: np.concatenate([a[None], b[:length]]), first, states)


def rollout_positions(policy: Policy, key, *, steps: int, stochastic: bool = False, env=None):
    """Joint positions `[n, nq]` of one episode (its initial state first), up to `steps` steps
    (a toy env: its whole state, e.g. toy_reach's point and target `[n, 4]`)."""
    return rollout_states(policy, key, steps=steps, stochastic=stochastic, env=env,
                          keep=joint_positions)


def joint_positions(state):
    return getattr(state.pipeline_state, "qpos", state.pipeline_state)


def unstack(states) -> list:
    """A stacked pytree `[n, ...]` as the list of its `n` members."""
    n = len(jax.tree.leaves(states)[0])
    return [jax.tree.map(lambda x: x[i], states) for i in range(n)]


# The gymnax envs gymnax 1.0.1's `Visualizer` draws (`gymnax.visualize`); the classic-control ones
# through gymnasium's renderer, which needs pygame.
GYMNAX_CLASSIC = ("Acrobot-v1", "CartPole-v1", "Pendulum-v1", "MountainCar-v0",
                  "MountainCarContinuous-v0")
GYMNAX_DRAWN = GYMNAX_CLASSIC + (
    "Catch-bsuite", "Asterix-MinAtar", "Breakout-MinAtar", "Freeway-MinAtar", "Seaquest-MinAtar",
    "SpaceInvaders-MinAtar", "Pong-misc", "PointRobot-misc", "MetaMaze-misc", "FourRooms-misc")
CAN_RENDER = ("an MJX env (Brax's, DM Control's), a gymnax env gymnax's Visualizer draws "
              f"({', '.join(GYMNAX_DRAWN)}), or an env with a render(states, *, width, height) "
              "method can")


def renderer(env, name: str, video: str):
    """`draw(states, width, height) -> frames [n, height, width, 3]` uint8 of `env`'s stacked
    states (an MJX env's: their joint positions, `rollout_positions`), or a `ConfigError` naming
    `video` and why `env` cannot be drawn (raised before any episode runs)."""
    def refuse(why):
        return invalid("video", video, f"env {name!r} {why}; {CAN_RENDER}")

    if mj_model(env) is not None:
        return lambda positions, width, height: render(env, positions, width=width,
                                                       height=height)
    if isinstance(env, GymnaxEnv):
        gymnax_name = env.env.name
        if gymnax_name not in GYMNAX_DRAWN:
            raise refuse(f"(gymnax's {gymnax_name}) has no renderer in gymnax")
        if gymnax_name in GYMNAX_CLASSIC and importlib.util.find_spec("pygame") is None:
            raise invalid("video", video, f"gymnax draws {gymnax_name} with gymnasium's "
                                          f"classic-control renderer, which needs pygame: "
                                          f"pip install pygame")
        return lambda states, width, height: render_gymnax(env, states, width=width, height=height)
    own = getattr(user_env(env), "render", None)
    if callable(own) and not isinstance(env, (ToyReach, ToyBandit)):
        def draw(states, width, height):
            frames = np.asarray(own(unstack(states), width=width, height=height))
            n = len(jax.tree.leaves(states)[0])
            if frames.shape != (n, height, width, 3) or frames.dtype != np.uint8:
                raise RuntimeError(f"env {name!r}: render(states, width={width}, height={height}) "
                                   f"must return uint8 frames of shape {(n, height, width, 3)}, "
                                   f"one per state; it returned {frames.dtype}{list(frames.shape)}")
            return frames
        return draw
    if name in TOY_ENVS:
        raise refuse("is a pure-JAX test env with no model to render")
    raise refuse("cannot draw itself (it has no render method)")


def mj_model(env):
    """The MuJoCo model of an MJX env (Brax's or Playground's), or None."""
    if isinstance(env, PlaygroundEnv):
        return env.mj_model
    return getattr(getattr(env, "sys", None), "mj_model", None)


def render_gymnax(env: GymnaxEnv, states, *, width: int = 480, height: int = 360):
    """RGB frames `[n, height, width, 3]` uint8 of a gymnax env's stacked states, drawn by gymnax's
    `Visualizer` (its matplotlib figure, titled with the return so far)."""
    import matplotlib.pyplot as plt
    from gymnax.visualize import Visualizer

    # gymnasium's classic-control renderer starts pygame, whose audio start-up complains on stderr
    # on a machine without a sound card; it draws only.
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")

    inner = unstack(states.pipeline_state["state"])
    returns = np.cumsum(np.asarray(states.reward))
    visualizer = Visualizer(env.env, env.params, inner, returns)
    dpi = visualizer.fig.get_dpi()
    visualizer.fig.set_size_inches(width / dpi, height / dpi)
    frames = []
    try:
        visualizer.init()
        for i in range(len(inner)):
            visualizer.update(i)
            visualizer.fig.canvas.draw()
            frames.append(np.asarray(visualizer.fig.canvas.buffer_rgba())[..., :3].copy())
    finally:
        plt.close(visualizer.fig)
    return np.stack(frames)


def render(env, positions, *, width: int = 480, height: int = 360):
    """RGB frames `[n, height, width, 3]` uint8 of an MJX env at the given joint positions."""
    import mujoco

    model = mj_model(env)
    data = mujoco.MjData(model)
    camera = "track" if any(model.camera(i).name == "track" for i in range(model.ncam)) else -1
    try:
        renderer = mujoco.Renderer(model, height, width)
    except Exception as error:  # no OpenGL context: say how to get one
        raise RuntimeError(
            f"MuJoCo could not create an OpenGL context ({error}). On a machine without a display "
            f"set MUJOCO_GL=egl (or osmesa) before Python imports mujoco.") from error
    frames = []
    with renderer:
        for q in positions:
            data.qpos[:] = q
            mujoco.mj_forward(model, data)
            renderer.update_scene(data, camera=camera)
            frames.append(renderer.render().copy())
    return np.stack(frames)


def write_html(path, env, positions) -> None:
    """Brax's interactive viewer of an MJX env's episode, from its joint positions."""
    from brax.io import html

    init = jax.jit(lambda q: env.pipeline_init(q, jnp.zeros(env.sys.qd_size())))
    states = [init(jnp.asarray(q)) for q in positions]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    io.write_bytes_atomic(path, html.render(env.sys.tree_replace({"opt.timestep": env.dt}),
                                            states).encode())


def write_video(path, frames, fps: int) -> None:
    """`frames [n, h, w, 3]` uint8 to a .gif (Pillow) or .mp4 (ffmpeg through imageio)."""
    import imageio.v3 as iio

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".gif":
        iio.imwrite(path, frames, extension=".gif", duration=1000.0 / fps, loop=0)
    else:
        try:
            with warnings.catch_warnings():   # ffmpeg runs as a subprocess: Python's fork notice
                warnings.filterwarnings("ignore", "os.fork", RuntimeWarning)
                iio.imwrite(path, frames, extension=".mp4", fps=fps, codec="libx264",
                            macro_block_size=1)
        except (ImportError, RuntimeError) as error:
            raise RuntimeError(f"writing {path.name} needs ffmpeg: pip install -e \".[video]\" "
                               f"(or write a .gif) ({error})") from error
