"""Version 2 of the LLM protocols: every objective tuned at each N before its scored runs (the
choice, its widening from an edge, its resume), the three lag calls with each N's tuned
configuration, the run table in the analysis schema's words, and the identity check that says
which objectives compute the same thing."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from vaco_jax import io
from vaco_jax.commands import bench as bench_command
from vaco_jax.llm import bench, experiment
from vaco_jax.llm import config as llm_config
from vaco_jax.study import tuning


def _protocol():
    """llm-tiny v2 with a grid that must widen: lr {1e-3, 3e-3} × ε {0.1, 0.2}, ladders beyond."""
    tiny = bench.protocol("llm-tiny", 2)
    return dataclasses.replace(tiny, tuning=dataclasses.replace(
        tiny.tuning, learning_rates=(1e-3, 3e-3), lr_only=(1e-3, 3e-3),
        lr_ladder=(3e-4, 1e-3, 3e-3, 1e-2), lr_only_ladder=(3e-4, 1e-3, 3e-3, 1e-2),
        constraints=(("ppo_clip", tuning.Constraint("clip_eps", (0.05, 0.1, 0.2, 0.4),
                                                    (0.1, 0.2))),), seeds=2))


def _score(lr, eps):
    """A hand-made accuracy, highest at lr 3e-3 and ε 0.2: both on the first grid's upper edge."""
    return 0.5 - 0.1 * (np.log10(lr) - np.log10(3e-3)) ** 2 - (eps - 0.2) ** 2


@pytest.fixture
def fake_training(monkeypatch):
    """`experiment.train_runs` replaced by `_score` of each run's leaves (+0.01 per seed index),
    two evaluations; the calls are recorded."""
    calls = []

    def train_runs(cfg, program, keys, hps, *args, **kwargs):
        lr, eps = np.asarray(hps.learning_rate), np.asarray(hps.clip_eps)
        calls.append(sorted(set(zip(lr.round(8).tolist(), eps.round(8).tolist()))))
        seed = np.asarray(keys)[:, -1] % 2 * 0.01
        final = np.array([_score(a, b) for a, b in zip(lr, eps)]) + seed
        sampled = np.stack([final - 0.1, final], 1)
        return ({"eval_sampled_accuracy": sampled, "eval_accuracy": sampled + 0.2,
                 "reward": np.tile(final[:, None], (1, cfg.grpo.iterations))}, 1.0, 2.0, "stub")

    monkeypatch.setattr(experiment, "train_runs", train_runs)
    return calls


def test_the_tuning_widens_an_edge_choice_until_inside_and_resumes(tmp_path, fake_training,
                                                                  stub_warm_start):
    proto = _protocol()
    stub_warm_start(proto.config().model)
    result = bench.tune(proto, "ppo_clip", tmp_path, log=lambda _: None)
    n1, n2 = result["ns"]["1"], result["ns"]["2"]
    # N = 1 (no constraint can act on-policy): learning rates alone, 1e-3 and 3e-3, then 1e-2.
    assert n1["grid"]["field"] is None and n1["grid"]["learning_rates"] == [1e-3, 3e-3, 1e-2]
    assert n1["chosen"] == {"learning_rate": 3e-3} and not n1["edge"]
    # N = 2: the first choice (3e-3, 0.2) sits on both upper edges, so a row and a column are
    # added (lr 1e-2, ε 0.4) and the choice, made again, is inside.
    assert n2["steps"][0]["chosen"] == {"learning_rate": 3e-3, "clip_eps": 0.2}
    assert n2["steps"][0]["notes"] == ["learning_rate above: 0.01", "clip_eps above: 0.4"]
    assert n2["grid"]["learning_rates"] == [1e-3, 3e-3, 1e-2]
    assert n2["grid"]["values"] == [0.1, 0.2, 0.4]
    assert n2["chosen"] == {"learning_rate": 3e-3, "clip_eps": 0.2} and not n2["edge"]
    # Each configuration ran once on each design seed, the added ones only in the second step.
    assert [len(c) for c in fake_training] == [2, 1, 4, 5]
    best = next(r for r in n2["configurations"] if r["learning_rate"] == 3e-3
                and r["clip_eps"] == 0.2)
    assert best["auc"] == pytest.approx(_score(3e-3, 0.2) - 0.05 + 0.005)
    assert best["runs"] == proto.tuning.seeds
    rows = io.read_rows(tmp_path / "tuning" / "n2.jsonl")
    assert len(rows) == 9 * proto.tuning.seeds
    assert {r["seed"] for r in rows} == {proto.design_seed, proto.design_seed + 1}
    # Resumed: every configuration is in, nothing trains again, the same choice.
    fake_training.clear()
    again = bench.tune(proto, "ppo_clip", tmp_path, log=lambda _: None)
    assert fake_training == [] and again["ns"] == result["ns"]
    assert bench.read_tuning(proto, "ppo_clip", tmp_path) == {
        1: {"learning_rate": 3e-3}, 2: {"learning_rate": 3e-3, "clip_eps": 0.2}}


