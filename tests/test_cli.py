"""The CLI writes config.json, metrics.jsonl and summary.json that agree with each other."""

import dataclasses
import json
import logging
import os
import re
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest
from absl import logging as absl_logging

from vaco_jax import ConfigError, cache, io, program
from vaco_jax.config import from_json_dict
from vaco_jax.commands.train import main, parse
from vaco_jax.driver import run

ARGS = ["--env", "toy_reach", "--algo", "vaco", "--capacity", "2", "--num-seeds", "2",
        "--total-steps", "768", "--num-envs", "8", "--unroll-length", "16", "--num-evals", "3",
        "--num-minibatches", "2", "--num-actors", "2", "--episode-length", "20", "--eval-envs", "4",
        "--actor-hidden", "16", "16", "--critic-hidden", "16", "16", "--no-progress"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "run"
    assert main(ARGS + ["--out", str(out), "--logger", "tensorboard"]) == 0
    return out


def test_cli_writes_config_metrics_and_summary(run_dir):
    config = json.loads((run_dir / "config.json").read_text())
    assert config["config"]["capacity"] == 2 and config["config"]["num_seeds"] == 2
    assert config["versions"]["jax"] and config["device"]["platform"] == "cpu"
    assert config["options"]["out"] == str(run_dir) and "out" not in config["config"]
    # Lossless: the stored config reads back as the one that ran (is_max = inf included).
    assert from_json_dict(config["config"]) == parse(ARGS).config

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [256, 512, 768]
    for row in rows:
        assert len(row["eval_return"]) == 2
        for key in ["filtered_fraction", "clip_fraction", "tv_estimate", "snapshot_age",
                    "policy_loss", "value_loss"]:
            assert len(row[key]) == 2, key

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final_eval_return"] == rows[-1]["eval_return"]
    assert summary["env_steps"] == 768 and summary["sps"] > 0 and summary["compile_seconds"] > 0


def test_every_metrics_row_and_the_config_name_the_code_that_made_them(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["source"] for row in rows] == [io.source_hash()] * 3
    sources = json.loads((run_dir / "config.json").read_text())["sources"]
    assert [(s["from_chunk"], s["source"]) for s in sources] == [(0, io.source_hash())]


def test_cli_seeds_match_single_seed_runs(run_dir, tmp_path):
    # Seed index 1 of the 2-seed run is seed 1 on its own.
    out = tmp_path / "single"
    args = [a if a != "2" or i != ARGS.index("--num-seeds") + 1 else "1" for i, a in enumerate(ARGS)]
    assert main(args + ["--seed", "1", "--out", str(out)]) == 0
    both = json.loads((run_dir / "summary.json").read_text())["final_eval_return"]
    single = json.loads((out / "summary.json").read_text())["final_eval_return"]
    np.testing.assert_allclose(single[0], both[1], rtol=1e-4)


def test_without_a_terminal_each_evaluation_prints_a_line(tmp_path, capsys, monkeypatch):
    # Not --no-progress: stderr is not a terminal here (batch-job logs), so no progress bar, also
    # in a process that imported Jupyter's modules without being a notebook kernel (nbclient).
    monkeypatch.setitem(sys.modules, "ipykernel", types.ModuleType("ipykernel"))
    assert main([a for a in ARGS if a != "--no-progress"] + ["--out", str(tmp_path / "run")]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("evaluation")]
    assert [line.split(":")[0] for line in lines] == ["evaluation 1/3", "evaluation 2/3",
                                                      "evaluation 3/3"]
    assert "step 768, eval return" in lines[-1] and "(mean of 2 seeds)" in lines[-1]


def test_tensorboard_gets_the_metrics_rows_at_their_steps(run_dir):
    from tensorboard.backend.event_processing import event_accumulator

    events = event_accumulator.EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for name in set(rows[0]) - {"step", "iteration", "source"}:
        assert {f"{name}/mean", f"{name}/seed_0", f"{name}/seed_1"} <= tags, name
    assert "perf/steps_per_second" in tags
    for tag, pick in [("eval_return/mean", np.mean), ("eval_return/seed_1", lambda v: v[1]),
                      ("tv_estimate/seed_0", lambda v: v[0])]:
        scalars = events.Scalars(tag)
        assert [e.step for e in scalars] == [row["step"] for row in rows] == [256, 512, 768]
        np.testing.assert_allclose([e.value for e in scalars],
                                   [pick(row[tag.split("/")[0]]) for row in rows], rtol=1e-6)


def test_wandb_offline_gets_per_seed_and_mean_scalars(tmp_path, monkeypatch):
    from vaco_jax import Config, loggers
    from vaco_jax.config import to_json_dict
    from vaco_jax.options import LoggerOptions

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    logger = loggers.make(LoggerOptions(logger=("wandb",), wandb_project="test"), tmp_path,
                          to_json_dict(Config(num_seeds=2, seed=5)))
    logger.log(100, loggers.scalars({"step": 100, "eval_return": [1.0, 3.0]}, [5, 6]))
    logger.log(200, loggers.scalars({"step": 200, "eval_return": [2.0, float("nan")]}, [5, 6]))
    summary = dict(logger.backends[0].run.summary)
    logger.close()
    # The last value of each; a NaN (a diverged seed) is left out rather than logged.
    assert summary["eval_return/mean"] == 2.0 and summary["eval_return/seed_5"] == 2.0
    assert summary["eval_return/seed_6"] == 3.0 and summary["_step"] == 200
    [record] = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    # What `wandb sync` uploads. W&B's service process writes the record after `finish` returns
    # (on a loaded machine, seconds later): wait for it.
    deadline = time.monotonic() + 60
    while b"eval_return/seed_6" not in record.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert record.read_bytes().count(b"eval_return/seed_6") >= 1
    assert (tmp_path / "wandb_run_id").read_text() in record.name   # a resume continues this run


def test_a_logger_without_its_package_is_refused_naming_the_install(monkeypatch):
    import importlib.util

    from vaco_jax import Options
    from vaco_jax.options import LoggerOptions, validate_options

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "wandb" else find_spec(name, *a))
    with pytest.raises(ConfigError, match=r"`logger` = 'wandb' is invalid: needs the wandb "
                                          r'package: pip install -e "\.\[wandb\]"'):
        validate_options(Options(logging=LoggerOptions(logger=("tensorboard", "wandb"))))
    validate_options(Options(logging=LoggerOptions(logger=("tensorboard",))))


