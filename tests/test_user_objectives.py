"""The objective is a value, like the env: a function registered by name or named `module:function`
trains like a built-in objective (bit for bit when it computes the same), declares its own
hyper-parameters, is traced and refused before compilation when it cannot run, keys the program
store by its code, and is recorded by each run so that a resume on edited code is refused."""

import dataclasses
import functools
import hashlib
import importlib
import json
import os
import subprocess
import sys
import textwrap

import chex
import jax
import jax.numpy as jnp
import pytest

import vaco_jax
from vaco_jax import Config, ConfigError, Options, Trainer, algorithms, checkpoint, make_train, program
from vaco_jax import fingerprint as fingerprint_lib
from vaco_jax import objectives as objectives_lib
from vaco_jax.config import to_json_dict, validate
from vaco_jax.commands.train import main
from vaco_jax.driver import run

# Two iterations, one evaluation: what the trainer passes an objective, at the least cost.
SMALL = Config(env="toy_reach", algo="ppo_clip", num_envs=8, unroll_length=8, num_epochs=2,
               num_minibatches=2, num_actors=2, episode_length=20, total_steps=8 * 8 * 2,
               num_evals=1, eval_envs=4, actor_hidden=(16, 16), critic_hidden=(16, 16))

MODULE = '''
import jax.numpy as jnp
import vaco_jax
from vaco_jax.objectives import log_ratio


@vaco_jax.objective(hparams={"tau": 0.04, "scale": 1.0})
def my_loss(x, p):
    """A clipped-ratio surrogate with a quadratic penalty of weight tau."""
    ratio = jnp.exp(log_ratio(x.log_prob, x.log_behavior))
    loss = -jnp.mean(ratio * x.advantages * p.scale - p.tau * (ratio - 1.0) ** 2)
    return loss, {"tau_seen": p.tau * jnp.ones(())}
'''


def write_module(directory, name: str, source: str):
    """`source` as module `name` in `directory`, importable now (and imported again if it was)."""
    path = directory / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    if str(directory) not in sys.path:
        sys.path.insert(0, str(directory))
    importlib.invalidate_caches()
    if name in sys.modules:
        importlib.reload(sys.modules[name])
    return path


def sha16(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def fingerprint(name: str) -> str:
    """What objective `name` computes (`algorithms.objective_fingerprint`), as this process sees it."""
    return algorithms.objective_fingerprint(algorithms.resolve_objective(name))


# --- a user's objective trains ---------------------------------------------------------------------

def ppo_clip_again(x, p):
    """PPO's clipped surrogate, written out again, with its ε as its own hyper-parameter."""
    ratio = jnp.exp(objectives_lib.log_ratio(x.log_prob, x.log_behavior))
    surrogate = jnp.minimum(ratio * x.advantages,
                            jnp.clip(ratio, 1.0 - p.eps, 1.0 + p.eps) * x.advantages)
    clipped = (jnp.abs(jax.lax.stop_gradient(ratio) - 1.0) > p.eps).astype(ratio.dtype)
    return -jnp.mean(surrogate), {"clip_fraction": jnp.mean(clipped)}


def test_a_registered_reimplementation_of_ppo_clip_trains_bit_for_bit_like_ppo_clip():
    vaco_jax.register_objective("ppo_clip_again", ppo_clip_again, hparams={"eps": 0.2})
    key = jax.random.PRNGKey(3)
    (state, metrics) = jax.jit(make_train(dataclasses.replace(SMALL, algo="gae+ppo_clip_again")))(key)
    built_in = jax.jit(make_train(SMALL))(key)
    # Every metric and the whole train state; the state's hyper-parameters also hold our ε.
    assert state.hparams.objective == {"eps": jnp.float32(0.2)}
    state = state.replace(hparams=state.hparams.replace(objective={}))
    chex.assert_trees_all_equal((state, metrics), built_in)


def test_a_module_objective_trains_from_the_command_line_and_its_run_records_it(tmp_path):
    path = write_module(tmp_path, "my_objectives", MODULE)
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "vaco_jax.commands.train", "--env", "toy_reach",
         "--algo", "gae+my_objectives:my_loss", "--objective-hparams", "tau=0.25",
         "--total-steps", "128", "--num-envs", "8", "--unroll-length", "8", "--num-minibatches",
         "2", "--num-evals", "1", "--episode-length", "20", "--eval-envs", "4", "--actor-hidden",
         "16", "16", "--critic-hidden", "16", "16", "--out", str(out), "--no-progress"],
        capture_output=True, text=True, timeout=600,
        env=dict(os.environ, JAX_PLATFORMS="cpu",
                 PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])))
    assert done.returncode == 0, done.stderr[-3000:]
    recorded = json.loads((out / "config.json").read_text())
    assert recorded["config"]["algo"] == "gae+my_objectives:my_loss"
    assert recorded["config"]["objective_hparams"] == ["tau=0.25"]
    # The objective as run: both hyper-parameters resolved (the default too), its file and hash.
    assert recorded["objective"] == {
        "name": "my_objectives:my_loss", "hparams": {"tau": 0.25, "scale": 1.0}, "needs_kl": False,
        "code": {"function": "my_loss", "module": "my_objectives", "file": str(path.resolve()),
                 "source": sha16(path), "fingerprint": fingerprint("my_objectives:my_loss")}}
    assert recorded["sources"][0]["objective_code"]["source"] == sha16(path)
    [row] = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert row["tau_seen"] == [pytest.approx(0.25)]   # the override reached p.tau in the program
    assert all(jnp.isfinite(jnp.asarray(row[name])).all() for name in ("policy_loss", "eval_return"))


