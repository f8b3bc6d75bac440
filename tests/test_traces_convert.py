"""Converters from FedScale, FLASH, session-list and CSV dumps, on small fixtures written here."""

from __future__ import annotations

import json
import pickle
import re

import numpy as np
import polars as pl
import pytest

from fedsim.errors import FedsimError
from fedsim.traces import AvailabilityIndex
from fedsim.traces.io import convert


def one_line_error(fmt, path, match, **kw) -> str:
    with pytest.raises(FedsimError, match=match) as info:
        convert(fmt, path, **kw)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    return message


# -- fedscale -------------------------------------------------------------------------------

def write_pickle(path, data):
    with open(path, "wb") as f:
        pickle.dump(data, f)
    return path


def test_fedscale_loops_each_client_on_its_own_finish_time(tmp_path):
    path = write_pickle(tmp_path / "client_behave_trace", {
        912: {"active": [0, 50], "inactive": [10, 60], "finish_time": 100, "duration": 3, "model": "x"},
        17: {"active": [20], "inactive": [], "finish_time": 30},  # online until its finish_time
    })
    trace = convert("fedscale", path, horizon=200.0)
    assert trace.generator["ids"] == [17, 912] and trace.wrap == "loop" and trace.horizon == 200
    first = trace.device_id == 0
    assert trace.start[first].tolist() == [20, 50, 80, 110, 140, 170]
    assert trace.end[first].tolist() == [30, 60, 90, 120, 150, 180]
    assert trace.start[~first].tolist() == [0, 50, 100, 150]
    assert trace.end[~first].tolist() == [10, 60, 110, 160]
    index = AvailabilityIndex(trace)
    assert index.online(255.0).tolist() == [True, True]  # loops on past the horizon
    assert convert("fedscale", path).horizon == 100.0  # default: the largest finish_time


def test_fedscale_bad_input(tmp_path):
    bad = write_pickle(tmp_path / "a.pkl", {3: {"active": [0, 5, 9], "inactive": [2], "finish_time": 10}})
    one_line_error("fedscale", bad, "client 3: 3 'active' times but 1 'inactive'")
    missing = write_pickle(tmp_path / "b.pkl", {3: {"active": [0]}})
    one_line_error("fedscale", missing, "client 3: needs keys")
    one_line_error("fedscale", write_pickle(tmp_path / "c.pkl", [1, 2]), "expected a dict")
    (tmp_path / "d.pkl").write_text("not a pickle")
    one_line_error("fedscale", tmp_path / "d.pkl", "not a FedScale client_behave_trace pickle")
    backwards = write_pickle(tmp_path / "e.pkl", {0: {"active": [5], "inactive": [2], "finish_time": 9}})
    one_line_error("fedscale", backwards, r"client 0: interval 0 \[5.0, 2.0\)")


class _Exploit:
    def __reduce__(self):
        return (print, ("pwned",))


def test_fedscale_refuses_pickles_that_run_code(tmp_path, capsys):
    path = write_pickle(tmp_path / "evil.pkl", {0: _Exploit()})
    one_line_error("fedscale", path, "refusing to load builtins.print")
    assert "pwned" not in capsys.readouterr().out


# -- flash ----------------------------------------------------------------------------------

def flash_messages(*rows) -> str:
    return "".join(f"2020-01-02 {clock}\t{state}\n" for clock, state in rows)


def test_flash_ready_when_locked_on_wifi_and_charging(tmp_path):
    data = {
        "u9": {"guid": "u9", "model": "Redmi", "messages": flash_messages(
            ("00:00:00", "screen_lock"), ("00:10:00", "wifi"), ("00:20:00", "battery_charged_on"),
            ("00:40:00", "4g"), ("00:45:00", "WiFi"), ("01:00:00", "screen_unlock"),
            ("02:00:00", "80%"))},
        "u1": {"guid": "u1", "model": "Mi", "messages": flash_messages(
            ("00:30:00", "wifi"), ("00:40:00", "battery_charged_on"), ("00:50:00", "screen_lock"),
            ("01:30:00", "screen_on"))},
    }
    path = tmp_path / "user_behavior.json"
    path.write_text(json.dumps(data))
    trace = convert("flash", path)
    assert trace.generator["ids"] == ["u1", "u9"] and trace.origin == "2020-01-02T00:00:00"
    assert trace.horizon == 7200.0
    u9 = trace.device_id == 1
    assert trace.start[u9].tolist() == [1200.0, 2700.0] and trace.end[u9].tolist() == [2400.0, 3600.0]
    u1 = trace.device_id == 0
    # Ready from 00:50 to its last message at 01:30, then replayed every hour (its span).
    assert trace.start[u1].tolist() == [0.0, 3000.0, 6600.0]
    assert trace.end[u1].tolist() == [1800.0, 5400.0, 7200.0]


