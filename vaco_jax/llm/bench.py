"""The LLM protocols of the lag-robustness benchmark: one objective of GRPO under backward lag k
and N minibatch updates per batch, on a fixed LLM configuration.

    vaco-bench --protocol llm-cpu --algo vaco --plan     # the size of its runs
    vaco-bench --protocol llm-cpu --algo vaco            # its runs and scorecard
    vaco-bench --table results/lag-bench/llm-cpu          # the LLM leaderboard

A protocol (`LLMProtocol`) is data: an LLM preset with its overrides, the constant lags `ks`, a
stochastic lag (each batch's age uniform over 0..max k) where it is cheap, the Ns, the seeds and the
shipped warm start. `run` trains the objective's runs with the programs `vaco-llm` runs
(`vaco_jax.llm.experiment`: one compiled program per N over every (k, seed), in chunks of at most
`runs_per_call` runs), resumably, into `--out`: `results.jsonl.gz` (one row per run, compacted once
every run is in), `config.json` and `summary.json` (the experiment's), `bench.json` (the method,
protocol, the commits of every call, comparability key and cost) and the scorecard
(`vaco_jax.llm.scorecard`).

The comparability key of an LLM result is the protocol and its version, a hash of the run
configuration (every model, task, SFT and GRPO field, with the ks, Ns and seeds), the objective's
fingerprint (the StableHLO of its loss and gradient, `algorithms.objective_fingerprint`), the warm
start's SHA-256 and the versions of the libraries that can change a number. It does not lower the
GRPO program itself: a change to the GRPO code that keeps the configuration keeps the key, and the
rows' `source` hashes (`io.source_hash`) say which code made them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from pathlib import Path

from vaco_jax import io, runtime
from vaco_jax.errors import ConfigError, invalid_option
from vaco_jax.llm import config as llm_config

BENCH_FILE = "bench.json"
RESULTS = "results.jsonl"
NAMES = ("llm-tiny", "llm-cpu", "llm-gpu")

LLM_CPU_KS = (0, 4, 16)
"""The constant backward lags of `llm-cpu`. Provisional: to be set from the measurement of where
synchronous PPO-Clip's held-out greedy accuracy gain measurably shrinks."""


@dataclasses.dataclass(frozen=True)
class LLMProtocol:
    """What an objective is scored on. Changing anything here changes `version`."""

    name: str
    version: int
    preset: str
    """The LLM preset (`vaco_jax.llm.config.PRESETS`) the configuration starts from."""
    overrides: tuple[tuple[str, tuple[tuple[str, object], ...]], ...] = ()
    """(section, ((field, value), ...)) applied to the preset (`llm_config.replace`)."""
    ks: tuple[int, ...] = (0, 1, 3)
    """Constant backward lags k (learner iterations), 0 first: synchronous."""
    uniform: bool = False
    """Also run the stochastic lag: each batch's age drawn uniformly from 0..max(ks)."""
    ns: tuple[int, ...] = (1, 8)
    """Minibatch updates per generated batch (forward lag)."""
    seed: int = 300
    seeds: int = 10
    """Seed s of every objective uses `PRNGKey(seed + s)`, s < seeds."""
    design_seed: int = 900
    design_seeds: int = 5
    """Seeds for design choices (the lag range, a hyper-parameter): never a score."""
    runs_per_call: int = 0
    """At most this many runs in one compiled program (0: every run of an N)."""
    fast_compile: bool = False
    """XLA's cheapest optimisation level (tiny runs, where compiling dominates)."""
    preregistration: str = ""
    """The commit that fixed the leaderboard's test families in advance (`vaco_jax.llm.families`):
    when every entry's runs were made at commits that descend from it, the families get verdict
    words; none named (or results made before it): exploratory."""
    reference: str = "ppo_clip"
    """Normalised score 1: this objective at k = 0, N = 1, the same seeds."""
    description: str = ""

    @property
    def largest_lag(self) -> int:
        return max(self.ks)

    @property
    def lag_settings(self) -> tuple[tuple[str, int], ...]:
        """(lag sampling, k) of every setting: the constant lags, then the stochastic one."""
        return (tuple(("constant", k) for k in self.ks)
                + ((("uniform", self.largest_lag),) if self.uniform else ()))

    def config(self) -> llm_config.LLMConfig:
        """The run configuration: the preset, the overrides, the seeds."""
        config = llm_config.preset(self.preset)
        for section, fields in self.overrides:
            config = llm_config.replace(config, **{section: dict(fields)})
        return llm_config.replace(config, grpo=dict(seed=self.seed, num_seeds=self.seeds))

    def describe(self) -> dict:
        return io.to_jsonable(dataclasses.asdict(self))


