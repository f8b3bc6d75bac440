"""`fedsim report`: the wall-clock questions asked of finished (or running) runs — when did each
reach a target accuracy, in rounds and in simulated time; how long were its rounds; who took
part — answered from run directories, as tables or as one JSON document.

The computations take polars frames (rounds.parquet, devices.parquet) so that they can be
checked on hand-made frames; `find_runs` reads the run directories and `report` combines them.
"""

from __future__ import annotations

import math
from typing import NamedTuple
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import polars as pl

from fedsim.config import read_toml
from fedsim.errors import FedsimError, first_line
from fedsim.files import plain_name, resume_command
from fedsim.results.latency import (PHASES, STRAGGLER_ARRIVED_BELOW, STRAGGLER_INVITED, close_reasons,
                                     events_kept, latency, participation_by, stragglers, wasted_work)
from fedsim.results.run_format import read_manifest
from fedsim.results.status import initial_evaluation, run_status


@dataclass(frozen=True)
class Hit:
    """When a run first reached a target: rounds completed and simulated seconds, both
    interpolated linearly (the same fraction of the way) when `interpolated`."""

    rounds: float
    time_s: float
    interpolated: bool


def finite(name: str) -> pl.Expr:
    """The column as floats, NaN and infinities (a diverged model's) read as missing."""
    col = pl.col(name).cast(pl.Float64)
    return pl.when(col.is_finite()).then(col).alias(name)


def metric_curve(rounds: pl.DataFrame, initial: dict | None = None, metric: str = "test_acc") -> pl.DataFrame:
    """The metric of the server's model over the run: `done` (rounds completed), `t` (simulated
    seconds) and `value`, at the initial model's evaluation (manifest "initial"), at every
    evaluation, and `held` at the end of the round after each evaluation.

    The model changes only when a round ends, so a value measured after round `a` holds until
    round a + 1 ends (through any wait for devices); a change seen at the next evaluation (after
    round b) was made by one of the rounds a + 1 .. b. Between those two points, (a + 1, its end)
    and (b, its end), the curve is linear: the rule of time to target, and of the plots."""
    rows = rounds.select(done=(pl.col("round") + 1).cast(pl.Float64), t=pl.col("t_end").cast(pl.Float64),
                         value=finite(metric))
    points = rows.drop_nulls("value")
    if initial and initial.get(metric) is not None:
        start = pl.DataFrame({"done": [0.0], "t": [float(initial.get("t") or 0.0)], "value": [float(initial[metric])]})
        points = pl.concat([start, points])
    held = points.select(pl.col("done") + 1, "value").join(rows.select("done", "t"), on="done").select(points.columns)
    # a held point and an evaluation after the same round: the held value comes first (a step)
    return (pl.concat([held.with_columns(held=pl.lit(True)), points.with_columns(held=pl.lit(False))])
            .sort(["done", "held"], descending=[False, True]))


def time_to_target(rounds: pl.DataFrame, target: float, initial: dict | None = None) -> Hit | None:
    """The first crossing of `target` by the accuracy curve (`metric_curve`; None: never
    reached): linear between its two points around the crossing, on rounds and on time alike.
    It is exact where no round lies between the curve's points (an evaluation after every
    round, or one equal to the target) and at the curve's first point (without an initial
    evaluation, a target met at the first evaluation is reported there: nothing earlier is
    known); never before the end of the first round, unless the initial model met it."""
    curve = metric_curve(rounds, initial)
    acc = curve["value"].to_numpy()
    reached = np.flatnonzero(acc >= target)
    if not len(reached):
        return None
    i = int(reached[0])
    done, t = curve["done"].to_numpy(), curve["t"].to_numpy()
    frac = 1.0 if i == 0 else (target - acc[i - 1]) / (acc[i] - acc[i - 1])
    if frac == 1.0 or done[i - 1] == done[i]:
        return Hit(float(done[i]), float(t[i]), False)
    return Hit(float(done[i - 1] + frac * (done[i] - done[i - 1])),
               float(t[i - 1] + frac * (t[i] - t[i - 1])), True)