def test_scored_runs_need_the_tuning_and_another_grids_tuning_is_refused(tmp_path, fake_training,
                                                                         stub_warm_start):
    proto = _protocol()
    with pytest.raises(llm_config.ConfigError, match="--tune"):
        bench.read_tuning(proto, "ppo_clip", tmp_path)
    stub_warm_start(proto.config().model)
    bench.tune(proto, "ppo_clip", tmp_path, log=lambda _: None)
    other = dataclasses.replace(proto, tuning=dataclasses.replace(proto.tuning, seeds=3))
    with pytest.raises(llm_config.ConfigError, match="another tuning grid"):
        bench.read_tuning(other, "ppo_clip", tmp_path)
    with pytest.raises(llm_config.ConfigError, match="'vaco'"):
        bench.read_tuning(proto, "vaco", tmp_path)


def test_each_n_runs_its_tuned_configuration_in_three_lag_calls(tmp_path, monkeypatch):
    proto = bench.protocol("llm-tiny", 2)
    chosen = {1: {"learning_rate": 3e-3}, 2: {"learning_rate": 1e-3, "clip_eps": 0.1}}
    io.write_json_atomic(tmp_path / bench.TUNING_FILE, {
        "method": "ppo_clip", "protocol": proto.name, "protocol_version": proto.version,
        "tuning": proto.tuning.describe(),
        "ns": {str(n): {"chosen": c} for n, c in chosen.items()}})
    seen = []

    def run(exp, log=print):   # writes the rows a real call would, keyed as it keys them
        seen.append(exp)
        g, out = exp.config.grpo, exp.out
        profile = json.loads(open(exp.lag_profile).read())["probabilities"] if exp.lag_profile \
            else None
        mode, ks = (("profile", (len(profile) - 1,)) if profile else
                    (exp.lag_sampling, [k for k in exp.ks if k or exp.lag_sampling == "constant"]))
        rows = [{"k": k, "lag_sampling": experiment.lag_mode(k, mode), "n": n,
                 "objective": exp.objectives[0], "seed": s, "eval_iterations": [2, 4],
                 "eval_accuracy": [0.1, 0.2], "eval_sampled_accuracy": [0.1, 0.3 + 0.1 * n],
                 "final_accuracy": 0.2, "final_sampled_accuracy": 0.3 + 0.1 * n,
                 "filtered_fraction_mean": [0.0, 0.1 * k], "compile_seconds": 1.0,
                 "run_seconds": 2.0}
                for n in exp.ns for k in ks for s in range(g.num_seeds)]
        io.append_jsonl(io.Path(out) / bench.RESULTS, rows)
        return {"warm_start": {"base_accuracy": 0.0, "digest": "d", "sha256": "s",
                               "origin": "shipped"}}

    monkeypatch.setattr(experiment, "run", run)
    monkeypatch.setattr(experiment, "summarize", lambda rows, base: {})
    monkeypatch.setattr(bench, "warm_start_sampled_accuracy", lambda proto: 0.0)
    keyed = []
    monkeypatch.setattr(bench, "program_key", lambda p, a, c=None: keyed.append(c) or {})
    info = bench.run(proto, "ppo_clip", tmp_path, log=lambda _: None)
    # Per N, the constant, uniform and profile calls, each with that N's configuration.
    # (The profile call is a constant-lag call given the profile's file, as `vaco-llm` takes it.)
    assert [(e.ns, e.lag_sampling, bool(e.lag_profile)) for e in seen] == [
        ((n,), mode, profile) for n in proto.ns
        for mode, profile in (("constant", False), ("uniform", False), ("constant", True))]
    assert [e.config.grpo.learning_rate for e in seen] == [3e-3] * 3 + [1e-3] * 3
    assert [e.config.grpo.clip_eps for e in seen[3:]] == [0.1] * 3
    assert {e.out for e in seen} == {str(tmp_path / "n1"), str(tmp_path / "n2")}
    assert keyed == [chosen] and info["tuned"] == {str(n): c for n, c in chosen.items()}
    table = pd.read_parquet(tmp_path / bench.RUNS_TABLE)
    assert len(table) == len(proto.lag_settings) * len(proto.ns) * proto.seeds
    assert set(zip(table.lag_sampling, table.k)) == {("constant", 0), ("constant", 1),
                                                     ("uniform", 1), ("profile", 2)}
    by_n = table.groupby("n")
    assert by_n.lr.unique().to_dict() == {1: [3e-3], 2: [1e-3]}
    assert np.isnan(by_n.constraint.first()[1]) and by_n.constraint.first()[2] == 0.1
    assert table.final_sampled_auc.tolist() == pytest.approx(
        [np.mean([0.1, 0.3 + 0.1 * n]) for n in table.n])
    assert (table.method == "ppo_clip").all()
    assert table.filtered_fraction.tolist() == pytest.approx([0.05 * k for k in table.k])


