"""Evaluate a trained policy again, and watch it: `python -m vaco_jax.evaluate RUN`.

    python -m vaco_jax.evaluate runs/quickstart                       # mean ± std return, seed 0
    python -m vaco_jax.evaluate runs/quickstart --seed 2 --episodes 100
    python -m vaco_jax.evaluate runs/quickstart --video pendulum.mp4  # or .gif
    python -m vaco_jax.evaluate runs/quickstart --html pendulum.html  # Brax's 3-D viewer

Loads the run's `policy.npz` (`vaco_jax.policy`; a finished run, or the newest checkpoint of one
in progress), runs `--episodes` episodes of the run's env with the deterministic policy (the
Gaussian mean; `--stochastic` samples) under the run's time limit, prints the returns and writes
them as JSON (`RUN/evaluation_seed<i>.json` unless `--json` says otherwise). Episodes follow the
same rule as training-time evaluation (`vaco_jax.evaluation.episode_returns`).

`--video` renders the first episode headless on the CPU with MuJoCo's own renderer (OpenGL through
EGL; `vaco_jax` selects it when no display is set and `MUJOCO_GL` is unset; `MUJOCO_GL=osmesa`
also works where Mesa's OSMesa is installed), from the model's tracking camera when it has one,
and writes it with imageio: `.gif` needs only Pillow, `.mp4` the `video` extra
(`pip install -e ".[video]"`, which brings an ffmpeg binary).
"""

from __future__ import annotations

import dataclasses
import sys
import time
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import tyro

from vaco_jax import evaluation, io, runtime
from vaco_jax.envs import DMC_ENVS, TOY_ENVS, PlaygroundEnv, make_env
from vaco_jax.errors import CheckpointError, ConfigError, invalid
from vaco_jax.policy import Policy, load_policy

VIDEO_FORMATS = (".gif", ".mp4")


@dataclasses.dataclass(frozen=True)
class Args:
    run: tyro.conf.Positional[str]
    """A run directory (it holds policy.npz)."""
    seed: int = 0
    """Which of the run's seeds (0-based index)."""
    episodes: int = 16
    """Episodes to run (each from a fresh random initial state)."""
    key: int = 0
    """PRNG seed of the episodes' initial states (and of the actions with --stochastic)."""
    stochastic: bool = False
    """Sample actions from the policy's distribution (Gaussian or categorical) instead of acting
    with its mode (the Gaussian's mean, the likeliest discrete action)."""
    json: str = ""
    """Where to write the returns (default RUN/evaluation_seed<i>.json)."""
    video: str = ""
    """Render the first episode to this .gif or .mp4 file."""
    html: str = ""
    """Write the first episode as Brax's interactive 3-D viewer (an .html file; the page loads
    the viewer's JavaScript from a CDN when opened)."""
    max_steps: int = 0
    """Most steps of the rendered episode (0 = the run's time limit)."""
    width: int = 480
    """Video frame width in pixels."""
    height: int = 360
    """Video frame height in pixels."""
    fps: int = 30
    """Frames per second of the video (steps are skipped to keep real time where possible)."""


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


def rollout_positions(policy: Policy, key, *, steps: int, stochastic: bool = False, env=None):
    """Joint positions `[n, nq]` of one episode (its initial state first), up to `steps` steps
    (a toy env: its whole state, e.g. toy_reach's point and target `[n, 4]`)."""
    env = env if env is not None else make_env(policy.config.env, policy.config.mjx_solver)

    def step(carry, t):
        state, alive = carry
        action = policy.act(state.obs, jax.random.fold_in(key, t) if stochastic else None)
        stepped = env.step(state, action)
        alive = alive & (stepped.done < 0.5)
        return (stepped, alive), (_positions(stepped), alive)

    def run(key):
        state = env.reset(key)
        _, (qpos, alive) = jax.lax.scan(step, (state, jnp.bool_(True)), jnp.arange(steps))
        return _positions(state), qpos, alive

    first, qpos, alive = jax.device_get(jax.jit(run)(key))
    # Keep the steps up to and including the one that ended the episode.
    length = int(np.argmin(alive)) + 1 if not alive.all() else steps
    return np.concatenate([first[None], qpos[:length]])


