"""Trace schema and Parquet I/O: round trips, merging, and one-line errors for bad files."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fedsim.errors import FedsimError
from fedsim.traces import Trace, read_trace, write_trace
from fedsim.traces.io import read_device_table, write_device_table

META = {"fedsim.trace.version": "1", "n_devices": "4", "horizon": "100.0", "wrap": "none",
        "origin": "", "generator": "{}"}
GOOD = {"device_id": [0, 0, 2, 3], "start": [0.0, 20.0, 5.0, 50.0], "end": [10.0, 30.0, 15.0, 100.0]}


def write_raw(path, columns=None, meta=None, schema=None):
    """A Parquet file with exactly the given columns and metadata (no validation)."""
    table = pa.table(columns if columns is not None else GOOD, schema=schema)
    pq.write_table(table.replace_schema_metadata(META if meta is None else meta), path)
    return path


def error_of(path) -> str:
    with pytest.raises(FedsimError) as info:
        read_trace(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    return message


def test_round_trip_keeps_everything(tmp_path):
    trace = Trace.from_intervals([3, 0, 0], [50.0, 20.0, 0.0], [60.0, 30.0, 10.5], n_devices=5,
                                 horizon=86400.0, wrap="loop", origin="2024-01-01T00:00:00+00:00",
                                 generator={"kind": "test", "p": [0.1, 0.2]})
    write_trace(trace, tmp_path / "t.parquet")
    back = read_trace(tmp_path / "t.parquet")
    assert back.device_id.tolist() == [0, 0, 3]
    assert back.start.tolist() == [0.0, 20.0, 50.0] and back.end.tolist() == [10.5, 30.0, 60.0]
    assert (back.n_devices, back.horizon, back.wrap, back.origin) == (5, 86400.0, "loop",
                                                                     "2024-01-01T00:00:00+00:00")
    assert back.generator == {"kind": "test", "p": [0.1, 0.2]}
    meta = pq.read_schema(tmp_path / "t.parquet").metadata
    assert meta[b"fedsim.trace.version"] == b"1" and json.loads(meta[b"generator"])["kind"] == "test"
    assert [p.name for p in tmp_path.iterdir()] == ["t.parquet"]  # no temp file left behind


def test_from_intervals_merges_touching_and_overlapping():
    trace = Trace.from_intervals([1, 1, 1, 1, 0], [0, 5, 8, 20, 3], [5, 9, 12, 25, 4],
                                 n_devices=2, horizon=30)
    assert trace.device_id.tolist() == [0, 1, 1]
    assert trace.start.tolist() == [3, 0, 20] and trace.end.tolist() == [4, 12, 25]
    assert trace.availability().tolist() == pytest.approx([1 / 30, 17 / 30])


def test_merge_keeps_a_long_interval_that_swallows_later_ones():
    trace = Trace.from_intervals([0, 0, 0, 1], [0, 2, 4, 1], [10, 3, 5, 2], n_devices=2, horizon=10)
    assert trace.start.tolist() == [0, 1] and trace.end.tolist() == [10, 2]


@pytest.mark.parametrize("ids, start, end, expect", [
    ([0], [5.0], [5.0], "end 5.0 <= start 5.0"),
    ([0], [-1.0], [5.0], "start -1.0 < 0"),
    ([0], [np.nan], [5.0], "start is nan"),
    ([2], [0.0], [1.0], "device_id 2 is outside 0..1"),
    ([0], [0.0], [11.0], "end 11.0 > horizon 10.0"),
])
def test_from_intervals_rejects_bad_rows(ids, start, end, expect):
    with pytest.raises(FedsimError, match=expect):
        Trace.from_intervals(ids, start, end, n_devices=2, horizon=10.0)


def test_from_intervals_rejects_bad_header():
    with pytest.raises(FedsimError, match="wrap"):
        Trace.from_intervals([0], [0], [1], n_devices=1, horizon=1, wrap="cycle")
    with pytest.raises(FedsimError, match="horizon"):
        Trace.from_intervals([0], [0], [1], n_devices=1, horizon=0)
    with pytest.raises(FedsimError, match="origin"):
        Trace.from_intervals([0], [0], [1], n_devices=1, horizon=1, origin="yesterday")


def test_read_merges_touching_rows(tmp_path):
    path = write_raw(tmp_path / "t.parquet", {"device_id": [0, 0], "start": [0.0, 5.0],
                                             "end": [5.0, 9.0]})
    trace = read_trace(path)
    assert trace.start.tolist() == [0.0] and trace.end.tolist() == [9.0]


def test_read_accepts_int32_ids_and_integer_times(tmp_path):
    schema = pa.schema([("device_id", pa.int32()), ("start", pa.int64()), ("end", pa.float32())])
    trace = read_trace(write_raw(tmp_path / "t.parquet", schema=schema))
    assert trace.device_id.dtype == np.int64 and trace.start.dtype == np.float64
    assert trace.end.tolist() == [10.0, 30.0, 15.0, 100.0]


def bad(column, values):
    return {**GOOD, column: values}


@pytest.mark.parametrize("columns, expect", [
    (bad("end", [10.0, 30.0, 15.0, 40.0]), "row 3 (device 3): end 40.0 <= start 50.0; intervals need end > start"),
    (bad("start", [0.0, 5.0, 5.0, 50.0]), "row 1 (device 0): start 5.0 < end 10.0 of the previous interval"),
    (bad("start", [0.0, 20.0, np.nan, 50.0]), "row 2 (device 2): start is nan"),
    (bad("start", [-2.0, 20.0, 5.0, 50.0]), "row 0 (device 0): start -2.0 < 0"),
    (bad("device_id", [0, 0, 4, 3]), "row 2 (device 4): device_id 4 is outside 0..3"),
    (bad("device_id", [0, 0, 3, 2]), "row 3 (device 2): rows are not sorted"),
    (bad("end", [10.0, 30.0, 15.0, 101.0]), "row 3 (device 3): end 101.0 > horizon 100.0"),
])
def test_read_names_first_bad_row(tmp_path, columns, expect):
    assert expect in error_of(write_raw(tmp_path / "bad.parquet", columns))


def test_read_reports_missing_and_mistyped_columns(tmp_path):
    missing = {k: v for k, v in GOOD.items() if k != "end"}
    assert "missing column 'end'" in error_of(write_raw(tmp_path / "a.parquet", missing))
    mistyped = {**GOOD, "start": ["0", "20", "5", "50"]}
    assert "column 'start' has type string" in error_of(write_raw(tmp_path / "b.parquet", mistyped))
    floats = {**GOOD, "device_id": [0.0, 0.0, 2.0, 3.0]}
    assert "column 'device_id' has type double" in error_of(write_raw(tmp_path / "c.parquet", floats))


def test_read_reports_nulls(tmp_path):
    path = write_raw(tmp_path / "n.parquet", bad("end", [10.0, None, 15.0, 100.0]))
    assert "row 1: end is null" in error_of(path)


def test_read_reports_missing_file_and_non_parquet(tmp_path):
    assert "file not found" in error_of(tmp_path / "nope.parquet")
    (tmp_path / "x.parquet").write_text("device_id,start,end\n0,0,1\n")
    assert "not a readable Parquet file" in error_of(tmp_path / "x.parquet")


@pytest.mark.parametrize("meta, expect", [
    ({}, "no 'fedsim.trace.version' metadata"),
    ({**META, "fedsim.trace.version": "7"}, "version '7' is not supported"),
    ({k: v for k, v in META.items() if k != "horizon"}, "metadata 'horizon' is missing"),
    ({**META, "n_devices": "four"}, "n_devices = 'four' is not an integer"),
    ({**META, "horizon": "-5"}, "horizon = -5.0"),
    ({**META, "wrap": "cycle"}, "wrap = 'cycle'"),
    ({**META, "origin": "noon"}, "origin = 'noon' is not an ISO-8601"),
    ({**META, "generator": "{oops"}, "generator is not valid JSON"),
])
def test_read_reports_bad_metadata(tmp_path, meta, expect):
    assert expect in error_of(write_raw(tmp_path / "m.parquet", meta=meta))


def test_device_table_round_trip_and_errors(tmp_path):
    table = {"device_id": np.array([0, 1, 2]), "tz_offset_h": np.array([-5.0, 0.0, 5.5]),
             "group": np.array([0, 1, 1]), "class": ["phone-low", "phone-mid", "tablet"],
             "flops": [1e9, 2e9, 3e9], "os": ["android", "ios", "android"], "battery_wh": [15.0, 12.0, 30.0]}
    write_device_table(table, tmp_path / "devices.parquet")
    back = read_device_table(tmp_path / "devices.parquet")
    # the older name tz_offset_h is read as tz_offset; columns of the user's own are kept
    assert sorted(back) == ["battery_wh", "class", "device_id", "flops", "group", "os", "tz_offset"]
    assert back["tz_offset"].tolist() == [-5.0, 0.0, 5.5] and back["group"].dtype == np.int64
    assert back["class"].tolist() == ["phone-low", "phone-mid", "tablet"] and back["os"].tolist()[1] == "ios"
    pq.write_table(pa.table({"device_id": [0, 0]}), tmp_path / "dup.parquet")
    with pytest.raises(FedsimError, match="row 1: device_id 0 appears twice"):
        read_device_table(tmp_path / "dup.parquet")
    pq.write_table(pa.table({"device_id": [0], "bandwidth_bps": ["fast"]}), tmp_path / "t.parquet")
    with pytest.raises(FedsimError, match="'bandwidth_bps' has type string; expected float64"):
        read_device_table(tmp_path / "t.parquet")


@pytest.mark.parametrize("columns, says", [
    ({"tz_offset": [15.0]}, "tz_offset = 15.0 on row 0 (device 0); it must be hours within [-14, 14]"),
    ({"flops": [0.0]}, "flops = 0.0 on row 0 (device 0); it must be a finite number > 0"),
    ({"latency_s": [float("nan")]}, "latency_s = nan on row 0 (device 0); it must be a finite number >= 0"),
    ({"class": [" "]}, "class = ' ' on row 0 (device 0); it must be a non-empty name"),
    ({"class": [3]}, "column 'class' has type int64; expected string"),
    ({"arrivals": [3]}, "column 'arrivals' is one that a run writes into devices.parquet itself; rename it"),
    ({"tz_offset": [1.0], "tz_offset_h": [1.0]}, "has both tz_offset_h and tz_offset (the same thing, by its "
                                                 "older name); keep tz_offset"),
    ({"class": [None]}, "column 'class' is null on row 0; give every device a value"),
])
def test_a_bad_device_table_column_is_one_line(tmp_path, columns, says):
    pq.write_table(pa.table({"device_id": [0], **columns}), tmp_path / "d.parquet")
    with pytest.raises(FedsimError) as err:
        read_device_table(tmp_path / "d.parquet")
    assert str(err.value) == f"device table {tmp_path / 'd.parquet'}: {says}"


def test_unsigned_ids_beyond_int64_are_named_by_their_value(tmp_path):
    """2^64-1 in a uint64 column was read as -1 and reported as "device -1"."""
    big = 2**64 - 1
    ids = pa.array(np.array([0, 0, 2, big], dtype=np.uint64))
    message = error_of(write_raw(tmp_path / "u.parquet", {**GOOD, "device_id": ids}))
    assert message.endswith(f"row 3: device_id {big} is too large; ids count devices from 0 "
                            "(at most 100,000,000 of them)")
    assert read_trace(write_raw(tmp_path / "small.parquet", {**GOOD, "device_id": pa.array(
        np.array([0, 0, 2, 3], dtype=np.uint64))})).device_id.dtype == np.int64
    pq.write_table(pa.table({"device_id": ids}), tmp_path / "devices.parquet")
    with pytest.raises(FedsimError, match=f"row 3: device_id {big} is too large"):
        read_device_table(tmp_path / "devices.parquet")
    with pytest.raises(FedsimError, match=f"row 1: device_id {big} is too large"):
        Trace.from_intervals(np.array([0, big], dtype=np.uint64), [0.0, 0.0], [1.0, 1.0],
                             n_devices=2, horizon=1.0)


def test_a_csv_id_beyond_int64_stays_a_name(tmp_path):
    """A CSV id too large for int64 is a device name, kept in the names file, never -1."""
    from fedsim.cli import main

    (tmp_path / "u.csv").write_text("device_id,start,end\n0,0,10\n18446744073709551615,0,10\n")
    out = tmp_path / "u.parquet"
    assert main(["trace", "convert", "--from", "csv", str(tmp_path / "u.csv"), "--out", str(out)]) == 0
    assert read_trace(out).device_id.tolist() == [0, 1]
    names = pq.read_table(tmp_path / "u.devices.parquet").to_pydict()
    assert [str(n) for n in names["name"]] == ["0", "18446744073709551615"]
