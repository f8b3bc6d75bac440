"""The in-memory availability trace and the rules every trace obeys.

A trace is a flat table of half-open online intervals ``[start, end)`` per device, sorted by
(device_id, start), with a device's intervals merged so they neither overlap nor touch. The
same checks serve traces built in memory (``Trace.from_intervals``) and traces read from disk
(``fedsim.traces.io.read_trace``), so both report the first bad row in the same words.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

from fedsim.errors import FedsimError

WRAPS = ("none", "loop")


@dataclass(frozen=True, eq=False)
class Trace:
    """Online intervals of ``n_devices`` devices over ``[0, horizon)`` seconds.

    Treat the arrays as read-only: an AvailabilityIndex built on a trace relies on them.
    (``eq=False``: comparing traces compares identity; compare arrays explicitly.)

    ``wrap = "loop"`` repeats the trace with period ``horizon`` (FedScale-style replay);
    ``"none"`` leaves every device offline from ``horizon`` on. ``generator`` records how the
    trace was made (JSON-able); round-indexed generators store there what
    ``known_probability`` needs to recompute p_i^t.
    """

    device_id: np.ndarray
    start: np.ndarray
    end: np.ndarray
    n_devices: int
    horizon: float
    wrap: str = "none"
    origin: str | None = None
    generator: dict = field(default_factory=dict)

    @classmethod
    def from_intervals(cls, device_id, start, end, *, n_devices, horizon, wrap="none",
                       origin=None, generator=None, where: str = "trace") -> "Trace":
        """Sort, validate and merge raw intervals (touching or overlapping ones of a device).

        ``where`` starts every error message (a converter passes its input file)."""
        device_id = _as_array(device_id, np.int64, "device_id", where)
        start = _as_array(start, np.float64, "start", where)
        end = _as_array(end, np.float64, "end", where)
        if not len(device_id) == len(start) == len(end):
            raise FedsimError(
                f"{where}: device_id, start and end have lengths {len(device_id)}, {len(start)}, "
                f"{len(end)}; give one value per interval in each"
            )
        n_devices, horizon = check_header(n_devices, horizon, wrap, origin, generator, where)
        problem = first_problem(device_id, start, end, n_devices, horizon, need_sorted=False)
        if problem is not None:
            raise FedsimError(f"{where}: {problem}")
        if not _is_sorted(device_id, start):
            order = np.lexsort((start, device_id))
            device_id, start, end = device_id[order], start[order], end[order]
        device_id, start, end = merge_sorted(device_id, start, end)
        return cls(device_id, start, end, n_devices, horizon, wrap, origin, dict(generator or {}))

    def availability(self) -> np.ndarray:
        """Fraction of ``[0, horizon)`` each device is online, float64 ``[n_devices]``."""
        online = np.bincount(self.device_id, weights=self.end - self.start, minlength=self.n_devices)
        return online / self.horizon

    @property
    def n_intervals(self) -> int:
        return len(self.device_id)


def _as_array(values, dtype, name: str, where: str) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1:
        raise FedsimError(f"{where}: {name} must be one-dimensional, got shape {array.shape}")
    if dtype is np.int64 and array.size and not np.issubdtype(array.dtype, np.integer):
        raise FedsimError(f"{where}: device_id must hold integers, got {array.dtype}")
    if dtype is np.int64:
        return signed_ids(array, name, where).copy()
    return np.array(array, dtype=dtype)  # a copy: the trace must not change under an index


def signed_ids(ids: np.ndarray, name: str, where: str) -> np.ndarray:
    """Integer ids as int64, refusing unsigned ones above its range by their true value (a
    plain cast would report 2^64-1 as -1)."""
    if ids.dtype.kind == "u" and ids.size and ids.max() > np.iinfo(np.int64).max:
        row = int(np.argmax(ids > np.iinfo(np.int64).max))
        raise FedsimError(f"{where}: row {row}: {name} {int(ids[row])} is too large; ids count "
                          f"devices from 0 (at most {MAX_DEVICES:,} of them)")
    return ids.astype(np.int64, copy=False)


def positive_seconds(value, name: str, where: str) -> float:
    """``value`` as a finite float > 0, or a FedsimError naming it."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise FedsimError(f"{where}: {name} = {value!r}; it must be a finite number of seconds > 0")
    return seconds