def test_entries_plan_and_options_of_version_2():
    cpu, old = bench.protocol("llm-cpu", 2), bench.protocol("llm-cpu", 1)
    assert max(k for _, k in cpu.lag_settings) <= cpu.config().grpo.iterations // 16
    assert cpu.lag_settings[-1] == ("profile", len(cpu.lag_profile) - 1)
    assert sum(cpu.lag_profile) == pytest.approx(1.0, abs=1e-12)
    design = json.loads((Path(__file__).resolve().parent.parent / "results" / "llm" / "design-v2"
                         / "lag_profile.json").read_text())
    assert list(cpu.lag_profile) == design["board"]["probabilities"]   # the modelled profile
    # Every objective spends the same budget: 9 configurations at each N.
    for objective in llm_config.OBJECTIVES:
        assert [len(cpu.tuning.grid(objective, n).configs()) for n in cpu.ns] == [9, 9]
    assert cpu.tuning.grid("vaco", 8).field == "delta" and cpu.tuning.grid("vaco", 1).field is None
    assert bench.plan(cpu, "vaco")["tuning"]["runs"] == 2 * 9 * cpu.tuning.seeds
    assert "before them (--tune): 54 runs" in bench.plan_text(cpu, "vaco")
    # VACO with its TV reference at the learner's policy is an entry of version 2 alone.
    assert bench.check(cpu, "vaco_learner").grpo.tv_reference == "learner"
    with pytest.raises(llm_config.ConfigError, match="no entry 'vaco_learner'"):
        bench.check(old, "vaco_learner")
    config = bench.tuned_config(cpu, "vaco_learner", 8, {"learning_rate": 1e-4, "delta": 0.01})
    assert (config.grpo.objective, config.grpo.tv_reference) == ("vaco", "learner")
    assert (config.grpo.learning_rate, config.grpo.delta, config.grpo.num_minibatches) == (
        1e-4, 0.01, 8)
    own = bench.tuned_config(cpu, "m2po", 8, {"learning_rate": 1e-4, "m2_tau": 0.08})
    assert own.grpo.objective_hparams == ("m2_tau=0.08",)
    # At N = 1 only the learning rate is tuned; each constraint stays at its window's middle.
    assert bench.tuned_config(cpu, "vaco", 1, {"learning_rate": 1e-4}).grpo.delta == 0.01
    assert bench.tuned_config(cpu, "m2po", 1, {"learning_rate": 1e-4}).grpo.objective_hparams \
        == ("m2_tau=0.04",)
    assert bench.tuned_config(cpu, "pg", 1, {"learning_rate": 1e-4}).grpo.learning_rate == 1e-4
    # The old version's definition is what its committed results recorded.
    assert "tuning" not in old.describe() and "lag_profile" not in old.describe()


def test_a_tuning_request_on_a_fixed_protocol_is_refused(capsys, monkeypatch):
    monkeypatch.setattr(bench, "tune", lambda *a, **k: pytest.fail("it tuned"))
    assert bench_command.main(["--protocol", "llm-cpu", "--protocol-version", "1", "--algo",
                               "vaco", "--tune"]) == 2
    assert "option `tune` is invalid for protocol llm-cpu v1" in capsys.readouterr().err


def test_the_identity_check_groups_objectives_whose_runs_agree_on_every_seed():
    from experiments import design_llm_v2 as design

    def row(objective, seed, reward, n=1, k=0):
        return {"objective": objective, "seed": seed, "n": n, "k": k, "reward": [0.1, reward],
                "grad_norm_mean": [1.0, 2.0], "eval_accuracy": [0.3],
                "eval_sampled_accuracy": [0.2]}

    rows = ([row("ppo_clip", s, 0.5) for s in (0, 1)] + [row("pg", s, 0.5) for s in (0, 1)]
            + [row("vaco", 0, 0.5), row("vaco", 1, 0.5 + 1e-3)]        # one seed differs
            + [row("spo", s, 0.5 * (1 + 1e-7)) for s in (0, 1)]         # within the tolerance
            + [row("pg", s, 0.7, k=8) for s in (0, 1)] + [row("ppo_clip", s, 0.5, k=8)
                                                         for s in (0, 1)])
    groups = design.identity_groups(rows)
    assert groups[(1, 0)] == [["ppo_clip", "pg", "spo"], ["vaco"]]
    assert groups[(1, 8)] == [["ppo_clip"], ["pg"]]
