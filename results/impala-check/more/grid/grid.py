"""One-pass IMPALA on dmc:CartpoleBalance, 300k steps, 4 seeds (keys PRNGKey(0..3)), every
combination of learning rate {3e-4, 1e-3}, entropy bonus {0, 0.01} and reward scale {1, 10} in one
program; the number of minibatches (a shape) is the first argument.

    python results/impala-check/more/grid/grid.py 8 minibatches8.json
    python results/impala-check/more/grid/grid.py 32 minibatches32.json
"""
import itertools, json, sys, time
import jax, jax.numpy as jnp, numpy as np
from vaco_jax import Config, make_train

mb = int(sys.argv[1]); out = sys.argv[2]
base = Config.for_env("dmc:CartpoleBalance", algo="impala", total_steps=300_000, num_minibatches=mb)
grid, settings = base.grid(learning_rate=(3e-4, 1e-3), ent_coef=(0.0, 0.01), reward_scale=(1.0, 10.0))
seeds = jnp.stack([jax.random.PRNGKey(s) for s in range(4)])
train = jax.jit(jax.vmap(jax.vmap(make_train(base), in_axes=(0, None)), in_axes=(None, 0)))
t = time.time()
state, metrics = train(seeds, grid)
ret = np.asarray(metrics["eval_return"])   # [settings, seeds, evals]
print("seconds", time.time() - t, file=sys.stderr)
rows = [{"num_minibatches": mb, **s, "final": ret[i, :, -1].round(1).tolist(),
         "mean_final": float(ret[i, :, -1].mean()), "curve": ret[i].mean(0).round(1).tolist()}
        for i, s in enumerate(settings)]
json.dump(rows, open(out, "w"), indent=1)
for r in rows: print(r["num_minibatches"], r["learning_rate"], r["ent_coef"], r["reward_scale"], r["final"], round(r["mean_final"], 1))