def waiting(rounds: pl.DataFrame) -> dict:
    """Simulated seconds until the first round ended (the first time the server could change
    the model: an accuracy before it is the initial model's) and spent waiting for devices to
    come online: before a round started (idle between rounds) and within it (`wait_s`:
    `min_selected`). Null for a run without rounds."""
    if not len(rounds):
        return {"first_update_s": None, "waiting_s": None}
    idle = rounds.select((pl.col("t_start") - pl.col("t_end").shift(1, fill_value=0.0)).clip(lower_bound=0.0).sum())
    within = rounds["wait_s"].fill_null(0.0).sum() if "wait_s" in rounds.columns else 0.0
    return {"first_update_s": float(rounds["t_end"][0]), "waiting_s": float(idle.item()) + float(within)}


def round_durations(rounds: pl.DataFrame) -> dict:
    """Median and 90th percentile (linear between rounds) of the rounds' simulated seconds;
    null for a run without rounds. Older run directories have no `duration`: t_end - t_start."""
    durations = (rounds["duration"] if "duration" in rounds.columns
                 else rounds["t_end"] - rounds["t_start"]).to_numpy()
    if not len(durations):
        return {"median_s": None, "p90_s": None}
    median, p90 = np.percentile(durations, [50, 90])
    return {"median_s": float(median), "p90_s": float(p90)}


def t_quantile(df: int) -> float:
    """Student's t 0.975 quantile (two-sided 95 %) for `df` degrees of freedom."""
    table = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
             2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
             2.060, 2.056, 2.052, 2.048, 2.045, 2.042]
    if df <= len(table):
        return table[df - 1]
    z = 1.959964  # beyond: Cornish-Fisher's expansion about the normal quantile (to 1e-5 from 31 on)
    return (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3))


def ci95(stds, counts, single=None) -> list:
    """Half-widths of 95 % confidence intervals of means (Student's t): one per (std, count);
    `single` where there is one value (or no std)."""
    return [t_quantile(int(n) - 1) * s / math.sqrt(n) if n and n > 1 and s is not None else single
            for s, n in zip(stds, counts)]


def gini(values) -> float | None:
    """Gini coefficient of non-negative values (0: all equal; (n-1)/n: one holds everything);
    None when they sum to zero."""
    x = np.sort(np.asarray(values, dtype=float))
    n, total = len(x), x.sum()
    if total == 0:
        return None
    return float(2 * np.dot(np.arange(1, n + 1), x) / (n * total) - (n + 1) / n)


def variation(values) -> float | None:
    """Coefficient of variation (population standard deviation over the mean); None at mean 0."""
    x = np.asarray(values, dtype=float)
    return float(x.std() / x.mean()) if len(x) and x.mean() > 0 else None


def participation(rounds: pl.DataFrame, devices: pl.DataFrame) -> dict:
    """Invitations over the run and what became of them (fractions of the invited), and how
    evenly the arrivals spread over the devices. Older runs have no `surplus` column: 0."""
    counts = ["invited", "arrived", "dropped", "late"]
    totals = rounds.select([pl.col(c).sum() for c in counts]
                           + [(pl.col("surplus").sum() if "surplus" in rounds.columns
                               else pl.lit(0)).alias("surplus")]).row(0, named=True)
    invited = int(totals["invited"])
    arrivals = devices["arrivals"].to_numpy()
    return {
        "invited": invited,
        **{f"{c}_rate": (int(totals[c]) / invited if invited else None)
           for c in ["arrived", "dropped", "late", "surplus"]},
        "devices": len(arrivals), "devices_arrived": int((arrivals > 0).sum()),
        "arrivals_gini": gini(arrivals), "arrivals_cv": variation(arrivals),
    }


def sample_spread(devices: pl.DataFrame) -> dict | None:
    """Training samples per device (devices.parquet's n_samples): their spread, and arrivals by
    quarter of the devices ordered by size: whether the big or the small devices got in.
    None for runs written before fedsim recorded n_samples."""
    if "n_samples" not in devices.columns:
        return None
    n = devices["n_samples"].to_numpy()
    order = np.argsort(n, kind="stable")
    quarters = []
    for k, part in enumerate(np.array_split(order, 4)):
        if len(part):
            rows = devices[part]
            invited = int(rows["invitations"].sum())
            quarters.append({"quarter": k + 1, "devices": len(part), "min": int(n[part].min()), "max": int(n[part].max()),
                             "arrival_rate": int(rows["arrivals"].sum()) / invited if invited else None,
                             "mean_arrivals": float(rows["arrivals"].mean())})
    return {"total": int(n.sum()), "min": int(n.min()), "median": float(np.median(n)), "max": int(n.max()),
            "gini": gini(n), "cv": variation(n), "quarters": quarters}


