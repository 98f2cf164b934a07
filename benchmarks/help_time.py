"""How long each installed command takes to print its `--help`.

    python -m benchmarks.help_time                  # every command, median of 3 fresh processes
    python -m benchmarks.help_time --repeats 5 --out benchmarks/results/help_time.json

Each command (pyproject.toml's `[project.scripts]`, installed beside this Python by `pip install
-e .`) runs `<command> --help` in a fresh process from an empty directory, `--repeats` times in
turn; a command's figure is the median of its wall times (its fastest and slowest beside it). The
machine's load average is printed before and after: other work on the machine slows every start.
Results go to stdout and, as JSON, to `--out`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

from vaco_jax import io

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def commands() -> list[str]:
    return list(tomllib.loads(PYPROJECT.read_text())["project"]["scripts"])


def help_seconds(path: Path, cwd: str) -> float:
    """Wall seconds of one `path --help` in a fresh process (which must succeed)."""
    start = time.perf_counter()
    subprocess.run([str(path), "--help"], cwd=cwd, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "100"})
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.help_time",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per command")
    parser.add_argument("--out", default="", help="JSON output path")
    args = parser.parse_args(argv)
    bin_dir = Path(sys.executable).parent
    names = commands()
    missing = [name for name in names if not (bin_dir / name).exists()]
    if missing:
        raise SystemExit(f"error: {missing} are not installed beside {sys.executable}: "
                         f"pip install -c requirements-lock.txt -e .")
    load_before = os.getloadavg()[0]
    print(f"{os.cpu_count()} CPUs, load average {load_before:.2f} before", flush=True)
    seconds = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="help_time_") as cwd:
        for _ in range(args.repeats):
            for name in names:
                seconds[name].append(help_seconds(bin_dir / name, cwd))
    rows = {name: {"median": statistics.median(times), "min": min(times), "max": max(times),
                   "seconds": times} for name, times in seconds.items()}
    width = max(map(len, names))
    print(f"{'command':<{width}}  --help, median of {args.repeats} (min–max)")
    for name, row in rows.items():
        print(f"{name:<{width}}  {row['median']:5.2f} s ({row['min']:.2f}–{row['max']:.2f})")
    load_after = os.getloadavg()[0]
    print(f"load average {load_after:.2f} after")
    result = {"repeats": args.repeats, "cpus": os.cpu_count(), "load_average_before": load_before,
              "load_average_after": load_after, "commands": rows, **io.provenance()}
    if args.out:
        io.write_json_atomic(args.out, result)
    return result


if __name__ == "__main__":
    main()