PROTOCOLS = {p.name: p for p in (
    LLMProtocol("llm-tiny", 1, "tiny", ks=(0, 1, 3), ns=(1, 2), seeds=3, design_seeds=2,
                fast_compile=True, description="seconds (tests)"),
    LLMProtocol("llm-cpu", 1, "cpu", ks=LLM_CPU_KS, uniform=True, ns=(1, 8), seeds=10,
                runs_per_call=10, description="one 2-core CPU machine"),
    # The ~0.3B bf16 model, cut to one prepared command of about 10 minutes on one H100: a short
    # warm start (no warm start is shipped for it), small batches, few iterations, 2 seeds, one
    # run per program call (one run at N = 1 holds the batch's activations).
    LLMProtocol("llm-gpu", 1, "gpu", overrides=(
        ("task", (("num_train", 8192), ("num_test", 256))),
        ("sft", (("steps", 300), ("batch_size", 32), ("warmup_steps", 30))),
        ("grpo", (("num_prompts", 8), ("group_size", 8), ("iterations", 16), ("eval_every", 8),
                  ("train_eval_size", 64)))),
                ks=(0, 4), ns=(1, 8), seeds=2, design_seeds=2, runs_per_call=1,
                description="one H100, about 10 minutes (an estimate)"),
)}


def protocol(name: str, version: int | None = None) -> LLMProtocol:
    """The LLM protocol `name` (its one version, 1)."""
    if name not in PROTOCOLS:
        raise invalid_option("--protocol", name, f"one of {NAMES}")
    proto = PROTOCOLS[name]
    if version not in (None, proto.version):
        raise invalid_option("--protocol-version", version,
                             f"{proto.version} (protocol {name} has one version)")
    return proto


def check(proto: LLMProtocol, algo: str) -> llm_config.LLMConfig:
    """Refuse, before anything compiles, an objective the LLM cannot run (naming `--algo` and the
    objectives it can) or a protocol whose configuration does not validate; the configuration."""
    if not algo:
        raise ConfigError("option `algo` is required (e.g. --algo vaco)")
    try:
        llm_config.resolve(algo, field="algo")
    except ConfigError as error:
        raise ConfigError(f"{error} (protocol {proto.name} runs LLM objectives)") from None
    config = llm_config.validate(proto.config(), (algo,))
    for n in proto.ns:
        for mode, ks in _calls(proto):
            llm_config.validate(llm_config.with_lags(llm_config.replace(
                config, grpo=dict(num_minibatches=n, objective=algo)), ks, mode), (algo,))
    return config


def _calls(proto: LLMProtocol) -> list[tuple[str, tuple[int, ...]]]:
    """The experiment's calls: the constant lags, then the stochastic lag beside k = 0."""
    calls = [("constant", tuple(proto.ks))]
    if proto.uniform:
        calls.append(("uniform", (0, proto.largest_lag)))
    return calls


def experiment_of(proto: LLMProtocol, algo: str, out: Path, mode: str, ks) -> llm_config.Experiment:
    return llm_config.Experiment(
        proto.config(), ns=tuple(proto.ns), ks=tuple(ks), lag_sampling=mode, objectives=(algo,),
        out=str(out), plot=False, throughput=False, runs_per_call=proto.runs_per_call,
        fast_compile=proto.fast_compile)


