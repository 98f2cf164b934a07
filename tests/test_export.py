"""The programs lower for NVIDIA GPUs and TPUs on this CPU-only install (`jax.export`, both
platforms at once): the MuJoCo trainer's learner and evaluation programs as `vaco_jax.program`
builds them, and one GRPO iteration of the LLM's `tiny` preset. Lowering for a platform is what
can fail there without a device (a primitive with no lowering for it, a call into a CPU library, a
host callback: `jax.export` refuses custom calls it does not know); compiling and running need
the device (`benchmarks/accelerator_check.py`, docs/scale-out.md)."""

import jax
import pytest

from vaco_jax import Config
from vaco_jax.llm import config as llm_config, experiment, grpo, model
from vaco_jax.program import TrainProgram

PLATFORMS = ("cuda", "tpu")


def avals(tree) -> list[tuple]:
    return [(tuple(x.shape), x.dtype) for x in jax.tree.leaves(tree)]


def check_export(fn, *args) -> jax.export.Exported:
    """`fn` (jitted) exported for `PLATFORMS` at `args` (ShapeDtypeStructs): its arguments and
    results are the jitted function's, and it serialises and reads back whole."""
    exported = jax.export.export(fn, platforms=PLATFORMS)(*args)
    assert exported.platforms == PLATFORMS
    assert exported.in_tree == jax.tree.structure((args, {}))
    assert avals(exported.in_avals) == avals(args)
    results = jax.eval_shape(fn, *args)
    assert exported.out_tree == jax.tree.structure(results)
    assert avals(exported.out_avals) == avals(results)
    # Serialised over the flat arrays (optax's and Flax's pytree classes have no serialisation
    # registered): the StableHLO module and the signature come back as they were.
    leaves, treedef = jax.tree.flatten(args)
    flat = jax.export.export(jax.jit(lambda *xs: jax.tree.leaves(fn(*treedef.unflatten(xs)))),
                             platforms=PLATFORMS)(*leaves)
    back = jax.export.deserialize(flat.serialize())
    assert back.platforms == PLATFORMS and back.nr_devices == flat.nr_devices
    assert avals(back.in_avals) == avals(leaves) and avals(back.out_avals) == avals(results)
    assert (back.in_shardings_hlo, back.out_shardings_hlo) == (flat.in_shardings_hlo,
                                                               flat.out_shardings_hlo)
    assert back.mlir_module_serialized == flat.mlir_module_serialized
    return exported


@pytest.fixture(scope="module")
def program():
    config = Config(env="toy_reach", num_envs=8, num_actors=2, num_minibatches=2, unroll_length=8,
                    total_steps=128, num_evals=2, eval_envs=4, episode_length=16,
                    actor_hidden=(16,), critic_hidden=(16,))
    return TrainProgram.build(config, 2, store=False)   # 2 runs; jitted, not compiled


def test_the_learner_program_exports_for_gpu_and_tpu(program):
    check_export(program.learn, program.abstract_state)


def test_the_evaluation_program_exports_for_gpu_and_tpu(program):
    state = program.abstract_state
    exported = check_export(program.evaluate, state.params["actor"], state.normalizer, state.key)
    assert avals(exported.out_avals)[0] == ((2,), jax.numpy.float32)   # a return per run


def test_a_grpo_iteration_of_the_tiny_preset_exports_for_gpu_and_tpu():
    config = llm_config.preset("tiny")
    train_set, test_set = experiment.load_problems(config)
    trainer = grpo.GRPO(config, train_set, test_set)
    params = model.init_params(config.model, jax.random.PRNGKey(0))
    state = trainer.init(jax.random.PRNGKey(1), params)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), (state, trainer.data))
    check_export(jax.jit(trainer.iteration), *abstract)
