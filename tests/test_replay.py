"""Replaying a trace that fits the experiment: device selection, offsets, the end of a trace,
devices.parquet's columns, and the warning for degenerate participation."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import quadratic_config, rounds  # noqa: E402

from fedsim.traces import AvailabilityIndex, Trace, generate, write_trace  # noqa: E402


def model_config(clients: int, rounds_: int = 4, **trace) -> dict:
    config = quadratic_config([], rounds=rounds_)
    config["data"] = {"dataset": "quadratic", "clients": clients, "dim": 2}
    config["server"] = {"timing": "model", "clients_per_round": min(20, clients), "deadline": 60.0}
    config["devices"] = {"model": "lognormal", "seconds_per_sample": 0.01}
    config["client"] = {"batch_size": 4, "local_steps": 2, "lr": 0.1}
    config["trace"] = trace
    return config


@pytest.fixture(scope="module")
def big_diurnal(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("traces") / "fleet.parquet"
    write_trace(generate("diurnal", 100_000, seed=3, days=2.0), path)
    return path


def test_a_large_fleet_replays_a_random_selection(cli_run, big_diurnal):
    from fedsim.traces import read_trace

    config = model_config(1000, source="file", path=str(big_diurnal), select="random")
    run_dir = cli_run(config)
    devices = pl.read_parquet(run_dir / "devices.parquet")
    chosen = devices["trace_device"].to_numpy()
    assert len(np.unique(chosen)) == 1000 and chosen.max() < 100_000 and np.all(np.diff(chosen) > 0)
    assert chosen.max() > 90_000  # spread over the fleet, not the first thousand
    fleet = read_trace(big_diurnal)
    np.testing.assert_array_equal(devices["tz_offset"].to_numpy(),
                                  np.asarray(fleet.generator["tz_offset_h"])[chosen])
    online = AvailabilityIndex(fleet).online(0.0)[chosen].sum()
    assert rounds(run_dir)["online"][0] == online
    again = cli_run(config, name="again")
    assert np.array_equal(pl.read_parquet(again / "devices.parquet")["trace_device"].to_numpy(), chosen)
    assert {"seconds_per_sample", "downlink_bps", "uplink_bps", "latency_s", "online_fraction"} <= set(devices.columns)
    assert ((devices["online_fraction"] >= 0) & (devices["online_fraction"] <= 1)).all()


@pytest.mark.parametrize("offset", [8 * 3600.0, "iso"])
def test_offset_moves_the_start_of_the_run(cli_run, tmp_path, offset):
    trace = generate("diurnal", 3000, seed=1, days=2.0)
    path = tmp_path / "d.parquet"
    write_trace(trace, path)
    from datetime import datetime, timedelta

    seconds = 8 * 3600.0
    if offset == "iso":
        offset = (datetime.fromisoformat(trace.origin) + timedelta(seconds=seconds)).isoformat()
    config = model_config(3000, source="file", path=str(path), offset=offset)
    df = rounds(cli_run(config, name="offset"))
    index = AvailabilityIndex(trace)
    assert df["online"][0] == index.online(seconds).sum() != index.online(0.0).sum()
    manifest = json.loads((cli_run.tmp / "runs" / "offset" / "manifest.json").read_text())
    expected = (datetime.fromisoformat(trace.origin) + timedelta(seconds=seconds))
    assert datetime.fromisoformat(manifest["trace"]["origin"]) == expected


def test_selection_policies_pick_the_devices_they_say():
    from fedsim.runs.replay import select_first, select_most_available, select_random

    trace = Trace.from_intervals([0, 1, 2, 3], [0, 0, 0, 0], [1.0, 4.0, 2.0, 4.0], n_devices=4, horizon=4.0)
    assert select_first(trace, 2, 0).tolist() == [0, 1]
    assert select_most_available(trace, 2, 0).tolist() == [1, 3]
    assert select_most_available(trace, 3, 0).tolist() == [1, 2, 3]
    picks = {tuple(select_random(trace, 2, seed)) for seed in range(30)}
    assert len(picks) > 3 and all(len(set(p)) == 2 for p in picks)


def test_a_looping_trace_rotates_at_the_offset():
    from fedsim.runs.replay import shift

    trace = Trace.from_intervals([0, 1], [1.0, 5.0], [3.0, 8.0], n_devices=2, horizon=10.0, wrap="loop")
    moved = shift(trace, 2.0)
    index, original = AvailabilityIndex(moved), AvailabilityIndex(trace)
    for t in np.arange(0.0, 30.0, 0.5):
        assert np.array_equal(index.online(t), original.online(t + 2.0)), t
    ends = shift(Trace.from_intervals([0], [1.0], [3.0], n_devices=1, horizon=10.0), 2.0)
    assert ends.horizon == 8.0 and ends.start.tolist() == [0.0] and ends.end.tolist() == [1.0]


@pytest.mark.parametrize("trace_kw, clients, says", [
    ({"offset": 3 * 86400.0}, 10, "[trace] offset = 259200.0 is beyond the trace's horizon (172800 s)"),
    ({"select": "random"}, 50, "has 10 devices but [data] clients = 50; set data.clients = 10 or fewer"),
    ({}, 5, "has 10 devices but [data] clients = 5; set data.clients = 10, or [trace] select = \"random\""),
    ({"offset": "2024-01-01T00:00:00"}, 10, "the trace has no origin"),
])
def test_replay_errors_are_one_line(cli_run, tmp_path, monkeypatch, trace_kw, clients, says):
    import fedsim.runs.replay as replay

    trace = generate("markov", 10, seed=0, days=2.0)
    path = tmp_path / "m.parquet"
    write_trace(Trace.from_intervals(trace.device_id, trace.start, trace.end, n_devices=10,
                                     horizon=trace.horizon), path)  # no origin
    if clients != 10:  # a device count that cannot be replayed: said from the file's metadata alone
        monkeypatch.setattr(replay, "read_trace", lambda path: pytest.fail("the intervals were read"))
    cli_run(model_config(clients, source="file", path=str(path), **trace_kw), name="bad", expect=2)
    err = cli_run.last_output.err
    assert err.count("\n") == 1 and says in err, err
    assert not (tmp_path / "runs" / "bad").exists()


def test_a_trace_that_ends_stops_an_ideal_run(cli_run):
    trace = Trace.from_intervals([0, 1], [0.0, 0.0], [10.0, 4.0], n_devices=2, horizon=10.0)
    run_dir = cli_run(quadratic_config([[1.0, 0.0], [0.0, 1.0]], rounds=100), trace)
    assert len(rounds(run_dir)) == 10
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "completed" and manifest["reason"] == "the trace ended at 10 s"
    assert "stopped after 10 of 100 rounds (the trace ended at 10 s)" in cli_run.last_output.out
    fraction = pl.read_parquet(run_dir / "devices.parquet")["online_fraction"].to_list()
    assert fraction == [1.0, 0.4]


def test_a_run_within_one_slot_of_its_generated_trace_and_a_run_of_failed_quorums_are_warned_of(cli_run):
    """Rounds of ~0.1 s under model timing in a Bernoulli trace of 60-s rounds: each device is
    online throughout or never; a quorum no round meets leaves the model where it was."""
    config = {"run": {"rounds": 6}, "data": {"dataset": "digits", "clients": 20},
              "trace": {"source": "bernoulli", "p": 0.6}, "server": {"timing": "model"}}
    warnings = json.loads((cli_run(config, name="static") / "manifest.json").read_text())["warnings"]
    assert len(warnings) == 1 and warnings[0].startswith(
        "static availability: the run's 6 rounds took "), warnings
    assert "within one 1 min round of the generated trace ([server] round_duration)" in warnings[0]
    always = {**config, "trace": {"source": "always"}}  # (online throughout by design)
    assert json.loads((cli_run(always, name="always") / "manifest.json").read_text())["warnings"] == []
    quorum = {**config, "server": {"timing": "model", "round_duration": 0.05, "update_frac": 1.0, "deadline": 0.05}}
    run_dir = cli_run(quorum, name="quorum")
    assert rounds(run_dir)["close_reason"].to_list() == ["quorum"] * 6
    assert json.loads((run_dir / "manifest.json").read_text())["warnings"][-1] == (
        "no update: all 6 rounds failed their quorum ([server] update_frac = 1), so the model never changed; "
        "lower update_frac, or raise the deadline or the devices' speeds")


def test_degenerate_participation_is_a_warning(cli_run):
    trace = Trace.from_intervals([0], [0.0], [1000.0], n_devices=20, horizon=1000.0)
    targets = [[float(i), 0.0] for i in range(20)]
    run_dir = cli_run(quadratic_config(targets, rounds=10), trace)
    warnings = json.loads((run_dir / "manifest.json").read_text())["warnings"]
    assert warnings == [
        "degenerate participation: 10 of 10 rounds had fewer than 2 arrivals (check the trace's "
        "availability, the deadline and the device speeds)",
        "degenerate participation: only 1 of 20 devices (5.0%) ever arrived",
        "short clock: the run covered 10 s of the trace's 16.7 min (1 %), so its availability pattern "
        "did not play out; run longer (run.rounds, run.max_time) or start where it matters ([trace] "
        "offset); docs/timing.md"]
    assert f"warning: fedavg: {warnings[1]}" in cli_run.last_output.out
    healthy = cli_run(quadratic_config(targets, rounds=3), name="ok")
    assert json.loads((healthy / "manifest.json").read_text())["warnings"] == []


def test_a_run_stopped_early_is_not_warned_of_its_short_clock(cli_run, monkeypatch):
    """Ctrl-C in round 2 of 10 on a 16.7-min trace: the resume goes on, so the clock it covered
    so far says nothing yet; the resumed run that ends short is warned."""
    import signal

    from fedsim.results.recorder import Recorder

    trace = Trace.from_intervals(list(range(4)), [0.0] * 4, [1000.0] * 4, n_devices=4, horizon=1000.0)
    add_round = Recorder.add_round

    def sigint(self, outcome, *args):
        if outcome.round == 2:
            signal.raise_signal(signal.SIGINT)
        return add_round(self, outcome, *args)

    monkeypatch.setattr(Recorder, "add_round", sigint)
    run_dir = cli_run(quadratic_config([[0.0], [1.0], [2.0], [3.0]], rounds=10), trace, expect=130)
    assert json.loads((run_dir / "manifest.json").read_text())["warnings"] == []
