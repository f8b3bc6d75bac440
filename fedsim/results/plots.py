"""Plots of a run (and of several runs side by side), into ``plots/`` of the run directory.

* ``accuracy_vs_rounds.png``, ``accuracy_vs_time.png``: test accuracy (%) and test loss (log
  scale) against rounds completed and hours since the start, from the initial model's evaluation
  on, each value held until the next round ends (the model changes only then: a wait for devices
  is flat), so that a line crosses a target where `fedsim report` says (with a clock-time axis on
  top when the trace has an origin); tasks without an accuracy show the loss only.
* ``round_duration_vs_time_of_day.png``: how long rounds take at each hour of the day.
* ``participation_<run>.png``: per round, who was online, invited, and what became of the
  invitations (arrived, dropped, late, surplus, stacked) over simulated time.
* ``participation_per_device.png``: devices by number of arrivals; arrivals against a device's
  training samples where they differ; mean arrivals per device
  by time zone or group when devices.parquet has one.
* ``latency_<run>.png``: the median download, compute and upload of a task over simulated time.
* ``arrival_rate_vs_speed.png``: each device's arrivals per invitation against its speed.

Under ideal timing (the papers' round model) a task takes no time and every round lasts
`round_duration`: simulated time is the round number scaled, so the plots by time, of round
durations, of latency and of speed would say nothing and are not drawn.
A plot whose columns a run directory lacks (written by an older fedsim) is skipped; the others
are drawn. matplotlib is imported when a plot is drawn (it costs a few tenths of a second), and
as a bare ``Figure``, which draws with Agg without pyplot's global state or backend switch;
fixed margins replace a layout pass (half of the drawing time).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import polars as pl

from fedsim.config import read_toml
from fedsim.errors import FedsimError
from fedsim.files import atomic_write, plain_name
from fedsim.results.latency import events_kept
from fedsim.results.run_format import read_manifest
from fedsim.results.status import initial_evaluation

DPI = 100
COUNTS = ("online", "invited", "arrived", "dropped", "late")
STACKED = ("arrived", "dropped", "late", "surplus")  # they add up to `invited`
GROUP_COLUMNS = {"tz_offset": "time zone (UTC offset, h)", "group": "device group"}


@dataclass
class RunData:
    """What the plots read from one run directory."""

    rounds: pl.DataFrame
    devices: pl.DataFrame | None  # None: no devices.parquet
    initial: dict | None  # the initial model's {"test_loss", "test_acc", "t"}
    origin: datetime | None  # the date-time of trace t = 0
    start: float  # simulated seconds at the run's start
    path: Path | None = None  # the run directory (events.parquet is read only by the plots of it)
    deadline: float | None = None  # [server] deadline under model timing
    timing: str = "model"  # [server] timing: "ideal" has no latency and rounds of one length
    events: str = "all"  # [run] events: the invitations events.parquet keeps


def _table(path: Path) -> pl.DataFrame:
    """A run's Parquet table; a damaged one (cut by a crash of an older fedsim, say) is one line."""
    try:
        return pl.read_parquet(path)
    except FileNotFoundError:
        raise
    except Exception as err:  # polars raises several kinds for a damaged file
        raise FedsimError(f"{path}: not a readable Parquet file ({type(err).__name__}); the run "
                          "directory is damaged: resume the run or run it again") from None


def load_run(run_dir: Path) -> RunData:
    """The tables and manifest entries of `run_dir`, with the defaults of columns added later."""
    run_dir = Path(run_dir)
    rounds = _table(run_dir / "rounds.parquet")
    if "surplus" not in rounds.columns:
        rounds = rounds.with_columns(surplus=pl.lit(0, pl.Int64))
    if "duration" not in rounds.columns and {"t_start", "t_end"} <= set(rounds.columns):
        rounds = rounds.with_columns(duration=pl.col("t_end") - pl.col("t_start"))
    devices_path = run_dir / "devices.parquet"
    devices = _table(devices_path) if devices_path.exists() else None
    manifest = read_manifest(run_dir)
    initial = initial_evaluation(run_dir, manifest)
    origin = (manifest.get("trace") or {}).get("origin")
    if origin is not None:
        try:
            origin = datetime.fromisoformat(origin)
        except (TypeError, ValueError):
            raise FedsimError(f"{run_dir / 'manifest.json'}: trace.origin = {origin!r} is not an ISO 8601 "
                              f"date-time; write one such as '2024-01-01T00:00:00+00:00', or null") from None
    start = (initial or {}).get("t")
    if start is None:
        start = rounds["t_start"][0] if "t_start" in rounds.columns and rounds.height else 0.0
    config = read_toml(run_dir / "config.toml") if (run_dir / "config.toml").exists() else {}
    server = config.get("server", {})
    timing = server.get("timing", "model")
    deadline = server.get("deadline") if timing == "model" else None
    return RunData(rounds, devices, initial, origin, float(start), run_dir, deadline, timing,
                   events_kept(config))


