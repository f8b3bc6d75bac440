"""Converters keep the record and say what they assume: --repeat, the added share, time zones
and per-device columns, from conversion through a run's devices.parquet."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from conftest import quadratic_config
from fedsim.cli import main
from fedsim.traces.io import read_device_table, read_trace

P, L = 6 * 3600, 3600  # device b's record spans P (a quarter of the day); sessions of L
DAY = "2024-03-04"


def clock(seconds: int) -> str:
    h, rest = divmod(seconds, 3600)
    return f"{DAY} {h:02d}:{rest // 60:02d}:{rest % 60:02d}" if h < 24 else f"2024-03-05 00:00:00"


# device a: recorded over the whole day, online [P, P+2L) and [2P, 2P+L);
# device b: recorded over [0, P) only, online [0, L)
SESSIONS = {"a": [(P, P + 2 * L), (2 * P, 2 * P + L)], "b": [(0, L)]}
RECORD_END = {"a": 4 * P, "b": P}


def flash_json() -> str:
    users = {}
    for user, sessions in SESSIONS.items():
        lines = [f"{clock(0)}\twifi", f"{clock(0)}\tscreen_unlock", f"{clock(0)}\tbattery_charged_on"]
        for start, end in sessions:
            lines += [f"{clock(start)}\tscreen_lock", f"{clock(end)}\tscreen_unlock"]
        lines.append(f"{clock(RECORD_END[user])}\tscreen_on")  # the record's last message
        users[user] = {"guid": f"g-{user}", "model": {"a": "Redmi Note 8", "b": "Pixel 4"}[user],
                       "messages": "\n".join(lines)}
    return json.dumps(users)


def csv_text() -> str:
    """The same sessions, device a's clock at UTC+8 and b's at UTC-5, with a per-device column
    and one that varies within a device."""
    rows = ["device_id,start,end,model,battery"]
    zone = {"a": "+08:00", "b": "-05:00"}
    for user, sessions in SESSIONS.items():
        for k, (start, end) in enumerate(sessions):
            rows.append(f"{user},{clock(start).replace(' ', 'T')}{zone[user]},"
                        f"{clock(end).replace(' ', 'T')}{zone[user]},{user.upper()}-phone,{50 + k}")
    return "\n".join(rows) + "\n"


def online_seconds(path) -> dict[int, float]:
    trace = read_trace(path)
    return {d: float((trace.end - trace.start)[trace.device_id == d].sum()) for d in range(trace.n_devices)}


def convert(tmp_path, capsys, fmt: str, name: str, *extra: str) -> tuple[str, str]:
    source = tmp_path / f"{name}.in"
    source.write_text(flash_json() if fmt == "flash" else csv_text())
    assert main(["trace", "convert", "--from", fmt, str(source), "--out", str(tmp_path / f"{name}.parquet"),
                 *extra]) == 0
    out = capsys.readouterr()
    return out.out, out.err


def test_csv_and_flash_without_repetition_hold_the_same_online_seconds(tmp_path, capsys):
    convert(tmp_path, capsys, "csv", "csv")
    _, err = convert(tmp_path, capsys, "flash", "none", "--repeat", "none")
    assert "warning" not in err
    expected = {0: 3 * L, 1: L}  # a: 2 h + 1 h; b: 1 h
    assert online_seconds(tmp_path / "csv.parquet") == online_seconds(tmp_path / "none.parquet") == expected
    assert read_trace(tmp_path / "none.parquet").wrap == "none"


def test_flash_repeats_each_record_over_its_span_by_default_and_says_how_much_it_added(tmp_path, capsys):
    _, err = convert(tmp_path, capsys, "flash", "span")
    # b's quarter-day record repeats 4 times in the day: 4 h online instead of 1; a's whole-day
    # record adds nothing: 7 h in the trace for 4 h recorded, +75 %
    assert online_seconds(tmp_path / "span.parquet") == {0: 3 * L, 1: 4 * L}
    assert err.strip() == ("warning: --repeat span added 75.0 % to the recorded online time (4.0 h recorded, "
                           "7.0 h in the trace); 1 of 2 devices' records cover less than half of the horizon; "
                           "--repeat none keeps only what was recorded")
    generator = read_trace(tmp_path / "span.parquet").generator
    assert (generator["repeat"], generator["recorded_online_s"], generator["online_s"], generator["short_records"]) == (
        "span", 4.0 * L, 7.0 * L, 1)
    assert "device_columns" not in generator  # they went to the device table
    table = read_device_table(tmp_path / "span.devices.parquet")
    assert table["name"].tolist() == ["a", "b"] and table["guid"].tolist() == ["g-a", "g-b"]
    assert table["model"].tolist() == ["Redmi Note 8", "Pixel 4"]


def test_repeat_modes_that_a_format_does_not_have_are_one_line(tmp_path, capsys):
    (tmp_path / "in.csv").write_text(csv_text())
    code = main(["trace", "convert", "--from", "csv", str(tmp_path / "in.csv"), "--out", str(tmp_path / "t.parquet"),
                 "--repeat", "span"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.endswith("--repeat = 'span' is not valid for this format (a record of intervals is converted as it "
                        "was recorded) (one of: none)\n")


def test_time_zones_of_iso_times_survive_conversion_and_replay(tmp_path, capsys, cli_run):
    _, err = convert(tmp_path, capsys, "csv", "zones", "--devices-out", str(tmp_path / "table.parquet"))
    assert err.strip() == ("warning: column battery varies within a device, so it is not a per-device column; "
                           "left out of the device table")
    trace = read_trace(tmp_path / "zones.parquet")
    assert trace.generator["tz_offset_h"] == [8.0, -5.0]
    for table in (read_device_table(tmp_path / "zones.devices.parquet"), read_device_table(tmp_path / "table.parquet")):
        assert table["tz_offset"].tolist() == [8.0, -5.0] and table["model"].tolist() == ["A-phone", "B-phone"]
        assert "battery" not in table
    # a run replaying it records the zones (from the trace) and the table's columns
    config = quadratic_config([[1.0, 0.0], [0.0, 1.0]], rounds=2,
                              trace={"source": "file", "path": str(tmp_path / "zones.parquet"),
                                     "devices_table": str(tmp_path / "zones.devices.parquet")})
    devices = pl.read_parquet(cli_run(config) / "devices.parquet")
    assert devices["tz_offset"].to_list() == [8.0, -5.0]
    assert devices["model"].to_list() == ["A-phone", "B-phone"] and devices["name"].to_list() == ["a", "b"]


@pytest.mark.parametrize("rows, expected", [
    # most common offset wins; a tie goes to the smallest
    (["x,2024-01-01T00:00:00+02:00,2024-01-01T01:00:00+02:00", "x,2024-01-02T00:00:00+03:00,2024-01-02T01:00:00+03:00",
      "x,2024-01-03T00:00:00+03:00,2024-01-03T01:00:00+03:00"], [3.0]),
    (["x,2024-01-01T00:00:00+02:00,2024-01-01T01:00:00+02:00",
      "x,2024-01-02T00:00:00-04:30,2024-01-02T01:00:00-04:30"], [-4.5]),
])
def test_a_devices_offset_is_its_most_common_one(tmp_path, capsys, rows, expected):
    (tmp_path / "in.csv").write_text("\n".join(rows) + "\n")
    assert main(["trace", "convert", "--from", "csv", str(tmp_path / "in.csv"), "--out", str(tmp_path / "t.parquet")]) == 0
    assert read_trace(tmp_path / "t.parquet").generator["tz_offset_h"] == expected


def test_times_without_an_offset_give_no_zone_unless_tz_says(tmp_path, capsys):
    (tmp_path / "in.csv").write_text("x,2024-01-01T00:00:00,2024-01-01T01:00:00\n")
    assert main(["trace", "convert", "--from", "csv", str(tmp_path / "in.csv"), "--out", str(tmp_path / "t.parquet")]) == 0
    assert "1 of 1 devices have no UTC offset in their times" in capsys.readouterr().err
    assert "tz_offset_h" not in read_trace(tmp_path / "t.parquet").generator
    assert main(["trace", "convert", "--from", "csv", str(tmp_path / "in.csv"), "--out", str(tmp_path / "u.parquet"),
                 "--tz", "+05:30"]) == 0
    assert read_trace(tmp_path / "u.parquet").generator["tz_offset_h"] == [5.5]


def test_fedscale_without_repetition_keeps_each_clients_record_once(tmp_path, capsys):
    import pickle

    data = {1: {"active": [0.0], "inactive": [10.0], "finish_time": 100.0, "model": "m1"},
            2: {"active": [5.0], "inactive": [15.0], "finish_time": 25.0, "model": "m2"}}
    (tmp_path / "f.pkl").write_bytes(pickle.dumps(data))
    base = ["trace", "convert", "--from", "fedscale", str(tmp_path / "f.pkl")]
    assert main([*base, "--out", str(tmp_path / "loop.parquet")]) == 0
    err = capsys.readouterr().err
    # client 2 repeats every 25 s up to 100 s: 4 copies of 10 s; 50 s in the trace for 20 s recorded
    assert online_seconds(tmp_path / "loop.parquet") == {0: 10.0, 1: 40.0}
    assert "--repeat period added 150.0 % to the recorded online time" in err
    assert "1 of 2 devices' records cover less than half of the horizon" in err
    assert main([*base, "--out", str(tmp_path / "once.parquet"), "--repeat", "none"]) == 0
    assert "warning" not in capsys.readouterr().err
    once = read_trace(tmp_path / "once.parquet")
    assert online_seconds(tmp_path / "once.parquet") == {0: 10.0, 1: 10.0} and once.wrap == "none"
    table = read_device_table(tmp_path / "once.devices.parquet")
    assert table["finish_time"].tolist() == [100.0, 25.0] and table["model"].tolist() == ["m1", "m2"]


def test_relative_milliseconds_read_as_seconds_are_a_warning_with_the_fix(tmp_path, capsys):
    """0 .. 172,800,000 ms (two days) read as seconds is 2,000 days: one warning naming --time-unit
    ms, which reads them as the two days they are."""
    (tmp_path / "ms.csv").write_text("0,0,3600000\n1,1800000,172800000\n")
    out = tmp_path / "ms.parquet"
    assert main(["trace", "convert", "--from", "csv", str(tmp_path / "ms.csv"), "--out", str(out)]) == 0
    assert capsys.readouterr().err == ("warning: the times were read as seconds since t = 0 (they start below 1e+08), "
                                       "which makes the trace 2,000 days long; if they are milliseconds, give "
                                       "--time-unit ms\n")
    assert main(["trace", "convert", "--from", "csv", str(tmp_path / "ms.csv"), "--out", str(out), "--force",
                 "--time-unit", "ms"]) == 0
    assert "warning" not in capsys.readouterr().err and read_trace(out).horizon == 172800.0


def test_wrap_loop_makes_a_recorded_day_replay_again(tmp_path, capsys):
    """A csv record of one day, converted with --wrap loop: the trace loops (a run past its
    horizon replays it from the start: device 0 online again an hour into day 2); without it,
    the format's default, none."""
    from fedsim.traces import AvailabilityIndex

    (tmp_path / "day.csv").write_text("0,0,7200\n1,3600,86400\n")
    for wrap in ("loop", None):
        out = tmp_path / f"{wrap}.parquet"
        assert main(["trace", "convert", "--from", "csv", str(tmp_path / "day.csv"), "--out", str(out),
                     *(["--wrap", wrap] if wrap else [])]) == 0
        trace = read_trace(out)
        assert trace.wrap == (wrap or "none")
        assert AvailabilityIndex(trace).online(86400 + 3600).tolist() == ([True, True] if wrap else [False, False])
    capsys.readouterr()
    assert main(["trace", "info", str(tmp_path / "loop.parquet")]) == 0
    assert "wrap loop" in capsys.readouterr().out


