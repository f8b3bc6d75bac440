"""A trace's devices by time zone (or group): where the zones come from, availability per zone,
and the order in which `fedsim trace plot` draws the devices.

Zones come from, in order: a device table given by the user (`--devices`), the table that
`fedsim trace convert` wrote beside the trace (`X.devices.parquet`), or the generator's
per-device lists in the trace's metadata (`tz_offset_h`, `group`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedsim.errors import FedsimError
from fedsim.traces.schema import Trace
from fedsim.traces.stats import hourly_profile

ZONE_COLUMNS = ("tz_offset", "group")


@dataclass(frozen=True)
class Zones:
    column: str  # "tz_offset" (hours) or "group"
    values: np.ndarray  # [n_devices]
    source: str  # where they came from, for the reader

    def label(self, value) -> str:
        return f"UTC{value:+g}" if self.column == "tz_offset" else f"group {value:g}"


def beside(trace_path) -> Path:
    """The device table `fedsim trace convert` writes beside a trace: X.parquet -> X.devices.parquet."""
    return Path(str(trace_path).removesuffix(".parquet") + ".devices.parquet")


def trace_zones(trace: Trace, trace_path=None, devices=None) -> Zones | None:
    """The zones of `trace`'s devices, or None where nothing says. A run's devices.parquet
    serves as the table too: the columns the run wrote itself are not read."""
    from fedsim.traces.io import RUN_DEVICE_COLUMNS, read_device_table

    if devices is not None:
        return _from_table(read_device_table(devices, skip=RUN_DEVICE_COLUMNS), trace, f"device table {devices}",
                           required=True)
    run_devices = Path(trace_path) / "devices.parquet" if trace_path is not None else None
    if run_devices is not None and run_devices.is_file():  # a run directory's own table
        found = _from_table(read_device_table(run_devices, skip=RUN_DEVICE_COLUMNS), trace, f"device table {run_devices}")
        if found is not None:
            return found
    if trace_path is not None and beside(trace_path).is_file():
        found = _from_table(read_device_table(beside(trace_path)), trace, f"device table {beside(trace_path)}")
        if found is not None:
            return found
    for key, column in (("tz_offset_h", "tz_offset"), ("group", "group")):
        values = trace.generator.get(key)
        if isinstance(values, list) and len(values) == trace.n_devices:
            return Zones(column, np.asarray(values, dtype=np.float64), f"the trace's metadata ({key})")
    return None


def _from_table(table: dict, trace: Trace, where: str, required: bool = False) -> Zones | None:
    column = next((c for c in ZONE_COLUMNS if c in table), None)
    if column is None:
        if required:
            raise FedsimError(f"{where}: has no tz_offset or group column; give a device table with one")
        return None
    ids = np.asarray(table["device_id"])
    if len(ids) != trace.n_devices or not np.array_equal(np.sort(ids), np.arange(trace.n_devices)):
        raise FedsimError(f"{where}: has {len(ids)} rows for the trace's {trace.n_devices} devices; it needs "
                          f"one row per device_id 0..{trace.n_devices - 1}")
    values = np.empty(trace.n_devices)
    values[ids] = np.asarray(table[column], dtype=np.float64)
    return Zones(column, values, where)


def plot_order(availability: np.ndarray, zones: Zones | None, rows: int, seed: int = 0) -> np.ndarray:
    """The devices to draw, top row first: by zone (ascending), then most available first; at
    most `rows`, sampled within each zone in proportion to its size (at least one each)."""
    n = len(availability)
    zone = zones.values if zones is not None else np.zeros(n)
    chosen = np.arange(n)
    if n > rows:
        keys, inverse, counts = np.unique(zone, return_inverse=True, return_counts=True)
        share = rows * counts / n
        quota = np.maximum(1, np.floor(share)).astype(int)
        extra = np.argsort(-(share - np.floor(share)), kind="stable")[:max(rows - quota.sum(), 0)]
        quota[extra] += 1  # the rows left go to the largest remainders
        quota = np.minimum(quota, counts)
        rng = np.random.default_rng(seed)
        chosen = np.concatenate([rng.choice(np.flatnonzero(inverse == k), q, replace=False)
                                 for k, q in enumerate(quota)])
    return chosen[np.lexsort((chosen, -availability[chosen], zone[chosen]))]


def by_zone(trace: Trace, zones: Zones) -> list[dict]:
    """Availability per zone: devices, mean, p10, median, p90, and the UTC hour (or t mod 24 h
    without an origin) at which most of the zone is online."""
    availability = trace.availability()
    rows = []
    for value in np.unique(zones.values):
        mine = zones.values == value
        renumber = np.cumsum(mine) - 1
        keep = mine[trace.device_id]
        sub = dataclasses.replace(trace, device_id=renumber[trace.device_id[keep]], start=trace.start[keep],
                                  end=trace.end[keep], n_devices=int(mine.sum()))
        profile = [p if p is not None else -1.0 for p in hourly_profile(sub)]
        q10, q50, q90 = np.quantile(availability[mine], [0.1, 0.5, 0.9])
        rows.append({"zone": float(value), "devices": int(mine.sum()), "mean": float(availability[mine].mean()),
                     "q10": float(q10), "median": float(q50), "q90": float(q90),
                     "peak_hour": int(np.argmax(profile))})
    return rows