def _figure(width: float = 6.4, height: float = 4.0, rows: int = 1, cols: int = 1, *, top: float = 0.9,
            left: float = 0.11, bottom: float = 0.12, right: float = 0.97, title: str = "",
            sharex: bool | None = None, hspace: float = 0.12):
    """A Figure with a `rows` x `cols` grid of axes (a flat list) and fixed margins; the rows
    of one column share their x axis unless `sharex` says otherwise."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI)
    fig.subplots_adjust(left=left, right=right, bottom=bottom, top=top, hspace=hspace, wspace=0.25)
    axes = fig.subplots(rows, cols, sharex=cols == 1 if sharex is None else sharex,
                        squeeze=False).ravel().tolist()
    fig.suptitle(title)
    for ax in axes:
        ax.grid(alpha=0.3)
    return fig, axes


def _hours(run: RunData, seconds) -> np.ndarray:
    return (np.asarray(seconds, dtype=np.float64) - run.start) / 3600.0


def _clock(runs: dict[str, RunData], same_start: bool = True) -> tuple[datetime, float, str] | None:
    """The runs' clock: midnight of their origin's day, the clock hours from it to trace t = 0,
    and the zone's name. None where a run has no origin, or the runs' origins (or, for an axis
    of hours since the start, their starts) differ: one clock would be wrong for some."""
    if len({(run.origin, run.start if same_start else 0.0) for run in runs.values()}) != 1:
        return None
    origin = next(iter(runs.values())).origin
    if origin is None:
        return None
    midnight = origin.replace(hour=0, minute=0, second=0, microsecond=0)
    return midnight, (origin - midnight).total_seconds() / 3600.0, origin.tzname() or "trace's local time"


def _metric_curves(runs: dict[str, RunData], metric: str, x: str):
    """Per run: x (rounds completed, or hours since the start), y and the positions of the
    evaluations on the metric's curve (report.metric_curve: the initial evaluation first, each
    value held until the next round ends, so a line crosses a target where `fedsim report`
    says); accuracy in percent."""
    from fedsim.results.report import metric_curve

    scale = 100.0 if metric == "test_acc" else 1.0
    curves = {}
    for name, run in runs.items():
        curve = metric_curve(run.rounds, run.initial, metric)
        xs = curve["done"].to_numpy() if x == "rounds" else _hours(run, curve["t"])
        curves[name] = xs, curve["value"].to_numpy() * scale, np.flatnonzero(~curve["held"].to_numpy())
    return curves


def _metric_figure(runs: dict[str, RunData], title: str, x: str):
    """Test accuracy (%, when the task has one) over test loss, against `x`."""
    metrics = [m for m in ("test_acc", "test_loss")
               if any(run.rounds[m].drop_nulls().len() for run in runs.values())] or ["test_loss"]
    clock = _clock(runs) if x == "hours" else None
    fig, axes = _figure(height=2.2 + 2.0 * len(metrics), rows=len(metrics),
                        top=0.84 if clock else 0.9, bottom=0.08 + 0.04 / len(metrics), title=title)
    for ax, metric in zip(axes, metrics):
        for k, (name, (xs, ys, evaluated)) in enumerate(_metric_curves(runs, metric, x).items()):
            ax.plot(xs, ys, marker=MARKERS[k % len(MARKERS)], markevery=evaluated.tolist(), label=name,
                    ls=LINESTYLES[k % len(LINESTYLES)])  # (curves that coincide stay visible)
        if metric == "test_acc":
            ax.set_ylim(0, 100)
            ax.set_ylabel("test accuracy (%)")
        else:
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(_plain_log())
            ax.yaxis.set_minor_formatter(_plain_log(labelOnlyBase=False))
            ax.set_ylabel("test loss (log scale)")
    axes[0].legend(loc="lower right" if metrics[0] == "test_acc" else "upper right")
    axes[-1].set_xlim(left=0)
    if x == "rounds":
        axes[-1].set_xlabel("rounds completed")
    else:
        _time_axis(axes[-1])
    if clock:
        _clock_axis(axes[0], clock, next(iter(runs.values())).start)
    return fig


def _time_axis(ax, label: str = "simulated time since the start") -> None:
    """`ax`'s x, in hours, labelled in the unit that reads best for its span: seconds below
    two minutes, minutes below two hours (a short run's 57 s is not 0.016 h), with ticks at
    the clock's round steps."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator, MultipleLocator

    span = max(ax.get_xlim()[1] - ax.get_xlim()[0], 1e-9)
    size, unit = (1 / 3600, "s") if span < 2 / 60 else (1 / 60, "min") if span < 2 else (1.0, "h")
    if span * 3600 < 4:  # under the clock's finest step (1 s): matplotlib's round steps of seconds
        ticks = MaxNLocator(6).tick_values(0.0, span * 3600)
        step = (ticks[1] - ticks[0]) / 3600
    else:
        step = clock_step(span)
    ax.xaxis.set_major_locator(MultipleLocator(step))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x / size:.6g}"))
    ax.set_xlabel(f"{label} ({unit})")


