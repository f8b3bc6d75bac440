"""Wall-clock availability models: Markov on/off, a nightly sleep window, and diurnal.

Times are seconds since the trace origin (UTC); devices live in time zones, so their local
hour is ``t / 3600 + origin hour + tz_offset_h``. Per-device draws are vectors over all
devices and nights; the only Python loops run over batches of sessions, never over devices.
"""

from __future__ import annotations

import math
from datetime import datetime

import numpy as np

from fedsim.errors import FedsimError
from fedsim.traces.intervals import alternating, clip
from fedsim.traces.request import Generated, Request
from fedsim.traces.schema import check_rows

DEFAULT_ORIGIN = "2024-01-01T00:00:00+00:00"  # a Monday, midnight UTC
# The built-in mixture, used while tz_offsets is empty (not set); tz_weights left empty weigh
# the offsets given equally.
TZ_OFFSETS = [-8.0, -5.0, -3.0, 0.0, 1.0, 3.0, 5.5, 8.0, 9.0]
TZ_WEIGHTS = [0.12, 0.15, 0.08, 0.1, 0.2, 0.05, 0.12, 0.12, 0.06]
_TIME_ZONES = {"tz_offsets": [], "tz_weights": [], "origin": DEFAULT_ORIGIN}

MARKOV_OPTIONS = {"mean_on": 3600.0, "mean_off": 10800.0, "spread": 0.5}
SLEEP_OPTIONS = {"hours": 8.0, "start_h": 23.0, "start_spread_h": 3.0, "activity": [],
                 **_TIME_ZONES}
DIURNAL_OPTIONS = {
    "availability": 0.3,          # mean fraction of the day a device is online
    "availability_spread": 0.1,   # its standard deviation across devices
    "night_start_h": 22.5,        # mean local hour the nightly window opens
    "night_start_spread_h": 1.5,  # std of that hour across devices
    "jitter_h": 0.5,              # night-to-night std of start and length of a device
    "weekend_shift_h": 1.0,       # mean later start on Friday and Saturday nights
    "skip_prob": 0.1,             # chance a device misses a night (not charging, no Wi-Fi)
    "interruptions_per_hour": 0.3,
    "interruption_min": 10.0,     # mean length of an interruption, minutes
    **_TIME_ZONES,
}


# -- markov ---------------------------------------------------------------------------------

def markov(req: Request) -> Generated:
    """Alternating exponential sessions and gaps; each device starts in its stationary state."""
    o, n, rng = req.options, req.n_devices, req.rng
    for key in ("mean_on", "mean_off"):
        if not o[key] > 0:
            raise FedsimError(f"trace generator 'markov': {key} = {o[key]}; give seconds > 0")
    if not o["spread"] >= 0:
        raise FedsimError(f"trace generator 'markov': spread = {o['spread']}; give a value >= 0")
    sigma = o["spread"]
    # Lognormal with mean 1, so the population mean of the per-device means stays as given.
    mean_on = o["mean_on"] * rng.lognormal(-sigma**2 / 2, sigma, n)
    mean_off = o["mean_off"] * rng.lognormal(-sigma**2 / 2, sigma, n)
    _check_sessions(req, np.zeros(n), np.full(n, req.horizon), mean_on, mean_off)
    first_on = rng.random(n) < mean_on / (mean_on + mean_off)
    dev, start, end = alternating(np.zeros(n), np.full(n, req.horizon), mean_on, mean_off,
                                  first_on, rng)
    dev, start, end = clip(dev, start, end, 0.0, req.horizon)  # drops sessions too short for floats
    meta = {"mean_on_s": mean_on.tolist(), "mean_off_s": mean_off.tolist()}
    return Generated(dev, start, end, meta)


# -- sleep window ---------------------------------------------------------------------------

