"""The comparability key (`vaco_jax.study.keys`): a behaviour change breaks it wherever it enters
(the program, or the values the program receives), a comment keeps it, it does not depend on
what the process lowered before, and a checkout of the same code checks a result without
lowering anything."""

from __future__ import annotations

import dataclasses
import json
import shutil

import jax
import pytest

from vaco_jax import algorithms, fingerprint, program
from vaco_jax.config import Config
from vaco_jax.study import bench, keys

TINY = bench.protocol("tiny", 2)


def cells(algo, lr=1e-3):
    return bench.bench_cells(bench.Method(algo), TINY, learning_rate=lr)


# --- what the programs receive ----------------------------------------------------------------------
def test_a_changed_objective_default_changes_the_key(monkeypatch):
    [cell, *_] = cells("icepop")
    before = keys.inputs_digest(cell)
    # IcePop's mask range [0.5, 2] as if edited to [0.2, 5] in `algorithms.py`.
    wider = dataclasses.replace(algorithms.OBJECTIVES["icepop"],
                                hparams=(("mis_low", 0.2), ("mis_high", 5.0)))
    monkeypatch.setitem(algorithms.OBJECTIVES, "icepop", wider)
    monkeypatch.setitem(algorithms.REGISTRY, "icepop", dataclasses.replace(
        algorithms.REGISTRY["icepop"], objective=wider))
    assert keys.inputs_digest(cell) != before
    assert keys.combine(cell, "p", keys.inputs_digest(cell)) != keys.combine(cell, "p", before)


def test_another_seed_map_changes_the_key(monkeypatch):
    [cell, *_] = cells("ppo_clip")
    before = keys.inputs_digest(cell)
    seed_keys = program.seed_keys
    monkeypatch.setattr(program, "seed_keys", lambda seeds: seed_keys([s + 12345 for s in seeds]))
    assert keys.inputs_digest(cell) != before


def test_a_halved_learning_rate_in_the_hyper_parameters_changes_the_key(monkeypatch):
    [cell, *_] = cells("ppo_clip")
    before = keys.inputs_digest(cell)
    hparams = Config.hparams
    monkeypatch.setattr(Config, "hparams", lambda self: hparams(
        dataclasses.replace(self, learning_rate=self.learning_rate / 2)))
    assert keys.inputs_digest(cell) != before


def test_the_inputs_are_what_a_run_receives():
    # The key hashes `sweep.cell_inputs`, which `run_cell` feeds: one PRNG key per run's seed.
    from vaco_jax.study import sweep

    [cell, *_] = cells("vaco")
    seeds, hparams = sweep.cell_inputs(cell)
    assert seeds.shape[0] == len(cell.runs) == hparams.learning_rate.shape[0]
    assert (seeds[0] == jax.random.key_data(jax.random.PRNGKey(cell.runs[0].seed))).all()


# --- what the programs compute -------------------------------------------------------------------
MODULE = """module @jit_f attributes {{mhlo.num_partitions = 1 : i32}} {{
  func.func public @main(%arg0: tensor<3xi32>) -> tensor<3xi32> {{
    %0 = call @{a}(%arg0) : (tensor<3xi32>) -> tensor<3xi32>
    %1 = call @{b}(%0) : (tensor<3xi32>) -> tensor<3xi32>
    return %1 : tensor<3xi32>
  }}
  func.func private @{a}(%arg0: tensor<3xi32>) -> tensor<3xi32> {{
    %0 = stablehlo.{op} %arg0, %arg0 : tensor<3xi32>
    return %0 : tensor<3xi32>
  }}
{extra}}}
"""
COPY = """  func.func private @remainder_0(%arg0: tensor<3xi32>) -> tensor<3xi32> {
    %0 = stablehlo.add %arg0, %arg0 : tensor<3xi32>
    return %0 : tensor<3xi32>
  }
"""


def test_a_duplicated_private_helper_or_a_renamed_one_keeps_the_module_digest():
    shared = MODULE.format(a="remainder", b="remainder", op="add", extra="")
    # What a process that lowered other programs first prints: two identical helpers.
    duplicated = MODULE.format(a="remainder", b="remainder_0", op="add", extra=COPY)
    renamed = MODULE.format(a="helper", b="helper", op="add", extra="").replace("@jit_f", "@jit_g")
    other = MODULE.format(a="remainder", b="remainder", op="multiply", extra="")
    assert fingerprint.rename_symbols(duplicated) != fingerprint.rename_symbols(shared)
    digest = fingerprint.module_digest(shared)
    assert fingerprint.module_digest(duplicated) == digest == fingerprint.module_digest(renamed)
    assert fingerprint.module_digest(other) != digest


