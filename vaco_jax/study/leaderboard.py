"""The leaderboard of a benchmark directory (one sub-directory per method, `vaco_jax.study.bench`):
a table (method × task: final-score retention at the protocol's largest lag, break-lag, retention
under high update frequency) and one figure. Methods made by other result code than the majority,
or on another protocol version, are listed apart, never ranked beside the others."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import pandas as pd

from vaco_jax import io
from vaco_jax.study import bench, scorecard


def table(directory: str | Path, *, reps: int = scorecard.REPS) -> tuple[pd.DataFrame, list[str]]:
    """One row per (method, task): retention at the largest lag and in the high-update-frequency
    setting (final score, 95% BCa CI), the break-lag; and the notes on methods left out."""
    results = scorecard.leaderboard_results(directory)
    if not results:
        raise FileNotFoundError(f"{directory} holds no benchmark directories")
    codes = collections.Counter((r.info["protocol"], r.info["protocol_version"], r.info["result_code"])
                                for r in results.values())
    (protocol_name, version, code), _ = codes.most_common(1)[0]
    proto = bench.protocol(protocol_name)
    rows, notes = [], []
    for name, result in results.items():
        info = result.info
        if (info["protocol"], info["protocol_version"], info["result_code"]) != (protocol_name, version, code):
            notes.append(f"`{name}` left out: made by result code {info['result_code']} on "
                         f"{info['protocol']} v{info['protocol_version']} (the rest: {code} on "
                         f"{protocol_name} v{version})")
            continue
        if result.missing:
            notes.append(f"`{name}`: {len(result.missing)} cells not finished")
        retention = scorecard.retention(result, proto, reps=reps)
        breaks = scorecard.break_lag(retention)
        final = retention[retention.metric == "final"]
        for task in final.task.unique():
            lag = final[(final.task == task) & (final.setting == "lag") & (final.lag == proto.largest_lag)]
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
    frame = pd.DataFrame(rows)
    frame.attrs.update(protocol=protocol_name, version=version, result_code=code,
                       largest_lag=proto.largest_lag,
                       forward=", ".join(f"{k}={v}" for k, v in proto.forward))
    return frame, notes


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
        lag = scorecard._ci(r.lag_retention, r.lag_low, r.lag_high)
        fwd = scorecard._ci(getattr(r, "forward_retention", np.nan), getattr(r, "forward_low", np.nan),
                            getattr(r, "forward_high", np.nan))
        brk = "none" if r.break_lag is None or pd.isna(r.break_lag) else str(int(r.break_lag))
        if brk != "none" and r.confirmed:
            brk = f"**{brk}**"
        lines.append(f"| {r.method} | {r.task} | {lag} | {fwd} | {brk} |")
    if notes:
        lines += [""] + [f"* {n}" for n in notes]
    return "\n".join(lines) + "\n"


def write(directory: str | Path) -> list[Path]:
    """`leaderboard.md`, `leaderboard.csv` and `leaderboard.png` in `directory`."""
    from vaco_jax.study import plotting

    directory = Path(directory)
    frame, notes = table(directory)
    io.write_bytes_atomic(directory / "leaderboard.md", markdown(frame, notes).encode())
    io.write_bytes_atomic(directory / "leaderboard.csv", frame.to_csv(index=False).encode())
    pooled = frame.groupby("method", as_index=False).mean(numeric_only=True) \
        if frame.task.nunique() > 1 else frame
    fig = plotting.leaderboard_figure(pooled)
    fig.savefig(directory / "leaderboard.png", dpi=120, bbox_inches="tight")
    return [directory / "leaderboard.md", directory / "leaderboard.csv", directory / "leaderboard.png"]
