"""Reading and writing trace files (Parquet) and the optional device table.

Every read validates the whole file and reports the first problem in one line naming the
file, the row (numbered from 0) and the device. Writes are atomic (temp file + os.replace),
so a crash never leaves a half-written trace behind.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from fedsim.errors import FedsimError
from fedsim.files import atomic_write
from fedsim.traces.converters import convert  # noqa: F401  (public API lives here too)
from fedsim.traces.schema import Trace, check_header, first_problem, merge_sorted, signed_ids

VERSION = "1"
COLUMNS = {"device_id": "integer", "start": "float", "end": "float"}
DEVICE_COLUMNS = {"device_id": "integer", "tz_offset_h": "float", "seconds_per_sample": "float",
                  "bandwidth_bps": "float", "group": "integer"}
# the lowest value of a speed column, and whether it is allowed itself
_DEVICE_BOUNDS = {"seconds_per_sample": (0.0, True), "bandwidth_bps": (0.0, False)}
_META_KEYS = ("fedsim.trace.version", "n_devices", "horizon", "origin", "wrap", "generator")


def write_trace(trace: Trace, path) -> None:
    """Write ``trace`` to ``path`` as Parquet with the fedsim key-value metadata."""
    table = pa.table({"device_id": pa.array(trace.device_id, pa.int64()),
                      "start": pa.array(trace.start, pa.float64()),
                      "end": pa.array(trace.end, pa.float64())})
    meta = {"fedsim.trace.version": VERSION, "n_devices": str(trace.n_devices),
            "horizon": repr(float(trace.horizon)), "wrap": trace.wrap,
            "origin": trace.origin or "", "generator": json.dumps(trace.generator, allow_nan=False)}
    table = table.replace_schema_metadata(meta)
    atomic_write(path, lambda tmp: pq.write_table(table, tmp))


def read_trace(path) -> Trace:
    """Read and fully validate a trace file written by ``write_trace`` (or any tool following
    the contract in docs/traces.md). Touching intervals of a device are merged silently."""
    where = f"trace {path}"
    table = _read_table(path, where)
    columns = _columns(table, COLUMNS, where, required=COLUMNS)
    device_id, start, end = columns["device_id"], columns["start"], columns["end"]
    n_devices, horizon, wrap, origin, generator = _read_meta(table.schema.metadata or {}, where)
    problem = first_problem(device_id, start, end, n_devices, horizon, need_sorted=True)
    if problem is not None:
        raise FedsimError(f"{where}: {problem}")
    device_id, start, end = merge_sorted(device_id, start, end)
    return Trace(device_id, start, end, n_devices, horizon, wrap, origin, generator)


def write_device_table(table: dict, path) -> None:
    """Write the optional per-device table (``devices.parquet``) atomically."""
    where = f"device table {path}"
    unknown = sorted(set(table) - set(DEVICE_COLUMNS))
    if unknown or "device_id" not in table:
        raise FedsimError(f"{where}: columns must include device_id and be among "
                          f"{', '.join(DEVICE_COLUMNS)}; got {', '.join(map(str, table))}")
    arrays = {name: pa.array(np.asarray(table[name],
                                        np.int64 if DEVICE_COLUMNS[name] == "integer" else np.float64))
              for name in DEVICE_COLUMNS if name in table}
    _check_device_ids(arrays["device_id"].to_numpy(), where)
    atomic_write(path, lambda tmp: pq.write_table(pa.table(arrays), tmp))


def read_device_table(path) -> dict[str, np.ndarray]:
    """Read ``devices.parquet``: ``device_id`` plus any of tz_offset_h, seconds_per_sample,
    bandwidth_bps, group. Returns the columns present, as numpy arrays."""
    where = f"device table {path}"
    table = _read_table(path, where)
    columns = _columns(table, DEVICE_COLUMNS, where, required={"device_id": "integer"})
    _check_device_ids(columns["device_id"], where)
    for name, values in columns.items():
        if values.dtype.kind != "f":
            continue
        low, inclusive = _DEVICE_BOUNDS.get(name, (-np.inf, False))
        bad = ~np.isfinite(values) | ((values < low) if inclusive else (values <= low))
        if bad.any():
            row = int(np.argmax(bad))
            bound = f" {'>=' if inclusive else '>'} {low:g}" if name in _DEVICE_BOUNDS else ""
            rule = f"a finite number{bound}"
            raise FedsimError(f"{where}: {name} = {float(values[row])!r} on row {row}; it must be "
                              f"{rule} (device {columns['device_id'][row]})")
    return columns


def _check_device_ids(ids: np.ndarray, where: str) -> None:
    if ids.size and ids.min() < 0:
        row = int(np.argmax(ids < 0))
        raise FedsimError(f"{where}: row {row}: device_id {ids[row]} < 0; ids start at 0")
    seen, first = np.unique(ids, return_index=True)
    if len(seen) < len(ids):
        row = int(np.setdiff1d(np.arange(len(ids)), first)[0])
        raise FedsimError(f"{where}: row {row}: device_id {ids[row]} appears twice; "
                          f"give one row per device")


def _read_table(path, where: str) -> pa.Table:
    path = Path(path)
    if not path.exists():
        raise FedsimError(f"{where}: file not found; check the path (relative paths start at "
                          f"{Path.cwd()})")
    if path.is_dir():
        raise FedsimError(f"{where}: is a directory; give the path of a .parquet file")
    try:
        return pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise FedsimError(f"{where}: not a readable Parquet file ({detail}); convert other formats "
                          f"with `fedsim trace convert`") from None


def _columns(table: pa.Table, kinds: dict, where: str, *, required: dict) -> dict[str, np.ndarray]:
    """The known columns as numpy arrays, type-checked; missing required ones are an error."""
    missing = [name for name in required if name not in table.column_names]
    if missing:
        raise FedsimError(f"{where}: missing column {missing[0]!r}; a trace needs columns "
                          f"{', '.join(required)} (has {', '.join(table.column_names) or 'none'})")
    out = {}
    for name, kind in kinds.items():
        if name not in table.column_names:
            continue
        column = table.column(name)
        ok = pa.types.is_integer(column.type) or (kind == "float" and pa.types.is_floating(column.type))
        if not ok:
            expected = "int64" if kind == "integer" else "float64 seconds"
            raise FedsimError(f"{where}: column {name!r} has type {column.type}; expected {expected}")
        if column.null_count:
            row = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
            raise FedsimError(f"{where}: row {row}: {name} is null; every row needs a value")
        values = column.to_numpy()
        out[name] = signed_ids(values, name, where) if kind == "integer" else values.astype(np.float64, copy=False)
    return out


def _read_meta(meta: dict, where: str):
    meta = {key.decode(): value.decode() for key, value in meta.items()}
    version = meta.get("fedsim.trace.version")
    if version is None:
        raise FedsimError(f"{where}: no 'fedsim.trace.version' metadata, so n_devices and horizon "
                          f"are unknown; write it with fedsim.traces.write_trace or make it with "
                          f"`fedsim trace convert --from csv`")
    if version != VERSION:
        raise FedsimError(f"{where}: trace version {version!r} is not supported; this fedsim "
                          f"reads version {VERSION!r}")
    for key in ("n_devices", "horizon"):
        if key not in meta:
            raise FedsimError(f"{where}: metadata {key!r} is missing; every trace records "
                              f"{', '.join(_META_KEYS[1:3])}")
    try:
        n_devices = int(meta["n_devices"])
    except ValueError:
        raise FedsimError(f"{where}: metadata n_devices = {meta['n_devices']!r} is not an integer") from None
    try:
        horizon = float(meta["horizon"])
    except ValueError:
        raise FedsimError(f"{where}: metadata horizon = {meta['horizon']!r} is not a number") from None
    wrap = meta.get("wrap") or "none"
    origin = meta.get("origin") or None
    try:
        generator = json.loads(meta.get("generator") or "{}")
    except json.JSONDecodeError as exc:
        raise FedsimError(f"{where}: metadata generator is not valid JSON ({exc})") from None
    if not isinstance(generator, dict):
        raise FedsimError(f"{where}: metadata generator must be a JSON object, got {generator!r}")
    n_devices, horizon = check_header(n_devices, horizon, wrap, origin, generator, where)
    return n_devices, horizon, wrap, origin, generator
