"""Plots of a run (and of several runs side by side): accuracy against rounds and sim time.

Tasks without an accuracy (the quadratic task) plot the test loss instead.

matplotlib is imported when a plot is drawn (it costs a few tenths of a second), and as a
bare ``Figure``, which draws with Agg without pyplot's global state or backend switch.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from fedsim.files import atomic_write


def _metric(frames: dict[str, pl.DataFrame]) -> tuple[str, str]:
    has_acc = any(df["test_acc"].drop_nulls().len() for df in frames.values())
    return ("test_acc", "test accuracy") if has_acc else ("test_loss", "test loss")


def plot_runs(frames: dict[str, pl.DataFrame], out_dir: Path, title: str = "") -> list[Path]:
    """One PNG per x-axis (rounds, simulated hours), one line per run. Returns the files.

    One figure serves both: only the lines' x data and the x label change between the two
    PNGs, and fixed margins replace a layout pass (together half of the drawing time)."""
    from matplotlib.figure import Figure

    metric, label = _metric(frames)
    fig = Figure(figsize=(6.4, 4.0), dpi=110)
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.12, top=0.92)
    ax = fig.subplots()
    points = {run: df.filter(pl.col(metric).is_not_null()) for run, df in frames.items()}
    lines = {run: ax.plot([], [], label=run, marker=".")[0] for run in frames}
    ax.set_ylabel(label)
    if metric == "test_loss":
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.set_title(title)
    if len(frames) > 1:
        ax.legend()
    written = []
    for x, xlabel, scale, name in (("round", "round", 1.0, "accuracy_vs_rounds"),
                                   ("t_end", "simulated time (h)", 3600.0, "accuracy_vs_time")):
        for run, line in lines.items():
            line.set_data(points[run][x].to_numpy() / scale, points[run][metric].to_numpy())
        ax.relim()
        ax.autoscale_view()
        ax.set_xlabel(xlabel)
        path = Path(out_dir) / f"{name}.png"
        atomic_write(path, lambda tmp: fig.savefig(tmp, format="png"))
        written.append(path)
    return written


def plot_dirs(runs: dict[str, Path], out_dir: Path, title: str = "") -> list[Path]:
    """The plots of the run directories `runs` (name -> directory), side by side."""
    frames = {name: pl.read_parquet(Path(run_dir) / "rounds.parquet") for name, run_dir in runs.items()}
    return plot_runs(frames, out_dir, title=title)


def draw_plots(plotter, runs: dict[str, Path], out_dir: Path, title: str) -> None:
    """The plots of `runs` (name -> run directory): by the plot worker (results/plot_worker.py)
    where there is one and it manages, here otherwise."""
    if plotter is None or not plotter.plot(runs, out_dir, title):
        plot_dirs(runs, out_dir, title)


def plot_run_dir(run_dir: Path) -> list[Path]:
    """(Re)draw the plots of a finished run directory, single or multi-algorithm."""
    run_dir = Path(run_dir)
    if (run_dir / "rounds.parquet").exists():
        runs = {run_dir.name: run_dir}
    else:
        runs = {p.parent.name: p.parent for p in sorted(run_dir.glob("*/rounds.parquet"))}
    if not runs:
        from fedsim.errors import FedsimError

        raise FedsimError(f"{run_dir}: no rounds.parquet here or in its sub-folders; pass a run directory")
    return plot_dirs(runs, run_dir / "plots", title=run_dir.name)
