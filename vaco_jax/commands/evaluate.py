"""Evaluate a trained policy again, and watch it: `vaco-evaluate RUN`.

    vaco-evaluate runs/quickstart                       # mean ± std return, seed 0
    vaco-evaluate runs/quickstart --seed 2 --episodes 100
    vaco-evaluate runs/quickstart --video pendulum.mp4  # or .gif
    vaco-evaluate runs/quickstart --html pendulum.html  # Brax's 3-D viewer

The command (`python -m vaco_jax.commands.evaluate` where the script is not installed); what it computes, writes and renders:
`vaco_jax.playback`, imported once the flags are parsed.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
import time
from pathlib import Path

import tyro

from vaco_jax.errors import CheckpointError, ConfigError, invalid

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
    """Where to write the returns (default RUN/evaluation_seed<i>_step<s>_episodes<n>_key<k>.json,
    named by what produced them)."""
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


def default_json(args: Args, env_steps: int) -> Path:
    """Where an evaluation is written unless `--json` says: named by what produced it (seed,
    the policy's env steps, episodes, key, sampling), so none replaces another's result."""
    return Path(args.run) / (f"evaluation_seed{args.seed}_step{env_steps}_episodes{args.episodes}"
                             f"_key{args.key}{'_stochastic' if args.stochastic else ''}.json")


def main(argv: list[str] | None = None, prog: str = "vaco-evaluate") -> int:
    args = tyro.cli(Args, args=argv, description=__doc__.split("\n\n")[0], prog=prog)
    # The library is imported once the flags are parsed: --help imports no JAX.
    import jax

    from vaco_jax import io, runtime
    from vaco_jax.envs import make_env, user_env
    from vaco_jax.playback import (joint_positions, mj_model, renderer, returns, rollout_states,
                                   write_html, write_video)
    from vaco_jax.policy import load_policy

    try:
        check(args)
        policy = load_policy(args.run, args.seed)
        if args.video and not args.video.endswith(".gif"):
            if importlib.util.find_spec("imageio_ffmpeg") is None:
                raise invalid("video", args.video, 'writing .mp4 needs the video extra: '
                              'pip install -e ".[video]" (or write a .gif)')
        env = make_env(policy.config.env, policy.config.mjx_solver)
        # Every env renders or is refused here, before any episode runs.
        draw = renderer(env, policy.env, args.video) if args.video else None
        if args.html and not hasattr(env, "pipeline_init"):
            raise invalid("html", args.html, f"Brax's viewer shows Brax envs only, not "
                                             f"{policy.env!r}; write a --video")
    except (ConfigError, CheckpointError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    runtime.configure_logging()
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
    out = Path(args.json) if args.json else default_json(args, meta["env_steps"])
    io.write_json_atomic(out, result)
    if args.video or args.html:
        steps = args.max_steps or policy.config.episode_length
        # An MJX env's episode is kept as its joint positions (what MuJoCo's renderer and Brax's
        # viewer need), any other's as its states.
        states = rollout_states(policy, jax.random.PRNGKey(args.key), steps=steps,
                                stochastic=args.stochastic, env=env,
                                keep=joint_positions if mj_model(env) is not None else None)
        n = len(jax.tree.leaves(states)[0])
    if args.video:
        dt = getattr(user_env(env), "dt", None)
        stride = max(1, round(1.0 / (float(dt) * args.fps))) if dt is not None else 1
        frames = draw(jax.tree.map(lambda x: x[::stride], states), args.width, args.height)
        write_video(args.video, frames, fps=args.fps)
        print(f"video: {len(frames)} frames ({n - 1} steps) -> {args.video}")
    if args.html:
        write_html(args.html, env, states)
        print(f"viewer: {n} states -> {args.html}")
    print(f"-> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(prog="python -m vaco_jax.commands.evaluate"))