# --- refused before anything compiles --------------------------------------------------------------

def vector_loss(x, p):
    return -(x.log_prob * x.advantages), {}


def not_a_pair(x, p):
    return jnp.mean(x.log_prob)


def per_sample_metric(x, p):
    return jnp.mean(x.log_prob), {"weights": jnp.exp(x.log_prob)}


def metrics_not_a_dict(x, p):
    return jnp.mean(x.log_prob), [jnp.mean(x.log_prob)]


def reads_kl(x, p):
    return jnp.mean(x.log_prob + x.kl), {}


def reads_reference(x, p):
    return jnp.mean(x.log_prob - x.log_reference), {}


def needs_a_mask(x, p):
    return jnp.sum(x.log_prob * x.mask) / jnp.sum(x.mask), {}


def undeclared_hparam(x, p):
    return jnp.mean(x.log_prob) * p.temperature, {}


def raises_inside(x, p):
    if x.log_prob.ndim == 2:
        raise ValueError("expected tokens [B, L, V]")
    return jnp.mean(x.log_prob), {}


@pytest.mark.parametrize("fn,expected", [
    (vector_loss, "its loss must be a scalar float (shape ()), got an array of shape (4, 3) and "
                  "dtype float32: reduce it to one number, e.g. with jnp.mean (traced on [4, 3] "
                  "inputs without a mask)"),
    (not_a_pair, "not a pair (loss, metrics) (the contract: fn(x: PolicyInputs, p: "
                 "ObjectiveParams) -> (loss, metrics))"),
    (per_sample_metric, "its metric 'weights' must be a scalar (shape ()), got an array of shape "
                        "(4, 3)"),
    (metrics_not_a_dict, "its metrics must be a dict of scalars ({name: value}), got list"),
    (reads_kl, "it read PolicyInputs.kl, which is None here: it is computed only for an objective "
               "declared needs_kl=True"),
    (reads_reference, "it read PolicyInputs.log_reference, which is None here: it is given only "
                      "with tv_reference='learner'"),
    (needs_a_mask, "when traced on [4, 3] inputs without a mask; it read PolicyInputs.mask, which "
                   "is None here"),
    (undeclared_hparam, "it reads p.temperature, a hyper-parameter it does not declare (declared: "
                        "none); declare it with @vaco_jax.objective(hparams={'temperature': "
                        "<default>})"),
    (raises_inside, "it raised ValueError: expected tokens [B, L, V] (at test_user_objectives.py:"),
])
def test_an_objective_that_cannot_run_is_refused_naming_what_is_wrong(fn, expected):
    vaco_jax.register_objective(fn.__name__, fn)
    algo = f"gae+{fn.__name__}"
    with pytest.raises(ConfigError) as error:
        Trainer(dataclasses.replace(SMALL, algo=algo))
    message = str(error.value)
    assert message.startswith(f"config field `algo` = {algo!r} is invalid: objective "
                              f"{fn.__name__!r} cannot be used: "), message
    assert expected in message, message