def test_a_run_starts_from_a_saved_config_and_flags_override_it(run_dir, tmp_path, capsys):
    from vaco_jax.commands.train import with_stored_config

    for source in (run_dir, run_dir / "config.json"):
        argv = ["--config", str(source), "--seed", "7", "--no-progress"]
        command = with_stored_config(parse(argv), argv)
        assert command.config == dataclasses.replace(parse(ARGS).config, seed=7)
    bare = tmp_path / "fields.json"
    bare.write_text(json.dumps({"env": "hopper", "capacity": 4}))
    config = with_stored_config(parse(["--config", str(bare)]), ["--config", str(bare)]).config
    assert (config.env, config.capacity, config.algo) == ("hopper", 4, "vaco")

    bare.write_text(json.dumps({"capacty": 4}))
    assert main(["--config", str(bare)]) == 2
    assert "`config` = " in (err := capsys.readouterr().err) and "['capacty']" in err
    assert main(["--config", str(run_dir), "--resume", str(run_dir)]) == 2
    assert "invalid with --resume" in capsys.readouterr().err


def test_cli_refuses_to_overwrite_a_finished_run(run_dir):
    before = (run_dir / "metrics.jsonl").read_text()
    with pytest.raises(ConfigError, match="already holds a finished run"):
        command = parse(ARGS + ["--out", str(run_dir)])
        run(command.config, command.options)
    assert (run_dir / "metrics.jsonl").read_text() == before


