"""`fedsim report` explains latency: phases, close reasons, stragglers and participation by
zone, checked against the run's own Parquet files and against hand-made tables."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from conftest import quadratic_config
from fedsim.cli import main
from fedsim.traces import Trace
from fedsim.traces.io import write_device_table


@pytest.fixture
def slow_run(cli_run):
    """12 devices always online, 4 of them too slow for the deadline, in two time zones, two
    classes; the table names them."""
    n = 12
    table = {"device_id": np.arange(n), "seconds_per_sample": [1.0] * 8 + [30.0] * 4,
             "bandwidth_bps": [8e6] * n, "latency_s": [0.5] * n, "class": ["phone-high"] * 8 + ["phone-low"] * 4,
             "tz_offset": [1.0, 8.0] * 6, "name": [f"phone{i}" for i in range(n)]}
    write_device_table(table, cli_run.tmp / "devices.parquet")
    trace = Trace.from_intervals(np.arange(n), np.zeros(n), np.full(n, 300.0), n_devices=n, horizon=300.0,
                                 wrap="loop")
    config = quadratic_config([[float(i), 0.0] for i in range(n)], rounds=8, steps=3,
                              server={"timing": "model", "deadline": 20.0, "clients_per_round": 9},
                              trace={"devices_table": str(cli_run.tmp / "devices.parquet")},
                              devices={"model": "table"})
    return cli_run(config, trace)


def report_json(run_dir, capsys) -> dict:
    assert main(["report", str(run_dir), "--json"]) == 0
    return json.loads(capsys.readouterr().out)["runs"][0]


def test_latency_close_reasons_and_stragglers_match_the_runs_files(slow_run, capsys):
    doc = report_json(slow_run, capsys)
    events = pl.read_parquet(slow_run / "events.parquet")
    rounds = pl.read_parquet(slow_run / "rounds.parquet")
    devices = pl.read_parquet(slow_run / "devices.parquet")
    ran = events.filter(pl.col("outcome").cast(pl.String).is_in(["arrived", "late", "surplus"]))
    assert doc["latency"]["tasks"] == ran.height == events.height  # nobody dropped here
    for phase in ("download_s", "compute_s", "upload_s"):
        values = ran[phase].to_numpy()
        assert doc["latency"][phase]["median"] == pytest.approx(np.median(values))
        assert doc["latency"][phase]["p90"] == pytest.approx(np.percentile(values, 90))
    # download of 2 floats: 0.5 s + 64 bits / 8 Mbit/s; compute: 3 steps on 1 sample x 1 s or 30 s
    assert doc["latency"]["download_s"]["median"] == pytest.approx(0.5 + 64 / 8e6)
    assert sorted(set(ran["compute_s"].round(6).to_list())) <= [3.0, 90.0]
    counts = dict(rounds.group_by("close_reason").len().iter_rows())
    assert doc["close_reasons"] == {"all-arrived": counts.get("all-arrived", 0), "quota": 0,
                                    "deadline": counts.get("deadline", 0), "nobody-invited": 0, "max-time": 0,
                                    "quorum": 0}
    assert sum(doc["close_reasons"].values()) == rounds.height == 8
    expected = (devices.filter((pl.col("invitations") >= 5) & (pl.col("arrivals") < 0.1 * pl.col("invitations")))
                .sort(["invitations", "device_id"], descending=[True, False]))
    assert [s["device_id"] for s in doc["stragglers"]] == expected["device_id"].to_list() != []
    assert {s["device_id"] for s in doc["stragglers"]} <= {8, 9, 10, 11}
    first = doc["stragglers"][0]
    row = devices.filter(pl.col("device_id") == first["device_id"]).row(0, named=True)
    assert (first["invitations"], first["arrivals"], first["late"], first["dropped"]) == (
        row["invitations"], row["arrivals"], row["late"], row["drops"])
    assert first["class"] == "phone-low" and first["name"] == f"phone{first['device_id']}"
    assert first["tz_offset"] == [1.0, 8.0][first["device_id"] % 2]
    assert first["median_compute_s"] == pytest.approx(90.0) and first["cause"] == "slow for the deadline"
    assert first["median_task_s"] == pytest.approx(90.0 + 2 * (0.5 + 64 / 8e6))
    by = doc["participation_by"]
    assert by["column"] == "tz_offset" and [z["zone"] for z in by["rows"]] == [1.0, 8.0]
    for zone in by["rows"]:
        mine = devices.filter(pl.col("tz_offset") == zone["zone"])
        assert zone["devices"] == mine.height and zone["invitations"] == mine["invitations"].sum()
        assert zone["arrival_rate"] == pytest.approx(mine["arrivals"].sum() / mine["invitations"].sum())


def test_the_text_report_names_the_stragglers_and_why(slow_run, capsys):
    assert main(["report", str(slow_run)]) == 0
    out = capsys.readouterr().out
    assert "latency (tasks run to their end)" in out and "rounds closed by" in out
    head = next(line for line in out.splitlines() if "straggler" in line)
    assert head.startswith("fedavg: ") and "(invited >= 5 times, arrived < 10 %)" in head
    assert "slow for the deadline" in out and "phone-low" in out
    assert "fedavg by UTC offset (h)" in out


def test_a_run_without_the_events_log_or_new_columns_still_reports(slow_run, capsys):
    (slow_run / "events.parquet").unlink()
    devices = pl.read_parquet(slow_run / "devices.parquet").drop("class", "tz_offset", "name")
    devices.write_parquet(slow_run / "devices.parquet")
    rounds = pl.read_parquet(slow_run / "rounds.parquet").drop("close_reason")
    rounds.write_parquet(slow_run / "rounds.parquet")
    doc = report_json(slow_run, capsys)
    assert doc["latency"] is None and doc["close_reasons"] is None and doc["participation_by"] is None
    assert doc["stragglers"] and doc["stragglers"][0]["class"] is None and doc["stragglers"][0]["median_compute_s"] is None
    assert main(["report", str(slow_run)]) == 0


def test_the_latency_and_speed_plots_are_drawn_and_skipped_without_their_files(slow_run):
    from fedsim.results.plots import build_figures, load_run

    figures = build_figures({"fedavg": load_run(slow_run)})
    assert {"latency_fedavg", "arrival_rate_vs_speed"} <= set(figures)
    ax = figures["arrival_rate_vs_speed"].axes[0]
    assert ax.get_xlabel() == "samples per second (1 / seconds_per_sample)"  # the table gave no flops
    assert sorted(t.get_text() for t in ax.get_legend().get_texts()) == ["phone-high", "phone-low"]
    (slow_run / "events.parquet").unlink()
    assert "latency_fedavg" not in build_figures({"fedavg": load_run(slow_run)})


def test_the_latency_plot_draws_each_rounds_deadline_under_deadline_sigma(cli_run):
    """FLASH's deadline_sigma: each round's own deadline is drawn as a step, at the rounds'
    starts; a fixed deadline is one line."""
    from fedsim.results.plots import build_figures, load_run

    n = 6
    trace = Trace.from_intervals(np.arange(n), np.zeros(n), np.full(n, 900.0), n_devices=n, horizon=900.0,
                                 wrap="loop")
    server = {"timing": "model", "deadline": 20.0, "deadline_sigma": 6.0}
    devices = {"model": "constant", "seconds_per_sample": 2.0, "bandwidth_bps": 8e6, "latency_s": 0.5}
    run_dir = cli_run(quadratic_config([[float(i), 0.0] for i in range(n)], rounds=6, steps=3, server=server,
                                       devices=devices), trace)
    rows = pl.read_parquet(run_dir / "rounds.parquet")
    ax = build_figures({"fedavg": load_run(run_dir)})["latency_fedavg"].axes[0]
    (line,) = [line for line in ax.get_lines() if line.get_label().startswith("deadline")]
    assert line.get_label() == "deadline, drawn\nper round\n(around 20 s)"
    assert set(line.get_ydata()) == set(rows["deadline"].to_list()) and rows["deadline"].n_unique() == 6
    fixed = cli_run(quadratic_config([[float(i), 0.0] for i in range(n)], rounds=2, steps=3,
                                     server={"timing": "model", "deadline": 20.0}, devices=devices), trace, name="fixed")
    ax = build_figures({"fedavg": load_run(fixed)})["latency_fedavg"].axes[0]
    assert [line.get_label() for line in ax.get_lines()] == ["deadline (20 s)"]


def test_a_run_without_stragglers_says_so(cli_run, capsys):
    n = 4
    trace = Trace.from_intervals(np.arange(n), np.zeros(n), np.full(n, 300.0), n_devices=n, horizon=300.0,
                                 wrap="loop")
    run_dir = cli_run(quadratic_config([[float(i), 0.0] for i in range(n)], rounds=6, steps=1,
                                       server={"timing": "model", "deadline": 1000.0}), trace)
    assert report_json(run_dir, capsys)["stragglers"] == []
    assert main(["report", str(run_dir)]) == 0
    lines = capsys.readouterr().out.splitlines()
    (head,) = [line for line in lines if "straggler" in line]
    assert head == "fedavg: 0 stragglers (invited >= 5 times, arrived < 10 %)"
    assert "likely cause" not in "\n".join(lines)  # no empty table under it


def test_a_straggler_too_slow_for_the_deadline_is_called_so_whatever_dropped_it_first(tmp_path, monkeypatch, capsys):
    """The quick start: device 64's tasks take 61.7 s against a 60 s deadline, and most of its
    invitations ended offline before that: its cause is the speed (it was "offline before
    finishing", a cause that would not have let it arrive had it stayed online). Under ideal
    timing there is no latency to report (every task takes no time)."""
    monkeypatch.chdir(tmp_path)
    assert main(["run", "quickstart", "--quiet", "--set", "run.algorithms=[]", "--set", "run.plots=false"]) == 0
    capsys.readouterr()
    report = report_json(tmp_path / "runs" / "quickstart", capsys)
    slow = [s for s in report["stragglers"] if s["median_task_s"] > 60.0]
    assert slow and any(s["dropped"] > s["late"] for s in slow)
    assert {s["cause"] for s in slow} == {"slow for the deadline"}
    assert main(["run", "quickstart", "--quiet", "--set", "run.algorithms=[]", "--set", "run.plots=false",
                 "--set", "server.timing=ideal", "--set", "run.name=ideal", "--set", "run.rounds=3"]) == 0
    capsys.readouterr()
    assert report_json(tmp_path / "runs" / "ideal", capsys)["latency"] is None
    assert main(["report", str(tmp_path / "runs" / "ideal")]) == 0
    assert "latency (tasks run to their end)" not in capsys.readouterr().out
