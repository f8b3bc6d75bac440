"""A study's tables: study.parquet (every point's rounds, axis values as columns) and
summary.parquet (per group of points that differ only in the seed: mean, std and 95 % CI of
the final and best accuracy, final loss and time to each target), and the text summary."""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

import polars as pl

from fedsim.errors import FedsimError, did_you_mean
from fedsim.files import atomic_write, resume_command
from fedsim.results.report import ci95, config_targets, duration, read_run, summarize_run
from fedsim.studies.study import Study


METRICS = ("final_acc", "best_acc", "final_loss", "best_loss")


def _axis_columns(values: dict[str, Any]) -> dict[str, Any]:
    return {axis: (json.dumps(v) if isinstance(v, (list, dict)) else v) for axis, v in values.items()}


@dataclass
class StudyTables:
    """Every point's rounds with its axis values (study.parquet), the summary over seeds
    (summary.parquet), each point's run report (results/report.py, with its axis `values`)
    and the targets they were made for."""

    frame: pl.DataFrame
    summary: pl.DataFrame
    runs: list[dict]
    targets: list[float]


def write_tables(study: Study, targets: list[float] | None = None) -> pl.DataFrame:
    """study.parquet and summary.parquet of a finished study; returns the summary."""
    tables = study_tables(study, targets)
    atomic_write(study.folder / "study.parquet", tables.frame.write_parquet)
    atomic_write(study.folder / "summary.parquet", tables.summary.write_parquet)
    return tables.summary


def study_tables(study: Study, targets: list[float] | None = None) -> StudyTables:
    """The study's tables and its points' reports (what `fedsim report` shows, without
    writing into the study it reads)."""
    runs = [read_run(study.folder / p.name, study.folder) for p in study.points]
    targets = config_targets(runs) if targets is None else targets
    frames = [r.rounds.with_columns(point=pl.lit(p.name), **{a: pl.lit(v) for a, v in _axis_columns(p.values).items()})
              for r, p in zip(runs, study.points)]
    reports, rows = [], []
    for run, point in zip(runs, study.points):
        s = summarize_run(run, point.name, targets)
        reports.append({**s, "values": point.values})
        row = {"point": point.name, **_axis_columns(point.values), "status": s["status"],
               **{m: s[m] for m in METRICS}}
        for t in s["targets"]:
            row[f"time_to_{t['target']:g}_s"] = t["time_s"]
            row[f"rounds_to_{t['target']:g}"] = t["rounds"]
        rows.append(row)
    points = pl.DataFrame(rows, infer_schema_length=None)
    return StudyTables(pl.concat(frames, how="diagonal_relaxed"), summarize_points(points, study.group_axes),
                       reports, targets)


def study_report(study: Study, tables: StudyTables, summary: pl.DataFrame | None = None) -> dict:
    """`fedsim report STUDY --json`: a run report's shape (`targets`, and `runs`: each point's
    run report with its axis `values`) and `groups`: per row of `summary` (default: the
    study's), the group's axis `values`, `seeds`, `points`, and under the run report's keys
    (`final_acc`, ..., `targets`' `rounds` and `time_s`) their `{mean, std, ci95}` over the seeds
    that have a value (`targets`' `reached`: how many seeds reached the target)."""
    summary = tables.summary if summary is None else summary

    def stats(row: dict, column: str) -> dict:
        return {k: row.get(f"{column}_{k}") for k in ("mean", "std", "ci95")}

    groups = []
    for row in summary.iter_rows(named=True):
        mine = [r for r in tables.runs
                if all(_axis_columns(r["values"])[a] == row[a] for a in study.group_axes)]
        groups.append({"values": {a: mine[0]["values"][a] for a in study.group_axes},
                       "seeds": row["seeds"], "points": [r["name"] for r in mine],
                       **{m: stats(row, m) for m in METRICS},
                       "targets": [{"target": t, "reached": row.get(f"time_to_{t:g}_s_n"),
                                    "rounds": stats(row, f"rounds_to_{t:g}"),
                                    "time_s": stats(row, f"time_to_{t:g}_s")} for t in tables.targets]})
    return {"study": study.name, "folder": str(study.folder), "axes": study.group_axes,
            "targets": tables.targets, "groups": groups, "runs": tables.runs}