def test_inputs_are_checked_as_the_trainer_gives_them():
    # Declared or configured, the same functions pass: the KL is computed for an objective that
    # needs it, π_T is the reference with tv_reference=learner.
    vaco_jax.register_objective("reads_kl_declared", reads_kl, needs_kl=True)
    vaco_jax.register_objective("reads_reference", reads_reference)
    validate(dataclasses.replace(SMALL, algo="vtrace_once+reads_kl_declared"))
    validate(dataclasses.replace(SMALL, algo="gae+reads_reference", tv_reference="learner"))
    declared = vaco_jax.objective(hparams={"temperature": 2.0})(
        lambda x, p: undeclared_hparam(x, p))
    vaco_jax.register_objective("declared_hparam", declared)
    validate(dataclasses.replace(SMALL, algo="gae+declared_hparam",
                                        objective_hparams=("temperature=0.5",)))
    assert algorithms.parse("gae+declared_hparam").objective.hparams == (("temperature", 2.0),)


@pytest.mark.parametrize("algo,expected", [
    ("my_objectives:my_loss", "a user objective runs with an advantage estimator: write "
                              "'<estimator>+my_objectives:my_loss' with estimator in ['gae', "
                              "'vtrace_once', 'vtrace_every'] (e.g. 'gae+my_objectives:my_loss')"),
    ("gae+no_such_module_for_vaco:loss", "module 'no_such_module_for_vaco' does not import "
                                         "(ModuleNotFoundError"),
    ("gae+my_objectives:no_such_loss", "module 'my_objectives' has no function 'no_such_loss'"),
    ("gae+no_such_objective", "objective 'no_such_objective' is unknown: the objectives are "
                              "['tv_filter', 'ppo_clip'"),
])
def test_an_objective_that_cannot_be_resolved_is_refused_naming_algo(tmp_path, algo, expected):
    write_module(tmp_path, "my_objectives", MODULE)
    with pytest.raises(ConfigError) as error:
        validate(dataclasses.replace(SMALL, algo=algo))
    message = str(error.value)
    assert message.startswith(f"config field `algo` = {algo!r} is invalid: "), message
    assert expected in message, message


def test_built_in_names_and_bad_declarations_are_refused():
    for name in ("ppo_clip", "clip", "vaco", "gae", "mod:fn", "a+b", ""):
        with pytest.raises(ConfigError, match=r"the name must be a Python identifier that is not a "
                                              r"built-in objective's"):
            vaco_jax.register_objective(name, ppo_clip_again)
    assert algorithms.OBJECTIVES["ppo_clip"].fn is not ppo_clip_again
    with pytest.raises(ConfigError, match=r"hyper-parameter name 'clip_eps' is invalid: .* not a "
                                          r"shared ObjectiveParams field"):
        vaco_jax.objective(hparams={"clip_eps": 0.1})
    with pytest.raises(ConfigError, match=r"hyper-parameter 'tau' has default inf: it must be a "
                                          r"finite number"):
        vaco_jax.register_objective("infinite_tau", ppo_clip_again, hparams={"tau": float("inf")})
    vaco_jax.register_objective("with_eps", ppo_clip_again, hparams={"eps": 0.2})
    with pytest.raises(ConfigError, match=r"`objective_hparams` item 'tau=1' is invalid: objective "
                                          r"'with_eps' declares the hyper-parameters \['eps'\]"):
        validate(dataclasses.replace(SMALL, algo="gae+with_eps", objective_hparams=("tau=1",)))


