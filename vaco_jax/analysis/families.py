"""Pre-registered tests: whether results were made after the tests were written (the ancestry
check), a family of paired tests with Holm's correction and verdicts, and the break rule's
verdict on a retention interval. The target of a comparison is a parameter of each study, never
fixed here."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from vaco_jax import io
from vaco_jax.analysis import stats

ALPHA = 0.05
WORDS = ("higher", "lower", "no difference shown")
"""A verdict's words: Holm's p below alpha with a positive estimate, with a negative one, else."""
BREAK_LEVEL = 0.8
"""The break rule's level (docs/preregistrations.md, section 3): a retention below it drops."""
BREAK_WORDS = ("holds", "breaks", "undetermined")
"""The break rule's verdicts: the interval's lower end above the level, its upper end below it,
else."""
STATUS = {"after": "made after the pre-registration",
          "before": "analysed before the pre-registration",
          "unknown": "not known to follow the pre-registration"}


def record_commits(paths) -> list[str]:
    """The commits that made a study's runs, as their records name them: each row's `git_commit`
    in a `.jsonl` file (a sweep's cells), else a JSON record's `commits` (every call that wrote
    it) or `git_commit`. Sorted, each once."""
    found = set()
    for path in paths:
        path = Path(path)
        if path.suffix == ".jsonl":
            found |= {r.get("git_commit") for r in io.read_jsonl(path)}
            continue
        info = json.loads(path.read_text())
        if isinstance(info, dict):
            found |= set(info.get("commits") or [info.get("git_commit")])
    return sorted(c for c in found if c)


def descends_from(commit: str, ancestor: str) -> bool | None:
    """Whether `commit` is `ancestor` or descends from it in this checkout's git history
    (`git merge-base --is-ancestor`); None when git cannot tell (no git, no repository, a commit
    it does not hold)."""
    try:
        out = subprocess.run(["git", "merge-base", "--is-ancestor", ancestor, commit],
                             cwd=Path(__file__).resolve().parents[2], capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return {0: True, 1: False}.get(out.returncode)


def status(commits, registration: str, descends=None) -> tuple[str, str]:
    """(status, in words) of results made at `commits` against the pre-registration commit
    `registration`: "after" when every commit descends from it (its tests judge them); else
    "before" (a commit made before it) or "unknown" (none recorded, or not in this history):
    exploratory. `descends(commit, ancestor)` is the ancestry check (`descends_from`)."""
    descends = descends_from if descends is None else descends
    commits = sorted({str(c) for c in commits if c} or {"unrecorded"})
    after = {c: descends(c, registration) if c != "unrecorded" else None for c in commits}
    short = lambda cs: ", ".join(c[:7] for c in cs)  # noqa: E731
    named = f"the pre-registration ({registration[:7]})"
    if all(after.values()):
        return "after", f"made at {short(commits)}, after {named}"
    before = [c for c, a in after.items() if a is False]
    if before:
        return "before", f"made at {short(before)}, before {named}"
    unknown = [c for c, a in after.items() if a is None]
    return "unknown", (f"made at {short(unknown)}: whether that descends from {named} cannot be "
                       f"checked (no commit recorded, or not in this checkout's git history)")


def verdict(estimate: float, p_holm: float, pre_registered: bool, alpha: float = ALPHA,
            words: tuple[str, str, str] = WORDS) -> str:
    """"higher" / "lower" when Holm's p is below `alpha`, else "no difference shown" (or the
    family's own `words` for these three); not pre-registered: what the adjusted p shows, no
    verdict."""
    if not np.isfinite(p_holm):
        return "undefined"
    if not pre_registered:
        return (f"Holm p < {alpha:g}, estimate {'>' if estimate > 0 else '<'} 0"
                if p_holm < alpha else f"Holm p ≥ {alpha:g}")
    higher, lower, neither = words
    return (higher if estimate > 0 else lower) if p_holm < alpha else neither


def break_verdict(low: float, high: float, pre_registered: bool,
                  level: float = BREAK_LEVEL) -> str:
    """The break rule on a retention's interval (`BREAK_WORDS`): "holds" when its lower end is
    above `level` (non-inferiority with margin 1 − `level`), "breaks" when its upper end is below
    it, else "undetermined"; not pre-registered: where the interval lies ("95% CI above 0.8", …);
    "undefined" for an interval that is not finite."""
    if not (np.isfinite(low) and np.isfinite(high)):
        return "undefined"
    words = (BREAK_WORDS if pre_registered else
             tuple(f"95% CI {w} {level:g}" for w in ("above", "below", "spans")))
    return words[0] if low > level else words[1] if high < level else words[2]


def family(tests: list[dict], *, test: str = "sign-flip", pre_registered: bool = True,
           alpha: float = ALPHA, words: tuple[str, str, str] = WORDS, exact: bool = False,
           interval: str = "t") -> pd.DataFrame:
    """A family of paired tests: each entry has `differences` (one per seed), `family` (whether
    it counts in the family; default True) and any labels. Adds the mean and its 95% Student-t
    interval (`interval` "sign-flip": the shifts the sign-flip test does not reject, so it
    excludes 0 exactly when that test's p is below 0.05), the sign-flip test's p (`p_sign_flip`;
    every sign pattern enumerated up to 24 seeds with `exact`) and the two-sided paired t-test's
    (`p_t`; 1 when every difference is 0), `p` (the one `test` names), Holm's adjusted p over
    the family and the verdict (in `words`, `verdict`)."""
    rows = []
    for entry in tests:
        d = np.asarray(entry["differences"], np.float64)
        mean, low, high = (stats.sign_flip_interval(d, exact=exact) if interval == "sign-flip"
                           else stats.paired_t_interval(d))
        p_t = (1.0 if len(d) > 1 and not np.any(d) else
               float(scipy_stats.ttest_1samp(d, 0.0).pvalue) if len(d) > 1 else np.nan)
        p_flip = stats.sign_flip_test(d, exact=exact)
        rows.append({**{k: v for k, v in entry.items() if k != "differences"},
                     "family": bool(entry.get("family", True)), "estimate": mean, "low": low,
                     "high": high, "seeds": len(d), "p_t": p_t, "p_sign_flip": p_flip,
                     "p": p_flip if test == "sign-flip" else p_t})
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    table["p_holm"] = np.nan
    counted = table["family"] & table["p"].notna()
    table.loc[counted, "p_holm"] = stats.holm(table.loc[counted, "p"].to_numpy())
    table["verdict"] = [verdict(r.estimate, r.p_holm, pre_registered, alpha, words) if r.family
                        else "left out" for r in table.itertuples()]
    return table
