"""The pre-registered test of PREREGISTRATION.md on this directory's runs: the CNN's mean final
return minus the MLP's, with a 95% Welch t interval, and the exploratory numbers. The study is a
study file (`studies/minatar-long.toml`); this prints the report that
`vaco-report --study-file studies/minatar-long.toml` writes to `results/studies/minatar-long/`.

    python results/minatar-cnn/long/test.py
"""

from pathlib import Path

from vaco_jax.analysis import study

ROOT = Path(__file__).resolve().parents[3]

if __name__ == "__main__":
    loaded = study.load(ROOT / "studies" / "minatar-long.toml", root=ROOT)
    print(study.make(loaded, ROOT)["report.md"], end="")
