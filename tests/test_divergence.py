"""Divergence: a non-finite loss, gradient or parameter is caught inside the compiled program, the
seed is frozen at its last good state, and the CLI stops (keeping the last good checkpoint) or, with
`--on-nan skip-seed`, continues the other seeds unchanged.

Configs made to diverge, both on toy_reach with K × M = 2 × 2 Adam steps per iteration:
  * learning_rate = 1e6: the first Adam step moves every parameter by ~1e6; iteration 1 fails.
  * learning_rate = 1, ent_coef = 1000: the entropy bonus dominates the loss, so Adam raises the
    policy's log σ by ~lr per step until σ = exp(log σ) overflows float32 (log σ > 88.7): the 89th
    step, in learner iteration 23 (index 22), for every seed alike (it does not depend on the data).
"""

import dataclasses
import re

import jax
import numpy as np
import pytest

from vaco_jax import io, stack_hparams
from vaco_jax.checkpoint import RunCheckpoints
from vaco_jax.program import seed_keys
from vaco_jax.commands.train import main
from vaco_jax.driver import DivergenceError, build_program, run
from vaco_jax.trainer import NONFINITE_GRADIENT

from test_checkpoint import BASE, options

ENTROPY_BLOWUP = dict(learning_rate=1.0, ent_coef=1000.0)


def run_chunks(hparams_per_seed):
    """All chunks of BASE's program for seeds 0 and 1 with the given per-seed hyper-parameters."""
    program = build_program(BASE)
    chunk, _ = program.compiled_chunk()
    state = program.init_state(seed_keys(range(2)), stack_hparams(hparams_per_seed))
    initial_params = jax.device_get(state.params)
    metrics = []
    for _ in range(BASE.num_evals):
        state, chunk_metrics = chunk(state)
        metrics.append(jax.device_get(chunk_metrics))
    return initial_params, jax.device_get(state), metrics


@pytest.fixture(scope="module")
def healthy():
    return run_chunks([BASE.hparams(), BASE.hparams()])


def test_a_diverged_seed_is_frozen_and_the_other_is_untouched(healthy):
    huge_lr = dataclasses.replace(BASE, learning_rate=1e6).hparams()
    initial, state, metrics = run_chunks([BASE.hparams(), huge_lr])
    # Seed 1 diverged in its first iteration and kept its initial (last good) state.
    assert state.health.nonfinite[1] != 0 and state.health.iteration[1] == 0
    assert state.iteration[1] == 0 and state.env_steps[1] == 0
    for frozen, start in zip(jax.tree.leaves(state.params), jax.tree.leaves(initial)):
        np.testing.assert_array_equal(frozen[1], start[1])
    # Seed 0 is healthy and bit-identical to seed 0 of an all-healthy run.
    _, healthy_state, healthy_metrics = healthy
    assert state.health.nonfinite[0] == 0 and state.health.iteration[0] == -1
    assert state.iteration[0] == BASE.num_iterations
    for ours, reference in zip(metrics, healthy_metrics):
        for name in reference:
            np.testing.assert_array_equal(ours[name][0], reference[name][0], err_msg=name)
    for ours, reference in zip(jax.tree.leaves(state.params), jax.tree.leaves(healthy_state.params)):
        np.testing.assert_array_equal(ours[0], reference[0])


def test_the_check_is_compiled_once_not_into_every_state_leaf():
    # Every leaf of the state is selected (kept or replaced) with one flag per iteration. XLA may
    # instead copy the whole non-finite test into the select of each leaf: it did here (240 is-finite
    # instructions for 95 state leaves), and on hopper that was a quarter of the learner program's
    # instructions and about a tenth of its XLA compile time.
    program = build_program(BASE)
    chunk, _ = program.compiled_chunk()
    tests = len(re.findall(r" is-finite\(", chunk.learn.as_text()))
    assert 0 < tests < len(jax.tree.leaves(program.abstract_state)), tests


