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
* ``sessions``: text lines ``user first_online start tz_offset_h len_ms len_ms ...``:
  alternating online/offline session lengths, the first online iff first_online is 1. All
  lines of a user are one device; t = 0 is the earliest start (a date in years 1..9999);
  tz_offset_h in [-14, 14].
* ``csv``: ``device,start,end`` lines, columns picked by a header row, header optional.

csv and sessions take keyword options: ``time_unit`` (how times are written, TIME_UNITS;
without it they are detected), ``tz`` (the UTC offset of ISO times written without one) and,
for csv, ``device_col``/``start_col``/``end_col`` (header names).

Client ids map to 0..n-1 in sorted order (numerically when they are all integers); the
mapping is kept in ``generator["ids"]``, and ``generator["merged"]`` counts the intervals
merged into another (overlapping or touching ones of a device). Bad input raises one
FedsimError line naming the file and the line (or client) at fault.

A converter is a function (path, where, horizon, **options) -> Trace, registered by name in
fedsim/config/catalog.py CONVERTERS (plugins: docs/extending.md); one that takes no options is
called as (path, where, horizon). polars is imported by the converters that use it, so that
the re-export in ``traces.io`` does not cost its import.
"""

from __future__ import annotations

import csv as csvlib
import inspect
import io
import json
import pickle
import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fedsim.config.catalog import CONVERTERS
from fedsim import errors
from fedsim.errors import FedsimError, choice_error, did_you_mean
from fedsim.traces.intervals import clip
from fedsim.traces.schema import Trace, check_rows, positive_seconds

if TYPE_CHECKING:
    import polars as pl

TIME_UNITS = ("s", "ms", "iso")  # --time-unit: seconds or milliseconds since 1970, ISO 8601
RELATIVE_BELOW = 1e8  # csv numbers (detected) starting below this are seconds since t = 0
MS_FROM = 1e11  # detected csv instants starting from here are milliseconds (year 5138 as s)
LONG_RELATIVE_S = 366 * 86400.0  # relative csv seconds spanning more: a warning (milliseconds read as seconds?)
YEARS_S = (-62_135_596_800, 253_402_300_799)  # 0001-01-01 .. 9999-12-31 23:59:59 UTC, seconds


def convert(fmt: str, in_path, *, horizon: float | None = None, **options) -> Trace:
    """Read ``in_path`` in format ``fmt`` and return a validated Trace.

    ``options`` (None: not given) go to the converter as keywords; without any, a converter
    gets the plain ``(path, where, horizon)`` call that plugins are written for."""
    converter = CONVERTERS.lookup(fmt, "--from (trace format)")
    path = Path(in_path)
    where = f"{fmt} trace {path}"
    given = {key: value for key, value in options.items() if value is not None}
    _check_options(converter, fmt, given, where)
    if path.is_dir():
        raise FedsimError(f"{where}: is a folder; give the file to convert")
    if not path.is_file():
        raise FedsimError(f"{where}: file not found; check the path")
    if horizon is not None:
        horizon = positive_seconds(horizon, "horizon", where)
    try:
        return converter(path, where, horizon, **given)
    except FedsimError as err:
        guess = sniff_format(path)
        if guess is None or guess == fmt:
            raise
        raise FedsimError(f"{err}; the file looks like {guess}: try --from {guess}") from None


def sniff_format(path: Path) -> str | None:
    """The built-in format that the start of a file looks like, to name when another one
    failed to read it: a pickle (fedscale), a JSON object (flash), lines with commas (csv),
    lines of five or more fields whose second is 0 or 1 (sessions); None if none fits."""
    with open(path, "rb") as file:
        head = file.read(4096)
    if head[:1] == b"\x80":  # the pickle protocol opcode
        return "fedscale"
    text = head.decode("utf-8", errors="replace").lstrip()
    lines = [line for line in text.splitlines()[:4] if line.strip()]
    if text.startswith("{"):
        return "flash"
    if lines and all("," in line for line in lines):
        return "csv"
    fields = lines[0].split() if lines else []
    return "sessions" if len(fields) >= 5 and fields[1] in ("0", "1") else None


def _check_options(converter, fmt: str, given: dict, where: str) -> None:
    """Refuse an option the converter has no parameter for (it takes those after
    (path, where, horizon); one with **kwargs takes any)."""
    if not given:
        return
    try:
        params = list(inspect.signature(converter).parameters.values())[3:]
    except (TypeError, ValueError):  # a callable without a signature takes no options
        params = []
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return
    taken = [_flag(p.name) for p in params]
    for key in given:
        if _flag(key) in taken:
            continue
        if not taken:
            raise FedsimError(f"{where}: the {fmt!r} format takes no options; remove {_flag(key)}")
        raise choice_error(f"{where}: option", _flag(key), taken,
                           f"is not taken by the {fmt!r} format")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


# -- fedscale -------------------------------------------------------------------------------

class _PlainUnpickler(pickle.Unpickler):
    """Loads plain containers and numbers only: a trace file must not run code."""

    _ALLOWED = {("builtins", name) for name in ("dict", "list", "tuple", "set", "int", "float",
                                                  "str", "bool")} | {("collections", "OrderedDict")}

    def find_class(self, module, name):
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def fedscale(path: Path, where: str, horizon: float | None, *, repeat: str | None = None) -> Trace:
    mode = _repeat_mode(repeat, ("period", "none"), where)
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
    devs, starts, ends, past = [], [], [], {}
    for device, client in enumerate(ids):
        active, inactive, finish, cut = _fedscale_client(data[client], client, where)
        periods[device] = finish
        if cut:
            past[client] = cut
        devs.append(np.full(len(active), device))
        starts.append(active)
        ends.append(inactive)
    horizon = float(periods.max()) if horizon is None else horizon
    dev, start, end = np.concatenate(devs), np.concatenate(starts), np.concatenate(ends)
    recorded = clip(dev, start, end, 0.0, horizon)
    if mode == "period":
        dev, start, end = _unroll(dev, start, end, periods, horizon, where)
    else:
        dev, start, end = recorded
    columns = _record_columns([data[c] for c in ids], ("active", "inactive"))
    first = next(iter(past), None)
    warnings = [f"{len(past)} client(s) online past their finish_time, which ends each record (client {first!r}: "
                f"{past[first]:g} s after {periods[ids.index(first)]:g} s); that time is left out, as FedScale's "
                "replay leaves it"] if past else []
    return _trace(dev, start, end, n_devices=len(ids), horizon=horizon,
                  wrap="loop" if mode == "period" else "none", where=where,
                  generator={"kind": "fedscale", "source": path.name,
                             "ids": [_jsonable(i) for i in ids], "finish_time": periods.tolist(),
                             **_repetition(mode, recorded, (dev, start, end), periods, horizon),
                             "device_columns": columns, **({"warnings": warnings} if warnings else {})})


def _fedscale_client(record, client, where: str):
    """One client's intervals within [0, finish_time), its finish_time and the seconds online
    past it (cut), checked."""
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
    cut = float(np.maximum(inactive - np.maximum(active, finish), 0.0).sum())  # online time past finish_time
    _, active, inactive = clip(np.zeros(len(active)), active, inactive, 0.0, finish)
    return active, inactive, finish, cut


# -- flash ----------------------------------------------------------------------------------

_FLASH_STATES = {
    "battery_charged_on": ("charged", True), "battery_charged_off": ("charged", False),
    "wifi": ("wifi", True), "unknown": ("wifi", False), "2g": ("wifi", False),
    "3g": ("wifi", False), "4g": ("wifi", False), "5g": ("wifi", False),
    "screen_lock": ("locked", True), "screen_unlock": ("locked", False),
    "phone_off": ("locked", False),
}
_FLASH_IGNORED = {"screen_on", "screen_off", "battery_low", "battery_okay", "phone_on"}


def flash(path: Path, where: str, horizon: float | None, *, repeat: str | None = None) -> Trace:
    import polars as pl

    mode = _repeat_mode(repeat, ("span", "none"), where)
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
    recorded = clip(dev, start_t, end_t, 0.0, horizon)
    trace = _unroll(dev, start_t, end_t, period, horizon, where) if mode == "span" else recorded
    return _trace(*trace, n_devices=len(ids), horizon=horizon, origin=origin.isoformat(),
                  where=where, generator={"kind": "flash", "source": path.name,
                                          "ids": [_jsonable(i) for i in ids],
                                          **_repetition(mode, recorded, trace, period, horizon),
                                          "device_columns": _record_columns([data[u] for u in ids],
                                                                            ("messages",))})


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

_SESSION_LINE = "'user first_online(0|1) start tz_offset_h len_ms ...'"
_MS_RANGE = (YEARS_S[0] * 1000, YEARS_S[1] * 1000)  # start and session ends, ms since 1970
SPAN_OF_UNITS_MS = 20 * 365.25 * 86400e3  # numeric starts further apart: seconds mixed with milliseconds


def _session_rules() -> list:
    """(bad line, what the line needs); a missing field counts as bad. The need "" marks a
    start that is not a time (worded by _time_problem)."""
    import polars as pl

    return [
        (pl.col("start").is_null(), "a start time"),
        (pl.col("start_ms").is_null(), ""),
        (~pl.col("first_online").is_in(["0", "1"]), "first_online 0 or 1"),
        (~pl.col("start_ms").is_between(*_MS_RANGE), "a start in the years 1..9999"),
        (pl.col("tz").is_null(), "a tz_offset_h (hours, a number) after the start"),
        (~pl.col("tz").is_between(-14, 14), "tz_offset_h in hours within [-14, 14]"),
        (pl.col("lengths").list.eval(pl.element().is_null() | pl.element().is_nan()
                                     | (pl.element() < 0)).list.any(), "lengths >= 0 (milliseconds)"),
        (~(pl.col("start_ms") + pl.col("lengths").list.sum()).is_between(*_MS_RANGE),
         "sessions that end by the year 9999"),
    ]


def sessions(path: Path, where: str, horizon: float | None, *, time_unit: str | None = None,
             tz: str | None = None, repeat: str | None = None) -> Trace:
    import polars as pl

    _repeat_mode(repeat, ("none",), where)
    unit, tz_s = _time_options(time_unit, tz, where)
    fields = (pl.DataFrame({"text": _text(path, where).splitlines()}, schema={"text": pl.String})
              .with_row_index("line", offset=1)
              .with_columns(pl.col("text").str.strip_chars())
              .filter((pl.col("text") != "") & ~pl.col("text").str.starts_with("#"))
              .with_columns(pl.col("text").str.extract_all(r"\S+").alias("f")))
    if not fields.height:
        raise FedsimError(f"{where}: no session lines found; expected {_SESSION_LINE}")
    table = fields.select(
        "line", "text",
        user=pl.col("f").list.first(),
        first_online=pl.col("f").list.get(1, null_on_oob=True),
        start=pl.col("f").list.get(2, null_on_oob=True),
        tz=pl.col("f").list.get(3, null_on_oob=True).cast(pl.Float64, strict=False),
        lengths=pl.col("f").list.slice(4).cast(pl.List(pl.Float64), strict=False),
    )
    kind = _time_kind(unit, table["start"][0], tz_s, where)
    to_ms = 1e-3 if kind == "iso" else 1e3 if unit == "s" else 1.0  # numbers: ms by default
    table = table.with_columns(start_ms=_parse_times(table["start"], kind, tz_s) * to_ms)
    why = pl.coalesce(pl.when(rule.fill_null(True)).then(pl.lit(need)) for rule, need in _session_rules())
    bad = table.select("line", "text", "start", why.alias("why")).drop_nulls("why")
    if bad.height:
        line, text, start, need = bad.row(0)
        if not need:
            raise FedsimError(f"{where}: line {line}: start {start!r} {_time_problem(start, kind, unit)}")
        raise FedsimError(f"{where}: line {line}: expected {_SESSION_LINE} with {need}, "
                          f"got {text[:60]!r}")
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
    if kind == "number" and start_ms.max() - origin_ms > SPAN_OF_UNITS_MS:
        early, late = int(np.argmin(start_ms)), int(np.argmax(start_ms))
        raise FedsimError(f"{where}: line {table['line'][early]}'s start {table['start'][early]} and line "
                          f"{table['line'][late]}'s {table['start'][late]} are over 20 years apart: one is in seconds, "
                          "the other in milliseconds? Write every start in one unit (milliseconds, or all seconds "
                          "with --time-unit s)")
    end = (start_ms[row] - origin_ms + total - before[row]) / 1000.0
    start = end - length_ms / 1000.0
    first_online = (table["first_online"] == "1").to_numpy()
    online = ((position % 2 == 0) == first_online[row]) & (length_ms > 0)
    if not online.any():
        raise FedsimError(f"{where}: no online session of positive length; nothing to convert")
    horizon = float(end[online].max()) if horizon is None else horizon
    dev, start, end = clip(device[row][online], start[online], end[online], 0.0, horizon)
    _, first_line = np.unique(device, return_index=True)  # each user's first line sets its tz
    tz_h = table["tz"].to_numpy()[first_line]
    return _trace(dev, start, end, n_devices=len(ids), horizon=horizon,
                  origin=_utc(round(origin_ms * 1000)), where=where,
                  generator={"kind": "sessions", "source": path.name,
                             "ids": [_jsonable(i) for i in ids], "tz_offset_h": tz_h.tolist()})


# -- csv ------------------------------------------------------------------------------------

_CSV_FLAGS = ("--device-col", "--start-col", "--end-col")
EXTRA = "extra:"  # the prefix of a csv's other columns while it is read


def csv(path: Path, where: str, horizon: float | None, *, time_unit: str | None = None,
        tz: str | None = None, device_col: str | None = None, start_col: str | None = None,
        end_col: str | None = None, repeat: str | None = None) -> Trace:
    import polars as pl

    _repeat_mode(repeat, ("none",), where)
    unit, tz_s = _time_options(time_unit, tz, where)
    frame, labels = _csv_frame(path, where, (device_col, start_col, end_col))
    kind = _time_kind(unit, frame["start"][0], tz_s, where)
    frame = frame.with_columns(t0=_parse_times(frame["start"], kind, tz_s),
                               t1=_parse_times(frame["end"], kind, tz_s))
    bad = frame.filter((pl.col("device") == "").fill_null(True) | pl.col("t0").is_null()
                       | pl.col("t1").is_null())
    if bad.height:
        row = bad.row(0, named=True)
        if not row["device"]:
            raise FedsimError(f"{where}: line {row['line']}: {labels[0]} is empty; every line "
                              f"needs a device id, a start and an end")
        key, label = ("start", labels[1]) if row["t0"] is None else ("end", labels[2])
        if row[key] is None:
            raise FedsimError(f"{where}: line {row['line']}: {label} is missing; every line needs "
                              f"a device id, a start and an end")
        raise FedsimError(f"{where}: line {row['line']}: {label} {row[key]!r} "
                          f"{_time_problem(row[key], kind, unit)}")
    start, end, origin = _csv_seconds(frame, kind, unit, labels, where)
    problem = np.flatnonzero(~((start >= 0) & (end > start) & np.isfinite(end)))
    if problem.size:
        row = frame.row(int(problem[0]), named=True)
        raise FedsimError(f"{where}: line {row['line']}: interval [{row['start']}, {row['end']}) "
                          f"needs finite 0 <= start < end")
    dev, ids = _device_numbers(frame["device"])
    numbers = dev
    merged_ids = _ids_of_one_number(frame["device"], dev) if ids is None else None
    n_devices = len(ids) if ids is not None else int(dev.max()) + 1
    horizon = float(end.max()) if horizon is None else horizon
    dev, start, end = clip(dev, start, end, 0.0, horizon)
    generator = {"kind": "csv", "source": path.name}
    if ids is not None:
        generator["ids"] = ids
    frame = frame.with_columns(number=pl.Series(numbers))
    warnings = [merged_ids] if merged_ids else []
    if kind == "number" and unit is None and origin is None and float(end.max()) > LONG_RELATIVE_S:
        warnings.append(f"the times were read as seconds since t = 0 (they start below {RELATIVE_BELOW:g}), which "
                        f"makes the trace {float(end.max()) / 86400:,.0f} days long; if they are milliseconds, give "
                        "--time-unit ms")
    if kind == "iso":
        tz_h, unknown, lineless = _device_offsets(frame.with_columns(offset=_local_offsets(frame["start"], tz_s)),
                                                  n_devices)
        if unknown:
            warnings.append(f"{unknown} of {n_devices} devices have no UTC offset in their times, which are read as "
                            "UTC; no tz_offset written (give --tz ZONE for the zone of times written without one)")
        else:
            generator["tz_offset_h"] = tz_h
            if lineless:
                warnings.append(f"{lineless} of {n_devices} devices have no line (never online: ids with gaps); their "
                                f"tz_offset is the one most devices have, {_most_common(tz_h):+g} h")
    generator["device_columns"], skipped = _csv_device_columns(frame, n_devices)
    if skipped and len(np.unique(numbers)) < n_devices:
        warnings.append(f"some device numbers have no line (ids with gaps), so the columns "
                        f"{', '.join(skipped)} are left out of the device table")
    elif skipped:
        many = len(skipped) > 1
        warnings.append(f"column{'s' * many} {', '.join(skipped)} var{'y' if many else 'ies'} within a device, "
                        f"so {'they are not per-device columns' if many else 'it is not a per-device column'}; "
                        "left out of the device table")
    if warnings:
        generator["warnings"] = warnings
    return _trace(dev, start, end, n_devices=n_devices, horizon=horizon, origin=origin,
                  generator=generator, where=where)


def _device_offsets(frame, n_devices: int) -> tuple[list[float], int, int]:
    """Each device's most common UTC offset in hours (ties: the smallest); how many devices with
    times have none known; and how many have no line at all, which take the offset most devices
    have (a device never online has no times to tell its zone, and needs one in the table)."""
    modes = (frame.drop_nulls("offset").group_by("number", "offset").len()
             .sort(["number", "len", "offset"], descending=[False, True, False])
             .unique("number", keep="first", maintain_order=True))
    tz = np.full(n_devices, np.nan)
    tz[modes["number"].to_numpy()] = modes["offset"].to_numpy()
    lined = np.zeros(n_devices, dtype=bool)
    lined[frame["number"].to_numpy()] = True
    unknown = int((np.isnan(tz) & lined).sum())
    if not unknown and not lined.all():
        tz[~lined] = _most_common(tz[lined])
    return tz.tolist(), unknown, int((~lined).sum())


def _most_common(values) -> float:
    """The most common of `values` (ties: the smallest)."""
    found, counts = np.unique(np.asarray(values, dtype=np.float64), return_counts=True)
    return float(found[np.argmax(counts)])


def _csv_device_columns(frame, n_devices: int) -> tuple[dict[str, list], list[str]]:
    """The csv's other columns whose value is one per device (numbers where they all read as
    numbers), and the names of those that vary within a device."""
    import polars as pl

    extras = [c for c in frame.columns if c.startswith(EXTRA)]
    if not extras:
        return {}, []
    per_device = frame.group_by("number").agg(*[pl.col(c).n_unique().alias(f"n:{c}") for c in extras],
                                              *[pl.col(c).first() for c in extras]).sort("number")
    columns, skipped = {}, []
    for c in extras:
        name = c.removeprefix(EXTRA)
        if per_device[f"n:{c}"].max() > 1 or per_device.height < n_devices or per_device[c].null_count():
            skipped.append(name)
            continue
        numbers = per_device[c].cast(pl.Float64, strict=False)
        columns[name] = (numbers if numbers.null_count() == 0 else per_device[c]).to_list()
    return columns, skipped


def _csv_frame(path: Path, where: str, named: tuple):
    """The data lines as stripped strings: columns line (1-based in the file), device, start,
    end; and the names of those columns for messages. Blank lines are dropped."""
    import polars as pl

    data = path.read_bytes().removeprefix(b"\xef\xbb\xbf")  # the BOM spreadsheets write
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        raise FedsimError(f"{where}: not a UTF-8 text file") from None
    body = data.lstrip()
    if not body:
        raise FedsimError(f"{where}: the file is empty; expected lines 'device_id,start,end'")
    first_line = data.count(b"\n", 0, len(data) - len(body)) + 1
    try:
        raw = pl.read_csv(body, has_header=False, infer_schema=False)
    except pl.exceptions.PolarsError as exc:
        _csv_unreadable(body, first_line, where, exc)
    raw = raw.select(pl.all().str.strip_chars())
    head = raw.row(0)
    header = any(named) or not _is_time(head[-1])
    if header and not any(named):
        _refuse_a_bad_first_line(head, where, first_line)
    columns, labels = _csv_columns(head if header else None, named, where, first_line)
    frame = (raw.with_row_index("line", offset=first_line)
             .slice(1 if header else 0)
             .filter(~pl.all_horizontal(pl.exclude("line").fill_null("") == ""))
             .select("line", *(pl.col(raw.columns[i]).alias(name)
                               for i, name in zip(columns, ("device", "start", "end"))),
                     *(pl.col(raw.columns[i]).alias(f"{EXTRA}{head[i]}") for i in range(len(head))
                       if header and head[i] and i not in columns)))
    if not frame.height:
        raise FedsimError(f"{where}: no data after the header line {first_line} "
                          f"{','.join(h or '' for h in head)[:60]!r}; expected lines "
                          f"'{','.join(labels)}'")
    return frame, labels


def _refuse_a_bad_first_line(head: tuple, where: str, line: int) -> None:
    """A first line of three fields whose start or end is a time is data, not a header: one of
    its times is wrong (`0,0,36OO`: a typo that would otherwise drop the line as a header)."""
    if len(head) != 3 or not any(v is not None and (_is_time(v) or _zone_beyond_range(v)) for v in head[1:]):
        return
    for name, value in zip(("start", "end"), head[1:]):
        if not value:
            raise FedsimError(f"{where}: line {line}: no {name} time (the line's other time makes it a line of "
                              f"data, not a header); give each line device,start,end")
        if not _is_time(value):
            zone = _zone_beyond_range(value)
            why = _time_problem(value, "iso", None) if zone else "is neither a number nor an ISO 8601 time"
            raise FedsimError(f"{where}: line {line}: {name} {value!r} {why} (the line's other time makes it a "
                              "line of data, not a header)")


def _csv_columns(head: tuple | None, named: tuple, where: str, line: int):
    """Indices of the device, start and end columns, and their names: by name when options
    name them or the header has device_id, start and end; else the only three columns."""
    defaults = ("device_id", "start", "end")
    if head is not None and (any(named) or set(defaults) <= set(head)):
        wanted = [name or default for name, default in zip(named, defaults)]
        for name in wanted:
            if name not in head:
                found = [h for h in head if h]
                raise FedsimError(f"{where}: line {line}: the header has no column {name!r}; "
                                  f"{did_you_mean(name, found, end='? ')}columns found: "
                                  f"{', '.join(found)}; pick them with {', '.join(_CSV_FLAGS)}")
        return [head.index(name) for name in wanted], wanted
    width = 3 if head is None else len(head)
    if width != 3:
        separator = next((name for sep, name in ((";", "semicolons"), ("\t", "tabs"), ("|", "bars"))
                          if width == 1 and sep in (head[0] or "")), None)
        if separator:
            raise FedsimError(f"{where}: line {line}: one column, its fields separated by {separator}; csv fields are "
                              "separated by commas: save the file with commas")
        missing = [name for name in defaults if name not in head]
        named_some = f"no column named {' or '.join(missing)}" if len(missing) < 3 else "none named device_id, start and end"
        raise FedsimError(f"{where}: line {line}: {width} column{'s' * (width != 1)} ({', '.join(map(str, head))}) but "
                          f"{named_some}; pick them with {', '.join(_CSV_FLAGS)}")
    return [0, 1, 2], ["device", "start", "end"] if head is None else [h or "" for h in head]


def _csv_unreadable(body: bytes, start_line: int, where: str, exc: Exception):
    """Raise for a file polars cannot parse, naming the first line with too many fields
    (read again with the csv module: only on this error path)."""
    reader = csvlib.reader(io.StringIO(body.decode("utf-8")))
    width = None
    for fields in reader:
        width = width or len(fields)
        if len(fields) > width:
            raise FedsimError(f"{where}: line {start_line + reader.line_num - 1}: {len(fields)} "
                              f"fields where line {start_line} has {width}; give every line the "
                              f"same columns")
    raise FedsimError(f"{where}: not readable as CSV ({errors.first_line(exc)})")


def _csv_seconds(frame, kind: str, unit: str | None, labels: list, where: str):
    """Start and end in seconds since t = 0, and the origin: the earliest start for instants,
    none for numbers read as relative seconds (detected: they start below RELATIVE_BELOW)."""
    t0, t1 = frame["t0"].to_numpy(), frame["t1"].to_numpy()
    first = t0.min()
    if kind == "iso":  # int64 microseconds: subtract before converting, exactly
        return (t0 - first) / 1e6, (t1 - first) / 1e6, _utc(int(first))
    if unit is None and first < RELATIVE_BELOW:
        return t0, t1, None
    ms = unit == "ms" or (unit is None and first >= MS_FROM)
    scale = 1e-3 if ms else 1.0
    low, high = YEARS_S[0] / scale, YEARS_S[1] / scale
    outside = np.flatnonzero(~((t0 >= low) & (t0 <= high) & (t1 >= low) & (t1 <= high)))
    if outside.size:
        row = frame.row(int(outside[0]), named=True)
        key, label = ("start", labels[1]) if not low <= row["t0"] <= high else ("end", labels[2])
        value = row["t0" if key == "start" else "t1"]
        what = "milliseconds" if ms else "seconds"
        fix = ("; this contradicts --time-unit s: the times look like milliseconds, use "
               "--time-unit ms" if unit == "s" and _MS_RANGE[0] <= value <= _MS_RANGE[1] else "")
        raise FedsimError(f"{where}: line {row['line']}: {label} {row[key]} as {what} since 1970 "
                          f"is outside the years 1..9999{fix}")
    return (t0 - first) * scale, (t1 - first) * scale, _utc(round(first * scale * 1e6))


def _ids_of_one_number(names, numbers: np.ndarray) -> str:
    """A warning where ids written differently are one device number ('007' and '7'), else ""."""
    import polars as pl

    spellings = pl.DataFrame({"name": names, "number": numbers}).unique().group_by("number").agg(pl.col("name").sort())
    twice = spellings.filter(pl.col("name").list.len() > 1)
    if not twice.height:
        return ""
    first = twice.sort("number").row(0, named=True)
    others = f" (and {twice.height - 1} more numbers written two ways)" if twice.height > 1 else ""
    return (f"ids written differently are one device: {' and '.join(repr(n) for n in first['name'])} are device "
            f"{first['number']}{others}; write each id one way if they are different devices")


def _device_numbers(names):
    """Device numbers for the id column: non-negative integers as they are; other ids map to
    0..n-1 in sorted order (numeric when all are integers), returned as the second value."""
    import polars as pl

    integer = names.cast(pl.Int64, strict=False)
    if integer.null_count() == 0 and integer.min() >= 0:
        return integer.to_numpy(), None
    key = integer if integer.null_count() == 0 else names
    ids = key.unique().sort()
    return ids.search_sorted(key).cast(pl.Int64).to_numpy(), ids.to_list()


# -- timestamps -----------------------------------------------------------------------------

# [0-9], not \d: both regex engines would take other scripts' digits
_NUMBER_RE = r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?[iI][nN][fF]"
_NUMBER = re.compile(_NUMBER_RE)
_ISO = (r"^[0-9]{4}-[0-9]{2}-[0-9]{2}(?:[Tt ][0-9]{2}:[0-9]{2}(?::[0-9]{2}(?:[.,][0-9]+)?)?"
        r"\s*(?:[Zz]|[+-][0-9]{2}(?::?[0-9]{2})?)?)?$")  # a zone only after a clock
_TZ = re.compile(r"(?:UTC|GMT|Z)?(?:([+-])([0-9]{1,2})(?::?([0-9]{2}))?)?", re.IGNORECASE)
_ISO_EXAMPLE = "2024-03-01T08:00:00+02:00"
MAX_TZ_S = 14 * 3600  # UTC offsets run from -12:00 to +14:00; fedsim takes either sign up to 14 h
_TZ_RANGE = "-14:00..+14:00"


def _time_options(time_unit, tz, where: str) -> tuple[str | None, int | None]:
    """The checked time unit (None: detect) and --tz as seconds east of UTC (None: not given)."""
    if time_unit is not None and time_unit not in TIME_UNITS:
        raise choice_error(f"{where}: --time-unit", time_unit, TIME_UNITS)
    if tz is None:
        return time_unit, None
    match = _TZ.fullmatch(str(tz).strip())
    if not str(tz).strip() or not match or int(match[3] or 0) > 59:
        raise FedsimError(f"{where}: --tz {tz!r} is not a UTC offset; give one like +02:00, "
                          f"-05:30 or UTC (zone names such as Europe/Paris are not supported)")
    sign = -1 if match[1] == "-" else 1
    tz_s = sign * (int(match[2] or 0) * 3600 + int(match[3] or 0) * 60)
    if abs(tz_s) > MAX_TZ_S:
        raise FedsimError(f"{where}: --tz {tz!r} is beyond {_TZ_RANGE}, the range of UTC offsets; give the "
                          "offset of the times' zone")
    return time_unit, tz_s


def _time_kind(unit: str | None, first: str | None, tz_s: int | None, where: str) -> str:
    """"iso" or "number": from the unit, else from the first value."""
    if unit is not None:
        kind = "iso" if unit == "iso" else "number"
    else:
        kind = "number" if first is not None and _NUMBER.fullmatch(first) else "iso"
    if tz_s is not None and kind == "number":
        raise FedsimError(f"{where}: --tz applies to ISO 8601 times written without an offset, "
                          f"but the times are numbers (since 1970, UTC); remove --tz")
    return kind


def _parse_times(text, kind: str, tz_s: int | None):
    """A Series of numbers as written (Float64) or of ISO 8601 times as microseconds since
    1970 (Int64); null where the text is not of that kind."""
    import polars as pl

    if kind == "number":
        return pl.select(pl.when(text.str.contains(f"^(?:{_NUMBER_RE})$"))
                         .then(text.cast(pl.Float64, strict=False))).to_series()
    parts, offset = _iso_parts(text, tz_s)
    hour, minute, second, zone_h, zone_m = map(pl.col, ("hour", "minute", "second", "zone_h", "zone_m"))
    us = (pl.col("date").cast(pl.Int64) * 86_400_000_000 + pl.col("us")
          + (hour * 3600 + minute * 60 + second - offset) * 1_000_000)
    valid = (pl.col("ok") & pl.col("date").is_not_null() & (pl.col("date").dt.year() >= 1)
             & (hour < 24) & (minute < 60) & (second < 60) & (zone_h * 3600 + zone_m * 60 <= MAX_TZ_S) & (zone_m < 60)
             & us.is_between(YEARS_S[0] * 1_000_000, YEARS_S[1] * 1_000_000 + 999_999))
    return parts.select(pl.when(valid).then(us)).to_series()


def _iso_parts(text, tz_s: int | None):
    """The fields of ISO 8601 times and their UTC offset in seconds (--tz, else UTC, where a
    time has none). Once _ISO matches, the date and clock fields sit at fixed places (slicing
    is much faster than capture groups): "YYYY-MM-DD", then "HH:MM[:SS[.f]]" after a T, then
    the zone."""
    import polars as pl

    clock = text.str.extract(r"^.{10}[Tt ]([0-9:.,]+)", 1)
    zone = (text.str.slice(clock.str.len_chars() + 11).str.strip_chars().fill_null("")
            .str.to_uppercase().str.replace(":", "", literal=True))
    parts = pl.DataFrame({
        "ok": text.str.contains(_ISO),
        "date": text.str.slice(0, 10).str.to_date("%Y-%m-%d", strict=False),
        "hour": _digits(clock.str.slice(0, 2)), "minute": _digits(clock.str.slice(3, 2)),
        "second": _digits(clock.str.slice(6, 2)),
        "us": _digits(clock.str.slice(9, 6).str.pad_end(6, "0")),
        "naive": zone == "", "zone_h": _digits(zone.str.slice(1, 2)),
        "zone_m": _digits(zone.str.slice(3, 2)), "west": zone.str.starts_with("-")})
    zone_h, zone_m = pl.col("zone_h"), pl.col("zone_m")
    offset = (pl.when("naive").then(pl.lit(tz_s or 0))
              .otherwise(pl.when("west").then(-1).otherwise(1) * (zone_h * 3600 + zone_m * 60)))
    return parts, offset


def _local_offsets(text, tz_s: int | None):
    """Each ISO time's UTC offset in hours: its own, --tz's for a time without one, null where
    neither says (a time without an offset and no --tz: UTC is assumed, not known)."""
    import polars as pl

    parts, offset = _iso_parts(text, tz_s)
    known = ~pl.col("naive") | pl.lit(tz_s is not None)
    return parts.select(pl.when(known).then(offset / 3600.0)).to_series()


def _digits(piece):
    """The integer a field of digits reads as; 0 where the field is absent."""
    import polars as pl

    return piece.cast(pl.Int64, strict=False).fill_null(0)


def _is_kind(value: str, kind: str) -> bool:
    import polars as pl

    if kind == "number":
        return _NUMBER.fullmatch(value) is not None
    return _parse_times(pl.Series([value], dtype=pl.String), "iso", None)[0] is not None


def _is_time(value: str | None) -> bool:
    return value is not None and (_is_kind(value, "number") or _is_kind(value, "iso"))


def _time_problem(value: str, kind: str, unit: str | None) -> str:
    """Why ``value`` is not a time of ``kind``: the end of an error line."""
    other = "iso" if kind == "number" else "number"
    what = {"iso": "an ISO 8601 time", "number": "a number"}
    zone = _zone_beyond_range(value)
    if zone:
        return f"has the UTC offset {zone}, beyond {_TZ_RANGE}; give the offset of the times' zone"
    if _is_kind(value, other):
        if unit:
            fix = "--time-unit iso" if other == "iso" else "--time-unit s or ms"
            return f"is {what[other]}, which contradicts --time-unit {unit}; use {fix}"
        return (f"is {what[other]} but the first line's start is {what[kind]}; write every time "
                f"the same way (or give --time-unit)")
    if unit is None:
        return f"is not a time; expected a number or an ISO 8601 time like {_ISO_EXAMPLE}"
    expected = f"an ISO 8601 time like {_ISO_EXAMPLE}" if kind == "iso" else "a number"
    return f"is not a time; expected {expected} (--time-unit {unit})"


def _zone_beyond_range(value: str) -> str | None:
    """The UTC offset of an ISO time, as written, if it is beyond +-14 h (else None)."""
    import polars as pl

    if _parse_times(pl.Series([value], dtype=pl.String), "iso", 0)[0] is not None:
        return None
    parts, offset = _iso_parts(pl.Series([value], dtype=pl.String), 0)
    zone = parts.select(pl.when(pl.col("ok") & ~pl.col("naive") & (pl.col("zone_m") < 60)).then(offset)).item()
    return None if zone is None or abs(zone) <= MAX_TZ_S else re.search(r"[+-][0-9:]+\s*$", value)[0].strip()


def _utc(microseconds: int) -> str:
    """The ISO 8601 instant (UTC) ``microseconds`` after 1970."""
    return (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=microseconds)).isoformat()


# -- shared ---------------------------------------------------------------------------------

def _trace(dev, start, end, *, where: str, **header) -> Trace:
    """The validated trace; ``generator["merged"]`` counts the intervals that
    ``Trace.from_intervals`` merged into another (overlapping or touching ones of a device)."""
    trace = Trace.from_intervals(dev, start, end, where=where, **header)
    return replace(trace, generator={**trace.generator, "merged": len(dev) - trace.n_intervals})


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


def _repeat_mode(repeat: str | None, modes: tuple[str, ...], where: str) -> str:
    """The checked --repeat (the first of `modes` when not given): the home simulator's rule
    (FLASH: span, FedScale: period) or none, which keeps only what was recorded."""
    if repeat is None:
        return modes[0]
    if repeat not in modes:
        only = (" (a record of intervals is converted as it was recorded)" if modes == ("none",) else "")
        raise choice_error(f"{where}: --repeat", repeat, list(modes), f"is not valid for this format{only}")
    return repeat


def _repetition(mode: str, recorded, trace, period: np.ndarray, horizon: float) -> dict:
    """What a repetition rule added, for the metadata and `trace convert`'s warning: online
    seconds as recorded and in the trace (both within the horizon), and how many devices'
    records (first to last message, or FedScale's finish_time) cover less than half of it."""
    online = lambda intervals: float(np.sum(intervals[2] - intervals[1]))  # noqa: E731
    return {"repeat": mode, "recorded_online_s": online(recorded), "online_s": online(trace),
            "short_records": int(np.sum(period < horizon / 2))}


def _record_columns(records: list, skip: tuple[str, ...]) -> dict[str, list]:
    """The per-device fields of a source's records that every device has as a plain value
    (a FLASH user's guid and model, a FedScale client's finish_time), as device-table columns."""
    dicts = [r for r in records if isinstance(r, dict)]
    if len(dicts) < len(records) or not dicts:
        return {}
    names = [k for k in dicts[0] if isinstance(k, str) and k not in skip
             and all(isinstance(r.get(k), (str, int, float)) and not isinstance(r.get(k), bool) for r in dicts)]
    columns = {}
    for name in names:
        values = [r[name] for r in dicts]
        kinds = {type(v) for v in values}
        if kinds <= {int, float}:
            columns[name] = [float(v) for v in values] if float in kinds else values
        elif kinds == {str}:
            columns[name] = values
    return columns


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


