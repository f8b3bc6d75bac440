"""The trace a run replays: a Parquet file or a generator with the run's sizes and seed, how
long it is, and whether it loops (a generated trace repeats, a recorded one ends).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np

from fedsim.catalog import GENERATORS
from fedsim.config import Config
from fedsim.errors import FedsimError
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
    trace = dataclasses.replace(config.trace, path=str(path.resolve()))
    return dataclasses.replace(config, trace=trace)


def load_trace(config: Config, n_devices: int, label_dist: np.ndarray | None) -> Trace:
    """The run's availability: a Parquet file or a generator with the run's sizes and seed."""
    tc = config.trace
    if tc.source == "file":
        path = Path(tc.path)
        trace = read_trace(path)
        if trace.n_devices != n_devices:
            raise FedsimError(
                f"trace {path}: has {trace.n_devices} devices but [data] clients = {n_devices}; "
                f"set data.clients = {trace.n_devices} (or use a trace with {n_devices} devices)"
            )
        return trace
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