def test_plot_runs_reads_the_cli_output_and_reports_final_returns_per_seed(run_dir, tmp_path):
    import matplotlib.pyplot as plt

    from vaco_jax.commands import plot_runs

    png = tmp_path / "curves.png"
    open_figures = plt.get_fignums()
    assert plot_runs.main([str(run_dir), "--out", str(png)]) == 0
    table = plot_runs.plot([run_dir], png)
    assert plt.get_fignums() == open_figures   # a written figure is closed
    final = json.loads((run_dir / "summary.json").read_text())["final_eval_return"]
    assert png.stat().st_size > 10_000
    (row,) = table.to_dict("records")
    assert (row["env"], row["algo"], row["capacity"], row["step"], row["seeds"]) == (
        "toy_reach", "vaco", 2, 768, 2)
    np.testing.assert_allclose(row["per_seed"], final, atol=0.05)
    assert row["mean"] == pytest.approx(np.mean(final), rel=1e-6)


def test_metrics_rows_carry_the_lag_diagnostics_to_the_loggers(run_dir):
    from tensorboard.backend.event_processing import event_accumulator

    from vaco_jax import diagnostics

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # K = 4 epochs × M = 2 minibatches, C = 2: ages up to 2·8 − 1 = 15.
    hist = [name for _, _, name in diagnostics.age_bins(2, 4, 2)]
    assert hist[-1] == "update_age_hist_8_15"
    names = ["update_age_mean", "update_age_p50", "update_age_p90", "update_age_max", *hist,
             "tv_backward", "tv_forward", "intervened_fraction", "ratio_clip_fraction"]
    for row in rows:
        for name in names:
            assert len(row[name]) == 2, name
        np.testing.assert_allclose(np.sum([row[name] for name in hist], axis=0), 1.0, rtol=1e-6)
        assert row["tv_backward"] == row["behavior_tv"]
        assert row["intervened_fraction"] == row["filtered_fraction"]   # VACO's own key
        assert all(0 <= a <= 15 for a in row["update_age_max"])
    events = event_accumulator.EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for name in names:
        assert {f"{name}/mean", f"{name}/seed_0", f"{name}/seed_1"} <= tags, name
    np.testing.assert_allclose([e.value for e in events.Scalars("tv_forward/seed_1")],
                               [row["tv_forward"][1] for row in rows], rtol=1e-6)


def test_plot_diagnostics_reads_the_cli_output(run_dir, tmp_path):
    import matplotlib.pyplot as plt

    from vaco_jax.commands import plot_diagnostics

    png = tmp_path / "diagnostics.png"
    open_figures = plt.get_fignums()
    assert plot_diagnostics.main([str(run_dir), "--out", str(png)]) == 0
    assert png.stat().st_size > 10_000
    assert plt.get_fignums() == open_figures


def test_dry_run_compiles_reports_memory_and_writes_nothing(run_dir, tmp_path, capsys):
    out = tmp_path / "dry"
    assert main(ARGS + ["--out", str(out), "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "JAX 0.9.2 on cpu: 1 device (cpu)" in err
    assert "dry run: 1 program of 2 runs (2 runs on 1 device)" in err and "per device: peak " in err
    assert not out.exists()
    command = parse(ARGS + ["--dry-run"])
    report = run(command.config, command.options)
    memory = report["memory_per_device"]
    assert 0 < memory["argument"] < memory["peak"] < 1e9 and memory["temp"] > 0
    assert f"per device: peak {program.size(memory['peak'])} " in err


# --- the per-user caches and library logging ----------------------------------------------------
CACHE_SCRIPT = """
import json, sys
from vaco_jax import cache
import jax, jax.numpy as jnp
report = {"off": str(cache.enable_compile_cache("off")), "configured": jax.config.jax_compilation_cache_dir}
path = cache.enable_compile_cache(sys.argv[1])
jax.jit(lambda x: jnp.sin(x) @ x.T)(jnp.ones((64, 64))).block_until_ready()
report.update(path=str(path), files=sorted(p.name for p in path.iterdir()), llm=str(cache.user_dir("llm")))
print(json.dumps(report))
"""


def cache_report(tmp_path, setting, **env):
    # A fresh shell: JAX's own settings (this process imported jax) are not inherited.
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("JAX_COMPILATION_CACHE_DIR", "TF_CPP_MIN_LOG_LEVEL")}
    environment.update(JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", **env)
    done = subprocess.run([sys.executable, "-c", CACHE_SCRIPT, setting], env=environment,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]), stderr=done.stderr)