def test_flash_bad_state_names_user_and_line(tmp_path):
    path = tmp_path / "u.json"
    path.write_text(json.dumps({"a": {"messages": flash_messages(("00:00:00", "wifi"),
                                                                 ("00:05:00", "teleported"))}}))
    one_line_error("flash", path, "user 'a' message line 2: .*teleported")
    path.write_text(json.dumps({"a": {"messages": "yesterday\twifi\n"}}))
    one_line_error("flash", path, "user 'a' message line 1")
    path.write_text("[1, 2")
    one_line_error("flash", path, "not FLASH user-behaviour JSON")


# -- sessions -------------------------------------------------------------------------------

def test_sessions_alternate_online_and_offline(tmp_path):
    path = tmp_path / "sessions.txt"
    path.write_text("# user first_online start_ms tz len...\n"
                    "u1 1 1000 2.0 5000 5000 5000\n"
                    "u0 0 0 -3 1000 2000\n"
                    "\n"
                    "u1 0 100000 2 3000 1000\n")
    trace = convert("sessions", path)
    assert trace.generator["ids"] == ["u0", "u1"] and trace.generator["tz_offset_h"] == [-3.0, 2.0]
    assert trace.device_id.tolist() == [0, 1, 1, 1]
    assert trace.start.tolist() == [1.0, 1.0, 11.0, 103.0]
    assert trace.end.tolist() == [3.0, 6.0, 16.0, 104.0]
    assert trace.horizon == 104.0 and trace.origin == "1970-01-01T00:00:00+00:00"


def test_sessions_bad_line(tmp_path):
    path = tmp_path / "s.txt"
    path.write_text("u1 1 1000 2.0 5000\nu2 yes 0 0 10\n")
    one_line_error("sessions", path, "line 2: expected 'user first_online")
    path.write_text("u1 1 1000 2.0 5000 -4\n")
    one_line_error("sessions", path, "line 1: .*lengths >= 0")
    path.write_text("u1 1 1577836800000 -5 3600000\nu2 1 1577836800 1 3600000\n")  # ms, then s
    one_line_error("sessions", path, "line 2's start 1577836800 and line 1's 1577836800000 are over 20 years apart: "
                                     "one is in seconds, the other in milliseconds")
    path.write_text("u1 1 1577836800000\n")  # the fields stop after the start
    one_line_error("sessions", path, "line 1: .* with a tz_offset_h \\(hours, a number\\) after the start, got")


# -- csv ------------------------------------------------------------------------------------

def test_csv_with_and_without_header(tmp_path):
    (tmp_path / "a.csv").write_text("device_id,start,end\n0,0,5\n\n2,1.5,3\n0,4,8\n")
    trace = convert("csv", tmp_path / "a.csv")
    assert trace.n_devices == 3 and trace.horizon == 8.0
    assert trace.device_id.tolist() == [0, 2] and trace.end.tolist() == [8.0, 3.0]  # merged
    (tmp_path / "b.csv").write_text("phone-b,0,5\nphone-a,1,2\n")
    named = convert("csv", tmp_path / "b.csv", horizon=10.0)
    assert named.generator["ids"] == ["phone-a", "phone-b"] and named.horizon == 10.0
    assert named.start[named.device_id == 1].tolist() == [0.0]


