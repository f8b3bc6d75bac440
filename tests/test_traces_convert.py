"""Converters from FedScale, FLASH, session-list and CSV dumps, on small fixtures written here."""

from __future__ import annotations

import json
import pickle
import re

import numpy as np
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
    ("0,0,5\n1,x,3\n", "line 2: expected 'device_id,start,end'"),
    ("0,0,5\n1,2,3,4\n", "line 2: expected"),
    ("device_id,start,end\n0,0,5\n\n1,3,2\n", r"line 4: interval \[3.0, 2.0\) needs 0 <= start < end"),
    ("", "the file is empty"),
])
def test_csv_bad_lines(tmp_path, text, match):
    (tmp_path / "bad.csv").write_text(text)
    one_line_error("csv", tmp_path / "bad.csv", match)


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
    ("sessions", "u 1 1e20 0 1000 1000\n", [], "line 1: .* with start_ms in milliseconds since 1970"),
    ("sessions", "u 1 0 0 10\nu 1 inf 0 1000\n", [], "line 2: .* with start_ms in milliseconds"),
    ("sessions", "u 1 nan 0 1000\n", [], "with start_ms in milliseconds since 1970, years 1..9999"),
    ("sessions", "u 1 0 0 1000 -5\n", [], "with lengths >= 0 \\(milliseconds\\)"),
    ("sessions", "u 1 0 0 1000 nan\n", [], "with lengths >= 0 \\(milliseconds\\)"),
    ("sessions", "u 1 0 0 1e308 1e308\n", [], "with sessions that end by the year 9999"),
    ("sessions", "u 1 0 nan 1000\n", [], "with tz_offset_h in hours within \\[-14, 14\\]"),
    ("sessions", "u 1 0 -300 1000\n", [], "with tz_offset_h in hours"),
    ("csv", "0,nan,1\n", [], "line 1: expected 'device_id,start,end' with times in seconds"),
    ("csv", "0,0,5\n1,1_0,20\n", [], "line 2: expected 'device_id,start,end'"),
    ("csv", "device_id,start,end\n\n", [], "no data after the header line 1 'device_id,start,end'"),
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
    assert not out.exists()
