"""The errors a user meets first: each says what is wrong and what to do, fast, in one message —
a misspelt name with the closest names, before JAX is imported; a grid field that does not exist;
a leaderboard directory that does not exist; a damaged Parquet table, by its name; and Ctrl-C,
one line naming what was kept and the command that resumes, exit status 130."""

import json
import subprocess
import sys

import pytest

from vaco_jax import io
from vaco_jax.config import Config
from vaco_jax.errors import ConfigError, SweepError


def _command_in_a_fresh_process(argv: list[str]) -> tuple[int, str, list[str]]:
    """`vaco-train argv` in a new interpreter: (exit status, stderr, the heavy modules it
    imported)."""
    code = ("import json, sys\nfrom vaco_jax.commands import train\n"
            f"status = train.main({argv!r})\n"
            "heavy = sorted(m for m in ('jax', 'brax', 'mujoco', 'mujoco.mjx') if m in sys.modules)\n"
            "print(json.dumps([status, heavy]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    status, heavy = json.loads(done.stdout.strip().splitlines()[-1])
    return status, done.stderr, heavy


@pytest.mark.parametrize("argv, suggestion", [
    (["--env", "inverted_pendulum", "--algo", "vacoo"], "did you mean 'vaco'"),
    (["--env", "hoper"], "did you mean 'hopper'"),
    (["--env", "dmc:CartpoleSwingupp"], "did you mean 'dmc:CartpoleSwingup'"),
    (["--algo", "gea+ppo_clip"], "did you mean 'gae+ppo_clip'"),
])
def test_a_misspelt_name_is_refused_before_jax_with_the_closest_names(argv, suggestion):
    status, stderr, heavy = _command_in_a_fresh_process(argv)
    assert status == 2 and suggestion in stderr, stderr
    assert stderr.startswith("error: config field") and len(stderr.strip().splitlines()) == 1
    assert heavy == []   # what made it take 20-60 s: JAX, Brax and MJX imported before the check


def test_the_slow_path_suggests_too():
    from vaco_jax import algorithms, config, envs

    with pytest.raises(ConfigError, match="did you mean 'ppo_clip'"):
        algorithms.parse("ppo_clp")
    with pytest.raises(ConfigError, match="did you mean 'walker2d'"):
        envs.check_name("walker2")
    with pytest.raises(ConfigError, match="did you mean 'impala'"):
        config.validate(Config(algo="impalla"))


def test_the_catalog_names_every_algorithm_estimator_and_objective():
    from vaco_jax import algorithms, catalog

    assert sorted(catalog.ALGORITHM_NAMES) == sorted(algorithms.REGISTRY)
    assert list(catalog.ESTIMATOR_NAMES) == list(algorithms.ESTIMATORS)
    assert list(catalog.OBJECTIVE_NAMES) == list(algorithms.OBJECTIVES)
    assert catalog.ABLATION_NAMES == algorithms.ABLATIONS


def test_a_grid_field_that_does_not_exist_is_named_so():
    with pytest.raises(ConfigError, match=r"`capcity` does not exist.*did you mean 'capacity'"):
        Config().grid(capcity=(1, 4))
    with pytest.raises(ConfigError, match="cannot be swept in one program"):
        Config().grid(num_envs=(4, 8))   # a field, but one that changes shapes


@pytest.mark.parametrize("check", [False, True])
def test_a_leaderboard_directory_that_does_not_exist_is_named_so(tmp_path, capsys, check):
    from vaco_jax.commands import bench

    missing = tmp_path / "lag-bench" / "nope"
    status = bench.main(["--table", str(missing), *(["--check"] if check else [])])
    err = capsys.readouterr().err
    assert status == 2 and f"error: {missing} does not exist" in err, err


def test_a_damaged_parquet_table_is_named_with_what_to_do(tmp_path):
    table = tmp_path / "runs" / "results.jsonl"
    io.append_jsonl(table, [{"cell": "a", "x": 1.5}, {"cell": "b", "x": 2.5}])
    io.compact_jsonl(table)
    packed = io.compact_path(table)
    data = packed.read_bytes()
    packed.write_bytes(data[: len(data) // 2])   # cut short
    with pytest.raises(SweepError) as raised:
        io.read_rows(table)
    message = str(raised.value)
    assert str(packed) in message and "damaged" in message and "git restore" in message
    assert "run the command again" in message


# --- Ctrl-C ------------------------------------------------------------------------------------
def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


def _one_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = (captured.out + captured.err).strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    return lines[0]


def test_ctrl_c_in_vaco_train_prints_one_line_and_the_resume_command(tmp_path, monkeypatch,
                                                                    capsys):
    from vaco_jax import driver, runtime
    from vaco_jax.commands import train

    monkeypatch.setattr(runtime, "start", lambda *a, **k: None)
    monkeypatch.setattr(driver, "run", _interrupt)
    out = tmp_path / "run"
    assert train.main(["--env", "toy_reach", "--algo", "vaco", "--out", str(out)]) == 130
    line = _one_line(capsys)
    assert line.startswith("interrupted:") and f"vaco-train --resume {out}" in line
    # Without --out the run's directory is named before it starts, so the line can name it.
    monkeypatch.chdir(tmp_path)
    assert train.main(["--env", "toy_reach", "--algo", "vaco"]) == 130
    assert "vaco-train --resume runs/toy_reach_vaco_C" in _one_line(capsys)


def test_ctrl_c_in_vaco_sweep_prints_one_line_and_the_resume_command(tmp_path, monkeypatch,
                                                                    capsys):
    from vaco_jax import runtime
    from vaco_jax.commands import sweep as command
    from vaco_jax.study import sweep

    monkeypatch.setattr(runtime, "start", lambda *a, **k: None)
    monkeypatch.setattr(sweep, "run_sweep", _interrupt)
    argv = ["--preset", "tiny", "--out", str(tmp_path / "sweep")]
    assert command.main(argv) == 130
    line = _one_line(capsys)
    assert line.startswith("interrupted:") and f"vaco-sweep --preset tiny --out {tmp_path}" in line


def test_ctrl_c_in_vaco_bench_prints_one_line_and_the_resume_command(tmp_path, monkeypatch,
                                                                    capsys):
    from vaco_jax import runtime
    from vaco_jax.commands import bench as command
    from vaco_jax.study import bench

    monkeypatch.setattr(runtime, "start", lambda *a, **k: None)
    monkeypatch.setattr(bench, "leaderboard_comparability", lambda *a, **k: "")
    monkeypatch.setattr(bench, "run_bench", _interrupt)
    argv = ["--algo", "vaco", "--protocol", "tiny", "--learning-rate", "3e-4",
            "--out", str(tmp_path / "vaco")]
    assert command.main(argv) == 130
    captured = capsys.readouterr()
    lines = (captured.out + captured.err).strip().splitlines()
    assert "Traceback" not in captured.err and lines[-1].startswith("interrupted:")
    assert f"vaco-bench --algo vaco --protocol tiny" in lines[-1]
    assert [line for line in lines if line.strip()] == [lines[-1]], lines