def _plain_log(**options):
    """matplotlib's choice of which ticks of a log axis get a label, as plain numbers: its
    default "2 x 10^0" goes through mathtext, which was a third of drawing the figure."""
    from matplotlib.ticker import LogFormatter

    class PlainLog(LogFormatter):
        def __call__(self, x, pos=None):
            return f"{x:.3g}" if super().__call__(x, pos) else ""

    return PlainLog(**options)


# Clock tick steps in hours, fine to coarse: 1 s up to 12 h; whole days beyond
CLOCK_STEPS = tuple(s / 3600 for s in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800,
                                        3600, 7200, 10800, 21600, 43200))
MAX_CLOCK_TICKS = 8  # of five characters (12:30); five of eight or nine (12:30:15, Mon 12:30)


def clock_step(span_h: float, ticks: int = MAX_CLOCK_TICKS) -> float:
    """The clock tick step (hours) for an axis `span_h` hours long: the finest of CLOCK_STEPS
    (or whole days) with at most `ticks` ticks; consecutive steps differ by at most 2.5x, so
    at least two ticks fall on any span of a few seconds or more."""
    return next((s for s in CLOCK_STEPS if span_h / s <= ticks), 24.0 * math.ceil(span_h / 24 / ticks))


def clock_format(span_h: float, step_h: float) -> str:
    """strftime of the clock labels: the weekday beyond a day, the seconds below a minute's step."""
    return ("%a " if span_h > 24 else "") + ("%H:%M:%S" if step_h < 1 / 60 else "%H:%M")


def clock_ticks(span_h: float) -> tuple[float, str]:
    """The step (hours) and strftime of the clock ticks of an axis `span_h` hours long, as
    many as their labels leave room for."""
    step = clock_step(span_h)
    if len(clock_format(span_h, step)) > len("%H:%M"):
        step = clock_step(span_h, 5)
    return step, clock_format(span_h, step)


def _clock_axis(ax, clock: tuple[datetime, float, str], start: float) -> None:
    """Clock time on top of `ax`, whose x is hours since the start (trace time `start`)."""
    from matplotlib.ticker import FuncFormatter, MultipleLocator

    midnight, at_zero, zone = clock
    shift = at_zero + start / 3600.0  # the clock hours at x = 0
    top = ax.secondary_xaxis("top", functions=(lambda h: h + shift, lambda c: c - shift))
    span = max(ax.get_xlim()[1] - ax.get_xlim()[0], 1e-9)
    step, form = clock_ticks(span)
    top.xaxis.set_major_locator(MultipleLocator(step))
    top.xaxis.set_major_formatter(FuncFormatter(
        lambda c, _: (midnight + timedelta(seconds=round(c * 3600))).strftime(form)))
    top.set_xlabel(f"clock time ({zone})")


SI_PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def si_number(x: float) -> str:
    """A tick label: 3 significant digits with an SI prefix from a thousand up (`20G`, `1.5k`)."""
    scale, prefix = next(((v, p) for v, p in SI_PREFIXES if abs(x) >= v), (1.0, ""))
    return f"{x / scale:.3g}{prefix}"


def log_subs(decades: float) -> tuple[float, ...] | None:
    """Which multiples of each power of ten a log axis spanning `decades` labels: more of them
    on a short axis, powers of ten only on a long one; None under a third of a decade, where
    evenly spaced ticks read better. matplotlib's default labels minor ticks in scientific
    notation, whose labels ran into each other on an axis of one to two decades."""
    if decades < 1 / 3:
        return None
    return (1.0, 2.0, 3.0, 5.0) if decades < 0.8 else (1.0, 2.0, 5.0) if decades < 2.5 else (1.0,)


def _log_ticks(axis) -> None:
    """Labelled ticks of a log `axis` (its limits set) that cannot overlap, as plain numbers:
    the labelled multiples of `log_subs`, unlabelled minor ticks between."""
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

    low, high = sorted(axis.get_view_interval())
    subs = log_subs(math.log10(high / low) if low > 0 else math.inf)
    axis.set_major_locator(MaxNLocator(5, steps=[1, 2, 5, 10]) if subs is None else LogLocator(subs=subs, numticks=9))
    axis.set_major_formatter(FuncFormatter(lambda x, _: si_number(x)))
    axis.set_minor_formatter(NullFormatter())


