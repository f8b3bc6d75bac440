"""Summary statistics of a trace (what ``fedsim trace info`` prints), computed exactly from the
intervals rather than by sampling."""

from __future__ import annotations

from datetime import datetime

import numpy as np

from fedsim.traces.round_bits import RoundBits
from fedsim.traces.schema import Trace

QUANTILES = (0.0, 0.1, 0.5, 0.9, 1.0)


def online_area(trace: Trace, edges: np.ndarray) -> np.ndarray:
    """Device-seconds online within each bin [edges[k], edges[k+1]).

    The online count is a step function; its integral is piecewise linear, so evaluating the
    integral at the bin edges (np.interp) gives exact per-bin areas in one vectorised pass.
    """
    if not trace.n_intervals:
        return np.zeros(len(edges) - 1)
    times = np.concatenate([trace.start, trace.end])
    steps = np.concatenate([np.ones(trace.n_intervals), -np.ones(trace.n_intervals)])
    order = np.argsort(times, kind="stable")
    times, count = times[order], np.cumsum(steps[order])
    area = np.concatenate([[0.0], np.cumsum(count[:-1] * np.diff(times))])
    return np.diff(np.interp(edges, times, area))


def online_fraction(trace: Trace, edges: np.ndarray) -> np.ndarray:
    """Mean fraction of devices online over each bin."""
    return online_area(trace, edges) / (np.diff(edges) * max(trace.n_devices, 1))


def clock_name(origin: str | None) -> str:
    """The clock that hours of day read: UTC for an origin with a UTC offset; the trace's own
    clock for one without (FLASH writes local times with no zone: calling them UTC would be a
    guess); t mod 24 h without an origin."""
    if not origin:
        return "t mod 24 h"
    return "UTC" if datetime.fromisoformat(origin).utcoffset() is not None else "the trace's clock, no time zone"


def origin_offset_s(trace: Trace) -> float:
    """Seconds after midnight (UTC when the origin has an offset, else on the trace's own clock)
    of t = 0."""
    if not trace.origin:
        return 0.0
    origin = datetime.fromisoformat(trace.origin)
    shift = origin.utcoffset().total_seconds() if origin.utcoffset() else 0.0
    return (origin.hour * 3600 + origin.minute * 60 + origin.second - shift) % 86400


def hourly_profile(trace: Trace) -> list[float | None]:
    """Mean fraction online per hour of day (on `clock_name`'s clock);
    None for hours the trace does not cover."""
    offset = origin_offset_s(trace)
    # Bin edges on whole clock hours, clipped to the trace.
    first = -(offset % 3600)
    edges = np.concatenate([[0.0], np.arange(first + 3600, trace.horizon, 3600.0), [trace.horizon]])
    area = online_area(trace, edges)
    width = np.diff(edges)
    hour = (((edges[:-1] + offset) // 3600) % 24).astype(int)
    covered = np.bincount(hour, weights=width, minlength=24)
    online = np.bincount(hour, weights=area, minlength=24)
    n = max(trace.n_devices, 1)
    return [float(online[h] / (covered[h] * n)) if covered[h] > 0 else None for h in range(24)]


def summarize(trace: Trace) -> dict:
    """Everything ``trace info`` reports, JSON-able."""
    availability = trace.availability()
    lengths = trace.end - trace.start
    same = trace.device_id[1:] == trace.device_id[:-1]
    gaps = (trace.start[1:] - trace.end[:-1])[same]
    return {
        "devices": trace.n_devices,
        "intervals": trace.n_intervals,
        "horizon_s": trace.horizon,
        "horizon_days": trace.horizon / 86400,
        "wrap": trace.wrap,
        "origin": trace.origin,
        "generator": trace.generator.get("kind"),
        "never_online": int(np.sum(availability == 0)),
        "availability": {"mean": _mean(availability), "std": _f(availability.std()),
                         **_quantiles(availability)},
        "hourly_profile": hourly_profile(trace),
        "hourly_clock": clock_name(trace.origin),
        "session_s": {"mean": _mean(lengths), **_quantiles(lengths)},
        "gap_s": {"mean": _mean(gaps), **_quantiles(gaps)},
    }


def _quantiles(values: np.ndarray) -> dict:
    if not len(values):
        return {f"q{round(q * 100)}": None for q in QUANTILES}
    return {f"q{round(q * 100)}": float(v) for q, v in zip(QUANTILES, np.quantile(values, QUANTILES))}


def _mean(values: np.ndarray) -> float | None:
    return float(values.mean()) if len(values) else None


def _f(value) -> float | None:
    return None if not np.isfinite(value) else float(value)


def device_online_fraction(trace: Trace | RoundBits, t: float) -> np.ndarray:
    """Per device, the fraction of [0, t) it is online (a looping trace repeats; a trace that
    ends counts as offline after its horizon)."""
    n = trace.n_devices
    if t <= 0:
        return np.zeros(n)

    def online_until(until: float) -> np.ndarray:
        if isinstance(trace, RoundBits):
            return trace.online_seconds(until)
        seconds = np.clip(np.minimum(trace.end, until) - trace.start, 0.0, None)
        return np.bincount(trace.device_id, weights=seconds, minlength=n)

    if trace.wrap != "loop" or t <= trace.horizon:
        return online_until(min(t, trace.horizon)) / t
    cycles, rest = divmod(t, trace.horizon)
    return (cycles * online_until(trace.horizon) + online_until(rest)) / t
