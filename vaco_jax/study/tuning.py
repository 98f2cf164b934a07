"""Per-task tuning (protocol version 3): every method gets the same budget of configurations on
every task, chosen at k = 0 on the design seeds.

A method's **grid** on a task is its learning rates × the values of its objective's key constraint
(`Constraint`: PPO-Clip's ε, VACO's δ, PPO-KL's coefficient, M2PO's τ, ...). A method whose
objective has none spends the same budget on learning rates alone (a finer ladder). Every value is
a `HParams` leaf, so a task's whole grid × design seeds is one compiled program.

The choice on a task is the configuration with the highest mean AUC over the design seeds (AUC: the
mean of a run's evaluation returns; a diverged run scores random from its divergence on). A choice
on the edge of its grid, in either direction, adds the ladder's next value on that side (the whole
row or column) and is made again, until it is inside its grid or the ladder ends (recorded).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

# Learning rates go up and down a ladder of half-decades.
LR_LADDER = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
# A method without a constraint spends its budget on a ladder four times finer (10^(1/8) apart).
FINE_LR_LADDER = tuple(float(f"{10 ** (k / 8):.3g}") for k in range(-40, -7))
# Trust-region sizes and coefficients double along their ladders.
DOUBLING = tuple(float(f"{0.0125 * 2 ** k:.4g}") for k in range(8))          # 0.0125 … 1.6
COEFFICIENTS = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
TARGETS = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3)


@dataclasses.dataclass(frozen=True)
class Constraint:
    """The key constraint of an objective: the config field (or objective hyper-parameter) that
    sets how far its update may move, the ladder of its values and the window a grid starts from."""

    field: str
    ladder: tuple[float, ...]
    window: tuple[float, ...]
    own: bool = False
    """Is it the objective's own hyper-parameter (`objective_hparams`), not a `Config` field?"""


@dataclasses.dataclass(frozen=True)
class Grid:
    """A method's configurations on one task: `learning_rates` × `values` of `field` (no field:
    learning rates alone)."""

    learning_rates: tuple[float, ...]
    field: str | None = None
    values: tuple[float, ...] = ()
    own: bool = False

    def configs(self) -> list[dict[str, Any]]:
        if self.field is None:
            return [{"learning_rate": lr} for lr in self.learning_rates]
        return [{"learning_rate": lr, self.field: v} for lr in self.learning_rates
                for v in self.values]

    def describe(self) -> dict:
        return {"learning_rates": list(self.learning_rates), "field": self.field,
                "values": list(self.values)}


def run_hparams(config: dict[str, Any], grid: Grid) -> dict[str, Any]:
    """A configuration as the fields a run sets: an objective's own constraint goes through
    `objective_hparams` ("name=value")."""
    if grid.own and grid.field in config:
        rest = {k: v for k, v in config.items() if k != grid.field}
        return {**rest, "objective_hparams": (f"{grid.field}={config[grid.field]!r}",)}
    return dict(config)


def base_grid(constraint: Constraint | None, learning_rates: tuple[float, ...],
              lr_only: tuple[float, ...]) -> Grid:
    """The grid a method starts from: `learning_rates` × the constraint's window, or `lr_only`
    where the method has no constraint."""
    if constraint is None:
        return Grid(tuple(lr_only))
    return Grid(tuple(learning_rates), constraint.field, tuple(constraint.window), constraint.own)


def _step(ladder: tuple[float, ...], current: tuple[float, ...], chosen: float):
    """(the ladder's next value beyond `current` on the side where `chosen` sits on its edge,
    "below" or "above"); (None, "lower/upper end of the ladder") where the ladder ends there;
    (None, None) when `chosen` is inside."""
    if len(current) < 2 or not (math.isclose(chosen, min(current)) or
                                math.isclose(chosen, max(current))):
        return None, None
    low = math.isclose(chosen, min(current))
    beyond = [v for v in ladder if (v < min(current) * (1 - 1e-9) if low
                                    else v > max(current) * (1 + 1e-9))]
    if not beyond:
        return None, "lower end of the ladder" if low else "upper end of the ladder"
    return (max(beyond) if low else min(beyond)), ("below" if low else "above")


def extend(grid: Grid, chosen: dict[str, Any], lr_ladder: tuple[float, ...],
           constraint: Constraint | None) -> tuple[Grid | None, list[str]]:
    """The grid one step wider where `chosen` sits on its edge (None: inside, or only ladder ends
    remain), and what was done (`"learning_rate above"`, `"clip_eps at the lower end of the
    ladder"`)."""
    notes, lrs, values = [], grid.learning_rates, grid.values
    new_lr, side = _step(lr_ladder, lrs, chosen["learning_rate"])
    if new_lr is not None:
        lrs = tuple(sorted((*lrs, new_lr)))
        notes.append(f"learning_rate {side}: {new_lr:g}")
    elif side:
        notes.append(f"learning_rate at the {side}")
    if grid.field is not None:
        new_value, side = _step(constraint.ladder, values, chosen[grid.field])
        if new_value is not None:
            values = tuple(sorted((*values, new_value)))
            notes.append(f"{grid.field} {side}: {new_value:g}")
        elif side:
            notes.append(f"{grid.field} at the {side}")
    if (lrs, values) == (grid.learning_rates, grid.values):
        return None, notes
    return dataclasses.replace(grid, learning_rates=lrs, values=values), notes


def added(old: Grid, new: Grid) -> list[dict[str, Any]]:
    """The configurations of `new` that `old` lacks."""
    have = {tuple(sorted(c.items())) for c in old.configs()}
    return [c for c in new.configs() if tuple(sorted(c.items())) not in have]


def matches(row: dict, config: dict[str, Any]) -> bool:
    """Does `row` (a run's or a table's) hold configuration `config`'s values?"""
    return all(math.isclose(row[k], v) for k, v in config.items())


def choose(per_run: list[dict], grid: Grid) -> tuple[dict[str, Any], list[dict]]:
    """The configuration of `grid` with the highest mean AUC over its runs (`per_run`: dicts with
    the configuration's fields, `auc` and `final`); ties to the smaller learning rate, then the
    smaller constraint. Also the table of every configuration's means."""
    table = []
    for config in grid.configs():
        mine = [r for r in per_run if matches(r, config)]
        if not mine:
            raise ValueError(f"no finished run of configuration {config}")
        table.append({**config, "runs": len(mine),
                      "auc": sum(r["auc"] for r in mine) / len(mine),
                      "final": sum(r["final"] for r in mine) / len(mine)})
    best = max(row["auc"] for row in table)
    tied = [row for row in table if row["auc"] >= best - 1e-12]
    order = (lambda row: (row["learning_rate"], row.get(grid.field, 0.0)))
    winner = min(tied, key=order)
    return {k: winner[k] for k in grid.configs()[0]}, table