def test_the_command_line_refuses_a_broken_objective_before_compiling(tmp_path):
    write_module(tmp_path, "broken_objectives", '''
        def vector_loss(x, p):
            return -(x.log_prob * x.advantages), {}
    ''')
    done = subprocess.run(
        [sys.executable, "-m", "vaco_jax.commands.train", "--env", "toy_reach",
         "--algo", "gae+broken_objectives:vector_loss", "--out", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=300,
        env=dict(os.environ, JAX_PLATFORMS="cpu",
                 PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])))
    assert done.returncode == 2, done.stderr[-2000:]
    assert ("config field `algo` = 'gae+broken_objectives:vector_loss' is invalid: objective "
            "'broken_objectives:vector_loss' cannot be used: its loss must be a scalar float "
            "(shape ()), got an array of shape (4, 3)") in done.stderr
    assert not (tmp_path / "run").exists()


# --- its code keys the program store and the run -----------------------------------------------------

def test_editing_the_module_changes_the_program_key_and_the_same_code_keeps_it(tmp_path):
    algo = dataclasses.replace(SMALL, algo="gae+keyed_objectives:my_loss")

    def fingerprint(source):
        write_module(tmp_path, "keyed_objectives", source)
        traced = program.traced_from(Trainer(algo))
        assert traced.storable
        return traced.digest

    first = fingerprint(MODULE)
    assert fingerprint(MODULE.replace("p.tau * (ratio - 1.0) ** 2", "p.tau * abs(ratio - 1.0)")) \
        != first
    assert fingerprint(MODULE) == first   # the same code, imported again: the same key
    # A helper constant the function reads is part of its code too.
    assert fingerprint(MODULE.replace("ratio = jnp.exp", "SCALE = 1.0\n    ratio = SCALE * jnp.exp")
                       ) != first


HELPED = '''
import jax.numpy as jnp
import vaco_jax
import resumed_helpers


@vaco_jax.objective(hparams={"tau": 0.04})
def my_loss(x, p):
    ratio = jnp.exp(x.log_prob - x.log_behavior)
    return -jnp.mean(ratio * x.advantages - p.tau * resumed_helpers.penalty(ratio)), {}
'''
HELPERS = '''
def penalty(ratio):
    return (ratio - 1.0) ** 2
'''


def test_a_resume_follows_what_the_objective_computes_a_helper_edit_refused_a_comment_not(
        tmp_path, capsys):
    path = write_module(tmp_path, "resumed_objectives", HELPED)
    write_module(tmp_path, "resumed_helpers", HELPERS)
    three_evals = dataclasses.replace(SMALL, algo="gae+resumed_objectives:my_loss", num_evals=3,
                                      total_steps=8 * 8 * 3)
    out = tmp_path / "run"
    run(three_evals, Options(out=str(out), progress=False, checkpoint_budget=1.0), stop_after=1)
    before, first_file = fingerprint("resumed_objectives:my_loss"), sha16(path)
    # Comments and docstrings in both files change what no program computes: the run resumes.
    write_module(tmp_path, "resumed_objectives", '"""My objective."""\n# tuned\n' + HELPED)
    write_module(tmp_path, "resumed_helpers", '# the penalty\n' + HELPERS)
    summary = run(three_evals, Options(resume=str(out), progress=False), stop_after=1)
    assert summary["resumed_from_chunk"] == 1 and not summary["finished"]
    # The helper module computes another penalty: refused, though the objective's file is unchanged.
    write_module(tmp_path, "resumed_helpers", HELPERS.replace("** 2", "** 4"))
    after = fingerprint("resumed_objectives:my_loss")
    assert after != before
    assert main(["--resume", str(out), "--no-progress"]) == 2
    message = " ".join(capsys.readouterr().err.split())
    assert (f"was written by other code of the run's objective (objective "
            f"'resumed_objectives:my_loss': fingerprint {before} ({path.resolve()}, source "
            f"{first_file}) in the checkpoint, fingerprint {after} ({path.resolve()}, source "
            f"{sha16(path)}) here)") in message, message
    assert "--allow-code-change" in message

    with pytest.warns(UserWarning, match="written by other code of the run's objective"):
        summary = run(three_evals, Options(resume=str(out), progress=False, allow_code_change=True))
    assert summary["finished"] and summary["resumed_from_chunk"] == 2
    sources = json.loads((out / "config.json").read_text())["sources"]
    assert [(s["from_chunk"], s["objective_code"]["fingerprint"]) for s in sources] == [
        (0, before), (2, after)]


