"""The trace a run replays: a Parquet file or a generator with the run's sizes and seed, how
long it is, whether it loops (a generated trace repeats, a recorded one ends), which of its
devices the run's clients replay (`[trace] select`) and where in it the run starts
(`[trace] offset`); and how a run records a generated trace: by what recreates it (the
generator's call in manifest.json) and a fingerprint that a resume checks (TraceRecord), not
by its intervals, which can be hundreds of MB. A round-indexed generator's trace is held as
bits per round and device (fedsim/traces/round_bits.py), not as intervals.
"""

from __future__ import annotations

import dataclasses
import re
import hashlib
import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np

from fedsim.config.catalog import GENERATORS, TRACE_SELECTIONS
from fedsim.config import Config, config_from_dict
from fedsim.errors import FedsimError
from fedsim.files import file_fingerprint, resolved
from fedsim.results.run_format import read_manifest, run_config, runs_in
from fedsim.traces import Trace, generate, read_trace
from fedsim.traces.io import devices_in_header
from fedsim.traces.round_bits import RoundBits


def resolve_trace_path(config: Config) -> Config:
    """A relative trace path or device table is looked up in the working directory, then beside
    the config file; the run's config.toml records the absolute path so that a resume from any
    directory finds it too."""
    trace = config.trace
    for key in ("path", "devices_table"):
        given = getattr(trace, key)
        if not given or (key == "path" and trace.source != "file"):
            continue
        path, beside_config = Path(given), Path(config.source).parent / given
        if not path.is_absolute() and not path.exists() and beside_config.exists():
            path = beside_config
        where = f"{config.origins.get(('trace', key), config.source)}: [trace] {key}"
        trace = dataclasses.replace(trace, **{key: str(resolved(path, where))})
    return dataclasses.replace(config, trace=trace)


@dataclass(frozen=True)
class TraceRecord:
    """The generated trace a run started with, as its manifest records it: the generator's
    metadata (kind, version, seed, rounds or days, options), its horizon and the fingerprint of
    its intervals. Runs of earlier releases kept the trace itself (trace.parquet): `saved`."""

    fingerprint: str
    horizon: float
    generator: dict
    saved: Trace | None = None
    hashed: str = "intervals"  # what the fingerprint hashes (manifest `fingerprint_of`): see hashes

    @classmethod
    def of(cls, trace: Trace) -> "TraceRecord":
        return cls(trace_fingerprint(trace), trace.horizon, trace.generator, hashed=hashes(trace))


def recorded_trace(run_dir: Path, manifest: dict) -> TraceRecord | None:
    """The TraceRecord of a generated-trace run: from its manifest, or from the trace.parquet
    that runs of earlier releases wrote; None for a file trace (kept by path and fingerprint)."""
    trace = check_trace_record(run_dir, manifest)
    saved = saved_trace(run_dir, trace)
    if saved is not None:
        return dataclasses.replace(TraceRecord.of(saved), saved=saved)
    if not trace.get("fingerprint"):
        return None
    return TraceRecord(trace["fingerprint"], float(trace["horizon"]), trace.get("generator") or {},
                       hashed=trace.get("fingerprint_of", "intervals"))


def saved_trace(run_dir: Path, recorded: dict) -> Trace | None:
    """The trace.parquet that runs of earlier releases wrote into their directory, where the
    manifest records no trace or that one (`recorded`: its record): a file of that name put
    there since (`fedsim trace generate --out RUN/trace.parquet`) is not the run's trace."""
    saved = run_dir / "trace.parquet"
    if not saved.exists():
        return None
    if not recorded.get("fingerprint"):
        return read_trace(saved)
    if recorded.get("fingerprint_of", "intervals") != "intervals":  # (bits: a release that wrote no file)
        return None
    try:
        trace = read_trace(saved)
    except FedsimError:
        return None
    horizon = float(recorded.get("horizon", trace.horizon))
    return trace if trace_fingerprint(trace, horizon, of="intervals") == recorded["fingerprint"] else None


# what a manifest's record of the trace holds where it is set: (type, what the error calls it)
TRACE_RECORD = {"file": (dict, "a table of bytes and sha256"), "fingerprint": (str, "a SHA-256 text"),
                "horizon": ((int, float), "a number of seconds"), "generator": (dict, "a table")}


def check_trace_record(run_dir: Path, manifest: dict) -> dict:
    """The manifest's record of the trace the run replays ({} where it has none); FedsimError
    where it is not what a run writes."""
    trace = manifest.get("trace") or {}
    damage = _trace_record_damage(trace)
    if damage:
        raise FedsimError(f"{run_dir / 'manifest.json'}: damaged ({damage}); restore it, or delete its \"trace\" "
                          "entry to read the run's trace without checking it against the record")
    return trace