def test_a_cell_lowered_after_others_keys_as_lowered_first():
    first = [c for algo in ("ppo_clip", "vaco") for c in cells(algo)]
    fresh = keys.program_digest(first[-1])
    jax.clear_caches()
    for cell in first[:-1]:
        keys.program_digest(cell)
    assert keys.program_digest(first[-1]) == fresh


def test_a_comment_keeps_the_key_and_a_change_of_behaviour_does_not():
    from pathlib import Path

    from vaco_jax import objectives

    [cell, *_] = cells("ppo_clip")
    source = Path(objectives.__file__).read_text()

    def key(text):   # objectives.py as if edited to `text` (lowered only, nothing compiled)
        exec(compile(text, objectives.__file__, "exec"), objectives.__dict__)
        return keys.program_digest(cell), keys.syntax_digest(text)

    try:
        first = key(source)
        documented = source.replace('"""Policy objectives', '# A comment moves every line.\n\n'
                                    '"""Policy objectives', 1).replace(
            '    """`log(π/ref)`', '    """Another docstring.\n\n    `log(π/ref)`', 1)
        assert documented != source and key(documented) == first
        changed = source.replace("MAX_LOG_RATIO = 20.0", "MAX_LOG_RATIO = 30.0")
        program_part, syntax = key(changed)
        assert changed != source and program_part != first[0] and syntax != first[1]
    finally:
        exec(compile(source, objectives.__file__, "exec"), objectives.__dict__)


def test_the_code_digest_reads_the_modules_programs_are_traced_from_without_their_comments():
    package = keys.program_files()[0].parent
    names = {p.relative_to(package).as_posix() for p in keys.program_files()}
    assert {"trainer.py", "objectives.py", "rollout.py", "envs.py", "program.py"} <= names
    assert not any(n.startswith(("study/", "commands/", "llm/", "analysis/")) for n in names)
    code = 'def f(x):\n    """Doc."""\n    return x + 1  # why\n'
    assert keys.syntax_digest(code) == keys.syntax_digest("def f(x):\n\n    return x + 1\n")
    assert keys.syntax_digest(code) != keys.syntax_digest("def f(x):\n    return x + 2\n")


# --- checking a result -------------------------------------------------------------------------------
@pytest.fixture()
def recorded(monkeypatch, tmp_path):
    monkeypatch.setenv("VACO_JAX_CACHE_DIR", str(tmp_path / "cache"))
    key = bench.comparability_key(bench.Method("ppo_clip"), TINY, learning_rate=1e-3)
    info = {"method": "ppo_clip", "algo": "ppo_clip", "overrides": [], "protocol": "tiny",
            "protocol_version": 2, "learning_rate": 1e-3, "comparability": key}
    shutil.rmtree(tmp_path / "cache")   # a fresh clone's empty cache
    return info


def test_the_same_code_checks_a_result_without_lowering(recorded, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("lowered")

    monkeypatch.setattr(program, "lowered_texts", refuse)
    assert bench.computed_here(recorded) == (True, "same programs, inputs, versions and protocol "
                                                   "tiny v2")
    # A value its programs receive changed: found without lowering, named.
    changed = json.loads(json.dumps(recorded))
    cell = "bench/toy_reach/ppo_clip/lag"
    changed["comparability"]["cells"][cell]["inputs"] = "0" * 16
    changed["comparability"]["programs"][cell] = keys.PREFIX + "0" * 16
    assert bench.computed_here(changed) == (False, f"cell {cell} differs (inputs)")


def test_other_code_lowers_each_cell_once_saying_so(recorded, monkeypatch):
    other = json.loads(json.dumps(recorded))
    other["comparability"]["code"] = "0" * 16   # made by a checkout with another code digest
    said = []
    assert bench.computed_here(other, log=said.append)[0]
    assert len(said) == len(other["comparability"]["programs"])
    assert said[0].startswith("  lowering cell 1/")
    said.clear()
    assert bench.computed_here(other, log=said.append)[0] and not said   # kept in the cache


def test_a_key_of_an_older_scheme_is_said_to_be_one(recorded):
    old = json.loads(json.dumps(recorded))
    del old["comparability"]["scheme"]
    same, why = bench.computed_here(old)
    assert not same and why.startswith("keyed by an older scheme")