def _duration_figure(runs: dict[str, RunData], title: str):
    """Round duration against the time of day at which the round started, one series per run."""
    clock = _clock(runs, same_start=False)
    fig, (ax,) = _figure(title=title)
    same = _same_series(runs, lambda run: (run.rounds["t_start"].to_numpy(), run.rounds["duration"].to_numpy()))
    for k, (name, run) in enumerate(same.items()):
        t = run.rounds["t_start"].to_numpy()
        hours = t / 3600.0 + clock[1] if clock else _hours(run, t)
        ax.plot(hours % 24.0, run.rounds["duration"].to_numpy(), ls="", marker=MARKERS[k % len(MARKERS)], ms=4,
                alpha=0.6, label=name)
    longest = max((run.rounds["duration"].max() or 0.0 for run in runs.values()), default=0.0)
    ax.set_xlim(0, 24)
    ax.set_xticks(range(0, 25, 3))
    ax.set_ylim(0, 1.08 * longest or 1.0)
    ax.set_xlabel(f"time of day at the round's start (h, {clock[2]})" if clock
                  else "hours since the start, modulo 24 (" + ("the runs' clock origins differ)"
                                                                    if any(r.origin for r in runs.values())
                                                                    else "the trace has no clock origin)"))
    ax.set_ylabel("round duration (s)")
    ax.legend(loc="upper right")
    return fig


def _steps(run: RunData, values) -> tuple[np.ndarray, np.ndarray]:
    """x (hours) and y of a per-round value held over each round's span."""
    x = np.column_stack([_hours(run, run.rounds["t_start"]), _hours(run, run.rounds["t_end"])])
    return x.ravel(), np.repeat(np.asarray(values, dtype=np.float64), 2)


def _participation_figure(run: RunData, title: str):
    """Per round: online and invited devices (lines) and the fates of the invitations (stacked).
    Where the online devices outnumber the invited ten to one (a large population, a small
    cohort), the online line has an axis of its own on the right, so the cohort stays readable."""
    online, invited = run.rounds["online"], run.rounds["invited"]
    apart = float(online.max() or 0) > 10 * max(float(invited.max() or 0), 1.0)
    fig, (ax,) = _figure(8.4 if apart else 7.2, 4.0, left=0.08 if apart else 0.09, right=0.72 if apart else 0.84,
                         title=title)
    bottom = np.zeros(2 * run.rounds.height)
    for column in STACKED:
        x, y = _steps(run, run.rounds[column])
        ax.fill_between(x, bottom, bottom + y, lw=0, alpha=0.8, label=column)
        bottom = bottom + y
    on = ax.twinx() if apart else ax
    on.plot(*_steps(run, online), ls="-", color="0.45" if apart else "black", lw=1,
            label="online (right axis)" if apart else "online")
    ax.plot(*_steps(run, invited), ls="--", color="black", lw=1, label="invited")
    for axis in {ax, on}:
        axis.set_ylim(bottom=0)
    ax.set_xlim(left=0)
    _time_axis(ax)
    ax.set_ylabel("devices per round (invited)" if apart else "devices per round")
    handles = [h for axis in dict.fromkeys((ax, on)) for h in axis.get_legend_handles_labels()[0]]
    if apart:
        on.set_ylabel("devices online")
    ax.legend(handles=handles, loc="center left", bbox_to_anchor=(1.15 if apart else 1.0, 0.5), fontsize="small")
    return fig