@pytest.mark.parametrize("text, match", [
    ("0,0,5\n1,x,3\n", "line 2: start 'x' is not a time; expected a number or an ISO 8601 time "
                       r"like 2024-03-01T08:00:00\+02:00$"),
    ("0,0,5\n1,2,3,4\n", "line 2: 4 fields where line 1 has 3; give every line the same columns$"),
    ("device_id,start,end\n0,0,5\n\n1,3,2\n", r"line 4: interval \[3, 2\) needs finite 0 <= start < end$"),
    ("0,0,5\n1,2\n", "line 2: end is missing; every line needs a device id, a start and an end$"),
    (" ,0,5\n", "line 1: device is empty; every line needs a device id"),
    ("", "the file is empty"),
    ("\n \n", "the file is empty"),
    # a first line of data with a typo is not taken for a header (and dropped)
    ("0,0,36OO\n1,0,3600\n", r"line 1: end '36OO' is neither a number nor an ISO 8601 time \(the line's other time "
                             r"makes it a line of data, not a header\)$"),
    ("0,0,\n1,0,3600\n", "line 1: no end time"),
    ("0,0,nan\n", r"line 1: end 'nan' is neither a number"),
    ("0,2024-03-01T08:00:00+14:30,2024-03-01T09:00:00+01:00\n", r"line 1: start '2024-03-01T08:00:00\+14:30' has the "
                                                              r"UTC offset \+14:30, beyond"),
])
def test_csv_bad_lines(tmp_path, text, match):
    (tmp_path / "bad.csv").write_text(text)
    one_line_error("csv", tmp_path / "bad.csv", match)


def test_csv_iso_times_with_offsets_named_columns_and_string_ids(tmp_path):
    path = tmp_path / "phones.csv"
    path.write_text('phone,model,on,off\n'
                    '"pixel, 7",x,2024-03-01T08:00:00+02:00,2024-03-01 07:30:00Z\n'
                    'alpha,y,2024-03-01T05:00:00,2024-03-01T05:00:00.003\n'
                    'alpha,y,2024-03-01T06:00,2024-03-01T07:00\n')
    columns = {"device_col": "phone", "start_col": "on", "end_col": "off"}
    trace = convert("csv", path, tz="+01:00", **columns)  # the naive times are at UTC+1
    assert trace.generator["ids"] == ["alpha", "pixel, 7"] and trace.n_devices == 2
    assert trace.origin == "2024-03-01T04:00:00+00:00" and trace.horizon == 12600.0
    assert trace.device_id.tolist() == [0, 0, 1]
    assert trace.start.tolist() == [0.0, 3600.0, 7200.0]
    assert trace.end.tolist() == [0.003, 7200.0, 12600.0]  # a 3 ms session, exactly
    utc = convert("csv", path, **columns)  # naive times default to UTC, and it says so
    assert utc.origin == "2024-03-01T05:00:00+00:00" and utc.start.tolist() == [0.0, 3600.0, 3600.0]
    assert utc.generator["warnings"] == ["1 of 2 devices have no UTC offset in their times, which are read as UTC; "
                                         "no tz_offset written (give --tz ZONE for the zone of times written "
                                         "without one)"]


def test_csv_devices_with_no_line_take_the_zone_most_devices_have(tmp_path):
    """Ids 0-3 with 2 missing (a device never online): the others' zones are kept, and it takes
    the one most of them have, where a device with no line used to drop every device's zone."""
    path = tmp_path / "z.csv"
    path.write_text("device,start,end\n"
                    "0,2024-03-01T08:00:00+02:00,2024-03-01T09:00:00+02:00\n"
                    "1,2024-03-01T08:00:00+02:00,2024-03-01T10:00:00+02:00\n"
                    "3,2024-03-01T01:00:00-05:00,2024-03-01T03:00:00-05:00\n")
    trace = convert("csv", path)
    assert trace.n_devices == 4 and trace.generator["tz_offset_h"] == [2.0, 2.0, 2.0, -5.0]
    assert trace.generator["warnings"] == ["1 of 4 devices have no line (never online: ids with gaps); their "
                                           "tz_offset is the one most devices have, +2 h"]


