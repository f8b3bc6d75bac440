"""The trace a run replays: a Parquet file or a generator with the run's sizes and seed, how
long it is, whether it loops (a generated trace repeats, a recorded one ends), which of its
devices the run's clients replay (`[trace] select`) and where in it the run starts
(`[trace] offset`).
"""

from __future__ import annotations

import dataclasses
import math
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np

from fedsim.config.catalog import GENERATORS, TRACE_SELECTIONS
from fedsim.config import Config
from fedsim.errors import FedsimError
from fedsim.files import resolved
from fedsim.traces import Trace, generate, read_trace


def resolve_trace_path(config: Config) -> Config:
    """A relative trace path is looked up in the working directory, then beside the config
    file; the run's config.toml records the absolute path so that a resume finds it too."""
    if config.trace.source != "file":
        return config
    path = Path(config.trace.path)
    beside_config = Path(config.source).parent / path
    if not path.is_absolute() and not path.exists() and beside_config.exists():
        path = beside_config
    where = f"{config.origins.get(('trace', 'path'), config.source)}: [trace] path"
    trace = dataclasses.replace(config.trace, path=str(resolved(path, where)))
    return dataclasses.replace(config, trace=trace)


def load_trace(config: Config, n_devices: int, label_dist: np.ndarray | None) -> tuple[Trace, np.ndarray]:
    """The run's availability and the trace device each of its devices replays."""
    trace = source_trace(config, n_devices, label_dist)
    chosen = np.arange(n_devices)
    if trace.n_devices != n_devices:
        chosen = choose_devices(config, trace, n_devices)
        trace = subset(trace, chosen)
    return shift(trace, offset_seconds(config, trace)), chosen


def choose_devices(config: Config, trace: Trace, n_devices: int) -> np.ndarray:
    where = f"trace {config.trace.path}"
    if trace.n_devices < n_devices:
        raise FedsimError(f"{where}: has {trace.n_devices} devices but [data] clients = {n_devices}; "
                          f"set data.clients = {trace.n_devices} or fewer (or use a larger trace)")
    if not config.trace.select:
        raise FedsimError(
            f"{where}: has {trace.n_devices} devices but [data] clients = {n_devices}; set "
            f"data.clients = {trace.n_devices}, or [trace] select = \"random\" (or \"first\", "
            "\"most-available\") to replay that many of them")
    select = TRACE_SELECTIONS.lookup(config.trace.select, f"{config.source}: [trace] select")
    return select(trace, n_devices, config.run.seed)


def select_first(trace: Trace, n: int, seed: int) -> np.ndarray:
    return np.arange(n)


def select_random(trace: Trace, n: int, seed: int) -> np.ndarray:
    return np.sort(np.random.default_rng([seed, 0x5E1EC7]).choice(trace.n_devices, n, replace=False))


def select_most_available(trace: Trace, n: int, seed: int) -> np.ndarray:
    """The n devices online longest over the trace (ties: the lower id)."""
    online = np.bincount(trace.device_id, weights=trace.end - trace.start, minlength=trace.n_devices)
    return np.sort(np.lexsort((np.arange(trace.n_devices), -online))[:n])


def subset(trace: Trace, chosen: np.ndarray) -> Trace:
    """The trace of devices `chosen` (sorted trace ids), renumbered 0..n-1; per-device lists of
    the generator's metadata (time zones, groups) follow them."""
    new_id = np.full(trace.n_devices, -1, dtype=np.int64)
    new_id[chosen] = np.arange(len(chosen))
    keep = new_id[trace.device_id] >= 0
    generator = {k: (np.asarray(v)[chosen].tolist() if isinstance(v, list) and len(v) == trace.n_devices
                     else v) for k, v in trace.generator.items()}
    return dataclasses.replace(trace, device_id=new_id[trace.device_id[keep]], start=trace.start[keep],
                               end=trace.end[keep], n_devices=len(chosen), generator=generator)