def test_compiled_programs_are_cached_per_user_by_default(tmp_path):
    user = tmp_path / "user"
    report = cache_report(tmp_path, "default", VACO_JAX_CACHE_DIR=str(user))
    assert report["off"] == "None" and report["configured"] is None
    assert report["path"] == str(user / "xla" / cache.host_tag()) and report["files"]   # written
    assert report["llm"] == str(user / "llm")
    # JAX's own setting wins over the per-user directory; an explicit directory over both.
    jax_dir = tmp_path / "jax_dir"
    assert cache_report(tmp_path, "default", VACO_JAX_CACHE_DIR=str(user),
                        JAX_COMPILATION_CACHE_DIR=str(jax_dir))["path"] == str(jax_dir)
    assert cache_report(tmp_path, str(tmp_path / "mine"))["path"] == str(tmp_path / "mine")
    # A program loaded from the cache: XLA's C++ notices about it stay out of the output.
    again = cache_report(tmp_path, str(tmp_path / "mine"))
    assert again["files"] and again["stderr"] == "", again["stderr"][:300]
    # Without VACO_JAX_CACHE_DIR: $XDG_CACHE_HOME/vaco_jax.
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    if "VACO_JAX_CACHE_DIR" in os.environ:
        env["VACO_JAX_CACHE_DIR"] = ""
    assert cache_report(tmp_path, "default", **env)["path"] == str(
        tmp_path / "xdg" / "vaco_jax" / "xla" / cache.host_tag())


TRAINER_CACHE_SCRIPT = """
import json, sys
import jax
from vaco_jax import Config, Options, Trainer, cache, make_train, run
if sys.argv[1] == "off-call":
    cache.enable_compile_cache("off")
if sys.argv[1] == "jax-disabled":
    jax.config.update("jax_enable_compilation_cache", False)
before = jax.config.jax_compilation_cache_dir
config = Config(env="toy_reach", num_envs=4, num_actors=2, num_minibatches=2, unroll_length=4,
                total_steps=160, num_evals=2, eval_envs=2, episode_length=8)
if sys.argv[1] == "run-off":   # vaco_jax.run takes its Options' setting
    run(config, Options(compile_cache="off", dry_run=True))
else:
    (Trainer if sys.argv[1] == "trainer" else make_train)(config)
print(json.dumps([before, jax.config.jax_compilation_cache_dir,
                  jax.config.jax_compilation_cache_max_size]))
"""