NOTEBOOK_CELL = '''
import jax.numpy as jnp

def notebook_loss(x, p):
    ratio = jnp.exp(x.log_prob - x.log_behavior)
    return -jnp.mean(ratio * x.advantages * SCALE), {}
'''


def define_in_a_notebook(source: str):
    """`notebook_loss` as a notebook cell (or `exec`) defines it: without a source file."""
    namespace = {}
    exec(source, namespace)
    return vaco_jax.register_objective("notebook_loss", namespace["notebook_loss"])


def test_an_objective_defined_in_a_notebook_is_fingerprinted_and_its_resume_checked():
    config = dataclasses.replace(SMALL, algo="gae+notebook_loss")
    define_in_a_notebook("SCALE = 1.0\n" + NOTEBOOK_CELL)
    recorded = checkpoint.source_record(0, config)
    assert recorded["objective_code"]["source"] is None and recorded["objective_code"]["fingerprint"]
    meta = {"sources": [recorded], "source": recorded["source"], "versions": recorded["versions"],
            "config": to_json_dict(config)}
    define_in_a_notebook("# run again, with a comment\nSCALE = 1.0\n\n" + NOTEBOOK_CELL)
    checkpoint.check_compatible(meta, config, "run", warn=False)   # the same program: resumed
    define_in_a_notebook("SCALE = 2.0\n" + NOTEBOOK_CELL)
    with pytest.raises(checkpoint.CheckpointError, match="other code of the run's objective") as error:
        checkpoint.check_compatible(meta, config, "run", warn=False)
    assert "no source file" in str(error.value)


def scaled_pg(x, p, *, transform):
    ratio = jnp.exp(objectives_lib.log_ratio(x.log_prob, x.log_behavior))
    return -jnp.mean(transform(ratio) * x.advantages), {}


def make_transform(power):
    def transform(ratio):
        return ratio ** power
    return transform


def test_a_partial_or_jit_wrapped_objective_is_keyed_by_what_it_computes(monkeypatch):
    config = dataclasses.replace(SMALL, algo="gae+wrapped_loss")

    def keys(power):
        helper = jax.jit(make_transform(power))   # same name, module and code: another constant
        vaco_jax.register_objective("wrapped_loss", functools.partial(scaled_pg, transform=helper))
        return (checkpoint.source_record(0, config)["objective_code"]["fingerprint"],
                program.traced_from(Trainer(config)).digest)

    # As if this module were installed: its code then counts by name in the program store's walk.
    monkeypatch.setattr(fingerprint_lib, "_installed", lambda module_name: True)
    first = keys(1.0)
    assert first[0] is not None and keys(1.0) == first
    second = keys(2.0)
    assert second[0] != first[0] and second[1] != first[1]


# --- the same objective in the LLM's GRPO ----------------------------------------------------------