def device_accuracy(devices: pl.DataFrame) -> dict | None:
    """How the final model does on each device's own test data (datasets with their own
    clients): the spread over the devices that have test samples, as LEAF reports it."""
    if "test_acc" not in devices.columns:
        return None
    acc = devices["test_acc"].drop_nans().drop_nulls().to_numpy()
    if not len(acc):
        return None
    p10, median, p90 = np.percentile(acc, [10, 50, 90])
    return {"devices": len(acc), "mean": float(acc.mean()), "p10": float(p10), "median": float(median),
            "p90": float(p90), "min": float(acc.min()), "max": float(acc.max())}


@dataclass
class Run:
    """One run directory as read from disk; `origin` is the run itself, or its comparison's
    folder (what tells two runs of one algorithm apart in a report)."""

    path: Path
    origin: Path
    algorithm: str
    manifest: dict
    config: dict
    rounds: pl.DataFrame
    devices: pl.DataFrame


ROUND_COLUMNS = ("round", "t_start", "t_end", "invited", "arrived", "dropped", "late", "test_loss",
                 "test_acc")


def _read_parquet(path: Path, columns: tuple[str, ...]) -> pl.DataFrame:
    """The table, which must have `columns` (a run directory of fedsim's has them all)."""
    try:
        frame = pl.read_parquet(path)
    except pl.exceptions.PolarsError as err:
        raise FedsimError(f"{path}: not a readable Parquet file ({first_line(err)}); "
                          "the run directory is damaged, run it again") from None
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise FedsimError(f"{path}: no column {', '.join(missing)}; this is not the table of a "
                          "fedsim run directory, pass the folder that `fedsim run` printed")
    return frame


def read_run(path: Path, origin: Path) -> Run:
    """A run directory; its manifest.json is missing while the run is going (or was aborted)."""
    manifest = read_manifest(path)
    initial_evaluation(path, manifest)  # checked before anything is told
    config = read_toml(path / "config.toml") if (path / "config.toml").exists() else {}
    return Run(path, origin, _algorithm(path, manifest, config), manifest, config,
               _read_parquet(path / "rounds.parquet", ROUND_COLUMNS),
               _read_parquet(path / "devices.parquet", ("arrivals",)))


def _algorithm(path: Path, manifest: dict, config: dict) -> str:
    return str(manifest.get("algorithm") or config.get("algorithm", {}).get("name") or path.name)


def _origin(path: Path) -> Path:
    """What tells two runs of one algorithm apart: the run, or its comparison's folder."""
    return path.parent if _is_comparison(path.parent) else path


def run_labels(paths: list[Path]) -> list[str]:
    """Each run directory's label in a report (`names`), from its manifest or config alone."""
    ids = []
    for path in paths:
        config = read_toml(path / "config.toml") if (path / "config.toml").exists() else {}
        ids.append(RunId(_algorithm(path, read_manifest(path, strict=False), config), _origin(path)))
    return names(ids)


class RunId(NamedTuple):
    algorithm: str
    origin: Path


def _is_run(path: Path) -> bool:
    return (path / "rounds.parquet").is_file() and (path / "devices.parquet").is_file()


def _is_comparison(path: Path) -> bool:
    """A comparison's folder: its own config.toml beside its algorithms' run directories."""
    return (path / "config.toml").is_file() and not _is_run(path)