def test_csv_header_names_pick_columns_in_any_order(tmp_path):
    (tmp_path / "a.csv").write_text('end,device_id,note,start\n5,a,"x, y",0\n9,b,,4\n')
    trace = convert("csv", tmp_path / "a.csv")
    assert trace.generator["ids"] == ["a", "b"] and trace.start.tolist() == [0.0, 4.0]
    assert trace.end.tolist() == [5.0, 9.0] and trace.origin is None


@pytest.mark.parametrize("text, options, start, end, origin", [
    # numbers starting below 1e8 are seconds since t = 0, used as they are
    ("a,100,160\nb,130.5,190\n", {}, [100, 130.5], [160, 190], None),
    # larger ones are instants since 1970: seconds, or milliseconds from 1e11 on
    ("a,1700000000,1700000060\nb,1700000030.5,1700000090\n", {}, [0, 30.5], [60, 90],
     "2023-11-14T22:13:20+00:00"),
    ("a,1700000000000,1700000060000\nb,1700000030500,1700000090000\n", {}, [0, 30.5], [60, 90],
     "2023-11-14T22:13:20+00:00"),
    # a unit given makes every number an instant
    ("a,100,160\nb,130.5,190\n", {"time_unit": "s"}, [0, 30.5], [60, 90], "1970-01-01T00:01:40+00:00"),
    ("a,0,5000\n", {"time_unit": "ms"}, [0], [5], "1970-01-01T00:00:00+00:00"),
])
def test_csv_numbers_are_relative_seconds_or_instants(tmp_path, text, options, start, end, origin):
    (tmp_path / "n.csv").write_text(text)
    trace = convert("csv", tmp_path / "n.csv", **options)
    assert trace.start.tolist() == start and trace.end.tolist() == end and trace.origin == origin


def test_csv_merges_overlapping_sessions_and_counts_them(tmp_path):
    (tmp_path / "m.csv").write_text("b,0,10\nb,5,20\nb,20,30\na,0,1\nb,40,50\n")
    trace = convert("csv", tmp_path / "m.csv")
    assert trace.start.tolist() == [0, 0, 40] and trace.end.tolist() == [1, 30, 50]
    assert trace.generator["merged"] == 2  # [5, 20) overlaps [0, 10); [20, 30) touches it