def _device_figure(runs: dict[str, RunData], title: str):
    """Number of devices by arrivals; mean arrivals per device by time zone / group; and each
    device's arrivals against its training samples where their numbers differ (a natural
    partition's size skew, or a skewed synthetic one)."""
    group = next((c for c in GROUP_COLUMNS if all(c in run.devices.columns for run in runs.values())),
                 None)
    skewed = all("n_samples" in run.devices.columns and run.devices["n_samples"].n_unique() > 1
                 for run in runs.values())
    cols = 1 + bool(group) + skewed
    fig, axes = _figure(6.4 if cols == 1 else 4.8 * cols, 4.0, cols=cols,
                        left=0.11 if cols == 1 else 0.15 / cols, title=title)
    same = _same_series(runs, lambda run: run.devices["arrivals"].to_numpy())
    arrivals = {name: run.devices["arrivals"].to_numpy() for name, run in same.items()}
    most = max(int(a.max(initial=0)) for a in arrivals.values())
    width = max(1, math.ceil((most + 1) / 40))  # whole numbers of arrivals per bin, at most ~40 bins
    edges = np.arange(most // width + 2) * width - 0.5
    for k, (name, a) in enumerate(arrivals.items()):
        axes[0].stairs(np.bincount(a // width, minlength=len(edges) - 1), edges, label=name, lw=1.5,
                       ls=LINESTYLES[k % len(LINESTYLES)])
    axes[0].set_xlabel("arrivals per device (rounds it took part in)")
    axes[0].set_ylabel("devices")
    axes[0].yaxis.get_major_locator().set_params(integer=True)
    axes[0].legend(loc="best")
    if group:
        ax = axes[1]
        means = {name: run.devices.drop_nulls(group).group_by(group).agg(pl.col("arrivals").mean())
                 .sort(group) for name, run in same.items()}  # (equal arrivals: one bar, named by both)
        keys = np.unique(np.concatenate([m[group].to_numpy() for m in means.values()]))
        bar = 0.8 / len(means)
        for i, (name, m) in enumerate(means.items()):
            at = np.searchsorted(keys, m[group].to_numpy()) + (i - (len(means) - 1) / 2) * bar
            ax.bar(at, m["arrivals"].to_numpy(), width=bar, label=name)
        ax.set_xticks(range(len(keys)), [f"{k:+g}" if group == "tz_offset" else f"{k:g}" for k in keys])
        ax.set_xlabel(GROUP_COLUMNS[group])
        ax.set_ylabel("mean arrivals per device")
        ax.legend(loc="best")
    if skewed:
        ax = axes[-1]
        for k, (name, run) in enumerate(same.items()):
            ax.scatter(run.devices["n_samples"].to_numpy(), run.devices["arrivals"].to_numpy(), s=12,
                       alpha=0.6, marker=MARKERS[k % len(MARKERS)], label=name)
        ax.set_xscale("log")
        _log_ticks(ax.xaxis)
        ax.set_xlabel("training samples on the device")
        ax.set_ylabel("arrivals")
        ax.legend(loc="best")
    return fig


PHASE_LABELS = {"download_s": "download", "compute_s": "compute", "upload_s": "upload"}
MAX_BINS = 300  # a long run's phases are medians over bins of simulated time


def _latency_figure(run: RunData, title: str):
    """The median phases of the tasks that ran to their end, stacked, over simulated time
    (per round, or per bin of a long run), with the deadline."""
    from fedsim.results.latency import collect

    events = collect(pl.scan_parquet(run.path / "events.parquet")
                     .filter(pl.col("outcome").cast(pl.String).is_in(["arrived", "late", "surplus"]))
                     .select("invited_at", *PHASE_LABELS), run.path)
    t = _hours(run, events["invited_at"])
    edges = np.unique(t) if len(np.unique(t)) <= MAX_BINS else np.linspace(t.min(), t.max(), MAX_BINS + 1)
    which = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, len(edges) - 1)
    medians = (events.with_columns(bin=pl.Series(which)).group_by("bin")
               .agg([pl.col(c).median() for c in PHASE_LABELS]).sort("bin"))
    x = edges[medians["bin"].to_numpy()]
    fig, (ax,) = _figure(7.6, 4.0, left=0.09, right=0.76, title=title)
    ax.stackplot(x, *[medians[c].to_numpy() for c in PHASE_LABELS], labels=list(PHASE_LABELS.values()),
                 step="post", alpha=0.85)
    top = float(np.max(medians.select(pl.sum_horizontal(list(PHASE_LABELS))).to_numpy(), initial=0.0))
    drawn = run.rounds.drop_nulls("deadline") if "deadline" in run.rounds.columns else run.rounds.clear()
    varies = drawn["deadline"].n_unique() > 1 if len(drawn) else False  # [server] deadline_sigma
    highest = float(drawn["deadline"].max()) if varies else run.deadline
    shown = run.deadline is not None and run.deadline <= 3 * top
    if shown and varies:  # each round's own draw, from its start
        ax.step(_hours(run, drawn["t_start"]), drawn["deadline"].to_numpy(), where="post", color="black", ls="--",
                lw=1, label=f"deadline, drawn\nper round\n(around {run.deadline:g} s)")
    elif shown:
        ax.axhline(run.deadline, color="black", ls="--", lw=1, label=f"deadline ({run.deadline:g} s)")
    elif run.deadline is not None:  # far above the tasks: said, not drawn
        ax.plot([], [], color="black", ls="--", lw=1, label=f"deadline {run.deadline:g} s\n(off the scale)")
    ax.set_ylim(0, 1.1 * max(top, highest) if shown else 1.15 * max(top, 1e-9))
    ax.set_xlim(left=0)
    _time_axis(ax)
    ax.set_ylabel("median seconds of a task" + (" (per round)" if len(edges) == len(np.unique(t)) else ""))
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small")
    return fig


def _speed_figure(runs: dict[str, RunData], title: str):
    """Each device's arrival rate (arrivals / invitations) against its speed (training FLOP/s,
    or 1 / seconds per sample), coloured by class; one panel per run."""
    width = 4.2 * len(runs) + 2.2
    fig, axes = _figure(width, 4.2, cols=len(runs), left=0.8 / width, right=1 - 1.6 / width, top=0.84,
                        sharex=True, title=title)
    for ax, (name, run) in zip(axes, runs.items()):
        devices = run.devices.filter(pl.col("invitations") > 0)
        by_flops = "flops" in devices.columns
        speed = devices["flops"] if by_flops else 1.0 / devices["seconds_per_sample"]
        rate = (devices["arrivals"] / devices["invitations"]).to_numpy()
        classes = devices["class"].to_numpy() if "class" in devices.columns else np.full(devices.height, "devices")
        for label in np.unique(classes):
            mine = classes == label
            ax.scatter(speed.to_numpy()[mine], 100 * rate[mine], s=14, alpha=0.7, label=str(label))
        ax.set_xscale("log")
        ax.set_ylim(-5, 105)
        ax.set_title(name, fontsize="medium")
        ax.set_xlabel("training FLOP/s" if by_flops else "samples per second (1 / seconds_per_sample)")
    _log_ticks(axes[0].xaxis)  # the panels share it
    axes[0].set_ylabel("arrivals (% of invitations)")
    axes[-1].legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small")
    return fig


MARKERS = (".", "x", "+", "1", "2")
LINESTYLES = ("-", "--", ":", "-.")


def _same_series(runs: dict[str, RunData], values) -> dict[str, RunData]:
    """The runs with one entry per distinct series (`values(run)`): runs whose series are equal
    share one, labelled with all their names (`fedavg = mifa`), so none hides under another."""
    groups: list[tuple[list[str], RunData, object]] = []
    for name, run in runs.items():
        mine = values(run)
        for names, _, theirs in groups:
            if _equal(mine, theirs):
                names.append(name)
                break
        else:
            groups.append(([name], run, mine))
    return {" = ".join(names): run for names, run, _ in groups}


def _equal(a, b) -> bool:
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=True))