def sleep_window(req: Request) -> Generated:
    """One window of ``hours`` at the same local time every day (001, Sentiment140).

    With ``activity`` (24 hourly activity levels, local time) the window opens at the hour
    where the summed activity over the window is least; without it, at ``start_h``. Each
    device's start is then spread uniformly over ``start_spread_h``.
    """
    o, n, rng = req.options, req.n_devices, req.rng
    hours = o["hours"]
    _check_rules("sleep-window", o, [
        ("hours", 0 < hours <= 24, "give 0 < hours <= 24"),
        ("start_h", 0 <= o["start_h"] <= 24, "give an hour of the day in [0, 24]"),
        ("start_spread_h", 0 <= o["start_spread_h"] <= 24, "give hours in [0, 24]"),
    ])
    tz, origin_h, _ = _zones(req, "sleep-window")
    start = _quietest_hour(o["activity"], hours) if o["activity"] else o["start_h"]
    start = start + rng.uniform(-0.5, 0.5, n) * o["start_spread_h"]
    day = _days(req, tz, origin_h)
    local = 24.0 * day[None, :] + start[:, None]
    begin = (local - tz[:, None] - origin_h) * 3600.0
    dev = np.broadcast_to(np.arange(n)[:, None], begin.shape).ravel()
    begin = begin.ravel()
    dev, begin, end = clip(dev, begin, begin + hours * 3600.0, 0.0, req.horizon)
    return Generated(dev, begin, end, {"tz_offset_h": tz.tolist(), "start_h": start.tolist()},
                     o["origin"])


def _quietest_hour(activity: list, hours: float) -> float:
    level = np.asarray(activity, dtype=np.float64)
    if level.shape != (24,) or not np.all(np.isfinite(level)):
        raise FedsimError(f"trace generator 'sleep-window': activity has {level.size} values; give "
                          f"24 hourly activity levels (local time), or leave it empty")
    width = max(1, round(hours))
    window = sum(np.roll(level, -k) for k in range(width))  # window[h]: hours h..h+width-1
    return float(np.argmin(window))


# -- diurnal --------------------------------------------------------------------------------

def diurnal(req: Request) -> Generated:
    """Nightly charging + idle + Wi-Fi windows in local time, with interruptions."""
    o, n, rng = req.options, req.n_devices, req.rng
    _check_diurnal(o)
    tz, origin_h, origin_weekday = _zones(req, "diurnal")
    # Between interruptions a device stays online Exp(1 / rate) hours, so the window keeps
    # 1 / (1 + rate * mean interruption) of its length.
    minutes, rate = o["interruption_min"], o["interruptions_per_hour"]
    kept = (1 - o["skip_prob"]) / (1 + rate * minutes / 60)
    target = _beta(rng, o["availability"], o["availability_spread"], n)
    length = np.clip(24.0 * target / kept, 0.25, 23.0)
    start = rng.normal(o["night_start_h"], o["night_start_spread_h"], n)
    weekend_shift = rng.normal(o["weekend_shift_h"], 0.5 * abs(o["weekend_shift_h"]), n)

    day = _days(req, tz, origin_h)
    shape = (n, len(day))
    weekend = np.isin((origin_weekday + day) % 7, (4, 5))  # Friday and Saturday nights
    local = (24.0 * day[None, :] + start[:, None] + weekend[None, :] * weekend_shift[:, None]
             + rng.normal(0.0, o["jitter_h"], shape))
    hours = np.maximum(length[:, None] + rng.normal(0.0, o["jitter_h"], shape), 0.0)
    keep = rng.random(shape) >= o["skip_prob"]
    begin = ((local - tz[:, None] - origin_h) * 3600.0)[keep]
    end = begin + (hours * 3600.0)[keep]
    dev = np.broadcast_to(np.arange(n)[:, None], shape)[keep]

    mean_on = 3600.0 / rate if rate > 0 else np.inf
    _check_sessions(req, begin, end, mean_on, minutes * 60.0)
    window, begin, end = alternating(begin, end, mean_on, minutes * 60.0, True, rng)
    dev = dev[window]
    dev, begin, end = clip(dev, begin, end, 0.0, req.horizon)
    meta = {"tz_offset_h": tz.tolist()}
    return Generated(dev, begin, end, meta, o["origin"])


