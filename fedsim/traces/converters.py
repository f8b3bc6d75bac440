"""Converters from third-party availability dumps to fedsim traces.

Formats (docs/traces.md):

* ``fedscale``: FedScale ``client_behave_trace`` pickle, ``{client_id: {'active': [s..],
  'inactive': [s..], 'finish_time': s, ...}}``; online on [active[k], inactive[k]); each client
  repeats modulo its own finish_time. Unrolled to ``horizon`` (default: the largest
  finish_time) and marked ``wrap = "loop"``, so the replay goes on like FedScale's does.
* ``flash``: FLASH ``user_behavior`` JSON, ``{uid: {'guid', 'model', 'messages'}}`` where
  ``messages`` holds lines ``YYYY-MM-DD HH:MM:SS<TAB>state``. A user is available while the
  screen is locked, on Wi-Fi and charging; each user repeats over its own first..last
  message span, as FLASH replays it. t = 0 is the earliest message of all users.
* ``sessions``: text lines ``user first_online start_ms tz_offset_h len_ms len_ms ...``:
  alternating online/offline session lengths, the first online iff first_online is 1. All
  lines of a user are one device; t = 0 is the earliest start_ms (a date in years 1..9999);
  tz_offset_h in [-14, 14].
* ``csv``: ``device_id,start,end`` in seconds, header optional.

Client ids map to 0..n-1 in sorted order (numerically when they are all integers); the
mapping is kept in ``generator["ids"]``. Bad input raises one FedsimError line naming the
file and the line (or client) at fault.

A converter is a function (path, where, horizon) -> Trace, registered by name in
fedsim/catalog.py CONVERTERS (plugins: docs/extending.md). polars is imported by the
converters that use it, so that the re-export in ``traces.io`` does not cost its import.
"""

from __future__ import annotations

import io
import json
import pickle
import re
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np

from fedsim.catalog import CONVERTERS
from fedsim.errors import FedsimError
from fedsim.traces.intervals import clip
from fedsim.traces.schema import Trace, check_rows, positive_seconds



def convert(fmt: str, in_path, *, horizon: float | None = None) -> Trace:
    """Read ``in_path`` in format ``fmt`` and return a validated Trace."""
    converter = CONVERTERS.lookup(fmt, "--from (trace format)")
    path = Path(in_path)
    where = f"{fmt} trace {path}"
    if not path.is_file():
        raise FedsimError(f"{where}: file not found; check the path")
    if horizon is not None:
        horizon = positive_seconds(horizon, "horizon", where)
    return converter(path, where, horizon)


# -- fedscale -------------------------------------------------------------------------------

class _PlainUnpickler(pickle.Unpickler):
    """Loads plain containers and numbers only: a trace file must not run code."""

    _ALLOWED = {("builtins", name) for name in ("dict", "list", "tuple", "set", "int", "float",
                                                  "str", "bool")} | {("collections", "OrderedDict")}

    def find_class(self, module, name):
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def fedscale(path: Path, where: str, horizon: float | None) -> Trace:
    try:
        with path.open("rb") as f:
            data = _PlainUnpickler(f).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as exc:
        raise FedsimError(f"{where}: not a FedScale client_behave_trace pickle ({exc})") from None
    if not isinstance(data, dict) or not data:
        got = "an empty dict" if isinstance(data, dict) else type(data).__name__
        raise FedsimError(f"{where}: expected a dict {{client_id: {{'active', 'inactive', "
                          f"'finish_time'}}}}, got {got}")
    ids = _sorted_ids(data)
    periods = np.empty(len(ids))
    devs, starts, ends = [], [], []
    for device, client in enumerate(ids):
        active, inactive, finish = _fedscale_client(data[client], client, where)
        periods[device] = finish
        devs.append(np.full(len(active), device))
        starts.append(active)
        ends.append(inactive)
    horizon = float(periods.max()) if horizon is None else horizon
    dev, start, end = np.concatenate(devs), np.concatenate(starts), np.concatenate(ends)
    dev, start, end = _unroll(dev, start, end, periods, horizon, where)
    return Trace.from_intervals(dev, start, end, n_devices=len(ids), horizon=horizon, wrap="loop",
                                where=where,
                                generator={"kind": "fedscale", "source": path.name,
                                           "ids": [_jsonable(i) for i in ids],
                                           "finish_time": periods.tolist()})