def whole_number(value, name: str, where: str, minimum: int) -> int:
    """``value`` as an int >= minimum (bools refused), or a FedsimError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise FedsimError(f"{where}: {name} = {value!r}; it must be an integer >= {minimum}")
    return int(value)


MAX_DEVICES = 100_000_000  # per-device arrays of this length still fit in memory
MAX_INTERVALS = 50_000_000  # rows a converter or generator may build: a few GB of arrays


def check_rows(count: float, what: str, where: str, fix: str) -> None:
    """Refuse up front to build ``count`` rows (``what`` says of what) beyond MAX_INTERVALS: the
    arrays would exhaust memory. ``count`` may be a float, so a huge estimate cannot overflow."""
    if not count <= MAX_INTERVALS:
        shown = f"{count:,.0f}" if count < 1e18 else f"{count:.3g}"
        raise FedsimError(f"{where}: {what} would make {shown} rows, above fedsim's limit of "
                          f"{MAX_INTERVALS:,}; {fix}")


def check_devices(n_devices: int, where: str, fix: str) -> None:
    """Refuse more than MAX_DEVICES devices: their per-device arrays would exhaust memory."""
    if n_devices > MAX_DEVICES:
        raise FedsimError(f"{where}: n_devices = {n_devices:,} is above fedsim's limit of "
                          f"{MAX_DEVICES:,}; {fix}")


def check_header(n_devices, horizon, wrap, origin, generator, where: str) -> tuple[int, float]:
    """Validate the per-trace values; return n_devices as int and horizon as float."""
    n_devices = whole_number(n_devices, "n_devices", where, 0)
    check_devices(n_devices, where, "check the device ids (they count from 0)")
    horizon = positive_seconds(horizon, "horizon", where)
    if wrap not in WRAPS:
        raise FedsimError(f"{where}: wrap = {wrap!r}; it must be one of {', '.join(WRAPS)}")
    if origin is not None:
        try:
            datetime.fromisoformat(origin)
        except (TypeError, ValueError):
            raise FedsimError(
                f"{where}: origin = {origin!r} is not an ISO-8601 instant such as "
                f"'2024-01-01T00:00:00+00:00'"
            ) from None
    if generator is not None:
        try:
            json.dumps(generator, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise FedsimError(f"{where}: generator metadata is not JSON-able ({exc})") from None
    return n_devices, horizon


def first_problem(device_id, start, end, n_devices, horizon, *, need_sorted) -> str | None:
    """Describe the first row that breaks a trace rule, or None when every row is fine.

    Rows are numbered from 0. With ``need_sorted`` the rows must already be sorted by
    (device_id, start) and a device's intervals must not overlap (as in a trace file);
    without it only the per-row rules apply (``from_intervals`` sorts and merges itself).
    """
    checks = [
        (~np.isfinite(start), lambda i: f"start is {start[i]}; give a finite number of seconds"),
        (~np.isfinite(end), lambda i: f"end is {end[i]}; give a finite number of seconds"),
        ((device_id < 0) | (device_id >= n_devices),
         lambda i: f"device_id {device_id[i]} is outside 0..{n_devices - 1}; "
                   f"ids must be below n_devices = {n_devices}"),
        (start < 0, lambda i: f"start {start[i]} < 0; times are seconds since the trace origin"),
        (end <= start, lambda i: f"end {end[i]} <= start {start[i]}; intervals need end > start"),
        (end > horizon, lambda i: f"end {end[i]} > horizon {horizon}; clip the interval or raise "
                                  f"the horizon"),
    ]
    if need_sorted and len(device_id) > 1:
        same = device_id[1:] == device_id[:-1]
        later = np.concatenate([[False], (device_id[1:] < device_id[:-1])
                                | (same & (start[1:] < start[:-1]))])
        overlap = np.concatenate([[False], same & (start[1:] < end[:-1])])
        checks += [
            (later, lambda i: f"rows are not sorted by (device_id, start): this row comes after "
                              f"device {device_id[i - 1]} start {start[i - 1]}; sort the rows"),
            (overlap, lambda i: f"start {start[i]} < end {end[i - 1]} of the previous interval "
                                f"of the device; intervals of a device must not overlap"),
        ]
    first, message = len(device_id), None
    for bad, describe in checks:
        hits = np.flatnonzero(bad[:first])
        if hits.size:
            first, message = int(hits[0]), describe
    if message is None:
        return None
    return f"row {first} (device {device_id[first]}): {message(first)}"


def _is_sorted(device_id, start) -> bool:
    """Rows already in (device_id, start) order? (Generators mostly emit them so; a check is
    much cheaper than a sort.)"""
    step = device_id[1:] - device_id[:-1]
    return bool(np.all((step > 0) | ((step == 0) & (start[1:] >= start[:-1]))))


def merge_sorted(device_id, start, end):
    """Merge touching or overlapping intervals of the same device (rows sorted by device, start)."""
    if len(device_id) < 2:
        return device_id, start, end
    same = device_id[1:] == device_id[:-1]
    if not np.any(same & (start[1:] <= end[:-1])):  # nothing touches: most generated traces
        return device_id, start, end
    reach = _running_max_per_device(device_id, end)
    # A row opens a new run when it belongs to a new device or starts after all earlier ends.
    opens = np.concatenate([[True], ~same | (start[1:] > reach[:-1])])
    if opens.all():
        return device_id, start, end
    first = np.flatnonzero(opens)
    last = np.concatenate([first[1:], [len(device_id)]]) - 1
    return device_id[first], start[first], reach[last]


def _running_max_per_device(device_id, end):
    """Cumulative max of ``end`` restarting at each device, exactly and without a Python loop.

    Ends are replaced by their integer rank and each device is lifted above all earlier ones,
    so a single global cumulative max stays within a device.
    """
    values, rank = np.unique(end, return_inverse=True)
    device_rank = np.concatenate([[0], np.cumsum(device_id[1:] != device_id[:-1])])
    lift = device_rank * len(values)
    return values[np.maximum.accumulate(rank + lift) - lift]