def runs_under(folder: Path) -> tuple[list[Path], list[Path]]:
    """The run directories of `folder` (a run, a comparison, or a folder of runs and
    comparisons: `[run] out`), in name order, and the studies in it, which are reported alone.
    One line where it holds no run."""
    if not folder.is_dir():
        what = "a file, not a run's folder" if Path(folder).exists() else "no such folder"
        raise FedsimError(f"{folder}: {what}; pass the folder that `fedsim run` printed after 'results:'")
    if _is_run(folder):
        return [folder], []
    children = sorted(p for p in folder.iterdir() if p.is_dir())
    studies = [p for p in children if (p / "study.toml").is_file()]
    runs = [run for p in children if p not in studies
            for run in ([p] if _is_run(p) else sorted(c for c in p.iterdir() if c.is_dir() and _is_run(c)))]
    if not runs and studies:
        raise FedsimError(f"{folder}: holds studies only ({', '.join(p.name for p in studies[:5])}"
                          f"{', ...' if len(studies) > 5 else ''}), and a study is reported alone: give its folder, "
                          f"e.g. `fedsim report {studies[0].absolute()}`")
    if not runs:
        raise FedsimError(f"{folder}: not a run directory (no rounds.parquet and devices.parquet here or in its "
                          "sub-folders); pass the folder that `fedsim run` printed after 'results:'")
    return runs, studies


def find_runs(paths: list[Path]) -> tuple[list[Run], list[Path]]:
    """The runs under each path (`runs_under`), and the studies left out."""
    runs, studies = [], []
    for origin in paths:
        found, left_out = runs_under(origin)
        runs += [read_run(p, _origin(p)) for p in found]
        studies += left_out
    return runs, studies


def not_started(paths: list[Path]) -> list[tuple[Path, str]]:
    """(comparison folder, algorithm) of each algorithm a comparison under `paths` names that
    has no run yet (a comparison stopped before it)."""
    missing = []
    for folder in [q for p in paths for q in [p, *sorted(c for c in p.iterdir() if c.is_dir())]]:
        if _is_comparison(folder):
            algorithms = read_toml(folder / "config.toml").get("run", {}).get("algorithms", [])
            missing += [(folder, a) for a in algorithms if isinstance(a, str) and not _is_run(folder / plain_name(a))]
    return missing


def names(runs: list[Run] | list[RunId]) -> list[str]:
    """Each run's algorithm; where two runs share one, followed by the shortest tail of the
    folder given that tells them apart: `fedavg (a)`, `fedavg (b)`."""
    counts = Counter(r.algorithm for r in runs)
    labels = []
    for r in runs:
        if counts[r.algorithm] == 1:
            labels.append(r.algorithm)
            continue
        parts = r.origin.resolve().parts
        others = [o.origin.resolve().parts for o in runs if o.algorithm == r.algorithm]
        k = next((k for k in range(1, len(parts)) if [o[-k:] for o in others].count(parts[-k:]) == 1),
                 len(parts))
        labels.append(f"{r.algorithm} ({Path(*parts[-k:]).as_posix()})")
    return labels