def test_a_trainer_turns_the_per_user_compile_cache_on_unless_told_not_to(tmp_path):
    """From Python (make_train, Trainer, vaco_jax.run) as from the commands; each case in a fresh
    process, so JAX's global settings do not leak between them."""
    user = tmp_path / "user"
    base = {k: v for k, v in os.environ.items()
            if k not in ("JAX_COMPILATION_CACHE_DIR", "VACO_JAX_COMPILE_CACHE")}
    base["VACO_JAX_CACHE_DIR"] = str(user)
    cases = {"trainer": {}, "make_train": {}, "off-call": {}, "run-off": {},
             "env-off": {"VACO_JAX_COMPILE_CACHE": "off"},
             "env-bad": {"VACO_JAX_COMPILE_CACHE": "sometimes"},
             "jax-dir": {"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jax_dir")},
             "jax-disabled": {}}
    started = {case: subprocess.Popen([sys.executable, "-c", TRAINER_CACHE_SCRIPT, case],
                                      env={**base, **env}, cwd=tmp_path, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
               for case, env in cases.items()}
    done = {case: process.communicate(timeout=300) + (process.returncode,)
            for case, process in started.items()}
    report = {case: json.loads(out.splitlines()[-1]) for case, (out, _, code) in done.items()
              if code == 0}
    per_user = str(user / "xla" / cache.host_tag())
    assert report["trainer"] == report["make_train"] == [None, per_user, cache.COMPILE_CACHE_BYTES]
    for case in ("off-call", "run-off", "env-off", "jax-disabled"):   # off: nothing is set
        assert report[case] == [None, None, -1], case
    # A directory JAX was given is kept as it is, its size bound too.
    assert report["jax-dir"] == [str(tmp_path / "jax_dir")] * 2 + [-1]
    _, err, code = done["env-bad"]
    assert code != 0 and "VACO_JAX_COMPILE_CACHE='sometimes' is invalid" in err


def test_each_kind_of_host_cpu_gets_its_own_compilation_cache(tmp_path):
    # Programs compiled for one CPU's instruction set must not be loaded on another.
    def tag(model, flags):
        path = tmp_path / "cpuinfo"
        path.write_text("".join(f"processor\t: {i}\nmodel name\t: {model}\nflags\t\t: {flags}\n\n"
                                for i in range(2)))
        return cache.host_tag(str(path))

    assert tag("EPYC 9654", "sse avx2 avx512f") == tag("EPYC 9654", "sse avx2 avx512f")
    assert len({tag("EPYC 9654", "sse avx2 avx512f"), tag("EPYC 7763", "sse avx2 avx512f"),
                tag("EPYC 9654", "sse avx2")}) == 3


def test_library_log_messages_show_only_when_verbose(caplog):
    from vaco_jax import runtime
    before = {name: logging.getLogger(name).level for name in runtime.LIBRARY_LOGGERS}
    try:
        runtime.configure_logging(verbose=False)
        absl_logging.warning("Waiting for previous save to complete took 1.2 seconds.")
        logging.getLogger("orbax").warning("an internal detail")
        absl_logging.error("a real problem")
        assert [r.getMessage() for r in caplog.records] == ["a real problem"]
        runtime.configure_logging(verbose=True)
        absl_logging.warning("Waiting for previous save to complete took 1.2 seconds.")
        assert [r for r in caplog.records if "previous save" in r.getMessage()]
    finally:
        for name, level in before.items():
            logging.getLogger(name).setLevel(level)


def test_help_documents_every_flag_and_lists_the_choices():
    from vaco_jax import Config, Options, algorithms, envs
    from vaco_jax.options import LoggerOptions
    from vaco_jax.runtime import Cluster
    done = subprocess.run([sys.executable, "-m", "vaco_jax.commands.train", "--help"], capture_output=True,
                          text=True, env=dict(os.environ, COLUMNS="100"), timeout=120)
    text = done.stdout
    assert done.returncode == 0 and text.startswith("usage: python -m vaco_jax.commands.train")
    assert "warp" not in text           # nothing but the help on stdout
    # No section-divider comment of config.py is taken for a flag's help.
    source = (Path(envs.__file__).parent / "config.py").read_text()
    titles = [t for t in re.findall(r"# --- (.+?) -{3,}", source) if len(t.split()) > 1]
    assert len(titles) >= 5
    for title in titles:
        assert title not in text, title
    lines = text.splitlines()
    for cls in (Config, Options, LoggerOptions, Cluster):
        for field in dataclasses.fields(cls):
            if field.name == "logging":   # Options' nested LoggerOptions: their own flags
                continue
            flag = "--" + field.name.replace("_", "-")
            i = next(i for i, line in enumerate(lines)
                     if flag in [token.rstrip(",") for token in line.strip(" │").split()])
            # The flag's description follows on its line or the next one: never empty.
            head = lines[i].strip(" │")
            rest = re.sub(r"^(--[\w-]+,? ?)+(\S+ )?", "", head).strip() or lines[i + 1].strip(" │")
            assert rest and not rest.startswith("--"), flag
    for name in envs.MJX_ENVS + envs.TOY_ENVS + tuple(algorithms.REGISTRY):
        assert name in text, name
    assert "dmc:<Task>" in text and "dmc:CheetahRun" in text   # the 25 tasks: README and errors


# --- what a cold start says while it compiles ---------------------------------------------------
def _rendered(text: str) -> list[str]:
    """What a terminal shows for `text`: each backspace moves back over the row it is on."""
    rows, row, column = [], [], 0
    for char in text:
        if char == "\n":
            rows.append("".join(row).rstrip())
            row, column = [], 0
        elif char == "\b":
            column = max(0, column - 1)
        else:
            if column < len(row):
                row[column] = char
            else:
                row.append(char)
            column += 1
    return rows + (["".join(row).rstrip()] if row else [])


def test_a_status_line_counts_the_seconds_in_place_on_a_terminal(monkeypatch):
    from vaco_jax.runtime import StatusLine

    class Terminal:
        def __init__(self):
            self.written = []

        def write(self, text):
            self.written.append(text)

        def flush(self):
            pass

    monkeypatch.setenv("COLUMNS", "200")
    terminal = Terminal()
    with StatusLine("compiling things", live=True, stream=terminal, tick_seconds=0.05) as status:
        time.sleep(0.3)
        status.outcome = "compiled"
    shown = "".join(terminal.written)
    assert shown.count("\b") >= 6 and "\r" not in shown   # the count was rewritten in place
    (line,) = _rendered(shown)
    assert re.fullmatch(r"compiling things compiled in 0\.[3-9] s", line), line
    # A line longer than the terminal keeps its count on the row it ends on, or starts a new one.
    monkeypatch.setenv("COLUMNS", "40")
    terminal = Terminal()
    with pytest.raises(KeyboardInterrupt):
        with StatusLine("x" * 30, live=True, stream=terminal, tick_seconds=10):
            raise KeyboardInterrupt
    assert _rendered("".join(terminal.written)) == ["x" * 30, "  stopped after 0 s"]


def test_without_a_terminal_the_status_is_a_line_when_compiling_starts_and_one_when_it_ends(
        run_dir, tmp_path, capsys):
    from types import SimpleNamespace

    from vaco_jax import runtime

    assert main([a for a in ARGS if a != "--no-progress"] + ["--out", str(tmp_path / "run")]) == 0
    lines = capsys.readouterr().err.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("compiling"))
    assert lines[start] == (
        "compiling the learner and evaluation programs for 2 runs of vaco on toy_reach (first run "
        "of this config: seconds to a minute on a CPU; later runs of the same config load them "
        "from the cache)")
    # The program compiled for `run_dir` in this process is used again.
    assert re.fullmatch(r"reused the programs compiled earlier in this process in \d+\.\d s",
                        lines[start + 1])
    assert lines[start + 2].startswith("evaluation 1/3")
    hits = cache.xla_cache_hits()
    outcome = lambda loaded, reused=False: runtime.compile_outcome(  # noqa: E731
        SimpleNamespace(loaded=loaded), reused=reused, xla_cache_hits=hits)
    assert (outcome(True), outcome(False)) == ("loaded from the cache", "compiled")