def _check_diurnal(o: dict) -> None:
    _check_rules("diurnal", o, [
        ("availability", 0 < o["availability"] < 1, "give a fraction in (0, 1)"),
        ("availability_spread", o["availability_spread"] >= 0, "give a value >= 0"),
        ("night_start_h", 0 <= o["night_start_h"] <= 24, "give an hour of the day in [0, 24]"),
        ("night_start_spread_h", 0 <= o["night_start_spread_h"] <= 24, "give hours in [0, 24]"),
        ("jitter_h", 0 <= o["jitter_h"] <= 24, "give hours in [0, 24]"),
        ("weekend_shift_h", -24 <= o["weekend_shift_h"] <= 24, "give hours in [-24, 24]"),
        ("skip_prob", 0 <= o["skip_prob"] < 1, "give a probability in [0, 1)"),
        ("interruptions_per_hour", o["interruptions_per_hour"] >= 0, "give a rate >= 0"),
        ("interruption_min", 0 < o["interruption_min"] <= 1440, "give minutes in (0, 1440]"),
    ])


def _check_rules(kind: str, o: dict, rules) -> None:
    """Raise for the first (key, ok, fix) rule that fails."""
    for key, ok, fix in rules:
        if not ok:
            raise FedsimError(f"trace generator {kind!r}: {key} = {o[key]!r}; {fix}")


def _check_sessions(req: Request, lo, hi, mean_on, mean_off) -> None:
    """Refuse up front on/off sessions in windows [lo, hi) whose expected number would exhaust
    memory (tiny mean lengths, a long span, many devices)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        expected = float(np.sum((hi - lo) / (mean_on + mean_off))) + len(lo)
    check_rows(expected, f"{req.n_devices:,} devices' sessions over {req.horizon:g} s", req.where,
               "give longer sessions and gaps, fewer devices or a shorter span")


def _beta(rng: np.random.Generator, mean: float, std: float, n: int) -> np.ndarray:
    """Per-device values in (0, 1) with the given mean and (at most the possible) spread."""
    if std == 0:
        return np.full(n, mean)
    std = min(std, 0.95 * math.sqrt(mean * (1 - mean)))
    k = mean * (1 - mean) / std**2 - 1
    return rng.beta(mean * k, (1 - mean) * k, n)


# -- time zones and calendar ----------------------------------------------------------------

def _zones(req: Request, kind: str):
    """Per-device tz offsets (hours), origin hour of day (UTC) and origin weekday (Mon = 0)."""
    o = req.options
    offsets = np.asarray(o["tz_offsets"] or TZ_OFFSETS, dtype=np.float64)
    default = TZ_WEIGHTS if not o["tz_offsets"] else np.ones(offsets.size)
    weights = np.asarray(o["tz_weights"] or default, dtype=np.float64)
    if weights.shape != offsets.shape or np.any(weights < 0) or weights.sum() <= 0:
        given = "" if o["tz_offsets"] else " (the built-in ones: tz_offsets is not set)"
        raise FedsimError(f"trace generator {kind!r}: tz_offsets ({offsets.size} values{given}) "
                          f"and tz_weights ({weights.size} values) need the same length, weights "
                          f">= 0 and a positive sum")
    if np.any(np.abs(offsets) > 14):
        raise FedsimError(f"trace generator {kind!r}: tz_offsets must be hours in [-14, 14]")
    try:
        origin = datetime.fromisoformat(o["origin"])
    except ValueError:
        raise FedsimError(f"trace generator {kind!r}: origin = {o['origin']!r} is not an ISO-8601 "
                          f"instant like {DEFAULT_ORIGIN!r}") from None
    utc_offset = origin.utcoffset()
    shift_h = utc_offset.total_seconds() / 3600 if utc_offset else 0.0
    origin_h = origin.hour + origin.minute / 60 + origin.second / 3600 - shift_h
    tz = offsets[req.rng.choice(offsets.size, size=req.n_devices, p=weights / weights.sum())]
    return tz, origin_h, origin.weekday()


def _days(req: Request, tz: np.ndarray, origin_h: float) -> np.ndarray:
    """Local day indices (relative to the origin's date) whose windows can reach [0, horizon)."""
    first = math.floor((origin_h + float(tz.min())) / 24) - 2
    last = math.ceil((origin_h + float(tz.max()) + req.horizon / 3600) / 24) + 1
    check_rows(float(req.n_devices) * (last - first + 1), f"{req.n_devices:,} devices over "
               f"{req.horizon / 86400:g} days", req.where, "generate fewer devices or days")
    return np.arange(first, last + 1)