def _trace_record_damage(trace) -> str:
    """What is wrong with a trace record ('' if nothing): the first field not of its type."""
    if not isinstance(trace, dict):
        return f"trace = {trace!r} is not a table"
    for key, (kind, what) in TRACE_RECORD.items():
        value = trace.get(key)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            return f"trace.{key} = {value!r} is not {what}"
    file = trace.get("file")
    if file and not (isinstance(file.get("bytes"), int) and isinstance(file.get("sha256"), str)):
        return f"trace.file = {file!r} is not a table of bytes and sha256"
    if trace.get("fingerprint") and trace.get("horizon") is None:
        return "trace.horizon is missing beside its fingerprint"
    return ""


def run_trace(run_dir: Path) -> Trace:
    """The trace a run replays (a comparison's: its first algorithm's), as the run sees it: a
    file checked by its fingerprint, or a generated trace made again from its record; for
    `fedsim trace info` and `plot` of a run directory: its data, never its model (a module of
    the user's may not be importable where the trace is looked at)."""
    from fedsim.training import devices_of

    members = runs_in(run_dir)
    if not members:
        raise FedsimError(f"{run_dir}: is a directory; give the path of a .parquet file, or a run directory "
                          "that `fedsim run` made (this one has no manifest.json)")
    if (run_dir / "study.toml").is_file():
        raise FedsimError(f"{run_dir}: is a study's folder, whose points may replay different traces; give "
                          f"one point's run directory, e.g. {members[0]}")
    run_dir, manifest = members[0], read_manifest(members[0])
    check_trace_record(run_dir, manifest)
    if not (run_dir / "config.toml").is_file():
        raise FedsimError(f"{run_dir / 'config.toml'}: missing, so the trace the run replays is unknown; restore "
                          "it (a copy is in checkpoint.pt's 'config')")
    config = config_from_dict(run_config(run_dir), origin=str(run_dir / "config.toml"))
    n_devices, label_dist = devices_of(config.data, seed=config.run.seed)
    record = None
    if config.trace.source == "file":
        check_trace_file(Path(config.trace.path), (manifest.get("trace") or {}).get("file"))
    else:
        record = recorded_trace(run_dir, manifest)
    trace = load_trace(config, n_devices, label_dist, record)[0]
    if isinstance(trace, RoundBits):  # what `trace info` and `plot` read: the file's form
        return trace.to_trace(f"{run_dir}: its trace", "trace info and plot read a trace as intervals (the run "
                              "holds its trace as bits, without this limit)")
    return trace


def check_trace_file(path: Path, recorded: dict | None) -> None:
    """FedsimError when the trace file a run started with (`recorded`: its manifest's size and
    SHA-256) is gone from its path or is another file now."""
    if not recorded:
        return
    was = f"it had {recorded['bytes']} bytes, sha256 {recorded['sha256'][:12]}..."
    if not path.is_file():
        raise FedsimError(f"{path}: the run's trace file is gone (moved or deleted; {was}); put it back "
                          "at that path, or give its new place to the resume with --set trace.path=NEW (its bytes "
                          "are checked to be the run's)")
    if file_fingerprint(path) != recorded:
        raise FedsimError(f"{path}: the trace file changed since the run started ({was}); put the "
                          "original back, or start a new run with this trace")


def hashes(trace: Trace | RoundBits) -> str:
    """What `trace_fingerprint` hashes by default: a round-indexed trace's bits ("bits"), or
    intervals (runs of releases before the bits recorded every fingerprint so)."""
    return "bits" if isinstance(trace, RoundBits) else "intervals"


def trace_fingerprint(trace: Trace | RoundBits, horizon: float | None = None, of: str | None = None) -> str:
    """SHA-256 of `trace` over [0, horizon) (default: its own): of its bits (RoundBits: a
    read of 1 bit per round and device), or of its devices and intervals, column after
    column (`of` = "intervals": the bits give their interval form chunk by chunk, so that a
    run of an earlier release, which recorded that, still resumes)."""
    horizon = trace.horizon if horizon is None else horizon
    of = hashes(trace) if of is None else of
    if of == "bits":
        digest = hashlib.sha256(np.array([trace.n_devices, horizon, trace.round_duration]).tobytes())
        digest.update(np.ascontiguousarray(trace.bits[:trace.rounds_before(horizon)]).data)
        return digest.hexdigest()
    digest = hashlib.sha256(np.array([trace.n_devices, horizon]).tobytes())
    for k in range(3):
        if isinstance(trace, RoundBits):
            parts = (chunk[k] for chunk in trace.intervals(horizon))
        else:
            keep = trace.start < horizon
            parts = [(trace.device_id[keep], trace.start[keep], np.minimum(trace.end[keep], horizon))[k]]
        for part in parts:
            digest.update(np.ascontiguousarray(part).tobytes())
    return digest.hexdigest()


def continues(trace: Trace | RoundBits, record: TraceRecord) -> bool:
    """Whether `trace` has exactly the recorded trace's availability over its horizon (a
    longer generation of the same trace: round-indexed generators draw round by round, so they
    are prefix-stable)."""
    if record.hashed == "bits" and not isinstance(trace, RoundBits):
        return False
    return trace.horizon >= record.horizon and \
        trace_fingerprint(trace, record.horizon, record.hashed) == record.fingerprint