# --- every command's help -----------------------------------------------------------------------
def _command_line_modules() -> list[str]:
    """Every module of the package, the experiments and the benchmarks that runs as a command."""
    root = Path(__file__).resolve().parent.parent
    return [".".join(path.relative_to(root).with_suffix("").parts)
            for package in ("vaco_jax", "experiments", "benchmarks")
            for path in sorted((root / package).rglob("*.py"))
            if re.search(r'^if __name__ == "__main__":', path.read_text(), re.MULTILINE)]


@pytest.mark.parametrize("module", _command_line_modules())
def test_every_command_s_help_shows_how_to_run_it(module, monkeypatch, capsys):
    """`python -m <module> --help`, run in this process as Python runs it (the installed commands:
    tests/test_commands.py)."""
    import runpy
    import warnings

    monkeypatch.setenv("COLUMNS", "200")
    for argv in (["--help"], ["tiny", "--help"]) if module.endswith(".llm") else (["--help"],):
        monkeypatch.setattr(sys, "argv", [module.replace(".", "/") + ".py", *argv])
        with pytest.raises(SystemExit) as exited, warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)   # runpy: the module is imported already
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        assert exited.value.code == 0
        usage = capsys.readouterr().out.splitlines()[0]
        assert usage.startswith(f"usage: python -m {module} {' '.join(argv[:-1])}".rstrip() + " "), usage