def check_target(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise FedsimError(f"{where}: target accuracy {value!r} is not in (0, 1]; give a fraction "
                          "such as 0.8 (not a percentage)")
    return float(value)


def parse_targets(texts: list[str] | None) -> list[float] | None:
    """The --target values (repeated, or comma-separated), ascending; None when none given."""
    if not texts:
        return None
    values = []
    for text in texts:
        for part in text.split(","):
            try:
                value = float(part)
            except ValueError:
                raise FedsimError(f"--target {text!r}: {part.strip()!r} is not a number; give "
                                  "accuracies in (0, 1], e.g. --target 0.8 or --target 0.8,0.9") from None
            values.append(check_target(value, f"--target {text!r}"))
    return sorted(set(values))


def config_targets(runs: list[Run]) -> list[float]:
    """The `[run] targets` of the runs' config.toml files, together, ascending."""
    values = set()
    for r in runs:
        targets = r.config.get("run", {}).get("targets", [])
        where = f"{r.path / 'config.toml'}: [run] targets"
        if not isinstance(targets, list):
            raise FedsimError(f"{where} = {targets!r} is not a list; write e.g. targets = [0.8, 0.9]")
        values.update(check_target(t, where) for t in targets)
    return sorted(values)


def _best(frame: pl.DataFrame, column: str, best: str, initial: float | None) -> tuple[float | None, float | None]:
    """(final, best) of an evaluated metric; `best` is "max" or "min", over the evaluations from
    the initial model's on (as a time to target counts it, at 0 rounds)."""
    values = frame.select(finite(column)).drop_nulls()[column]
    final = float(values[-1]) if len(values) else None
    if initial is not None and math.isfinite(initial):
        values = pl.concat([pl.Series(column, [float(initial)]), values.cast(pl.Float64)])
    return final, float(getattr(values, best)()) if len(values) else None


def model_deadline(config: dict) -> float | None:
    """A run's `[server] deadline` where its tasks have durations (model timing), else None."""
    from fedsim.config import ServerConfig

    server = config.get("server", {})
    model = server.get("timing", ServerConfig.timing) == "model"
    return float(server.get("deadline", ServerConfig.deadline)) if model else None


def summarize_run(run: Run, name: str, targets: list[float]) -> dict:
    """The report of one run, with plain numbers (None where there is nothing to report)."""
    initial = run.manifest.get("initial") or {}
    final_acc, best_acc = _best(run.rounds, "test_acc", "max", initial.get("test_acc"))
    final_loss, best_loss = _best(run.rounds, "test_loss", "min", initial.get("test_loss"))
    t_end = run.rounds["t_end"]
    kept = events_kept(run.config)
    hits = [time_to_target(run.rounds, t, run.manifest.get("initial")) for t in targets]
    return {
        "name": name, "algorithm": run.algorithm, "run_dir": str(run.path),
        "status": run_status(run.path, run.manifest), "reason": run.manifest.get("reason"),
        "rounds": len(run.rounds),
        "sim_time_s": run.manifest.get("sim_time_s", float(t_end[-1]) if len(t_end) else 0.0),
        **waiting(run.rounds),
        "final_acc": final_acc, "best_acc": best_acc, "final_loss": final_loss, "best_loss": best_loss,
        "targets": [{"target": t, **(asdict(h) if h else dict.fromkeys(["rounds", "time_s", "interpolated"]))}
                    for t, h in zip(targets, hits)],
        "round_duration": round_durations(run.rounds),
        "participation": participation(run.rounds, run.devices),
        "events": kept,
        "latency": latency(run.path, kept) if model_deadline(run.config) is not None else None,  # (ideal: none)
        "close_reasons": close_reasons(run.rounds),
        "wasted": wasted_work(run.path, run.rounds, run.devices, kept),
        "stragglers": stragglers(run.path, run.devices, kept, deadline=model_deadline(run.config)),
        "participation_by": participation_by(run.devices),
        "samples": sample_spread(run.devices),
        "device_accuracy": device_accuracy(run.devices),
        "incomplete_outputs": run.manifest.get("incomplete_outputs") or [],
        "trainer": run.manifest.get("trainer"),
    }


def report(paths: list[Path], targets: list[float] | None = None) -> dict:
    """The report of the runs under `paths`; targets default to the runs' `[run] targets`."""
    runs, studies = find_runs([Path(p) for p in paths])
    targets = config_targets(runs) if targets is None else targets
    missing = not_started([Path(p) for p in paths])
    return {"targets": targets, "runs": [summarize_run(r, n, targets) for r, n in zip(runs, names(runs))],
            **({"studies_left_out": [str(p) for p in studies]} if studies else {}),
            **({"not_started": [{"comparison": str(f), "algorithm": a} for f, a in missing]} if missing else {})}


# -- text -------------------------------------------------------------------------------------
def percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def target_label(target: float) -> str:
    return f"{100 * target:g}%"


def duration(seconds: float | None) -> str:
    """Seconds in the unit their size calls for, with 3 significant digits: `0.0966s`, `14.5s`,
    `3.20min`, `4.22h`, `1250h` (every duration of the run and study reports)."""
    if seconds is None:
        return "-"
    value, unit = ((seconds, "s") if abs(seconds) < 60 else (seconds / 60, "min") if abs(seconds) < 3600
                   else (seconds / 3600, "h"))
    value = float(f"{value:.3g}")  # 9.996 -> 10.0, not 10.00
    if value == 0:
        return f"0{unit}"
    decimals = max(0, 2 - math.floor(math.log10(abs(value))))
    return f"{value:.{decimals}f}{unit}"


def hit_time(hit: Hit | None, measured: bool = True) -> str:
    """`~1.83h` (interpolated), `1.83h` (an evaluation), `never`, or `-` where no accuracy was
    `measured` (the quadratic task): nothing to reach."""
    if hit is None:
        return "never" if measured else "-"
    return ("~" if hit.interpolated else "") + duration(hit.time_s)


def _hit(entry: dict) -> Hit | None:
    """The Hit of a report's target entry (None: never reached)."""
    return None if entry["rounds"] is None else Hit(entry["rounds"], entry["time_s"], entry["interpolated"])


def hit_rounds(hit: Hit | None, measured: bool = True) -> str:
    if hit is None:
        return "never" if measured else "-"
    return f"~{hit.rounds:.1f}" if hit.interpolated else f"{hit.rounds:.0f}"


def _number(value: float | None, spec: str = ".4g") -> str:
    return "-" if value is None else format(value, spec)


def table_text(header: list[str], rows: list[list[str]]) -> str:
    """Columns as wide as their widest cell; the first left-aligned, the others right."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                      for i, (cell, w) in enumerate(zip(row, widths))) for row in [header, *rows]]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def format_report(doc: dict) -> str:
    """The report as tables: results, time to each target (when there are targets), rounds
    and participation."""
    runs = doc["runs"]
    blocks = [table_text(
        ["run", "status", "rounds", "sim time", "first update", "waited", "final acc", "best acc", "final loss",
         "best loss"],
        [[r["name"], r["status"], str(r["rounds"]), duration(r["sim_time_s"]), duration(r["first_update_s"]),
          duration(r["waiting_s"]), percent(r["final_acc"]),
          percent(r["best_acc"]), _number(r["final_loss"]), _number(r["best_loss"])] for r in runs])]
    if doc["targets"]:
        header = ["time to target"]
        for t in doc["targets"]:
            header += [f"{target_label(t)} rounds", f"{target_label(t)} time"]
        blocks.append(table_text(header, [
            [r["name"], *[cell for entry in r["targets"]
                          for cell in (hit_rounds(_hit(entry), measured), hit_time(_hit(entry), measured))]]
            for r in runs for measured in [r["best_acc"] is not None]]))
    blocks.append(table_text(
        ["participation", "median round", "p90 round", "invited", "arrived", "dropped",
         "late", "surplus", "devices arrived", "gini", "cv"],
        [[r["name"], duration(r["round_duration"]["median_s"]),
          duration(r["round_duration"]["p90_s"]), str(p["invited"]),
          percent(p["arrived_rate"]), percent(p["dropped_rate"]), percent(p["late_rate"]),
          percent(p["surplus_rate"]), f"{p['devices_arrived']} of {p['devices']}",
          _number(p["arrivals_gini"], ".3f"), _number(p["arrivals_cv"], ".3f")]
         for r in runs for p in [r["participation"]]]))
    return "\n\n".join(blocks + latency_blocks(runs) + trainer_block(runs) + incomplete_block(runs)
                       + studies_block(doc.get("studies_left_out", [])) + not_started_block(doc.get("not_started", [])))


def not_started_block(missing: list[dict]) -> list[str]:
    """A line per comparison some of whose algorithms have not run (it stopped before them)."""
    by: dict[str, list[str]] = {}
    for entry in missing:
        by.setdefault(entry["comparison"], []).append(entry["algorithm"])
    return ["\n".join(f"not started: {', '.join(left)} of {folder} (the comparison stopped before "
                      f"{'it' if len(left) == 1 else 'them'}): `{resume_command('run', Path(folder))}` runs "
                      f"{'it' if len(left) == 1 else 'them'}" for folder, left in by.items())] if by else []


def studies_block(studies: list[str]) -> list[str]:
    """A line naming the studies of the folder that the report left out (each reported alone)."""
    if not studies:
        return []
    return [f"not reported here: {len(studies)} stud{'y' if len(studies) == 1 else 'ies'} "
            f"({', '.join(Path(s).name for s in studies[:5])}{', ...' if len(studies) > 5 else ''}), each reported "
            f"alone: `fedsim report {Path(studies[0]).absolute()}`"]


def trainer_block(runs: list[dict]) -> list[str]:
    """A line per run: the trainer path and torch threads of most of its training calls, of how
    many, and why; none where no run recorded them (runs of earlier releases)."""
    lines = [f"trainer: {r['name']}: {trainer_line(r['trainer'])}" for r in runs if r.get("trainer")]
    return ["\n".join(lines)] if lines else []


def points_trainer_block(runs: list[dict]) -> list[str]:
    """A study's points by the trainer path and threads of most of their calls: a line each,
    with the reason of its first point (one line per point would bury the summary)."""
    groups: dict[str, list[dict]] = {}
    for r in runs:
        if r.get("trainer") and r["trainer"].get("calls"):
            groups.setdefault(_on(r["trainer"]["calls"][0]), []).append(r)
    return ["\n".join(f"trainer: {len(group)} of {len(runs)} points: {on} for most of their calls "
                      f"({group[0]['name']}: {group[0]['trainer']['why']})"
                      for on, group in groups.items())] if groups else []


def trainer_line(t: dict) -> str:
    """`batched on 1 thread with fedsim's kernels, 40 of 42 calls (auto: ...; [run] threads = ...);
    2 on loop on 1 thread`."""
    if not t.get("calls"):
        return "no training call recorded"
    total = sum(c["calls"] for c in t["calls"])
    since = f" since the resume at round {t['from_round']}" if t.get("from_round") else ""
    code = f" with {t['code']}" if t.get("code") else ""  # (runs of earlier releases: not recorded)
    main, *others = t["calls"]
    return (f"{_on(main)}{code}, {main['calls']} of {total} calls{since} ({main['why']})"
            + "".join(f"; {c['calls']} on {_on(c)}" for c in others))


def _on(call: dict) -> str:
    """`batched on 2 threads`, `loop in 2 one-thread parts side by side` (a GPU's calls: the path alone)."""
    n, parts = call["threads"], call.get("parts", 1)
    if parts > 1:
        return f"{call['path']} in {parts} one-thread parts side by side"
    return call["path"] + ("" if n is None else f" on {n} thread{'s' * (n != 1)}")


def completing_command(run_dir: Path) -> str:
    """What logs a run's missing rounds: its resume, or for a point of a study (which only its
    sweep writes to) the study's, which resumes such a point."""
    study = run_dir.absolute().parent
    if (study / "study.toml").is_file():
        return resume_command("sweep", study)
    return resume_command("run", run_dir)


def incomplete_block(runs: list[dict]) -> list[str]:
    """A line per output of a run that lacks rounds (a tracker that failed), with the command
    that logs them once the cause is fixed; none when every output is complete."""

    lines = [f"incomplete: {r['name']}: its events log ({o.get('path')}) lacks rows ({o.get('cause')}); they cannot be "
             "written again (its other files are complete)" if o.get("output") == "events" else
             f"incomplete: {r['name']}: its {o.get('output')} output ({o.get('path')}) lacks rounds ({o.get('cause')}); "
             f"rounds.parquet has them all: once that is fixed, `{completing_command(Path(r['run_dir']))}` logs them"
             for r in runs for o in r.get("incomplete_outputs", [])]
    return ["\n".join(lines)] if lines else []


SHOWN_STRAGGLERS = 10
NOT_KEPT = {  # what the report cannot show of a run whose events log kept less (`[run] events`)
    "failures": 'its events log keeps only the invitations that did not arrive ([run] events = "failures"): '
                "no latency of the tasks that ran to their end, no share of the work wasted, no task times of "
                "stragglers",
    "none": 'it kept no events log ([run] events = "none"): no latency of the tasks, no share of the work '
            "wasted, no task times of stragglers",
}


def latency_blocks(runs: list[dict]) -> list[str]:
    """Where the time went (phases, how rounds closed), the stragglers, participation by zone."""
    blocks = []
    timed = [r for r in runs if r.get("latency") and r["latency"]["tasks"]]
    if timed:
        header = ["latency (tasks run to their end)", "tasks"]
        for phase in PHASES:
            header += [f"{phase[:-2]} median", "p90"]
        blocks.append(table_text(header, [
            [r["name"], str(r["latency"]["tasks"]),
             *[duration(r["latency"][p][q]) for p in PHASES for q in ("median", "p90")]] for r in timed]))
    blocks += [f"{r['name']}: {NOT_KEPT[r['events']]}" for r in runs if r.get("events", "all") != "all"]
    closed = [r for r in runs if r.get("close_reasons")]
    if closed:
        reasons = [k for k in closed[0]["close_reasons"] if any(r["close_reasons"].get(k) for r in closed)]
        blocks.append(table_text(["rounds closed by", *reasons],
                                 [[r["name"], *[str(r["close_reasons"].get(k, 0)) for k in reasons]]
                                  for r in closed]))
    blocks += _wasted_blocks(runs)
    for r in runs:
        if r.get("stragglers") is not None:  # none is said too: a missing block reads as "not looked"
            blocks.append(_straggler_block(r["name"], r["stragglers"]))
    spread = [r for r in runs if r.get("samples")]
    if spread:
        blocks.append(table_text(["training samples per device", "total", "min", "median", "max", "gini", "cv"],
                                 [[r["name"], str(q["total"]), str(q["min"]), _number(q["median"]), str(q["max"]),
                                   _number(q["gini"], ".3f"), _number(q["cv"], ".3f")]
                                  for r in spread for q in [r["samples"]]]))
    judged = [r for r in runs if r.get("device_accuracy")]
    if judged:
        blocks.append(table_text(["final accuracy on each device's own test data", "devices", "mean", "p10",
                                  "median", "p90", "min", "max"],
                                 [[r["name"], str(a["devices"]), *(percent(a[k]) for k in ("mean", "p10", "median",
                                                                                         "p90", "min", "max"))]
                                  for r in judged for a in [r["device_accuracy"]]]))
    for r in spread:
        if r["samples"]["min"] < r["samples"]["max"]:
            blocks.append(table_text(
                [f"{r['name']} by size quarter", "devices", "samples", "arrived", "arrivals per device"],
                [[f"Q{q['quarter']}" + (" (smallest)" if q["quarter"] == 1 else " (largest)" if q["quarter"] == 4
                                        else ""), str(q["devices"]), f"{q['min']}-{q['max']}",
                  percent(q["arrival_rate"]), _number(q["mean_arrivals"], ".1f")] for q in r["samples"]["quarters"]]))
    for r in runs:
        by = r.get("participation_by")
        if by and len(by["rows"]) > 1:
            label = "UTC offset (h)" if by["column"] == "tz_offset" else by["column"]
            blocks.append(table_text(
                [f"{r['name']} by {label}", "devices", "invited", "arrived", "arrivals per device"],
                [[_zone(z["zone"], by["column"]), str(z["devices"]), str(z["invitations"]),
                  percent(z["arrival_rate"]), _number(z["mean_arrivals"], ".1f")] for z in by["rows"]]))
    return blocks


def _wasted_blocks(runs: list[dict]) -> list[str]:
    """Work whose update was never used (FLASH's and Oort's cost of drops, deadlines, over-commit)."""
    shown = [r for r in runs if r.get("wasted") and r["wasted"]["wasted_s"]]
    if not shown:
        return []
    blocks = [table_text(["wasted work (device-seconds not aggregated)", "total", "per round", "share of work"],
                         [[r["name"], duration(w["wasted_s"]), duration(w["per_round"]), percent(w["share"])]
                          for r in shown for w in [r["wasted"]]])]
    for r in shown:
        if len(r["wasted"]["rows"]) > 1:
            blocks.append(table_text([f"{r['name']} wasted by class", "device-seconds", "share of its work"],
                                     [[str(c["class"]), duration(c["wasted_s"]), percent(c["share"])]
                                      for c in r["wasted"]["rows"]]))
    return blocks


def _straggler_block(name: str, rows: list[dict]) -> str:
    shown = rows[:SHOWN_STRAGGLERS]
    more = f"; {len(rows) - len(shown)} more in --json" if len(rows) > len(shown) else ""
    head = (f"{name}: {len(rows)} straggler{'s' * (len(rows) != 1)} (invited >= {STRAGGLER_INVITED} times, "
            f"arrived < {100 * STRAGGLER_ARRIVED_BELOW:g} %){more}")
    if not rows:
        return head
    table = table_text(
        ["device", "class", "UTC offset", "invited", "arrived", "late", "dropped", "median compute", "median task",
         "likely cause"],
        [[str(d["device_id"]), d["class"] or "-", _zone(d["tz_offset"], "tz_offset") if d["tz_offset"] is not None
          else "-", str(d["invitations"]), str(d["arrivals"]), str(d["late"]), str(d["dropped"]),
          duration(d["median_compute_s"]), duration(d["median_task_s"]), d["cause"]] for d in shown])
    return head + "\n" + table


def _zone(value, column: str) -> str:
    return f"{value:+g}" if column == "tz_offset" else str(value)