def _positions(state):
    return getattr(state.pipeline_state, "qpos", state.pipeline_state)


def render(env, positions, *, width: int = 480, height: int = 360):
    """RGB frames `[n, height, width, 3]` uint8 of an MJX env at the given joint positions."""
    import mujoco

    model = env.mj_model if isinstance(env, PlaygroundEnv) else env.sys.mj_model
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


def check(args: Args) -> None:
    """Refuse bad arguments before anything is compiled."""
    if args.episodes < 1:
        raise invalid("episodes", args.episodes, "must be an integer >= 1")
    if args.video and Path(args.video).suffix not in VIDEO_FORMATS:
        raise invalid("video", args.video, f"must end in one of {list(VIDEO_FORMATS)}")
    if args.html and Path(args.html).suffix != ".html":
        raise invalid("html", args.html, "must end in .html")
    for field in ("width", "height", "fps"):
        if getattr(args, field) < 1:
            raise invalid(field, getattr(args, field), "must be an integer >= 1")
    if args.max_steps < 0:
        raise invalid("max_steps", args.max_steps, "must be >= 0 (0 = the run's time limit)")


def main(argv: list[str] | None = None) -> int:
    args = tyro.cli(Args, args=argv, description=__doc__.split("\n\n")[0],
                    prog="python -m vaco_jax.evaluate")
    try:
        check(args)
        policy = load_policy(args.run, args.seed)
        for field in ("video", "html"):
            if getattr(args, field) and policy.env in TOY_ENVS:
                raise invalid(field, getattr(args, field), f"{policy.env} is a pure-JAX test env "
                                                           f"with no model to render; an MJX env is")
        if args.html and policy.env in DMC_ENVS:
            raise invalid("html", args.html, "Brax's viewer shows Brax envs only; for a DM Control "
                                             "task write a --video")
        if args.video and not args.video.endswith(".gif"):
            import importlib.util
            if importlib.util.find_spec("imageio_ffmpeg") is None:
                raise invalid("video", args.video, 'writing .mp4 needs the video extra: '
                              'pip install -e ".[video]" (or write a .gif)')
    except (ConfigError, CheckpointError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    runtime.configure_logging()
    env = make_env(policy.config.env, policy.config.mjx_solver)
    start = time.perf_counter()
    values = returns(policy, jax.random.PRNGKey(args.key), episodes=args.episodes,
                     stochastic=args.stochastic, env=env)
    seconds = time.perf_counter() - start
    meta = policy.meta
    result = {"run": str(args.run), "env": policy.env, "algo": policy.config.algo,
              "seed_index": args.seed, "seed": meta["seeds"][args.seed],
              "policy_env_steps": meta["env_steps"], "episodes": args.episodes,
              "stochastic": args.stochastic, "key": args.key,
              "mean": float(values.mean()), "std": float(values.std()),
              "min": float(values.min()), "max": float(values.max()), "returns": values,
              "seconds": seconds, "diverged": policy.diverged, **io.provenance()}
    print(f"{policy.env} {policy.config.algo} seed {result['seed']} "
          f"(after {meta['env_steps']:,} steps): return {result['mean']:.1f} ± "
          f"{result['std']:.1f} over {args.episodes} episodes (min {result['min']:.1f}, "
          f"max {result['max']:.1f})")
    out = Path(args.json) if args.json else Path(args.run) / f"evaluation_seed{args.seed}.json"
    io.write_json_atomic(out, result)
    if args.video or args.html:
        steps = args.max_steps or policy.config.episode_length
        positions = rollout_positions(policy, jax.random.PRNGKey(args.key), steps=steps,
                                      stochastic=args.stochastic, env=env)
    if args.video:
        stride = max(1, round(1.0 / (float(env.dt) * args.fps)))
        frames = render(env, positions[::stride], width=args.width, height=args.height)
        write_video(args.video, frames, fps=args.fps)
        print(f"video: {len(frames)} frames ({len(positions) - 1} steps) -> {args.video}")
    if args.html:
        write_html(args.html, env, positions)
        print(f"viewer: {len(positions)} states -> {args.html}")
    print(f"-> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