def llm_token_batch():
    """Token log-probabilities of 6 answers of 7 tokens, some padded, away from the behaviour's."""
    from vaco_jax.llm import grpo
    keys = jax.random.split(jax.random.PRNGKey(11), 4)
    log_behavior = -3.0 * jax.random.uniform(keys[0], (6, 7))
    log_prob = log_behavior + 0.3 * jax.random.normal(keys[1], (6, 7))
    mask = (jnp.arange(7)[None] < jax.random.randint(keys[2], (6, 1), 2, 8)).astype(jnp.float32)
    advantages = jnp.repeat(jax.random.normal(keys[3], (6, 1)), 7, 1) * mask
    return log_prob, grpo.Batch(None, None, mask, advantages, log_behavior, log_behavior)


def ppo_clip_masked(x, p):
    """`ppo_clip_again` over the tokens of `x.mask` alone (padding is not a sample)."""
    ratio = jnp.exp(objectives_lib.log_ratio(x.log_prob, x.log_behavior))
    surrogate = jnp.minimum(ratio * x.advantages,
                            jnp.clip(ratio, 1.0 - p.eps, 1.0 + p.eps) * x.advantages)
    clipped = (jnp.abs(jax.lax.stop_gradient(ratio) - 1.0) > p.eps).astype(ratio.dtype)
    binds = objectives_lib.clip_binds(jax.lax.stop_gradient(ratio), x.advantages,
                                      1.0 - p.eps, 1.0 + p.eps)
    return (-objectives_lib.masked_mean(surrogate, x.mask),
            {"clip_fraction": objectives_lib.masked_mean(clipped, x.mask),
             "intervened_fraction": objectives_lib.masked_mean(binds.astype(ratio.dtype),
                                                               x.mask)})


def test_a_user_objective_runs_in_grpo_exactly_as_the_built_in_it_reimplements():
    from vaco_jax.llm import config as llm_config, grpo
    vaco_jax.register_objective("ppo_clip_again", ppo_clip_masked, hparams={"eps": 0.2})
    base = llm_config.preset("tiny").grpo
    program = llm_config.program_objectives(("ppo_clip", "ppo_clip_again", "vaco"))
    # The built-ins keep their indices; a user objective comes after them.
    assert program == llm_config.OBJECTIVES + ("ppo_clip_again",)
    mine = llm_config.hparams(dataclasses.replace(base, objective="ppo_clip_again"), program)
    theirs = llm_config.hparams(dataclasses.replace(base, objective="ppo_clip"), program)
    assert int(mine.objective) == len(llm_config.OBJECTIVES) and "eps" in mine.objective_hparams
    log_prob, batch = llm_token_batch()

    def loss(hp):
        return jax.value_and_grad(grpo.policy_loss, has_aux=True)(
            log_prob, batch, hp, "behavior", program)

    (mine_loss, mine_metrics), mine_grad = jax.jit(loss)(mine)
    (their_loss, their_metrics), their_grad = jax.jit(loss)(theirs)
    assert float(their_metrics["clip_fraction"]) > 0.1   # the clip is active on this batch
    chex.assert_trees_all_close((mine_loss, mine_grad), (their_loss, their_grad), rtol=1e-6)
    chex.assert_trees_all_close(mine_metrics["intervened_fraction"],
                                their_metrics["intervened_fraction"])
    # A GRPO trainer configured with it builds the program that can run it.
    config = llm_config.replace(llm_config.preset("tiny"), grpo=dict(objective="ppo_clip_again"))
    assert llm_config.validate(config) is config


def reads_the_kl(x, p):
    return jnp.mean(x.kl), {}