def _fedscale_client(record, client, where: str):
    """One client's intervals within [0, finish_time) and its finish_time, checked."""
    at = f"{where}: client {client!r}"
    if not isinstance(record, dict) or not {"active", "inactive", "finish_time"} <= set(record):
        raise FedsimError(f"{at}: needs keys 'active', 'inactive' and 'finish_time'")
    try:
        active = np.asarray(record["active"], dtype=np.float64).reshape(-1)
        inactive = np.asarray(record["inactive"], dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise FedsimError(f"{at}: 'active' and 'inactive' must be lists of seconds") from None
    finish = positive_seconds(record["finish_time"], "finish_time", at)
    if len(active) == len(inactive) + 1:  # still online when the record ends
        inactive = np.append(inactive, finish)
    if len(active) != len(inactive):
        raise FedsimError(f"{at}: {len(active)} 'active' times but {len(inactive)} 'inactive'; "
                          f"they pair up as online intervals [active[k], inactive[k])")
    bad = np.flatnonzero(~(np.isfinite(active) & np.isfinite(inactive) & (active >= 0)
                           & (inactive >= active)))
    if bad.size:
        k = int(bad[0])
        raise FedsimError(f"{at}: interval {k} [{active[k]}, {inactive[k]}) is not a valid online "
                          f"interval (need 0 <= active <= inactive)")
    _, active, inactive = clip(np.zeros(len(active)), active, inactive, 0.0, finish)
    return active, inactive, finish


# -- flash ----------------------------------------------------------------------------------

_FLASH_STATES = {
    "battery_charged_on": ("charged", True), "battery_charged_off": ("charged", False),
    "wifi": ("wifi", True), "unknown": ("wifi", False), "2g": ("wifi", False),
    "3g": ("wifi", False), "4g": ("wifi", False), "5g": ("wifi", False),
    "screen_lock": ("locked", True), "screen_unlock": ("locked", False),
    "phone_off": ("locked", False),
}
_FLASH_IGNORED = {"screen_on", "screen_off", "battery_low", "battery_okay", "phone_on"}


def flash(path: Path, where: str, horizon: float | None) -> Trace:
    import polars as pl

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as exc:  # bad UTF-8 or JSON, a 5000-digit number, deep nesting
        raise FedsimError(f"{where}: not FLASH user-behaviour JSON ({exc})") from None
    if not isinstance(data, dict) or not data:
        raise FedsimError(f"{where}: expected a JSON object {{uid: {{'messages': ...}}}}")
    ids = _sorted_ids(data)
    for uid in ids:
        if not isinstance(data[uid], dict) or not isinstance(data[uid].get("messages"), str):
            raise FedsimError(f"{where}: user {uid!r} has no 'messages' string")
    lines = (pl.DataFrame({"device": np.arange(len(ids)),
                           "text": [data[uid]["messages"] for uid in ids]})
             .with_columns(pl.col("text").str.split("\n"))
             .explode("text")
             .with_columns(pl.int_range(pl.len()).over("device").alias("line"),
                           pl.col("text").str.strip_chars())
             .filter(pl.col("text") != "")
             .with_columns(pl.col("text").str.split_exact("\t", 1).alias("parts"))
             .unnest("parts")
             .rename({"field_0": "stamp", "field_1": "state"})
             .with_columns(pl.col("stamp").str.strip_chars()
                           .str.strptime(pl.Datetime("us"), "%Y-%m-%d %H:%M:%S", strict=False)
                           .alias("time"),
                           pl.col("state").str.strip_chars().str.to_lowercase()))
    _flash_check(lines, ids, where)
    lines = lines.sort(["device", "time"], maintain_order=True)
    for flag in ("charged", "wifi", "locked"):
        setting = {s: v for s, (f, v) in _FLASH_STATES.items() if f == flag}
        lines = lines.with_columns(
            pl.col("state").replace_strict(setting, default=None, return_dtype=pl.Boolean)
            .forward_fill().over("device").fill_null(False).alias(flag))
    origin = lines["time"].min()
    seconds = ((lines["time"] - origin).dt.total_microseconds() / 1e6).to_numpy()
    ready = (lines["charged"] & lines["wifi"] & lines["locked"]).to_numpy()
    device = lines["device"].to_numpy().astype(np.int64)
    first = np.concatenate([[True], device[1:] != device[:-1]])
    last = np.concatenate([device[1:] != device[:-1], [True]])
    was_ready = np.roll(ready, 1) & ~first
    # A run opens at a message that makes the user ready and closes at the next message that
    # does not, or at the user's last message.
    opens = np.flatnonzero(ready & ~was_ready)
    closes = np.flatnonzero((~ready & was_ready) | (ready & last))
    span_start, span_end = seconds[first], seconds[last]
    flat = np.flatnonzero(span_end <= span_start)
    if flat.size:
        raise FedsimError(f"{where}: user {ids[device[first][flat[0]]]!r} has messages at one "
                          f"instant only; a trace needs a time span to replay")
    period = np.zeros(len(ids))
    period[device[first]] = span_end - span_start
    dev, start_t, end_t = device[opens], seconds[opens], seconds[closes]
    horizon = float(span_end.max()) if horizon is None else horizon
    dev, start, end = _unroll(dev, start_t, end_t, period, horizon, where)
    return Trace.from_intervals(dev, start, end, n_devices=len(ids), horizon=horizon, wrap="none",
                                origin=origin.isoformat(), where=where,
                                generator={"kind": "flash", "source": path.name,
                                           "ids": [_jsonable(i) for i in ids]})


def _flash_check(lines: pl.DataFrame, ids: list, where: str) -> None:
    import polars as pl

    if not lines.height:
        raise FedsimError(f"{where}: no user has any message; expected 'messages' lines "
                          f"'YYYY-MM-DD HH:MM:SS<TAB>state'")
    known = set(_FLASH_STATES) | _FLASH_IGNORED
    is_level = pl.col("state").str.contains(r"^[0-9.]+%$")
    bad = lines.filter(pl.col("time").is_null() | pl.col("state").is_null()
                       | ~(pl.col("state").is_in(list(known)) | is_level))
    if bad.height:
        row = bad.row(0, named=True)
        user = ids[row["device"]]
        raise FedsimError(f"{where}: user {user!r} message line {row['line'] + 1}: "
                          f"{row['text']!r} is not 'YYYY-MM-DD HH:MM:SS<TAB>state' with a known "
                          f"state ({', '.join(sorted(known))} or a battery level like 80%)")


# -- sessions -------------------------------------------------------------------------------

# start_ms and session ends must be datetimes: years 1..9999, in ms since 1970
_MS_RANGE = (-62_135_596_800_000, 253_402_300_799_000)


def _session_rules() -> list:
    """(bad line, what the line needs); a missing field counts as bad."""
    import polars as pl

    return [
        (~pl.col("first_online").is_in(["0", "1"]), "first_online 0 or 1"),
        (~pl.col("start_ms").is_between(*_MS_RANGE), "start_ms in milliseconds since 1970, years 1..9999"),
        (~pl.col("tz").is_between(-14, 14), "tz_offset_h in hours within [-14, 14]"),
        (pl.col("lengths").list.eval(pl.element().is_null() | pl.element().is_nan()
                                     | (pl.element() < 0)).list.any(), "lengths >= 0 (milliseconds)"),
        (~(pl.col("start_ms") + pl.col("lengths").list.sum()).is_between(*_MS_RANGE),
         "sessions that end by the year 9999"),
    ]


def sessions(path: Path, where: str, horizon: float | None) -> Trace:
    import polars as pl

    fields = (pl.DataFrame({"text": _text(path, where).splitlines()}, schema={"text": pl.String})
              .with_row_index("line", offset=1)
              .with_columns(pl.col("text").str.strip_chars())
              .filter((pl.col("text") != "") & ~pl.col("text").str.starts_with("#"))
              .with_columns(pl.col("text").str.extract_all(r"\S+").alias("f")))
    if not fields.height:
        raise FedsimError(f"{where}: no session lines found; expected 'user first_online(0|1) "
                          f"start_ms tz_offset_h len_ms ...'")
    number = pl.col("f").list.get(pl.lit(2), null_on_oob=True)
    table = fields.select(
        "line", "text",
        user=pl.col("f").list.first(),
        first_online=pl.col("f").list.get(1, null_on_oob=True),
        start_ms=number.cast(pl.Float64, strict=False),
        tz=pl.col("f").list.get(3, null_on_oob=True).cast(pl.Float64, strict=False),
        lengths=pl.col("f").list.slice(4).cast(pl.List(pl.Float64), strict=False),
    )
    why = pl.coalesce(pl.when(rule.fill_null(True)).then(pl.lit(need)) for rule, need in _session_rules())
    bad = table.select("line", "text", why.alias("why")).drop_nulls("why")
    if bad.height:
        line, text, need = bad.row(0)
        raise FedsimError(f"{where}: line {line}: expected 'user first_online(0|1) start_ms "
                          f"tz_offset_h len_ms ...' with {need}, got {text[:60]!r}")
    users = table["user"].to_list()
    ids = _sorted_ids(dict.fromkeys(users))
    device = table["user"].replace_strict({u: i for i, u in enumerate(ids)},
                                          return_dtype=pl.Int64).to_numpy()
    count = table["lengths"].list.len().to_numpy()
    length_ms = table["lengths"].explode().drop_nulls().to_numpy()
    row = np.repeat(np.arange(table.height), count)
    offset = np.cumsum(count) - count
    position = np.arange(len(length_ms)) - offset[row]
    # Cumulative milliseconds per line: exact for integer ms (float64 sums of integers).
    total = np.cumsum(length_ms)
    before = np.concatenate([[0.0], total])[offset]
    start_ms = table["start_ms"].to_numpy()
    origin_ms = float(start_ms.min())
    end = (start_ms[row] - origin_ms + total - before[row]) / 1000.0
    start = end - length_ms / 1000.0
    first_online = (table["first_online"] == "1").to_numpy()
    online = ((position % 2 == 0) == first_online[row]) & (length_ms > 0)
    if not online.any():
        raise FedsimError(f"{where}: no online session of positive length; nothing to convert")
    horizon = float(end[online].max()) if horizon is None else horizon
    dev, start, end = clip(device[row][online], start[online], end[online], 0.0, horizon)
    _, first_line = np.unique(device, return_index=True)  # each user's first line sets its tz
    tz = table["tz"].to_numpy()[first_line]
    origin = (datetime(1970, 1, 1) + timedelta(milliseconds=origin_ms)).isoformat() + "+00:00"
    return Trace.from_intervals(dev, start, end, n_devices=len(ids), horizon=horizon,
                                origin=origin, where=where,
                                generator={"kind": "sessions", "source": path.name,
                                           "ids": [_jsonable(i) for i in ids],
                                           "tz_offset_h": tz.tolist()})


# -- csv ------------------------------------------------------------------------------------

def csv(path: Path, where: str, horizon: float | None) -> Trace:
    import polars as pl

    text = _text(path, where)
    rows = [line for line in text.splitlines()]
    first = next((i for i, line in enumerate(rows) if line.strip()), None)
    if first is None:
        raise FedsimError(f"{where}: the file is empty; expected lines 'device_id,start,end'")
    header = not _is_number(rows[first].split(",")[-1].strip())
    skip = first + (1 if header else 0)
    if not any(line.strip() for line in rows[skip:]):
        raise FedsimError(f"{where}: no data after the header line {first + 1} "
                          f"{rows[first].strip()[:60]!r}; expected lines 'device_id,start,end'")
    try:
        table = pl.read_csv(io.StringIO(text), has_header=False, skip_rows=skip,
                            new_columns=["device_id", "start", "end"],
                            schema_overrides=[pl.String] * 3)
        if table.width != 3:
            raise pl.exceptions.ComputeError("wrong field count")
    except (pl.exceptions.PolarsError, ValueError):
        _csv_bad_line(rows, skip, where)
        raise
    table = table.filter(~pl.all_horizontal(pl.all().is_null()))  # blank lines
    ids_raw = table["device_id"].str.strip_chars()
    start = table["start"].str.strip_chars().cast(pl.Float64, strict=False).to_numpy()
    end = table["end"].str.strip_chars().cast(pl.Float64, strict=False).to_numpy()
    bad = np.flatnonzero(ids_raw.is_null().to_numpy() | np.isnan(start) | np.isnan(end))
    if bad.size:
        _csv_bad_line(rows, skip, where)
    integer = ids_raw.cast(pl.Int64, strict=False)
    if integer.null_count() == 0 and integer.min() >= 0:
        dev = integer.to_numpy()
        n_devices, ids = int(dev.max()) + 1 if len(dev) else 0, None
    else:
        ids = sorted(set(ids_raw.to_list()))
        dev = ids_raw.replace_strict({k: i for i, k in enumerate(ids)}, return_dtype=pl.Int64).to_numpy()
        n_devices = len(ids)
    problem = np.flatnonzero((start < 0) | (end <= start) | ~np.isfinite(start) | ~np.isfinite(end))
    if problem.size:
        k = int(problem[0])
        raise FedsimError(f"{where}: line {_csv_line(rows, skip, k)}: interval [{start[k]}, {end[k]}) "
                          f"needs 0 <= start < end")
    horizon = float(end.max()) if horizon is None else horizon
    dev, start, end = clip(dev, start, end, 0.0, horizon)
    generator = {"kind": "csv", "source": path.name}
    if ids is not None:
        generator["ids"] = ids
    return Trace.from_intervals(dev, start, end, n_devices=max(n_devices, 1), horizon=horizon,
                                generator=generator, where=where)


def _csv_bad_line(rows: list[str], skip: int, where: str) -> None:
    """Find the first malformed data line (slow path, only on error) and raise."""
    for number in range(skip, len(rows)):
        line = rows[number]
        if not line.strip():
            continue
        fields = [x.strip() for x in line.split(",")]
        if len(fields) != 3 or not fields[0] or not all(_is_number(x) for x in fields[1:]):
            raise FedsimError(f"{where}: line {number + 1}: expected 'device_id,start,end' with "
                              f"times in seconds, got {line.strip()[:60]!r}")
    raise FedsimError(f"{where}: could not parse as 'device_id,start,end' lines")


def _csv_line(rows: list[str], skip: int, k: int) -> int:
    """1-based file line of data row k (blank lines are skipped by the parser)."""
    seen = -1
    for number in range(skip, len(rows)):
        if rows[number].strip():
            seen += 1
            if seen == k:
                return number + 1
    return skip + k + 1


# -- shared ---------------------------------------------------------------------------------

def _unroll(dev, start, end, period, horizon: float, where: str):
    """Repeat each device's intervals every ``period[device]`` seconds, over [0, horizon)."""
    with np.errstate(over="ignore"):  # a tiny period with a huge horizon: refused just below
        first_k = np.floor(-end / period[dev]) + 1  # first copy ending after 0
        last_k = np.ceil((horizon - start) / period[dev]) - 1  # last copy starting before horizon
    count = np.maximum(last_k - first_k + 1, 0)  # floats: a huge horizon cannot overflow
    check_rows(count.sum(), f"unrolling to horizon {horizon:g} s", where, "give a shorter --horizon")
    count = count.astype(np.int64)
    row = np.repeat(np.arange(len(dev)), count)
    k = first_k[row] + np.arange(len(row)) - np.repeat(np.cumsum(count) - count, count)
    shift = k * period[dev[row]]
    return clip(dev[row], start[row] + shift, end[row] + shift, 0.0, horizon)


def _sorted_ids(mapping) -> list:
    """Keys in numeric order when they all are integers (or integer strings), else as text."""
    keys = list(mapping)
    try:
        return sorted(keys, key=lambda k: int(k))
    except (TypeError, ValueError):
        return sorted(keys, key=str)


def _jsonable(value):
    return value if isinstance(value, (int, str)) else str(value)


def _text(path: Path, where: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise FedsimError(f"{where}: not a UTF-8 text file") from None


_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|[+-]?inf", re.IGNORECASE)


def _is_number(text: str) -> bool:
    """A number as the CSV parser reads it (no nan, no 1_000, unlike Python's float)."""
    return _NUMBER.fullmatch(text.strip()) is not None