def summarize_points(points: pl.DataFrame, group_axes: list[str]) -> pl.DataFrame:
    """Per group of points (same values on `group_axes`): seeds, and for each metric its mean,
    std (n - 1) and the half-width of its 95 % CI (t quantile; null with one seed); for the
    rounds and time to a target also `_n`, the seeds that reached it (the others have none)."""
    metrics = [c for c in points.columns if c in METRICS or c.startswith(("time_to_", "rounds_to_"))]
    by = group_axes or [pl.lit("all").alias("group")]
    aggregations = [pl.len().alias("seeds")]
    for m in metrics:
        aggregations += [pl.col(m).mean().alias(f"{m}_mean"), pl.col(m).std().alias(f"{m}_std"),
                         pl.col(m).count().alias(f"{m}_n")]
    summary = points.group_by(by, maintain_order=True).agg(aggregations)
    for m in metrics:
        half = ci95(summary[f"{m}_std"], summary[f"{m}_n"])
        summary = summary.with_columns(pl.Series(f"{m}_ci95", half, dtype=pl.Float64))
        if m in METRICS:  # a target's count stays: the seeds that reached it
            summary = summary.drop(f"{m}_n")
    return summary


def best_by(summary: pl.DataFrame, metric: str, over: str, group_axes: list[str]) -> pl.DataFrame:
    """For each value of the other axes, the row whose mean `metric` is best over the values
    of axis `over` (losses and times: lowest; accuracies: highest) — the papers' "best
    learning rate per method". A time or rounds to a target: the row where most seeds reached
    it, then the lowest mean (the mean is over those seeds)."""
    column = f"{metric}_mean"
    if column not in summary.columns:
        known = sorted(c.removesuffix("_mean") for c in summary.columns if c.endswith("_mean"))
        target = re.fullmatch(r"time_to_(.+)_s|rounds_to_(.+)", metric)  # (a target not reported)
        close = did_you_mean(metric, known)
        hint = f"; add --target {target[1] or target[2]} to report it" if target else f"; {close}" if close else ""
        raise FedsimError(f"--best-by {metric!r}: not a metric of the summary (one of: {', '.join(known)}){hint}")
    if over == "run.seed":
        raise FedsimError(f"--over {over!r}: the seeds are what the study's means and intervals are over, not a "
                          f"setting to choose the best of; give one of its axes: {', '.join(group_axes) or 'none'}")
    if over not in group_axes:
        raise FedsimError(f"--over {over!r}: not an axis of the study (axes: {', '.join(group_axes) or 'none'})")
    lowest = metric.endswith("loss") or metric.startswith(("time_to_", "rounds_to_"))
    others = [a for a in group_axes if a != over]
    reached = f"{metric}_n"  # a target's: the seeds that reached it, whose mean it is
    if reached in summary.columns:  # more seeds reaching it first: a mean over the lucky one seed is no best
        ranked = summary.sort([reached, column], descending=[True, False], nulls_last=True)
    else:
        ranked = summary.sort(column, descending=not lowest, nulls_last=True)
    return ranked.group_by(others, maintain_order=True).first() if others else ranked.head(1)


def no_best_lines(best: pl.DataFrame, metric: str, over: str, group_axes: list[str]) -> list[str]:
    """A line for each row of `best_by` whose metric no value of `over` had (a target no seed
    reached): its row is not the best of anything."""
    others = [a for a in group_axes if a != over]
    why = "no seed reached the target" if metric.startswith(("time_to_", "rounds_to_")) else "every seed diverged"
    lines = []
    for row in best.filter(pl.col(f"{metric}_mean").is_null()).iter_rows(named=True):
        where = ", ".join(f"{a} = {row[a]}" for a in others)
        lines.append(f"--best-by {metric}: no value of {over} has it{f' for {where}' if where else ''} "
                     f"({why}), so its row above ({over} = {row[over]}) is not a best")
    return ["\n".join(lines)] if lines else []


