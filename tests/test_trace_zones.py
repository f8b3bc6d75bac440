"""Trace plots and `trace info` by time zone: where zones come from, the raster's order, the
clock axis, availability per zone."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedsim.cli import main
from fedsim.errors import FedsimError
from fedsim.traces import Trace, read_trace, write_trace
from fedsim.traces.io import write_device_table
from fedsim.traces.plot import trace_figure
from fedsim.traces.zones import Zones, by_zone, plot_order, trace_zones

H = 3600.0


def zoned_trace(origin: str | None = "2024-03-04T00:00:00+00:00") -> Trace:
    """6 devices over 2 days; device d online [0, (d + 1) h) each day; zones +8, -5, +8, 0, -5, +8."""
    ids = np.repeat(np.arange(6), 2)
    start = np.tile([0.0, 24 * H], 6)
    end = start + (ids + 1) * H
    return Trace.from_intervals(ids, start, end, n_devices=6, horizon=48 * H, origin=origin,
                                generator={"kind": "test", "tz_offset_h": [8.0, -5.0, 8.0, 0.0, -5.0, 8.0]})


def test_the_raster_sorts_by_zone_then_most_available_first():
    trace = zoned_trace()
    zones = trace_zones(trace)
    assert zones.column == "tz_offset" and zones.source == "the trace's metadata (tz_offset_h)"
    order = plot_order(trace.availability(), zones, rows=200)
    # zone -5: devices 4, 1 (4 is online longer); zone 0: 3; zone +8: 5, 2, 0
    assert order.tolist() == [4, 1, 3, 5, 2, 0]
    assert plot_order(trace.availability(), None, rows=200).tolist() == [5, 4, 3, 2, 1, 0]


def test_a_sample_keeps_every_zone():
    n = 1000
    zones = Zones("group", np.where(np.arange(n) < 990, 0.0, 1.0), "test")
    order = plot_order(np.random.default_rng(0).random(n), zones, rows=100, seed=3)
    assert len(order) <= 100 and (order >= 990).sum() >= 1 and (order < 990).sum() >= 90


def test_the_time_axis_reads_utc_clock_time_and_weekday():
    fig, shown = trace_figure(zoned_trace(), zones=trace_zones(zoned_trace()))
    axis = fig.axes[1]
    labels = [t.get_text() for t in axis.get_xticklabels()]
    assert labels[:3] == ["Mon 00:00", "Mon 06:00", "Mon 12:00"] and labels[-1] == "Wed 00:00"
    assert axis.get_xlabel() == "clock time (UTC)"
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend == ["UTC-5", "UTC+0", "UTC+8"]
    plain, _ = trace_figure(zoned_trace(origin=None))
    assert plain.axes[1].get_xlabel() == "time since the start (hours)" and plain.axes[0].get_legend() is None


def test_trace_info_breaks_availability_down_by_zone(tmp_path, capsys):
    trace = zoned_trace()
    write_trace(trace, tmp_path / "t.parquet")
    assert main(["trace", "info", str(tmp_path / "t.parquet"), "--json"]) == 0
    by = json.loads(capsys.readouterr().out)["by_zone"]
    assert by["column"] == "tz_offset"
    availability = (np.arange(6) + 1) / 24.0  # d + 1 hours a day
    for row in by["rows"]:
        mine = np.asarray([8.0, -5.0, 8.0, 0.0, -5.0, 8.0]) == row["zone"]
        assert row["devices"] == mine.sum() and row["mean"] == pytest.approx(availability[mine].mean())
        assert row["median"] == pytest.approx(np.median(availability[mine]))
        assert row["peak_hour"] == 0  # everyone is online from midnight UTC
    assert main(["trace", "info", str(tmp_path / "t.parquet")]) == 0
    out = capsys.readouterr().out
    assert "availability by time zone" in out
    utc8 = next(line for line in out.splitlines() if line.startswith("UTC+8 "))
    assert utc8.endswith("   00h (UTC)"), utc8


def test_a_device_table_gives_the_zones_and_must_fit_the_trace(tmp_path, capsys):
    trace = zoned_trace(origin=None)
    write_trace(trace, tmp_path / "t.parquet")
    write_device_table({"device_id": np.arange(6), "group": [1, 1, 2, 2, 3, 3]}, tmp_path / "g.parquet")
    zones = trace_zones(trace, tmp_path / "t.parquet", tmp_path / "g.parquet")
    assert zones.column == "group" and zones.values.tolist() == [1, 1, 2, 2, 3, 3]
    assert [r["devices"] for r in by_zone(trace, zones)] == [2, 2, 2]
    # the table that `trace convert` writes beside the trace is found by itself
    write_device_table({"device_id": np.arange(6), "tz_offset": [1.0] * 6}, tmp_path / "t.devices.parquet")
    assert trace_zones(trace, tmp_path / "t.parquet").values.tolist() == [1.0] * 6
    write_device_table({"device_id": np.arange(4), "group": [1, 1, 2, 2]}, tmp_path / "short.parquet")
    code = main(["trace", "plot", str(tmp_path / "t.parquet"), "--out", str(tmp_path / "p.png"),
                 "--devices", str(tmp_path / "short.parquet")])
    err = capsys.readouterr().err
    assert code == 2 and err == (f"error: device table {tmp_path / 'short.parquet'}: has 4 rows for the trace's "
                                 f"6 devices; it needs one row per device_id 0..5\n")
    with pytest.raises(FedsimError, match="file not found"):
        trace_zones(trace, None, tmp_path / "missing.parquet")


def test_a_flash_trace_without_a_time_zone_reads_its_own_clock_not_utc(tmp_path, capsys):
    messages = "".join(f"2020-01-02 {clock}\t{state}\n" for clock, state in (
        ("06:00:00", "screen_lock"), ("06:10:00", "wifi"), ("06:20:00", "battery_charged_on"),
        ("09:00:00", "screen_unlock"), ("12:00:00", "screen_on")))
    (tmp_path / "flash.json").write_text(json.dumps({"u1": {"guid": "u1", "messages": messages}}))
    out = tmp_path / "t.parquet"
    assert main(["trace", "convert", "--from", "flash", str(tmp_path / "flash.json"), "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["trace", "info", str(out)]) == 0
    text = capsys.readouterr().out
    assert "hourly profile (fraction online by hour of day, the trace's clock, no time zone)" in text
    assert "UTC" not in text
    profile = text[text.index("hourly profile"):].splitlines()
    assert profile[7].startswith("  06h") and "#" in profile[7] and "#" not in profile[6]  # 06:20 on its clock
    assert main(["trace", "info", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["hourly_clock"] == "the trace's clock, no time zone"
    fig, _ = trace_figure(read_trace(out))
    assert fig.axes[1].get_xlabel() == "clock time (the trace's clock, no time zone)"
    assert [t.get_text() for t in fig.axes[1].get_xticklabels()][:2] == ["Thu 06:00", "Thu 12:00"]


def test_a_runs_own_devices_table_gives_the_zones_of_its_trace(tmp_path, capsys):
    """`trace info RUN` (and with `--devices RUN/devices.parquet`): the run's table (its group,
    copied from the device table it ran with) is read; the columns the run wrote itself are not."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from conftest import quadratic_config

    from fedsim.config import dump_toml

    write_trace(Trace.from_intervals([0, 1, 2], [0.0] * 3, [100.0, 50.0, 25.0], n_devices=3, horizon=100.0),
                tmp_path / "t.parquet")
    write_device_table({"device_id": np.arange(3), "group": [1, 1, 2]}, tmp_path / "d.parquet")
    config = quadratic_config([[1.0], [2.0], [3.0]], rounds=2)
    config["run"].update(out=str(tmp_path / "runs"), name="t", progress=False, plots=False)
    config["trace"] = {"source": "file", "path": str(tmp_path / "t.parquet"), "devices_table": str(tmp_path / "d.parquet")}
    (tmp_path / "c.toml").write_text(dump_toml(config))
    assert main(["run", str(tmp_path / "c.toml"), "--quiet"]) == 0
    run = tmp_path / "runs" / "t"
    capsys.readouterr()
    assert main(["trace", "info", str(run), "--devices", str(run / "devices.parquet"), "--json"]) == 0
    by = json.loads(capsys.readouterr().out)["by_zone"]
    assert by["column"] == "group" and by["source"] == f"device table {run / 'devices.parquet'}"
    assert [(row["zone"], row["devices"], row["mean"]) for row in by["rows"]] == [(1, 2, pytest.approx(0.75)),
                                                                                 (2, 1, pytest.approx(0.25))]
    assert main(["trace", "info", str(run), "--json"]) == 0  # the run's own table without being named
    assert json.loads(capsys.readouterr().out)["by_zone"] == by


def test_a_fortnights_clock_labels_turn_and_the_axis_title_stays_in_the_picture():
    """15 midnights side by side overlapped: more than 8 labels are turned, and the figure keeps
    room for them and the axis's title (which says whose clock it is)."""
    days = 14
    ids = np.repeat(np.arange(2), days)
    start = np.tile(np.arange(days) * 24 * H, 2)
    trace = Trace.from_intervals(ids, start, start + H, n_devices=2, horizon=days * 24 * H,
                                 origin="2024-03-04T00:00:00+00:00")
    fig, _ = trace_figure(trace)
    axis = fig.axes[1]
    assert len(axis.get_xticklabels()) == 15 and {t.get_rotation() for t in axis.get_xticklabels()} == {40.0}
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    assert axis.xaxis.label.get_window_extent(renderer).y0 >= 0  # the title inside the picture
    assert min(t.get_window_extent(renderer).y0 for t in axis.get_xticklabels()) >= 0
