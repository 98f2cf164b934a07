"""The pre-registered test of PREREGISTRATION.md on this directory's runs: the CNN's mean final
return minus the MLP's, with a 95% Welch t interval (scipy), and the exploratory numbers.

    python results/minatar-cnn/long/test.py
"""

import json
from pathlib import Path

import numpy as np
from scipy import stats

from vaco_jax import io

HERE = Path(__file__).resolve().parent


def curves(network: str) -> tuple[np.ndarray, np.ndarray]:
    rows = io.read_rows(HERE / network / "metrics.jsonl")
    return np.array([r["step"] for r in rows]), np.array([r["eval_return"] for r in rows]).T


def main() -> None:
    steps, mlp = curves("mlp")
    _, cnn = curves("cnn")
    final_mlp, final_cnn = mlp[:, -1], cnn[:, -1]
    test = stats.ttest_ind(final_cnn, final_mlp, equal_var=False)
    low, high = test.confidence_interval(0.95)
    difference = final_cnn.mean() - final_mlp.mean()
    verdict = ("the CNN learns more than the MLP at this budget" if low > 0 else
               "the MLP learns more at this budget" if high < 0 else
               "no difference shown at this budget")
    print(f"final return at {steps[-1]:,} steps, per seed: mlp {final_mlp.round(2).tolist()} "
          f"(mean {final_mlp.mean():.2f}), cnn {final_cnn.round(2).tolist()} (mean {final_cnn.mean():.2f})")
    print(f"primary: cnn - mlp = {difference:+.2f}, 95% Welch interval [{low:+.2f}, {high:+.2f}] "
          f"(p = {test.pvalue:.3f}): {verdict}")
    auc = {name: np.trapezoid(c, steps, axis=1) / (steps[-1] - steps[0]) for name, c in
           (("mlp", mlp), ("cnn", cnn))}
    print(f"exploratory: mean return over the curve (area / steps): mlp {auc['mlp'].mean():.2f}, "
          f"cnn {auc['cnn'].mean():.2f}")
    for network in ("mlp", "cnn"):
        summary = json.loads((HERE / network / "summary.json").read_text())
        print(f"exploratory: {network} {summary['sps']:,.0f} env steps/s (all seeds together)")


if __name__ == "__main__":
    main()
