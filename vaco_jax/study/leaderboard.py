"""The leaderboard of a benchmark directory (one sub-directory per method, `vaco_jax.study.bench`):
a table (method × task: final-score retention at the protocol's largest lag, break-lag, retention
under high update frequency) and one figure. Methods made by other result code than the majority,
or on another protocol version, are listed apart, never ranked beside the others."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from vaco_jax import io
from vaco_jax.pipeline import estimates, figures, tables
from vaco_jax.study import bench, scorecard


def table(directory: str | Path, *, reps: int = scorecard.REPS) -> tuple[pd.DataFrame, list[str]]:
    """One row per (method, task): retention at the largest lag and in the high-update-frequency
    setting (final score, 95% BCa CI), the break-lag; and the notes on methods left out."""
    if not Path(directory).is_dir():
        raise FileNotFoundError(f"{directory} does not exist" if not Path(directory).exists()
                                else f"{directory} is not a directory")
    results = scorecard.leaderboard_results(directory)
    if not results:
        raise FileNotFoundError(f"{directory} holds no benchmark directories")
    codes = collections.Counter((r.info["protocol"], r.info["protocol_version"], r.info["result_code"])
                                for r in results.values())
    (protocol_name, version, code), _ = codes.most_common(1)[0]
    proto = bench.protocol(protocol_name, version)
    rows, notes = [], []
    for name, result in results.items():
        info = result.info
        if (info["protocol"], info["protocol_version"], info["result_code"]) != (protocol_name, version, code):
            notes.append(f"`{name}` left out: made by result code {info['result_code']} on "
                         f"{info['protocol']} v{info['protocol_version']} (the rest: {code} on "
                         f"{protocol_name} v{version})")
            continue
        if not (result.directory / bench.RUNS).is_dir():   # e.g. committed without its runs
            notes.append(f"`{name}` left out: its directory holds no per-seed runs")
            continue
        if result.missing:
            notes.append(f"`{name}`: {len(result.missing)} cells not finished")
        retention = scorecard.retention(result, proto, reps=reps)
        rows += _rows(name, retention, scorecard.break_lag(retention), proto.largest_lag)
    frame = pd.DataFrame(rows)
    if frame.empty:
        raise ValueError(f"{directory}: no method of protocol {protocol_name} v{version} and result "
                         f"code {code} holds per-seed runs to tabulate ({'; '.join(notes)})")
    frame.attrs.update(protocol=protocol_name, version=version, result_code=code,
                       largest_lag=proto.largest_lag,
                       forward=", ".join(f"{k}={v}" for k, v in proto.forward))
    return frame, notes


def _rows(name: str, retention: pd.DataFrame, breaks: pd.DataFrame, largest_lag: int) -> list[dict]:
    """One method's rows: per task, final-score retention at `largest_lag` and in the
    high-update-frequency setting (its largest lag), and the break-lag."""
    rows = []
    final = retention[retention.metric == "final"]
    for task in final.task.unique():
        lag = final[(final.task == task) & (final.setting == "lag") & (final.lag == largest_lag)]
        fwd = final[(final.task == task) & (final.setting == "forward")]
        fwd = fwd[fwd.lag == fwd.lag.max()] if len(fwd) else fwd
        brk = breaks[breaks.task == task]
        row = {"method": name, "task": task}
        for prefix, sel in (("lag", lag), ("forward", fwd)):
            if len(sel):
                r = sel.iloc[0]
                row.update({f"{prefix}_retention": r.retention, f"{prefix}_low": r.low,
                            f"{prefix}_high": r.high})
        if len(brk):
            value = brk.iloc[0].break_lag
            row["break_lag"] = None if value is None or pd.isna(value) else int(value)
            row["confirmed"] = bool(brk.iloc[0].confirmed)
        rows.append(row)
    return rows


SCORECARD = "scorecard.json"


def table_of_scorecards(directory: str | Path) -> tuple[pd.DataFrame, list[str]]:
    """`table` from each method's committed `scorecard.json` (its retention and break-lag, as
    the scorecard computed them from its runs) when the runs themselves are not kept, as for the
    v1 leaderboard. Every scorecard must share one protocol, version and result code."""
    cards = {p.parent.name: json.loads(p.read_text())
             for p in sorted(Path(directory).glob(f"*/{SCORECARD}"))}
    if not cards:
        raise FileNotFoundError(f"{directory} holds no scorecards (<method>/"
                                f"{SCORECARD})")
    keys = {(c["protocol"], c["protocol_version"], c["result_code"]) for c in cards.values()}
    if len(keys) > 1:
        raise ValueError(f"{directory}: scorecards of {len(keys)} protocols or result codes "
                         f"{sorted(keys)}: a leaderboard ranks one")
    (protocol_name, version, code), = keys
    proto = bench.protocol(protocol_name, version)
    rows = []
    for card in cards.values():
        rows += _rows(card["method"], pd.DataFrame(card["retention"]),
                      pd.DataFrame(card["break_lag"]), proto.largest_lag)
    frame = pd.DataFrame(rows)
    frame.attrs.update(protocol=protocol_name, version=version, result_code=code,
                       largest_lag=proto.largest_lag,
                       forward=", ".join(f"{k}={v}" for k, v in proto.forward))
    return frame, []


def markdown(frame: pd.DataFrame, notes: list[str]) -> str:
    a = frame.attrs
    lines = [f"Protocol `{a['protocol']}` v{a['version']}, result code `{a['result_code']}`: "
             f"final-score retention (score ÷ the method's own synchronous score, 95% BCa CI) at "
             f"k = {a['largest_lag']} and with {a['forward']}; break-lag = the first k below 0.8 "
             f"(bold: the CI's upper end is below 0.8 too).", "",
             "| method | task | retention at k = {} | with {} | break-lag |".format(
                 a["largest_lag"], a["forward"]), "|---|---|---|---|---|"]
    order = frame.sort_values(["task", "lag_retention"], ascending=[True, False])
    for r in order.itertuples():
        lag = tables.interval(r.lag_retention, r.lag_low, r.lag_high)
        fwd = tables.interval(getattr(r, "forward_retention", np.nan), getattr(r, "forward_low", np.nan),
                            getattr(r, "forward_high", np.nan))
        brk = "none" if r.break_lag is None or pd.isna(r.break_lag) else str(int(r.break_lag))
        if brk != "none" and r.confirmed:
            brk = f"**{brk}**"
        lines.append(f"| {r.method} | {r.task} | {lag} | {fwd} | {brk} |")
    if notes:
        lines += [""] + [f"* {n}" for n in notes]
    return "\n".join(lines) + "\n"


# The controlled-lag study's names (`vaco-report`'s degradation.csv) of the leaderboard's methods
# where they differ: its report names variants by their overrides. Every benchmark method runs at
# the protocol's K = 4 epochs, IMPALA too, so the benchmark's `impala` is the study's 4-epoch
# variant (the study's `impala` row is the one-pass form).
STUDY_NAMES = {"ppo_kl_adaptive": "ppo_kl [kl_adaptive]",
               "ppo_kl_adaptive_learner": "ppo_kl [kl_adaptive_learner]",
               "impala": "impala [epochs=4]"}


def agreement(frame: pd.DataFrame, degradation_csv: str | Path) -> pd.DataFrame:
    """The leaderboard against a controlled-lag study (its report's `degradation.csv`), per task
    both hold and per method both name: final-score retention at the protocol's largest lag in
    each, and whether each drops (point estimate below 0.8). `attrs`: Spearman's rank correlation
    of the two retentions over those methods (and its p-value), the number of methods, and how many
    agree on dropping."""
    from scipy import stats

    study = pd.read_csv(degradation_csv)
    lag = f"k={frame.attrs['largest_lag']}"
    study = study[(study.sampling == "oldest") & (study.lag == lag)]
    rows = []
    for r in frame.itertuples():
        name = STUDY_NAMES.get(r.method, r.method)
        match = study[(study.task == r.task) & (study.method == name)]
        if len(match) and not pd.isna(getattr(r, "lag_retention", np.nan)):
            theirs = float(match.iloc[0].degradation)
            rows.append({"method": r.method, "task": r.task, "study_method": name,
                         "benchmark": r.lag_retention, "study": theirs,
                         "benchmark_drops": bool(r.lag_retention < estimates.BREAK_LEVEL),
                         "study_drops": bool(theirs < estimates.BREAK_LEVEL)})
    out = pd.DataFrame(rows)
    if len(out) >= 3:
        rho, p = stats.spearmanr(out.benchmark, out.study)
        out.attrs.update(spearman=float(rho), p_value=float(p))
    out.attrs.update(methods=len(out), lag=lag,
                     agree=int((out.benchmark_drops == out.study_drops).sum()) if len(out) else 0)
    return out


def agreement_markdown(frame: pd.DataFrame, source: str) -> str:
    a = frame.attrs
    rho = (f"Spearman's ρ = {a['spearman']:.2f} (p = {a['p_value']:.3f})" if "spearman" in a
           else "too few methods for a rank correlation")
    lines = [f"Final-score retention at {a['lag']}: this benchmark against the controlled-lag study "
             f"`{source}`, over the {a['methods']} methods both ran. {rho}; the two agree on "
             f"which methods drop (retention below {estimates.BREAK_LEVEL}) for {a['agree']} of "
             f"{a['methods']}.", "",
             "| method | task | benchmark | study | drops here | drops there |", "|---|---|---|---|---|---|"]
    for r in frame.sort_values("study", ascending=False).itertuples():
        lines.append(f"| {r.method} | {r.task} | {r.benchmark:.2f} | {r.study:.2f} | "
                     f"{'yes' if r.benchmark_drops else 'no'} | {'yes' if r.study_drops else 'no'} |")
    return "\n".join(lines) + "\n"


def leaderboard_figure(table: pd.DataFrame):
    """The leaderboard: each method's final-score retention at the protocol's largest lag (and in
    the high-update-frequency setting) with 95% CIs, best first."""
    table = table.sort_values("lag_retention")
    fig, ax = plt.subplots(figsize=(7.5, 0.35 * len(table) + 1.2))
    y = np.arange(len(table))
    column = lambda name: table[name].to_numpy(np.float64)  # noqa: E731 (arrays: no pandas in mpl)
    for prefix, shift, fmt, color, label in (("lag", 0.0, "o", "k", "largest lag"),
                                             ("forward", 0.2, "s", "tab:orange",
                                              "high update frequency")):
        if f"{prefix}_retention" not in table:
            continue
        point = column(f"{prefix}_retention")
        ax.errorbar(point, y + shift, xerr=[point - column(f"{prefix}_low"),
                                            column(f"{prefix}_high") - point],
                    fmt=fmt, color=color, capsize=2, label=label)
    ax.axvline(0.8, color="grey", ls=":", lw=1)
    ax.set_yticks(y)
    ax.set_yticklabels(table.method)
    ax.set_xlabel("final-score retention (score ÷ own synchronous score; 95% BCa CI)")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def write(directory: str | Path, agree_with: str | Path | None = None, *,
          out: str | Path | None = None, scorecards: bool = False) -> list[Path]:
    """`leaderboard.md`, `leaderboard.csv` and `leaderboard.png` in `out` (default `directory`);
    with `agree_with` (a controlled-lag study's `degradation.csv`), also `agreement.md` and
    `agreement.csv` (`agreement`). `scorecards`: from each method's scorecard.json
    (`table_of_scorecards`), not its runs."""
    frame, notes = (table_of_scorecards if scorecards else table)(directory)
    directory = Path(directory if out is None else out)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    if agree_with:
        agree = agreement(frame, agree_with)
        io.write_bytes_atomic(directory / "agreement.md",
                              agreement_markdown(agree, str(agree_with)).encode())
        io.write_bytes_atomic(directory / "agreement.csv", agree.to_csv(index=False).encode())
        written = [directory / "agreement.md", directory / "agreement.csv"]
    io.write_bytes_atomic(directory / "leaderboard.md", markdown(frame, notes).encode())
    io.write_bytes_atomic(directory / "leaderboard.csv", frame.to_csv(index=False).encode())
    pooled = frame.groupby("method", as_index=False).mean(numeric_only=True) \
        if frame.task.nunique() > 1 else frame
    fig = leaderboard_figure(pooled)
    figures.save(fig, directory / "leaderboard.png", dpi=120, bbox_inches="tight")
    return [directory / "leaderboard.md", directory / "leaderboard.csv", directory / "leaderboard.png",
            *written]