@pytest.mark.parametrize("objective,expected", [
    ("gae+ppo_clip", "one of ('ppo_clip', 'vaco'"),
    ("no_such_objective", "registered with vaco_jax.register_objective"),
    ("no_such_module_xyz:fn", "module 'no_such_module_xyz' does not import"),
    ("vector_loss", "its loss must be a scalar float"),
    ("reads_the_kl", "reads the analytic KL (needs_kl=True), which the LLM does not compute"),
    ("clashing_name", "its hyper-parameter 'mis_high' is also declared by 'icepop'"),
])
def test_grpo_refuses_a_user_objective_it_cannot_run_naming_grpo_objective(objective, expected):
    from vaco_jax.llm import config as llm_config
    vaco_jax.register_objective("vector_loss", vector_loss)
    vaco_jax.register_objective("reads_the_kl", reads_the_kl, needs_kl=True)
    vaco_jax.register_objective("clashing_name", ppo_clip_again,
                                hparams={"eps": 0.2, "mis_high": 3.0})
    config = llm_config.replace(llm_config.preset("tiny"), grpo=dict(objective=objective))
    with pytest.raises(ConfigError, match="grpo.objective") as refused:
        llm_config.validate(config)
    assert expected in str(refused.value)


def test_the_llm_sweep_takes_a_module_objective_records_it_and_refuses_its_edited_code(
        tmp_path, monkeypatch, stub_warm_start):
    from vaco_jax import io
    from vaco_jax.llm import config as llm_config, experiment
    tiny = llm_config.preset("tiny")
    path = write_module(tmp_path, "llm_objectives", MODULE)
    calls = []

    def fake_train_one_n(config, n, objectives, params, train_set, test_set, log=print,
                         compiler_options=None, program=None, runs_per_call=0):
        calls.append((n, tuple(objectives), program))
        return [{"n": n, "objective": o, "seed": s, "eval_iterations": [4], "eval_accuracy": [0.5],
                 "eval_sampled_accuracy": [0.4], "train_greedy_accuracy": [0.6],
                 "final_accuracy": 0.5, "final_sampled_accuracy": 0.4,
                 "final_train_greedy_accuracy": 0.6, "reward": [0.4],
                 "clip_fraction_mean": [0.01], "filtered_fraction_mean": [0.0],
                 "tv_estimate_mean": [0.001], "tv_estimate_max": [0.002], "approx_kl_mean": [0.0]}
                for o in objectives for s in range(config.grpo.num_seeds)]

    monkeypatch.setattr(experiment, "train_one_n", fake_train_one_n)
    stub_warm_start(tiny.model)
    mine = "llm_objectives:my_loss"
    sweep = experiment.Experiment(
        llm_config.replace(tiny, grpo=dict(objective_hparams=("tau=0.5", "mis_high=3"))),
        ns=(1,), objectives=("vaco", mine), out=str(tmp_path / "out"), throughput=False,
        plot=False)
    summary = experiment.run(sweep, log=lambda _: None)
    assert calls == [(1, ("vaco", mine), llm_config.OBJECTIVES + (mine,))]
    assert set(summary["by_objective"]) == {"vaco", mine}
    recorded = json.loads((tmp_path / "out" / "config.json").read_text())
    assert recorded["user_objectives"] == {mine: {
        "name": mine, "hparams": {"tau": 0.5, "scale": 1.0}, "needs_kl": False,
        "code": {"function": "my_loss", "module": "llm_objectives", "file": str(path.resolve()),
                 "source": sha16(path), "fingerprint": fingerprint(mine)}}}
    rows = io.read_jsonl(tmp_path / "out" / "results.jsonl")
    assert {r["objective"]: r.get("objective_code") for r in rows} == {"vaco": None,
                                                                       mine: fingerprint(mine)}
    # The same code resumes (nothing to run); edited code is refused before anything runs.
    calls.clear()
    experiment.run(sweep, log=lambda _: None)
    assert calls == []
    write_module(tmp_path, "llm_objectives", MODULE + "# tuned\n")   # computes the same: kept
    experiment.run(sweep, log=lambda _: None)
    assert calls == []
    write_module(tmp_path, "llm_objectives", MODULE.replace("** 2", "** 4"))
    with pytest.raises(ConfigError, match="made by other code") as refused:
        experiment.run(sweep, log=lambda _: None)
    assert "objectives" in str(refused.value) and calls == []
