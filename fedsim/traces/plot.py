"""A picture of a trace: device x time raster plus the fraction of devices online.

The raster sorts the devices by time zone (or group) and, within a zone, most available first,
each zone in its own colour; with a clock origin the time axis reads UTC clock time and weekday.
matplotlib is imported when a plot is drawn, as a bare ``Figure`` (drawn with Agg, without
pyplot's global state), so the other trace commands do not load it.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np

from fedsim.files import TRACE_PICTURE, atomic_write
from fedsim.traces.schema import Trace
from fedsim.traces.stats import clock_name, online_fraction
from fedsim.traces.zones import Zones, plot_order

MAX_ROWS = 200


def plot_trace(trace: Trace, out, *, zones: Zones | None = None, seed: int = 0, title: str | None = None) -> int:
    """Write a PNG; returns how many devices the raster shows (at most 200)."""
    fig, shown = trace_figure(trace, zones=zones, seed=seed, title=title)
    atomic_write(Path(out), lambda tmp: fig.savefig(tmp, dpi=110, format="png", metadata={"Software": TRACE_PICTURE}))
    return len(shown)


def trace_figure(trace: Trace, *, zones: Zones | None = None, seed: int = 0, title: str | None = None):
    """The figure and the devices its raster shows, top row first."""
    from matplotlib.collections import LineCollection
    from matplotlib.figure import Figure

    shown = plot_order(trace.availability(), zones, MAX_ROWS, seed)
    row = np.full(trace.n_devices, -1)
    row[shown] = len(shown) - 1 - np.arange(len(shown))  # the first device on the top row
    keep = row[trace.device_id] >= 0
    scale, unit = _time_unit(trace.horizon)

    fig = Figure(figsize=(10, 6.5))
    fig.subplots_adjust(left=0.08, right=0.84 if zones else 0.97, top=0.93, bottom=0.1, hspace=0.08)
    raster, fraction = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    y = row[trace.device_id[keep]]
    segments = np.stack([np.column_stack([trace.start[keep] / scale, y]),
                         np.column_stack([trace.end[keep] / scale, y])], axis=1)
    width = max(0.5, min(4.0, 300 / max(len(shown), 1)))
    colors = "tab:blue"
    if zones is not None:
        keys = np.unique(zones.values[shown])
        palette = [f"C{k % 10}" for k in range(len(keys))]
        zone_of = np.searchsorted(keys, zones.values)
        colors = [palette[z] for z in zone_of[trace.device_id[keep]]]
        for k, key in enumerate(keys):  # legend entries, and a line between two zones
            raster.plot([], [], color=palette[k], lw=4, label=zones.label(key))
            lowest = row[shown][zones.values[shown] == key].min()
            if lowest > 0:
                raster.axhline(lowest - 0.5, color="0.3", lw=0.6)
        raster.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small",
                      title="time zone" if zones.column == "tz_offset" else "group")
    raster.add_collection(LineCollection(segments, linewidths=width, colors=colors))
    raster.set_xlim(0, trace.horizon / scale)
    raster.set_ylim(-1, max(len(shown), 1))
    raster.set_yticks([])
    sampled = f"{len(shown)} of {trace.n_devices}, " if len(shown) < trace.n_devices else ""
    order = "by zone, then " if zones is not None else ""
    raster.set_ylabel(f"devices ({sampled}{order}most available on top)")
    raster.set_title(title or f"{trace.generator.get('kind', 'trace')}: {trace.n_devices} "
                              f"device{'s' * (trace.n_devices != 1)}, "
                              f"mean availability {trace.availability().mean():.3f}")

    edges = np.linspace(0.0, trace.horizon, min(2000, max(50, trace.n_intervals)) + 1)
    frac = online_fraction(trace, edges)
    fraction.step(edges[:-1] / scale, frac, where="post", color="tab:orange")
    fraction.set_ylim(0, max(0.05, float(frac.max()) * 1.1))
    fraction.set_ylabel("fraction online")
    if trace.origin:
        _clock_ticks(fraction, trace, scale)
    else:
        fraction.set_xlabel(f"time since the start ({unit})")
    return fig, shown


def _clock_ticks(ax, trace: Trace, scale: float) -> None:
    """Ticks at midnights (or every 6 hours for a trace of under 3 days), labelled with weekday
    and clock time: UTC for an origin with an offset, the trace's own clock for one without."""
    origin = datetime.fromisoformat(trace.origin)
    if origin.tzinfo is not None:
        origin = origin.astimezone(timezone.utc)
    step = 86400.0 if trace.horizon >= 3 * 86400 else 6 * 3600.0
    if trace.horizon / step > 16:  # a long trace: at most 16 labels
        step *= np.ceil(trace.horizon / step / 16)
    day = origin.replace(hour=0, minute=0, second=0, microsecond=0)
    first = (day - origin).total_seconds()
    ticks = first + step * np.arange(np.ceil(-first / step), np.floor((trace.horizon - first) / step) + 1)
    ax.set_xticks(ticks / scale, [(origin + timedelta(seconds=float(t))).strftime("%a %H:%M") for t in ticks])
    if len(ticks) > 8:  # (more would overlap side by side: a fortnight's midnights)
        ax.tick_params(axis="x", labelrotation=40)
        for label in ax.get_xticklabels():
            label.set_horizontalalignment("right")
        ax.figure.subplots_adjust(bottom=0.17)  # (room for the turned labels and the axis's title)
    ax.set_xlabel(f"clock time ({clock_name(trace.origin)})")


def _time_unit(horizon: float) -> tuple[float, str]:
    if horizon >= 3 * 86400:
        return 86400.0, "days"
    if horizon >= 3 * 3600:
        return 3600.0, "hours"
    return 1.0, "s"
