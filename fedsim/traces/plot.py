"""A picture of a trace: device x time raster plus the fraction of devices online.

matplotlib is imported when a plot is drawn, as a bare ``Figure`` (drawn with Agg, without
pyplot's global state), so the other trace commands do not load it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedsim.files import atomic_write
from fedsim.traces.schema import Trace
from fedsim.traces.stats import online_fraction

MAX_ROWS = 200


def plot_trace(trace: Trace, out, *, seed: int = 0, title: str | None = None) -> int:
    """Write a PNG; returns how many devices the raster shows (a sample of at most 200)."""
    from matplotlib.collections import LineCollection
    from matplotlib.figure import Figure

    shown = np.arange(trace.n_devices)
    if trace.n_devices > MAX_ROWS:
        shown = np.sort(np.random.default_rng(seed).choice(trace.n_devices, MAX_ROWS, replace=False))
    row = np.full(trace.n_devices, -1)
    row[shown] = np.arange(len(shown))
    keep = row[trace.device_id] >= 0
    scale, unit = _time_unit(trace.horizon)

    fig = Figure(figsize=(10, 6.5))
    raster, fraction = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    y = row[trace.device_id[keep]]
    segments = np.stack([np.column_stack([trace.start[keep] / scale, y]),
                         np.column_stack([trace.end[keep] / scale, y])], axis=1)
    width = max(0.5, min(4.0, 300 / max(len(shown), 1)))
    raster.add_collection(LineCollection(segments, linewidths=width, colors="tab:blue"))
    raster.set_xlim(0, trace.horizon / scale)
    raster.set_ylim(-1, max(len(shown), 1))
    sampled = f" (random {len(shown)} of {trace.n_devices})" if len(shown) < trace.n_devices else ""
    raster.set_ylabel(f"device{sampled}")
    raster.set_title(title or f"{trace.generator.get('kind', 'trace')}: {trace.n_devices} devices, "
                              f"mean availability {trace.availability().mean():.3f}")

    edges = np.linspace(0.0, trace.horizon, min(2000, max(50, trace.n_intervals)) + 1)
    frac = online_fraction(trace, edges)
    fraction.step(edges[:-1] / scale, frac, where="post", color="tab:orange")
    fraction.set_ylim(0, max(0.05, float(frac.max()) * 1.1))
    fraction.set_ylabel("fraction online")
    fraction.set_xlabel(f"time ({unit})")
    fig.tight_layout()

    atomic_write(Path(out), lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    return len(shown)


def _time_unit(horizon: float) -> tuple[float, str]:
    if horizon >= 3 * 86400:
        return 86400.0, "days"
    if horizon >= 3 * 3600:
        return 3600.0, "hours"
    return 1.0, "s"