def _has(runs: dict[str, RunData], *columns: str) -> bool:
    return all(set(columns) <= set(run.rounds.columns) for run in runs.values())


def build_figures(runs: dict[str, RunData], title: str = "") -> dict[str, object]:
    """The figures of `runs` (name -> RunData), by file name without ``.png``; not saved.

    A figure whose columns some run lacks is left out, and so are those that ideal timing
    leaves without meaning."""
    head = f"{title}: " if title else ""
    timed = any(run.timing != "ideal" for run in runs.values())
    figures = {"accuracy_vs_rounds": _metric_figure(runs, f"{head}test metrics by round", "rounds")}
    if timed and _has(runs, "t_end"):
        figures["accuracy_vs_time"] = _metric_figure(runs, f"{head}test metrics by simulated time", "hours")
    if timed and _has(runs, "t_start", "duration"):
        figures["round_duration_vs_time_of_day"] = _duration_figure(
            runs, f"{head}round duration by time of day")
    if _has(runs, "t_start", "t_end", *COUNTS, *STACKED):
        for name, run in runs.items():
            figures[f"participation_{name}"] = _participation_figure(run, f"{head}devices per round ({name})")
    if all(run.devices is not None for run in runs.values()):
        figures["participation_per_device"] = _device_figure(runs, f"{head}participation per device")
    for name, run in runs.items():
        if run.timing != "ideal" and run.events == "all" and run.path is not None \
                and (run.path / "events.parquet").is_file():  # (the tasks that arrived are in all only)
            figures[f"latency_{name}"] = _latency_figure(run, f"{head}where a task's time goes ({name})")
    if timed and all(run.devices is not None and {"invitations", "arrivals"} <= set(run.devices.columns)
           and ({"flops"} <= set(run.devices.columns) or "seconds_per_sample" in run.devices.columns)
           for run in runs.values()):
        figures["arrival_rate_vs_speed"] = _speed_figure(runs, f"{head}arrivals by device speed")
    return figures


def plot_dirs(runs: dict[str, Path], out_dir: Path, title: str = "") -> list[Path]:
    """Draw the plots of the run directories `runs` (name -> directory) into `out_dir`."""
    figures = build_figures({name: load_run(run_dir) for name, run_dir in runs.items()}, title)
    written = []
    for name, fig in figures.items():
        path = Path(out_dir) / f"{re.sub(r'[.]+', '.', plain_name(name)).strip('.')}.png"  # `fedavg (a)`: fedavg.a
        # zlib level 1: a third faster than the default to write, files 10 % larger
        atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", pil_kwargs={"compress_level": 1}))
        written.append(path)
    return written


def draw_plots(plotter, runs: dict[str, Path], out_dir: Path, title: str) -> None:
    """The plots of `runs` (name -> run directory): by the plot worker (results/plot_worker.py)
    where there is one and it manages, here otherwise."""
    if plotter is None or not plotter.plot(runs, out_dir, title):
        plot_dirs(runs, out_dir, title)


def plot_run_dir(run_dir: Path) -> tuple[list[Path], list[Path]]:
    """(Re)draw the plots of a run, a comparison, or a folder of runs and comparisons, each run
    labelled as the report labels it (by algorithm); the files, and the studies left out (each
    drawn alone: `fedsim plot STUDY`)."""
    from fedsim.results.report import run_labels, runs_under

    run_dir = Path(run_dir)
    runs, studies = runs_under(run_dir)
    return plot_dirs(dict(zip(run_labels(runs), runs)), run_dir / "plots", title=run_dir.name), studies