def _pm(mean, ci, scale: float = 1.0, spec: str = ".2f") -> str:
    if mean is None:
        return "-"
    return f"{mean * scale:{spec}}" + (f" ± {ci * scale:{spec}}" if ci is not None else "")


def _target_pm(row: dict, column: str) -> str:
    """`4.22h ± 12.0min` (times, each in the unit its size calls for) or `26.1 ± 3.2` (rounds),
    `(2 of 3)` when some seeds never reached the target (the mean is over those that did),
    `never` when none did."""
    mean, ci, reached = row[f"{column}_mean"], row[f"{column}_ci95"], row.get(f"{column}_n")
    if mean is None:
        return "never" if reached == 0 else "-"
    shown = duration if column.startswith("time_to_") else (lambda rounds: f"{rounds:.1f}")
    text = shown(mean) + (f" ± {shown(ci)}" if ci is not None else "")
    return text + (f" ({reached} of {row['seeds']})" if reached is not None and reached < row["seeds"] else "")


def format_summary(study: Study, summary: pl.DataFrame | None = None) -> str:
    """The summary as a table: one row per group, mean ± 95 % CI over its seeds."""
    if summary is None:
        summary = pl.read_parquet(study.folder / "summary.parquet")
    targets = sorted({c.removeprefix("time_to_").removesuffix("_s_mean") for c in summary.columns
                      if c.startswith("time_to_") and c.endswith("_s_mean")}, key=float)
    columns = [(f"{kind} to {100 * float(t):g}%", f"{kind}_to_{t}{'_s' * (kind == 'time')}")
               for t in targets for kind in ("rounds", "time") if f"{kind}_to_{t}{'_s' * (kind == 'time')}_mean"
               in summary.columns]
    header = [*study.group_axes, "seeds", "final acc %", "best acc %", "final loss", *(h for h, _ in columns)]
    rows = []
    for r in summary.iter_rows(named=True):
        rows.append([*(str(r[a]) for a in study.group_axes), str(r["seeds"]),
                     _pm(r["final_acc_mean"], r["final_acc_ci95"], 100),
                     _pm(r["best_acc_mean"], r["best_acc_ci95"], 100),
                     _pm(r["final_loss_mean"], r["final_loss_ci95"], 1, ".4g"),
                     *(_target_pm(r, column) if r["best_acc_mean"] is not None else "-" for _, column in columns)])
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    return "\n".join(line.rstrip() for line in lines)


def unfinished_block(study: Study, runs: list[dict]) -> list[str]:
    """A line for the points that diverged (their final metrics are missing from their groups'
    means), and one for those that have not finished (interrupted, crashed or running: the
    table compares them where they stopped), with the command that finishes them."""
    diverged = [r["name"] for r in runs if r["status"] == "diverged"]
    lines = [f"diverged: {len(diverged)} of {len(runs)} points ({', '.join(diverged[:3])}"
             f"{', ...' if len(diverged) > 3 else ''}); a diverged point has no final accuracy or loss, so its "
             "group's means are over its other seeds ('-' where all diverged)"] if diverged else []
    left = [r for r in runs if r["status"] not in ("completed", "diverged")]
    if not left:
        return lines
    kinds = Counter(r["status"].split(" (")[0] for r in left)
    done = sorted(r["rounds"] for r in left)
    after = f"{done[0]}" if done[0] == done[-1] else f"{done[0]}-{done[-1]}"
    finish = ("the sweep running now finishes them" if set(kinds) == {"running"}
              else f"`{resume_command('sweep', study.folder)}` finishes them")
    return lines + [f"unfinished: {len(left)} of {len(runs)} points ({', '.join(f'{n} {k}' for k, n in kinds.items())}"
                     f", after {after} rounds), compared above where they stopped; {finish}"]