def offset_seconds(config: Config, trace: Trace) -> float:
    """`[trace] offset` in seconds after the trace's t = 0 (a date-time needs its origin)."""
    offset, where = config.trace.offset, f"{config.source}: [trace] offset"
    if isinstance(offset, str):
        if trace.origin is None:
            raise FedsimError(f"{where} = {offset!r}: the trace has no origin (no date for its t = 0); "
                              "give the offset in seconds")
        origin = datetime.fromisoformat(trace.origin)
        at = datetime.fromisoformat(offset)
        if at.tzinfo is None:
            at = at.replace(tzinfo=origin.tzinfo)
        if origin.tzinfo is None:
            origin = origin.replace(tzinfo=at.tzinfo)
        seconds = (at - origin).total_seconds()
        if seconds < 0:
            raise FedsimError(f"{where} = {offset!r} is before the trace starts ({trace.origin})")
    else:
        seconds = float(offset)
    if seconds >= trace.horizon:
        raise FedsimError(f"{where} = {offset!r} is beyond the trace's horizon ({trace.horizon:g} s); "
                          f"give an offset below it")
    return seconds


def shift(trace: Trace, offset: float) -> Trace:
    """The trace as seen from `offset` seconds in: t = 0 is then; a looping trace rotates."""
    if not offset:
        return trace
    later = trace.end > offset
    dev = [trace.device_id[later]]
    start, end = [np.maximum(trace.start[later], offset) - offset], [trace.end[later] - offset]
    horizon = trace.horizon - offset
    if trace.wrap == "loop":  # what came before the offset comes at the end of each cycle
        earlier = trace.start < offset
        dev.append(trace.device_id[earlier])
        start.append(trace.start[earlier] + horizon)
        end.append(np.minimum(trace.end[earlier], offset) + horizon)
        horizon = trace.horizon
    origin = None
    if trace.origin is not None:
        origin = (datetime.fromisoformat(trace.origin) + timedelta(seconds=offset)).isoformat()
    return Trace.from_intervals(np.concatenate(dev), np.concatenate(start), np.concatenate(end),
                                n_devices=trace.n_devices, horizon=horizon, wrap=trace.wrap,
                                origin=origin, generator={**trace.generator, "offset_s": offset})


def source_trace(config: Config, n_devices: int, label_dist: np.ndarray | None) -> Trace:
    """A Parquet file, or a generator with the run's sizes and seed."""
    tc = config.trace
    if tc.source == "file":
        return read_trace(Path(tc.path))
    spec = GENERATORS.lookup(tc.source, f"{config.source}: [trace] source")
    days = tc.days or None
    if days is None and not spec.round_indexed:  # wall-clock models: cover max_time, or a week
        days = config.run.max_time / 86400 if config.run.max_time else 7.0
    trace = generate(
        tc.source, n_devices, seed=config.run.seed, rounds=trace_rounds(config),
        round_duration=config.server.round_duration, days=days,
        label_dist=label_dist if spec.needs_labels else None, **tc.options,
    )
    # A generated trace repeats, so that a run is never cut short by the trace's length.
    return dataclasses.replace(trace, wrap="loop")


def trace_rounds(config: Config) -> int:
    """Rounds of `round_duration` seconds a round-indexed generator makes for this run: one per
    server round under ideal timing; under model timing enough for rounds that last up to the
    deadline, but no more than max_time needs."""
    run, server = config.run, config.server
    if server.timing == "ideal":
        return run.rounds
    seconds = run.rounds * max(server.round_duration, server.deadline)
    if run.max_time:
        seconds = min(seconds, run.max_time)
    return max(1, math.ceil(seconds / server.round_duration - 1e-9))


def agrees_with(new: Trace, old: Trace) -> bool:
    """Whether `new` has exactly `old`'s intervals over old's horizon (a longer generation of
    the same trace: round-indexed generators draw round by round, so they are prefix-stable)."""
    if new.n_devices != old.n_devices or new.horizon < old.horizon:
        return False
    keep = new.start < old.horizon
    return (np.array_equal(new.device_id[keep], old.device_id)
            and np.array_equal(new.start[keep], old.start)
            and np.array_equal(np.minimum(new.end[keep], old.horizon), old.end))