def test_ids_written_two_ways_that_are_one_device_number_are_a_warning(tmp_path, capsys):
    (tmp_path / "lead.csv").write_text("007,0,10\n7,20,30\n3,0,5\n")
    assert main(["trace", "convert", "--from", "csv", str(tmp_path / "lead.csv"), "--out",
                 str(tmp_path / "t.parquet")]) == 0
    assert capsys.readouterr().err == ("warning: ids written differently are one device: '007' and '7' are device 7; "
                                       "write each id one way if they are different devices\n")
    assert read_trace(tmp_path / "t.parquet").n_devices == 8


def test_fedscale_sessions_past_finish_time_are_cut_with_a_warning(tmp_path, capsys):
    import pickle

    (tmp_path / "behave").write_bytes(pickle.dumps({0: {"active": [0, 150], "inactive": [10, 200], "finish_time": 100},
                                                    1: {"active": [5], "inactive": [50], "finish_time": 100}}))
    out = tmp_path / "t.parquet"
    assert main(["trace", "convert", "--from", "fedscale", str(tmp_path / "behave"), "--out", str(out)]) == 0
    assert capsys.readouterr().err == ("warning: 1 client(s) online past their finish_time, which ends each record "
                                       "(client 0: 50 s after 100 s); that time is left out, as FedScale's replay "
                                       "leaves it\n")
    trace = read_trace(out)
    assert trace.start.tolist() == [0.0, 5.0] and trace.end.tolist() == [10.0, 50.0]