def test_entropy_blowup_is_caught_at_the_predicted_iteration():
    config = dataclasses.replace(BASE, **ENTROPY_BLOWUP)
    _, state, _ = run_chunks([config.hparams(), config.hparams()])
    np.testing.assert_array_equal(state.health.iteration, [22, 22])
    assert np.all(state.health.nonfinite & NONFINITE_GRADIENT)
    np.testing.assert_array_equal(state.iteration, [22, 22])  # frozen after 22 good iterations
    assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(state.params))


def test_cli_stops_with_a_clear_message_and_keeps_the_last_good_checkpoint(tmp_path, capsys):
    out = tmp_path / "diverges"
    config = dataclasses.replace(BASE, **ENTROPY_BLOWUP)
    with pytest.raises(DivergenceError) as error:
        run(config, options(out=str(out)))
    message = str(error.value)
    for seed in (0, 1):
        assert f"seed {seed} (index {seed} of 2) produced a non-finite " in message
    assert message.count("gradient and parameters in learner iteration 23 of 120 (after 1,408 env "
                         "steps)") == 2
    assert f"the last good checkpoint is {out / 'checkpoints' / '1'} (chunk 1 of 6)" in message
    assert "every seed has diverged" in message
    assert [int(p.name) for p in (out / "checkpoints").iterdir()] == [1]
    assert len(io.read_jsonl(out / "metrics.jsonl")) == 1 and not (out / "summary.json").exists()

    # Resuming with skip-seed cannot help when every seed diverges: exit code 3, same message.
    assert main(["--resume", str(out), "--on-nan", "skip-seed", "--no-progress"]) == 3
    assert "every seed has diverged" in capsys.readouterr().err


@pytest.fixture
def seed_one_made_unstable(tmp_path):
    """A run checkpointed after 2 chunks, then seed 1's learning rate set to 1e6 in the checkpoint
    (a per-seed hyper-parameter the CLI cannot express): it diverges in its next iteration."""
    first = tmp_path / "first"
    run(BASE, options(out=str(first)), stop_after=2)
    checkpoints = RunCheckpoints(first, create=False)
    restored = checkpoints.restore_latest(build_program(BASE).abstract_state, BASE)
    checkpoints.close()
    state = restored.state.replace(hparams=restored.state.hparams.replace(
        learning_rate=restored.state.hparams.learning_rate.at[1].set(1e6)))
    out = tmp_path / "unstable"
    checkpoints = RunCheckpoints(out)
    checkpoints.save(2, state, restored.history, BASE)
    checkpoints.close()
    return out


def test_skip_seed_freezes_one_seed_and_continues_the_other(seed_one_made_unstable, tmp_path):
    reference = tmp_path / "reference"
    run(BASE, options(out=str(reference)))
    summary = run(BASE, options(resume=str(seed_one_made_unstable), on_nan="skip-seed"))
    assert summary["finished"]
    assert summary["diverged_seeds"] == [
        {"seed": 1, "index": 1, "iteration": 41, "nonfinite": ["loss", "gradient", "parameters"]}]
    rows, expected = (io.read_jsonl(seed_one_made_unstable / "metrics.jsonl"),
                      io.read_jsonl(reference / "metrics.jsonl"))
    assert rows[:2] == expected[:2]
    for row, reference_row in zip(rows[2:], expected[2:]):
        assert row["eval_return"][1] is None and row["loss"][1] is None  # seed 1 reports nothing
        assert row["step"] == reference_row["step"]
        for name, values in reference_row.items():  # seed 0 goes on exactly as without seed 1
            if isinstance(values, list):
                assert row[name][0] == values[0], name
    assert summary["final_eval_return"][1] is None or np.isnan(summary["final_eval_return"][1])


def test_stop_names_the_seed_and_iteration(seed_one_made_unstable):
    with pytest.raises(DivergenceError, match=r"seed 1 \(index 1 of 2\) produced a non-finite loss, "
                                              r"gradient and parameters in learner iteration 41 of 120 "
                                              r".*the last good checkpoint is .*checkpoints/2 \(chunk 2 "
                                              r"of 6\); to continue the other seeds from there, run "
                                              r"--resume .* --on-nan skip-seed"):
        run(BASE, options(resume=str(seed_one_made_unstable)))