def study_bands(study: pl.DataFrame, group_axes: list[str], x: str, metric: str = "test_acc",
                initial: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per group and evaluated round: x (rounds completed, or the mean over the seeds of
    "t_end"), the mean of `metric` over the seeds and the half-width of its 95 % CI (t
    quantile; 0 with one seed), from the initial evaluation (`initial`: rows of round -1 at
    the initial time) on; and, `held`, each evaluation's values at the end of the next round
    (the model changes only then: report.metric_curve's rule). Seeds are matched by round:
    under model timing their rounds end at different times, and a group's curve ends where its
    first seed ended (under max_time the seeds run different numbers of rounds: a mean over the
    seeds still running would step back in time and change meaning along the curve)."""
    from fedsim.results.report import ci95

    keys = group_axes or [pl.lit("all").alias("group")]
    points = study.filter(pl.col(metric).is_not_null())
    if initial is not None and initial.height:
        points = pl.concat([initial.select(points.columns), points], how="vertical_relaxed")
    held = (points.select(pl.exclude("t_end", "round"), pl.col("round") + 1)
            .join(study.select("point", "round", "t_end"), on=["point", "round"]).select(points.columns))
    points = pl.concat([held.with_columns(held=pl.lit(True)), points.with_columns(held=pl.lit(False))])
    bands = points.group_by([*keys, "round", "held"], maintain_order=True).agg(
        x_value=(pl.col("round") + 1).first().cast(pl.Float64) if x == "round" else pl.col(x).mean(),
        mean=pl.col(metric).mean(), std=pl.col(metric).std(), n=pl.len())
    if group_axes:
        bands = bands.join(points.group_by(group_axes).agg(seeds=pl.col("point").n_unique()), on=group_axes)
    else:
        bands = bands.with_columns(seeds=pl.lit(points["point"].n_unique()))
    bands = bands.filter(pl.col("n") == pl.col("seeds")).drop("seeds")
    half = ci95(bands["std"], bands["n"], single=0.0)
    bands = bands.with_columns(ci95=pl.Series(half, dtype=pl.Float64))
    if not group_axes:
        return bands.sort(["round", "held"], descending=[False, True])
    order = study.select(group_axes).unique(maintain_order=True).with_row_index("group_order")  # the study's
    return (bands.join(order, on=group_axes).sort(["group_order", "round", "held"], descending=[False, False, True])
            .drop("group_order"))


def _initial_rows(folder: Path, frame: pl.DataFrame) -> pl.DataFrame | None:
    """Each point's initial evaluation (its manifest's `initial`) as a row of round -1, with
    the point's axis values."""
    rows = []
    for point in frame.group_by("point", maintain_order=True).first().iter_rows(named=True):
        initial = initial_evaluation(folder / point["point"], read_manifest(folder / point["point"]))
        if initial:
            rows.append({**point, "round": -1, "t_end": initial.get("t") or 0.0,
                         "test_acc": initial.get("test_acc"), "test_loss": initial.get("test_loss")})
    return pl.DataFrame(rows, schema=frame.schema) if rows else None


SMALL_MULTIPLES_ABOVE = 4  # more groups than this get a panel each


def plot_study(folder: Path, name: str, group_axes: list[str], targets: list[float] = ()) -> list[Path]:
    """Test accuracy (above) and loss (below) of a study (fedsim/studies/study.py) by rounds and by
    simulated hours, from the initial evaluation: per group of points (same values on
    `group_axes`) the mean over the seeds with its 95 % band (accuracy within [0, 100] %,
    the loss above 0), the target accuracies dashed; more than 4 groups get a panel each."""
    folder = Path(folder)
    frame = pl.read_parquet(folder / "study.parquet")
    initial = _initial_rows(folder, frame)
    written = []
    for x, label, scale, file in (("round", "rounds completed", 1.0, "study_accuracy_vs_rounds"),
                                  ("t_end", "simulated time", 3600.0, "study_accuracy_vs_time")):
        metrics = [m for m in ("test_acc", "test_loss") if frame[m].drop_nulls().len()]
        bands = {m: study_bands(frame, group_axes, x, m, initial) for m in metrics}
        keys = list(bands[metrics[0]].partition_by(group_axes, as_dict=True, maintain_order=True)) \
            if group_axes else [("all",)]
        panels = len(keys) if len(keys) > SMALL_MULTIPLES_ABOVE else 1
        cols = min(4, math.ceil(math.sqrt(panels)))
        rows = -(-panels // cols) * len(metrics)
        width, height = 4.0 * cols + 1.5, 2.6 * rows + 0.9
        titled = 0.3 if panels > 1 else 0.0  # the top panels' own titles, under the figure's
        height += titled
        fig, axes = _figure(width, height, rows=rows, cols=cols, sharex=True, top=1 - (0.6 + titled) / height,
                            bottom=0.55 / height, left=0.95 / width, hspace=0.3,
                            title=f"{name}: test metrics, mean and 95 % CI over seeds")
        for spare in range(panels, -(-panels // cols) * cols):  # the grid's empty places
            for m in range(len(metrics)):
                axes[(spare // cols * len(metrics) + m) * cols + spare % cols].set_visible(False)
        for k, key in enumerate(keys):
            panel = k if panels > 1 else 0
            for m, metric in enumerate(metrics):
                ax = axes[(panel // cols * len(metrics) + m) * cols + panel % cols]
                band = bands[metric].filter(*[pl.col(a) == v for a, v in zip(group_axes, key)]) \
                    if group_axes else bands[metric]
                _band(ax, band, scale, metric, ", ".join(str(v) for v in key), f"C{k % 10}")
                if metric == "test_acc" and (panels > 1 or k == 0):  # once a panel
                    for target in targets:
                        ax.axhline(100 * target, color="0.35", ls="--", lw=0.9)
                if panels > 1 and m == 0:
                    ax.set_title(", ".join(f"{a} = {v}" for a, v in zip(group_axes, key)), fontsize="small")
        for i, ax in enumerate(axes):  # x ticks under each group's last panel, named under a column's last
            if ax.get_visible() and (i // cols) % len(metrics) == len(metrics) - 1:
                ax.tick_params(labelbottom=True)
                below = i + cols * len(metrics)  # the same panel of the group under it (the next titles)
                named = label if below >= len(axes) or not axes[below].get_visible() else ""
                if x == "round":
                    ax.set_xlabel(named)
                else:
                    _time_axis(ax, label)
                    ax.set_xlabel(ax.get_xlabel() if named else "")
        for r in range(rows):
            metric = metrics[r % len(metrics)]
            axes[r * cols].set_ylabel("test accuracy (%)" if metric == "test_acc" else "test loss (log scale)")
        if panels == 1:
            axes[0].legend(title=", ".join(group_axes) or None, fontsize="small")
        path = folder / "plots" / f"{file}.png"
        atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", pil_kwargs={"compress_level": 1}))
        written.append(path)
    return written


def _band(ax, band: pl.DataFrame, scale: float, metric: str, label: str, colour: str) -> None:
    """A group's mean and 95 % band: accuracy in percent within [0, 100], loss on a log scale."""
    xs = band["x_value"].to_numpy() / scale
    mean, half = band["mean"].to_numpy(), band["ci95"].to_numpy()
    if metric == "test_acc":
        low, high = 100 * np.clip(mean - half, 0, 1), 100 * np.clip(mean + half, 0, 1)
        ax.plot(xs, 100 * mean, label=label, color=colour)
        ax.set_ylim(0, 100)
    else:
        floor = np.nanmin(mean[mean > 0]) / 10 if (mean > 0).any() else 1e-9
        low, high = np.maximum(mean - half, floor), mean + half
        ax.plot(xs, mean, label=label, color=colour)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(_plain_log())  # as the run plots' loss: 3, not 3 x 10^0
        ax.yaxis.set_minor_formatter(_plain_log(labelOnlyBase=False))
    ax.fill_between(xs, low, high, alpha=0.2, color=colour, lw=0)


VERDICT_COLOURS = {"holds": "tab:green", "does not hold": "tab:red", "inconclusive": "tab:orange"}


def plot_claims(rows: list[dict], path: Path, name: str) -> Path:
    """One panel per claim (fedsim/results/claims.py): its deciding statistic, mean and 95 % CI
    over the seeds, against 0 (the band of a `within` claim, the dashed line of `at_least`),
    coloured by verdict; an inconclusive one's title says how many more seeds would decide it."""
    import textwrap

    height = 0.7 + 1.0 * len(rows)
    fig, axes = _figure(width=7.5, height=height, rows=len(rows), top=1 - 0.45 / height, bottom=0.3 / height,
                        left=0.04, right=0.97, title=f"{name}: claims (mean and 95 % CI over seeds)",
                        sharex=False, hspace=1.1)
    for ax, row in zip(axes, rows):
        scale = row["scale"]
        mean, ci = row["mean"] * scale, row["ci"] * scale
        colour = VERDICT_COLOURS[row["verdict"]]
        ax.errorbar([mean], [0], xerr=[[ci], [ci]], fmt="o", color=colour, capsize=4)
        ax.axvline(0, color="black", lw=0.8)
        if row["within"]:
            ax.axvspan(-row["within"] * scale, row["within"] * scale, color="tab:green", alpha=0.12)
        elif row["at_least"]:
            ax.axvline(row["at_least"] * scale, color="tab:green", lw=1.2, ls="--")
        reach = max(abs(mean) + ci, (row["within"] or 0) * scale, abs(row["at_least"] or 0) * scale, 1e-9) * 1.3
        ax.set(xlim=(-reach, reach), yticks=[])
        ax.tick_params(axis="x", labelbottom=True, labelsize="small")
        ax.set_title(f"{textwrap.shorten(row['claim'], 65)}: {row['verdict_text']}" +
                     (" (pp)" if scale == 100 else ""), fontsize="small", color=colour, loc="left")
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", pil_kwargs={"compress_level": 1}))
    return path