def write_iso_fleet(path, rows: int, seed: int):
    """A CSV of `rows` sessions of 40 named devices with ISO times in mixed zones, and the
    (device name, start, end) in seconds since 1970 it encodes."""
    from datetime import datetime, timedelta, timezone

    rng = np.random.default_rng(seed)
    names = [f"dev-{k:02d}" for k in rng.permutation(40)]
    device = rng.integers(0, 40, rows)
    begin = 1_709_251_200 + rng.integers(0, 3 * 86400, rows)  # 2024-03-01 on, whole seconds
    end = begin + rng.integers(1, 4 * 3600, rows)
    zones = [timezone.utc, timezone(timedelta(hours=2)), timezone(timedelta(hours=-5, minutes=-30)), None]
    zone = rng.integers(0, len(zones), rows)

    def iso(t, z):
        if zones[z] is None:  # naive: UTC, the default of --tz
            return datetime.fromtimestamp(int(t), timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
        return datetime.fromtimestamp(int(t), zones[z]).isoformat()

    lines = ["device_id,start,end"] + [f"{names[d]},{iso(b, z)},{iso(e, z)}"
                                       for d, b, e, z in zip(device, begin, end, zone)]
    path.write_text("\n".join(lines) + "\n")
    return [names[d] for d in device], begin, end


def union_seconds(names, begin, end) -> dict:
    """Seconds online per device name: the length of the union of its sessions."""
    total = {}
    for name in set(names):
        spans = sorted((b, e) for n, b, e in zip(names, begin, end) if n == name)
        covered, reach = 0, -np.inf
        for b, e in spans:
            covered += max(e - max(b, reach), 0)
            reach = max(reach, e)
        total[name] = covered
    return total


def test_csv_thousands_of_iso_lines_match_an_independent_union(tmp_path):
    path = tmp_path / "fleet.csv"
    names, begin, end = write_iso_fleet(path, 4000, seed=7)
    trace = convert("csv", path)
    ids = trace.generator["ids"]
    assert ids == sorted(set(names)) and trace.n_devices == 40
    origin = datetime_from_iso(trace.origin).timestamp()
    assert origin == begin.min() and trace.horizon == end.max() - begin.min()
    online = trace.availability() * trace.horizon
    expected = union_seconds(names, begin, end)
    assert online.tolist() == pytest.approx([expected[name] for name in ids], abs=1e-6)
    assert trace.generator["merged"] == 4000 - trace.n_intervals > 0
    lines = path.read_text().splitlines()
    lines[2500] = lines[2500].rsplit(",", 1)[0] + ",2024-02-30T01:00:00"
    path.write_text("\n".join(lines) + "\n")
    one_line_error("csv", path, r"line 2501: end '2024-02-30T01:00:00' is not a time")


def datetime_from_iso(text):
    from datetime import datetime

    return datetime.fromisoformat(text)


def test_sessions_take_iso_and_second_starts(tmp_path):
    path = tmp_path / "s.txt"
    path.write_text("alice 1 2024-03-01T08:00:00+02:00 2 3600000 1800000 7200000\n"
                    "bob   0 2024-03-01T07:00:00 1 600000 5400000\n")
    trace = convert("sessions", path)
    assert trace.origin == "2024-03-01T06:00:00+00:00" and trace.generator["ids"] == ["alice", "bob"]
    assert trace.start.tolist() == [0, 5400, 4200] and trace.end.tolist() == [3600, 12600, 9600]
    shifted = convert("sessions", path, tz="+01:00", time_unit="iso")  # bob's start is 06:00 UTC
    assert shifted.start[shifted.device_id == 1].tolist() == [600.0]
    path.write_text("u 1 1709272800 0 1000\n")
    seconds = convert("sessions", path, time_unit="s")
    assert seconds.origin == "2024-03-01T06:00:00+00:00" and seconds.end.tolist() == [1.0]


def test_options_reach_only_converters_that_take_them(tmp_path, monkeypatch):
    from fedsim.config.catalog import CONVERTERS
    from fedsim.traces.schema import Trace

    calls = []

    def plain(path, where, horizon):
        calls.append((path.name, where, horizon))
        return Trace.from_intervals([0], [0.0], [1.0], n_devices=1, horizon=1.0)

    def keywords(path, where, horizon, **options):
        calls.append(options)
        return plain(path, where, horizon)

    monkeypatch.setitem(CONVERTERS, "plain", plain)
    monkeypatch.setitem(CONVERTERS, "keywords", keywords)
    (tmp_path / "in.txt").write_text("x")
    convert("plain", tmp_path / "in.txt", tz=None, time_unit=None)  # None: not given
    assert calls == [("in.txt", f"plain trace {tmp_path / 'in.txt'}", None)]
    convert("keywords", tmp_path / "in.txt", tz="UTC")
    assert calls[1] == {"tz": "UTC"}
    one_line_error("plain", tmp_path / "in.txt", "the 'plain' format takes no options; remove --tz$",
                   tz="UTC")
    one_line_error("sessions", tmp_path / "in.txt", r"option = '--device-col' is not taken by the "
                   r"'sessions' format \(one of: --time-unit, --tz, --repeat\)$", device_col="user")
    one_line_error("csv", tmp_path / "in.txt", r"option = '--time-unt' is not taken by the 'csv' "
                   r"format; did you mean '--time-unit'\?", time_unt="s")


def test_convert_unknown_format_and_missing_file(tmp_path):
    with pytest.raises(FedsimError, match="--from .trace format. = 'parquet' is unknown .one of: fedscale, flash, sessions, csv"):
        convert("parquet", tmp_path / "x")
    one_line_error("csv", tmp_path / "missing.csv", "file not found")


def test_unrolled_replay_matches_modular_lookup(tmp_path):
    """The unrolled FedScale trace answers like FedScale's own `t mod finish_time` lookup."""
    rng = np.random.default_rng(0)
    data = {}
    for client in range(20):
        finish = float(rng.integers(50, 400))
        points = np.sort(rng.choice(np.arange(finish), 6, replace=False))
        data[client] = {"active": points[0::2].tolist(), "inactive": points[1::2].tolist(),
                        "finish_time": finish}
    trace = convert("fedscale", write_pickle(tmp_path / "r.pkl", data), horizon=1000.0)
    index = AvailabilityIndex(trace)
    for t in rng.uniform(0, 1000, 40):
        expected = [any(a <= t % c["finish_time"] < b for a, b in zip(c["active"], c["inactive"]))
                    for c in data.values()]
        assert index.online(t).tolist() == expected


def _flash_json(messages: str) -> str:
    return json.dumps({"a": {"messages": messages}, "b": {"messages": "  \n"}})


@pytest.mark.parametrize("fmt, content, args, says", [
    ("flash", _flash_json(""), [], "no user has any message"),
    ("flash", _flash_json("\t\t\n"), [], "no user has any message"),
    ("flash", "1" * 5000, [], "not FLASH user-behaviour JSON"),
    ("flash", _flash_json(flash_messages(("00:00:00", "wifi"), ("00:00:01", "screen_lock"),
                                         ("00:00:02", "battery_charged_on"), ("00:00:03", "80%"))),
     ["--horizon", "1e300"], r"unrolling to horizon 1e\+300 s would make 3.33e\+299 rows, above "
                             r"fedsim's limit of 50,000,000; give a shorter --horizon"),
    ("sessions", "", [], "no session lines found"),
    ("sessions", "u 1 1e20 0 1000 1000\n", [], "line 1: .* with a start in the years 1..9999"),
    ("sessions", "u 1 0 0 10\nu 1 inf 0 1000\n", [], "line 2: .* with a start in the years 1..9999"),
    ("sessions", "u 1 nan 0 1000\n", [], "line 1: start 'nan' is not a time; expected a number or an "
                                         "ISO 8601 time"),
    ("sessions", "u 1\n", [], "line 1: expected 'user first_online.0|1. start .* with a start time"),
    ("sessions", "u 1 0 0 1000 -5\n", [], "with lengths >= 0 \\(milliseconds\\)"),
    ("sessions", "u 1 0 0 1000 nan\n", [], "with lengths >= 0 \\(milliseconds\\)"),
    ("sessions", "u 1 0 0 1e308 1e308\n", [], "with sessions that end by the year 9999"),
    ("sessions", "u 1 0 nan 1000\n", [], "with tz_offset_h in hours within \\[-14, 14\\]"),
    ("sessions", "u 1 0 -300 1000\n", [], "with tz_offset_h in hours"),
    ("csv", "0,nan,1\n", [], "line 1: start 'nan' is not a time"),
    ("csv", "0,0,5\n1,1_0,20\n", [], "line 2: start '1_0' is not a time"),
    ("csv", "0,0,inf\n", [], r"line 1: interval \[0, inf\) needs finite 0 <= start < end"),
    ("csv", "device_id,start,end\n\n", [], "no data after the header line 1 'device_id,start,end'"),
    ("csv", "a,1700000000000,1700000060000\n", ["--time-unit", "s"],
     "line 1: start 1700000000000 as seconds since 1970 is outside the years 1..9999; this "
     "contradicts --time-unit s: the times look like milliseconds, use --time-unit ms$"),
    ("csv", "a,1e20,1e21\n", ["--time-unit", "ms"],
     "line 1: start 1e20 as milliseconds since 1970 is outside the years 1..9999$"),
    ("csv", "a,1700000000,1700000060\n", ["--time-unit", "iso"],
     "line 1: start '1700000000' is a number, which contradicts --time-unit iso; use --time-unit "
     "s or ms$"),
    ("csv", "a,0,5\nb,2024-03-01,2024-03-02\n", ["--time-unit", "ms"],
     "line 2: start '2024-03-01' is an ISO 8601 time, which contradicts --time-unit ms; use "
     "--time-unit iso$"),
    ("csv", "a,0,5\nb,2,2024-03-01T00:00:00\n", [],
     r"line 2: end '2024-03-01T00:00:00' is an ISO 8601 time but the first line's start is a "
     r"number; write every time the same way \(or give --time-unit\)$"),
    ("csv", "\n\ndevice_id,start,end\n0,2024-03-01T00:00,2024-03-01T01:00\n\n1,2024-03-01,2024-02-30\n",
     ["--time-unit", "iso"], r"line 6: end '2024-02-30' is not a time; expected an ISO 8601 time "
                             r"like 2024-03-01T08:00:00\+02:00 \(--time-unit iso\)$"),
    ("csv", "a,2024-03-01T25:00,2024-03-02\n", [], "line 1: start '2024-03-01T25:00' is not a time"),
    ("csv", "a,0,5\n", ["--time-unit", "sec"],
     r"--time-unit = 'sec' is unknown; did you mean 's'\? \(one of: s, ms, iso\)$"),
    ("csv", "a,2024-03-01,2024-03-02\n", ["--tz", "Europe/Paris"],
     r"--tz 'Europe/Paris' is not a UTC offset; give one like \+02:00, -05:30 or UTC"),
    ("csv", "a,0,5\n", ["--tz", "+02:00"], r"--tz applies to ISO 8601 times written without an "
                                           r"offset, but the times are numbers .since 1970, UTC.; "
                                           r"remove --tz$"),
    ("csv", "phone,begin,finish\na,0,5\n", ["--device-col", "phone", "--start-col", "bgin"],
     r"line 1: the header has no column 'bgin'; did you mean 'begin'\? columns found: phone, "
     r"begin, finish; pick them with --device-col, --start-col, --end-col$"),
    ("csv", "\nphone,begin,finish,x\na,0,5,1\n", [],
     r"line 2: 4 columns \(phone, begin, finish, x\) but none named device_id, start and end; pick them with "
     "--device-col"),
    ("csv", "device_id,start\n0,5\n", [], r"line 1: 2 columns \(device_id, start\) but no column named end; pick them"),
    ("csv", "device_id;start;end\n0;0;5\n", [], "line 1: one column, its fields separated by semicolons; csv fields "
                                                 "are separated by commas: save the file with commas"),
    ("sessions", "u 1 2024-03-01 0 1000\n", ["--time-unit", "ms"],
     "line 1: start '2024-03-01' is an ISO 8601 time, which contradicts --time-unit ms"),
    ("sessions", "u 1 0 0 1000\n", ["--device-col", "u"],
     "option = '--device-col' is not taken by the 'sessions' format"),
    ("fedscale", pickle.dumps({}), ["--tz", "UTC"], "option = '--tz' is not taken by the 'fedscale' format; "
                                                    r"did you mean '--repeat'\? \(one of: --repeat\)$"),
    ("fedscale", pickle.dumps({}), ["--repeat", "span"], r"--repeat = 'span' is not valid for this format "
                                                         r"\(one of: period, none\)$"),
    ("fedscale", pickle.dumps({}), [], "got an empty dict"),
    ("fedscale", pickle.dumps({0: {"active": [0], "inactive": [5], "finish_time": 1e-300}}),
     ["--horizon", "1e300"], "unrolling to horizon 1e\\+300 s would make inf rows"),
])
def test_malformed_input_is_one_line_naming_the_file(tmp_path, capsys, fmt, content, args, says):
    from fedsim.cli import main

    path = tmp_path / f"input.{fmt}"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    out = tmp_path / "t.parquet"
    assert main(["trace", "convert", "--from", fmt, str(path), "--out", str(out), *args]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith(f"error: {fmt} trace {path}: ") and "\n" not in err, captured.err
    assert re.search(says, err), err
    assert not out.exists() and not (tmp_path / "t.devices.parquet").exists()


def test_trace_convert_prints_merges_and_writes_device_names(tmp_path, capsys):
    import pyarrow.parquet as pq

    from fedsim.cli import main
    from fedsim.traces import read_trace

    (tmp_path / "in.csv").write_text("name,on,off\nb,0,10\nb,5,20\nb,20,30\na,0,1\n")
    out = tmp_path / "t.parquet"
    assert main(["trace", "convert", "--from", "csv", str(tmp_path / "in.csv"), "--out", str(out),
                 "--device-col", "name", "--start-col", "on", "--end-col", "off"]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = tmp_path / "t.devices.parquet"
    assert lines[0].startswith(f"wrote {out}: csv, 2 devices, 2 intervals")
    assert lines[1:] == ["merged 2 overlapping or touching sessions",
                         f"wrote {names}: the device table (device_id, name) of the 2 devices"]
    table = pq.read_table(names)
    assert str(table.schema.field("device_id").type) == "int64"
    assert str(table.schema.field("name").type) == "string"
    assert table.to_pydict() == {"device_id": [0, 1], "name": ["a", "b"]}
    assert read_trace(out).generator["ids"] == ["a", "b"]

    (tmp_path / "ints.csv").write_text("0,0,5\n3,1,2\n")
    assert main(["trace", "convert", "--from", "csv", str(tmp_path / "ints.csv"),
                 "--out", str(tmp_path / "plain")]) == 0  # no .parquet suffix
    assert "merged 0 overlapping" in capsys.readouterr().out
    assert not (tmp_path / "plain.devices.parquet").exists()  # ids used as they are

    (tmp_path / "s.txt").write_text("7 1 0 0 1000\n12 1 0 0 500\n")
    assert main(["trace", "convert", "--from", "sessions", str(tmp_path / "s.txt"),
                 "--out", str(tmp_path / "plain")]) == 2  # the output exists: kept
    assert main(["trace", "convert", "--from", "sessions", str(tmp_path / "s.txt"),
                 "--out", str(tmp_path / "plain"), "--force"]) == 0
    assert pq.read_table(tmp_path / "plain.devices.parquet").to_pydict() == {
        "device_id": [0, 1], "name": ["7", "12"], "tz_offset": [0.0, 0.0]}  # the lines' offsets


def test_devices_out_may_name_the_table_beside_the_trace(tmp_path, capsys):
    from fedsim.cli import main

    (tmp_path / "in.csv").write_text("a,0,5\n")
    out = tmp_path / "t.parquet"
    assert main(["trace", "convert", "--from", "csv", str(tmp_path / "in.csv"), "--out", str(out),
                 "--devices-out", str(tmp_path / "t.devices.parquet")]) == 0
    assert capsys.readouterr().out.count("the device table") == 1  # one table, written once
    assert pl.read_parquet(tmp_path / "t.devices.parquet")["name"].to_list() == ["a"]


# -- the wrong --from ---------------------------------------------------------------------------

@pytest.mark.parametrize("wrong, content, right", [
    ("sessions", "device_id,start,end\n0,0,10\n1,5,20\n", "csv"),
    ("flash", "device_id,start,end\n0,0,10\n", "csv"),
    ("csv", "user1 1 1600000000000 2 1000 2000\nuser2 0 1600000000000 -5 500 700\n", "sessions"),
    ("csv", json.dumps({"u1": {"messages": "2020-01-02 00:00:00\twifi\n2020-01-02 01:00:00\t4g\n"}}), "flash"),
    ("sessions", pickle.dumps({0: {"active": [0], "inactive": [5], "finish_time": 10}}), "fedscale"),
])
def test_a_file_read_with_the_wrong_from_names_the_one_it_looks_like(tmp_path, capsys, wrong, content, right):
    from fedsim.cli import main

    path = tmp_path / "input"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    out = tmp_path / "out.parquet"
    assert main(["trace", "convert", "--from", wrong, str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {wrong} trace {path}: ") and err.count("\n") == 1
    assert err.endswith(f"; the file looks like {right}: try --from {right}\n")
    assert not out.exists()
    assert main(["trace", "convert", "--from", right, str(path), "--out", str(out)]) == 0  # and it is


def test_an_unknown_from_suggests_the_nearest_format(tmp_path, capsys):
    from fedsim.cli import main

    (tmp_path / "a.csv").write_text("device_id,start,end\n0,0,10\n")
    assert main(["trace", "convert", "--from", "sesions", str(tmp_path / "a.csv"), "--out",
                 str(tmp_path / "o.parquet")]) == 2
    assert capsys.readouterr().err == ("error: --from (trace format) = 'sesions' is unknown; did you mean "
                                       "'sessions'? (one of: fedscale, flash, sessions, csv)\n")