def test_command_line_modules_are_found():
    assert {"vaco_jax.commands.train", "vaco_jax.commands.evaluate", "experiments.llm",
            "experiments.references", "benchmarks.throughput"} <= set(_command_line_modules())


def test_train_help_heads_each_group_by_what_it_holds(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit):
        main(["--help"])
    # Each group's heading is a line of its own, boxed or not (rich draws boxes on UTF-8 only).
    headings = [line.strip(" │╭─╮") for line in capsys.readouterr().out.splitlines()
                if line.strip(" │╭─╮").endswith(" options") or line.strip(" │╭─╮") == "options"]
    assert headings == ["options", "config options", "process options", "logging options",
                        "cluster options", "asynchrony options"], headings


def test_references_lists_the_presets(capsys):
    from vaco_jax.commands import references

    with pytest.raises(SystemExit) as refused:
        references.main(["--preset", "nope"])
    assert refused.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "invalid choice 'nope'" in err and "'tiny', 'smoke', 'cpu', 'hopper-1m', 'paper'" in err


def test_the_readme_quotes_the_quick_start_s_own_step_count():
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert "--num-seeds 4 --total-steps 200000 --out runs/quickstart" in readme
    from vaco_jax import Config

    steps = Config(env="inverted_pendulum", total_steps=200_000).env_steps   # default shapes
    # The quick start's final line (README) and the evaluation of its policy (docs).
    evaluated = (Path(__file__).resolve().parent.parent / "docs" / "environments.md").read_text()
    quoted = re.findall(r"\(([\d,]+) steps/seed|\(after ([\d,]+) steps\)", readme + evaluated)
    assert [bool(a) for a, b in quoted] == [True, False], quoted
    assert {int((a or b).replace(",", "")) for a, b in quoted} == {steps}, quoted


EXAMPLE_PROFILE = Path(__file__).resolve().parent.parent / "docs" / "lag_profiles" / "example.json"


def test_lag_profile_flag_reads_the_file_and_sets_sampling_and_capacity(tmp_path, capsys):
    probabilities = tuple(json.loads(EXAMPLE_PROFILE.read_text())["probabilities"])
    config = parse(["--env", "toy_reach", "--lag-profile", str(EXAMPLE_PROFILE)]).config
    assert (config.lag_profile, config.snapshot_sampling) == (probabilities, "profile")
    assert config.capacity == len(probabilities)
    config = parse(["--lag-profile", str(EXAMPLE_PROFILE), "--capacity", "10"]).config
    assert config.capacity == 10                            # a capacity given is kept
    assert main(ARGS + ["--lag-profile", str(EXAMPLE_PROFILE), "--out", str(tmp_path / "run")]) == 2
    assert "`capacity` = 2 is invalid" in capsys.readouterr().err
    assert main(["--lag-profile", str(EXAMPLE_PROFILE), "--snapshot-sampling", "oldest",
                 "--env", "toy_reach", "--out", str(tmp_path / "run")]) == 2
    assert "`snapshot_sampling` = 'oldest' is invalid" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_lag_profile_run_reports_its_realised_snapshot_ages(tmp_path, capsys):
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"probabilities": [0.5, 0.0, 0.5]}))
    out = tmp_path / "run"
    at = ARGS.index("--capacity")
    assert main(ARGS[:at] + ARGS[at + 2:] + ["--lag-profile", str(profile), "--out", str(out)]) == 0
    assert "snapshot ages, profile -> realised" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())["snapshot_ages"]
    assert summary["profile"] == [0.5, 0.0, 0.5]
    assert len(summary["realised_per_seed"]) == 2 and summary["draws"] == 6 * 2
    np.testing.assert_allclose(sum(summary["realised"]), 1.0, atol=1e-5)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(len(row["snapshot_age_hist_2"]) == 2 for row in rows)