def load_trace(config: Config, n_devices: int, label_dist: np.ndarray | None,
               record: TraceRecord | None = None) -> tuple[Trace | RoundBits, np.ndarray]:
    """The run's availability and the trace device each of its devices replays. A resumed
    generated-trace run (`record`) continues its trace when a generation for its new extent
    agrees with it; otherwise it replays the trace it started with, generated again from the
    record (or read from an earlier release's trace.parquet) and checked by its fingerprint."""
    trace, chosen = placed(config, source_trace(config, n_devices, label_dist), n_devices)
    if record is None or continues(trace, record):
        return trace, chosen
    if record.saved is not None:
        return record.saved, chosen
    extent = {key: record.generator.get(key) for key in ("rounds", "days")}
    again, chosen = placed(config, source_trace(config, n_devices, label_dist, extent), n_devices)
    if continues(again, record):
        return again, chosen
    version = f" version {record.generator['version']}" if "version" in record.generator else ""
    raise FedsimError(
        f"{config.source}: [trace] source = {config.trace.source!r} now generates another trace than the "
        f"run started with (generator{version}, fingerprint sha256 {record.fingerprint[:12]}...); resume "
        "it with the release that started it (its manifest.json names it), or start a new run")


def placed(config: Config, trace: Trace | RoundBits, n_devices: int) -> tuple[Trace | RoundBits, np.ndarray]:
    """`trace` cut to the run's devices (`[trace] select`) and moved to its `[trace] offset`.
    Round-indexed bits stay bits unless moved (an offset takes rounds off their grid)."""
    if isinstance(trace, RoundBits):
        if trace.n_devices == n_devices and not offset_seconds(config, trace):
            return trace, np.arange(n_devices)
        trace = trace.to_trace(f"{config.where('trace', 'source')} = {config.trace.source!r}",
                               "use fewer devices or rounds, or no [trace] offset")
    chosen = np.arange(n_devices)
    if trace.n_devices != n_devices:
        chosen = choose_devices(config, trace, n_devices)
        trace = subset(trace, chosen)
    return shift(trace, offset_seconds(config, trace)), chosen


def choose_devices(config: Config, trace: Trace, n_devices: int) -> np.ndarray:
    check_device_count(config, trace.n_devices, n_devices)
    select = TRACE_SELECTIONS.lookup(config.trace.select, config.where("trace", "select"))
    return select(trace, n_devices, config.run.seed)


def check_device_count(config: Config, in_trace: int, n_devices: int) -> None:
    """A trace file of `in_trace` devices can replay a run of `n_devices` (with `[trace] select`
    where it has more); checked from its metadata before its intervals are read too."""
    where = f"trace {config.trace.path}"
    if in_trace < n_devices:
        raise FedsimError(f"{where}: has {in_trace} devices but [data] clients = {n_devices}; "
                          f"set data.clients = {in_trace} or fewer (or use a larger trace)")
    if in_trace != n_devices and not config.trace.select:
        raise FedsimError(
            f"{where}: has {in_trace} devices but [data] clients = {n_devices}; set "
            f"data.clients = {in_trace}, or [trace] select = \"random\" (or \"first\", "
            "\"most-available\") to replay that many of them")


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
    offset, where = config.trace.offset, config.where("trace", "offset")
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


def source_trace(config: Config, n_devices: int, label_dist: np.ndarray | None,
                 extent: dict | None = None) -> Trace | RoundBits:
    """A Parquet file, or a generator with the run's sizes and seed (over `extent`, rounds and
    days, when given: a resume's recorded one); a round-indexed generator's as bits."""
    tc = config.trace
    if tc.source == "file":
        in_trace = devices_in_header(Path(tc.path))
        if in_trace is not None:  # (a mismatch is one line before 100 MB of intervals are read)
            check_device_count(config, in_trace, n_devices)
        return read_trace(Path(tc.path))
    spec = GENERATORS.lookup(tc.source, config.where("trace", "source"))
    days = tc.days or None
    if days is None and not spec.round_indexed:  # wall-clock models: cover max_time, or a week
        days = config.run.max_time / 86400 if config.run.max_time else 7.0
    rounds = trace_rounds(config)
    if extent is not None:
        rounds, days = extent["rounds"], extent["days"]
    try:
        trace = generate(
            tc.source, n_devices, seed=config.run.seed, rounds=rounds,
            round_duration=config.server.round_duration, days=days,
            label_dist=label_dist if spec.needs_labels else None, as_bits=True, **tc.options,
        )
    except FedsimError as err:  # a generator's own check of its option: named with where it was set
        named = re.match(r"trace generator '[^']+': (\w+) ", str(err))
        where = config.origins.get(("trace", named[1])) if named else None
        raise (FedsimError(f"{where}: {err}") if where else err) from None
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