def plan(proto: LLMProtocol, algo: str = "") -> dict:
    """The size of an objective's runs: runs, compiled programs, generated batches (iterations),
    sampled answers and answer tokens (at most `answer_len` each) of training, and the answers of
    its evaluations."""
    config = proto.config()
    g, t = config.grpo, config.task
    runs = len(proto.lag_settings) * len(proto.ns) * proto.seeds
    iterations = runs * g.iterations
    answers = iterations * g.batch_size
    evals = g.iterations // g.eval_every
    per_eval = 2 * t.num_test + min(g.train_eval_size, t.num_train)   # greedy, sampled, train
    # Per N, the constant call runs every k; the stochastic call's k = 0 runs are done by then.
    per_n = [len(ks if mode == "constant" else ks[1:]) * proto.seeds for mode, ks in _calls(proto)]
    calls = len(proto.ns) * sum(-(-runs_of // (proto.runs_per_call or runs_of))
                                for runs_of in per_n)
    return {"protocol": proto.name, "version": proto.version, "runs": runs,
            "programs": len(proto.ns) * len(_calls(proto)), "program_calls": calls,
            "iterations": iterations, "answers": answers,
            "answer_tokens": answers * t.answer_len, "evaluation_answers": runs * evals * per_eval,
            "sft_steps": config.sft.steps, "preset": proto.preset}


def plan_text(proto: LLMProtocol, algo: str = "") -> str:
    size = plan(proto, algo)
    config = proto.config()
    lags = ", ".join(f"k={k}" if m == "constant" else f"uniform 0..{k}"
                     for m, k in proto.lag_settings)
    from vaco_jax.llm import sft
    shipped = sft.shipped_record(config)
    lines = [f"protocol {proto.name} v{proto.version} ({proto.description}), preset {proto.preset}"
             f"{' with overrides' if proto.overrides else ''}: {size['runs']} runs "
             f"({lags}; N = {', '.join(map(str, proto.ns))}; seeds {proto.seed}–"
             f"{proto.seed + proto.seeds - 1}) in {size['programs']} compiled programs "
             f"({size['program_calls']} calls"
             + (f" of at most {proto.runs_per_call} runs)" if proto.runs_per_call else ")"),
             f"  {size['iterations']:,} generated batches of {config.grpo.batch_size} answers: "
             f"{size['answers']:,} answers, at most {size['answer_tokens']:,} answer tokens",
             f"  evaluations: {size['evaluation_answers']:,} answers "
             f"(held-out greedy and sampled, training greedy)",
             f"  model: {config.model.num_layers} layers, d = {config.model.d_model}, "
             f"{config.model.dtype}; warm start: "
             + ("shipped (no supervised training)" if shipped else
                f"{config.sft.steps:,} supervised steps of {config.sft.batch_size} when not "
                f"cached")]
    return "\n".join(lines)


# --- what a result computes -----------------------------------------------------------------------
def config_hash(proto: LLMProtocol, config: llm_config.LLMConfig) -> str:
    """SHA-256 (16 hex digits) of the run configuration and the protocol's lags, Ns and seeds."""
    what = {"config": io.to_jsonable(config), "ks": list(proto.ks), "uniform": proto.uniform,
            "ns": list(proto.ns), "seed": proto.seed, "seeds": proto.seeds}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def comparability_key(proto: LLMProtocol, algo: str, warm_start_sha256: str) -> dict:
    """What decides whether two LLM results may be compared (module docstring)."""
    from vaco_jax import algorithms
    from vaco_jax.study import bench as control_bench

    objective = llm_config.resolve(algo, field="algo")
    return {"protocol": proto.name, "protocol_version": proto.version,
            "config": config_hash(proto, proto.config()),
            "objective": algorithms.objective_fingerprint(objective),
            "warm_start": warm_start_sha256, "versions": control_bench.key_versions()}


def key_differences(ours: dict, theirs: dict) -> list[str]:
    """Why two comparability keys differ, one phrase per part (none: comparable). The objective's
    own fingerprint is left out: two objectives differ in it by design."""
    reasons = []
    for part, what in (("protocol", "protocol"), ("protocol_version", "protocol version"),
                       ("config", "configuration"), ("warm_start", "warm start")):
        if ours.get(part) != theirs.get(part):
            reasons.append(f"{what} {theirs.get(part)} (here {ours.get(part)})")
    for name, version in (theirs.get("versions") or {}).items():
        if (ours.get("versions") or {}).get(name) != version:
            reasons.append(f"made with {name} {version} (here "
                           f"{(ours.get('versions') or {}).get(name)})")
    return reasons


# --- running ----------------------------------------------------------------------------------------
def run(proto: LLMProtocol, algo: str, out: str | Path, log=print) -> dict:
    """Train every run of `algo` on `proto` not yet in `out` (the experiment resumes by
    (k, N, objective)), compact the rows once all are in, and write `bench.json`; returns it."""
    from vaco_jax.llm import experiment

    check(proto, algo)
    out = Path(out)
    previous = _read_bench(out, proto, algo)
    start = time.perf_counter()
    summary = None
    for mode, ks in _calls(proto):
        summary = experiment.run(experiment_of(proto, algo, out, mode, ks), log=log)
    rows = io.read_rows(out / RESULTS)
    primary = runtime.is_primary()   # process 0 writes; every process computes
    if primary and _finished(proto, algo, rows):
        io.compact_jsonl(out / RESULTS)
    warm = summary["warm_start"]
    summary.update(experiment.summarize(rows, warm["base_accuracy"]))   # every lag of the runs
    if primary:
        io.write_json_atomic(out / "summary.json", summary)
    sampled = _sampled(previous, warm["sha256"], proto)
    cost = _cost(rows, time.perf_counter() - start + previous.get("cost", {}).get("wall_seconds", 0))
    info = {"method": algo, "algo": algo, "protocol": proto.name,
            "protocol_version": proto.version, "protocol_definition": proto.describe(),
            "warm_start": {"digest": warm["digest"], "sha256": warm["sha256"],
                           "origin": warm["origin"], "greedy": warm["base_accuracy"],
                           "sampled": sampled},
            "comparability": comparability_key(proto, algo, warm["sha256"]),
            "cost": cost, **io.provenance()}
    info["commits"] = sorted(set(commits(previous) if previous else [])
                             | set(commits({"git_commit": info.get("git_commit")})))
    if primary:
        io.write_json_atomic(out / BENCH_FILE, info)
    return info


def commits(info: dict) -> list[str]:
    """The commits a bench.json's runs were made at: its `commits` (every `run` call that wrote
    it), else its `git_commit`; "unrecorded" where none is."""
    return [c or "unrecorded" for c in (info.get("commits") or [info.get("git_commit")])]


def _sampled(previous: dict, sha256: str, proto: LLMProtocol) -> float:
    """The warm start's sampled accuracy: as bench.json recorded it for the same warm start, else
    measured."""
    warm = previous.get("warm_start") or {}
    if warm.get("sha256") == sha256 and warm.get("sampled") is not None:
        return warm["sampled"]
    return warm_start_sampled_accuracy(proto)


def _read_bench(out: Path, proto: LLMProtocol, algo: str) -> dict:
    """`out`'s bench.json ({} if none); one of another method or protocol is refused."""
    path = out / BENCH_FILE
    if not path.exists():
        return {}
    old = json.loads(path.read_text())
    if (old.get("method"), old.get("protocol"), old.get("protocol_version")) != (
            algo, proto.name, proto.version):
        raise ConfigError(f"{out} holds method {old.get('method')!r} on protocol "
                          f"{old.get('protocol')} v{old.get('protocol_version')}, not {algo!r} on "
                          f"{proto.name} v{proto.version}: use another --out directory")
    return old


def _finished(proto: LLMProtocol, algo: str, rows) -> bool:
    from vaco_jax.llm.experiment import lag_of

    have = {(lag_of(r), r["n"], r["seed"]) for r in rows if r["objective"] == algo}
    return all(((mode if k else "constant", k), n, s) in have for mode, k in proto.lag_settings
               for n in proto.ns for s in range(proto.seeds))


def _cost(rows, wall_seconds: float) -> dict:
    """Wall seconds of every `run` call, and compile and training seconds of every program: each
    program's rows share its `compile_seconds` and `run_seconds`."""
    programs = {(r["n"], r.get("compile_seconds"), r.get("run_seconds")) for r in rows}
    return {"wall_seconds": float(wall_seconds),
            "compile_seconds": float(sum(c or 0 for _, c, _ in programs)),
            "training_seconds": float(sum(t or 0 for _, _, t in programs))}


def warm_start_sampled_accuracy(proto: LLMProtocol) -> float:
    """Held-out accuracy of one answer per problem sampled at temperature 1 by the warm start, with
    the noise of an evaluation at iteration 0 (`GRPO.evaluations`): the sampled score's 0."""
    import jax

    from vaco_jax.llm import evaluation, experiment, sft

    config = proto.config()
    train_set, test_set = experiment.load_problems(config)
    params, _ = sft.warm_start(config, train_set, test_set, log=lambda _: None)
    key = jax.random.fold_in(jax.random.PRNGKey(0), 0)
    fn = jax.jit(evaluation.sampled_accuracy, static_argnums=(2, 3))
    return float(fn(params, test_set, config.model, config.task.answer_len, key))
