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

from fedsim.errors import FedsimError, first_line
from fedsim.files import atomic_write, resolved
from fedsim.traces.converters import convert  # noqa: F401  (public API lives here too)
from fedsim.traces.schema import Trace, check_header, first_problem, merge_sorted, signed_ids

VERSION = "1"
COLUMNS = {"device_id": "integer", "start": "float", "end": "float"}
# the device table's known columns: (kind, the lowest value or None, whether it is allowed)
DEVICE_COLUMNS = {"device_id": ("integer", None, False), "tz_offset": ("float", -14.0, True),
                  "group": ("integer", None, False), "class": ("string", None, False),
                  "name": ("string", None, False), "flops": ("float", 0.0, False),
                  "downlink_bps": ("float", 0.0, False), "uplink_bps": ("float", 0.0, False),
                  "latency_s": ("float", 0.0, True), "seconds_per_sample": ("float", 0.0, True),
                  "bandwidth_bps": ("float", 0.0, False)}
OLD_NAMES = {"tz_offset_h": "tz_offset"}  # device tables of earlier fedsim versions
# what a run writes into devices.parquet itself: a device table column may not take these names
RUN_DEVICE_COLUMNS = ("invitations", "arrivals", "drops", "late", "surplus", "last_round", "trace_device",
                      "online_fraction", "n_samples", "n_test_samples", "user", "test_acc", "test_loss")
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


def devices_in_header(path) -> int | None:
    """A trace file's device count from its Parquet metadata alone (its intervals unread), or
    None where the file or its metadata is not as `write_trace` writes them (`read_trace` then
    says what is wrong)."""
    try:
        return int((pq.read_schema(path).metadata or {})[b"n_devices"])
    except (pa.ArrowException, OSError, KeyError, ValueError):
        return None


def checked_device_table(table: dict, path) -> pa.Table:
    """A device table (one row per trace device) as it is written to `path`: the known columns
    with their types, any other column as given, checked as `read_device_table` checks it (a
    command checks it so before it writes anything)."""
    where = f"device table {path}"
    frame = _device_frame({k: v if isinstance(v, np.ndarray) else np.asarray(v) for k, v in table.items()}, where)
    return pa.table({name: pa.array(values.tolist() if values.dtype == object else values)
                     for name, values in frame.items()})


def write_device_table(table: dict | pa.Table, path) -> None:
    """Write a device table atomically (a dict is checked first: checked_device_table)."""
    checked = table if isinstance(table, pa.Table) else checked_device_table(table, path)
    atomic_write(path, lambda tmp: pq.write_table(checked, tmp))


def read_device_table(path, skip: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """Read a device table (docs/timing.md, docs/traces.md): ``device_id`` and any of the known
    columns (DEVICE_COLUMNS; ``tz_offset_h`` is read as ``tz_offset``), plus any other column
    as it is, except the columns `skip`. Strings come back as arrays of Python str (dtype object)."""
    where = f"device table {path}"
    table = _read_table(path, where)
    columns = {}
    for name in table.column_names:
        if name in skip:
            continue
        column = table.column(name)
        if column.null_count:
            row = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
            raise FedsimError(f"{where}: column {name!r} is null on row {row}; give every device a value")
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            columns[name] = np.array(column.to_pylist(), dtype=object)
        elif pa.types.is_integer(column.type) or pa.types.is_floating(column.type) or pa.types.is_boolean(column.type):
            columns[name] = column.to_numpy()
        else:
            raise FedsimError(f"{where}: column {name!r} has type {column.type}; device table columns "
                              "are numbers or strings")
    return _device_frame(columns, where)


def _device_frame(columns: dict[str, np.ndarray], where: str) -> dict[str, np.ndarray]:
    """The columns checked and typed: device_id present and unique, known columns of their kind
    and range, no name a run writes itself; the first problem is one FedsimError line."""
    for old, new in OLD_NAMES.items():
        if old in columns and new in columns:
            raise FedsimError(f"{where}: has both {old} and {new} (the same thing, by its older name); "
                              f"keep {new}")
        if old in columns:
            columns = {(new if k == old else k): v for k, v in columns.items()}
    if "device_id" not in columns:
        raise FedsimError(f"{where}: missing column 'device_id'; a device table has one row per device "
                          f"(has {', '.join(columns) or 'none'})")
    clash = [name for name in columns if name in RUN_DEVICE_COLUMNS]
    if clash:
        raise FedsimError(f"{where}: column {clash[0]!r} is one that a run writes into devices.parquet "
                          "itself; rename it")
    ids = columns["device_id"]
    if ids.dtype.kind not in "iu":
        raise FedsimError(f"{where}: column 'device_id' has type {ids.dtype}; expected int64")
    ids = signed_ids(ids, "device_id", where)
    _check_device_ids(ids, where)
    out = {"device_id": ids}
    for name, values in columns.items():
        if name != "device_id":
            out[name] = _device_column(name, values, ids, where)
    return out


def _device_column(name: str, values: np.ndarray, ids: np.ndarray, where: str) -> np.ndarray:
    kind, low, inclusive = DEVICE_COLUMNS.get(name, (None, None, False))
    if len(values) != len(ids):
        raise FedsimError(f"{where}: column {name!r} has {len(values)} values for {len(ids)} devices")
    is_text = values.dtype == object or values.dtype.kind in "US"
    if kind is None:  # a column of the user's own: kept as it is
        return np.array([str(v) for v in values], dtype=object) if is_text else values
    expected = {"integer": "int64", "float": "float64", "string": "string"}[kind]
    fits = (is_text if kind == "string" else values.dtype.kind in "iu" if kind == "integer"
            else values.dtype.kind in "iuf")
    if not fits:
        raise FedsimError(f"{where}: column {name!r} has type {'string' if is_text else values.dtype}; "
                          f"expected {expected}")
    if kind == "string":
        values = np.array([str(v) for v in values], dtype=object)
        bad = np.array([not v.strip() for v in values], dtype=bool)
        rule = "a non-empty name"
    elif kind == "integer":
        return signed_ids(values, name, where) if values.dtype.kind == "u" else values.astype(np.int64)
    else:
        values = values.astype(np.float64)
        bad = ~np.isfinite(values)
        if low is not None:
            bad |= (values < low) if inclusive else (values <= low)
        if name == "tz_offset":
            bad |= values > 14.0
        rule = ("hours within [-14, 14]" if name == "tz_offset" else
                f"a finite number {'>=' if inclusive else '>'} {low:g}" if low is not None else "a finite number")
    if bad.any():
        row = int(np.argmax(bad))
        value = values[row].item() if isinstance(values[row], np.generic) else values[row]
        raise FedsimError(f"{where}: {name} = {value!r} on row {row} (device {ids[row]}); it must be "
                          f"{rule}")
    return values


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
    if path.is_symlink() and not path.exists():
        resolved(path, where)  # a loop says so; a dangling link is a missing file
    if not path.exists():
        raise FedsimError(f"{where}: file not found; check the path (relative paths start at "
                          f"{Path.cwd()})")
    if path.is_dir():
        raise FedsimError(f"{where}: is a directory; give the path of a .parquet file")
    try:
        return pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        detail = first_line(exc)
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
