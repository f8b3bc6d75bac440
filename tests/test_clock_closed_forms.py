"""The clock against closed forms, through the whole engine (config -> `fedsim run` -> Parquet,
no mocks): devices of known speeds from a device table, each task exactly 1 s download + 2
samples x seconds_per_sample + 1 s upload (the quadratic model's 64 bits over 64 bit/s)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import quadratic_config, rounds  # noqa: E402
from test_server_rules import always, targets  # noqa: E402

from fedsim.traces import Trace  # noqa: E402
from fedsim.traces.index import AvailabilityIndex  # noqa: E402
from fedsim.traces.io import write_device_table  # noqa: E402

SPS = np.array([0.5, 4.0, 1.25, 2.0, 0.75, 3.5, 1.0, 2.75])  # dyadic: the sums are exact
TASK = 2.0 + 2.0 * SPS  # seconds of each device's task


def known_speeds(cli_run, rounds_: int, **server) -> dict:
    n = len(SPS)
    write_device_table({"device_id": np.arange(n), "seconds_per_sample": SPS, "bandwidth_bps": np.full(n, 64.0),
                        "latency_s": np.zeros(n)}, cli_run.tmp / "speeds.parquet")
    config = quadratic_config(targets(n), rounds=rounds_, server={"timing": "model", **server},
                              devices={"model": "table"},
                              trace={"devices_table": str(cli_run.tmp / "speeds.parquet")})
    config["client"].update(batch_size=1, local_steps=2)
    config["run"]["seed"] = 5
    return config


def invited_per_round(run_dir: Path) -> list[np.ndarray]:
    ev = pl.read_parquet(run_dir / "events.parquet")
    return [g["device_id"].to_numpy() for _, g in ev.sort("round").group_by("round", maintain_order=True)]


@pytest.fixture
def events_of(cli_run):
    def run(rounds_: int, trace: Trace | None = None, **server):
        run_dir = cli_run(known_speeds(cli_run, rounds_, **server), trace or always(len(SPS)))
        return run_dir, rounds(run_dir), pl.read_parquet(run_dir / "events.parquet")
    return run


def test_a_round_without_deadline_lasts_exactly_its_slowest_invited_task(events_of):
    run_dir, df, ev = events_of(12, clients_per_round=3, deadline=1e6)
    invited = invited_per_round(run_dir)
    assert [len(i) for i in invited] == [3] * 12 and len({tuple(i) for i in invited}) > 3
    np.testing.assert_array_equal(ev["download_s"] + ev["compute_s"] + ev["upload_s"], TASK[ev["device_id"]])
    np.testing.assert_array_equal(df["duration"], [TASK[i].max() for i in invited])
    np.testing.assert_array_equal(df["t_start"][1:], df["t_end"][:-1])  # back to back: always online
    assert (df["arrived"] == 3).all() and set(df["close_reason"]) == {"all-arrived"}


def test_overcommit_closes_at_the_kth_finish(events_of):
    """K = 2 of ceil(2 x 1.5) = 3 invited: the round ends at the 2nd order statistic of the
    invited tasks, the two fastest arrive, the third is surplus."""
    run_dir, df, ev = events_of(12, clients_per_round=2, overcommit=0.5, deadline=1e6)
    invited = invited_per_round(run_dir)
    assert [len(i) for i in invited] == [3] * 12
    np.testing.assert_array_equal(df["duration"], [np.sort(TASK[i])[1] for i in invited])
    for r, ids in enumerate(invited):
        fastest = ids[np.argsort(TASK[ids])]
        got = ev.filter(pl.col("round") == r).sort("device_id")
        assert set(got.filter(pl.col("outcome") == "arrived")["device_id"]) == set(fastest[:2])
        assert got.filter(pl.col("outcome") == "surplus")["device_id"].to_list() == [fastest[2]]
    assert set(df["close_reason"]) == {"quota"}


def test_a_deadline_closes_the_round_at_min_of_deadline_and_slowest(events_of):
    run_dir, df, ev = events_of(16, clients_per_round=3, deadline=7.0)
    invited = invited_per_round(run_dir)
    np.testing.assert_array_equal(df["duration"], [min(7.0, TASK[i].max()) for i in invited])
    np.testing.assert_array_equal(df["arrived"], [(TASK[i] <= 7.0).sum() for i in invited])
    np.testing.assert_array_equal(df["late"], [(TASK[i] > 7.0).sum() for i in invited])
    assert {"deadline", "all-arrived"} <= set(df["close_reason"])
    late = ev.filter(pl.col("outcome") == "late")
    np.testing.assert_array_equal(late["work_s"], 7.0)  # worked until the deadline


def churning_trace(n: int, seed: int, horizon: float = 400.0) -> Trace:
    """Sessions and gaps of 2 to 12 s: tasks of 3 to 10 s often outlive the session."""
    rng = np.random.default_rng(seed)
    ids, starts, ends = [], [], []
    for device in range(n):
        t = float(rng.integers(0, 6))
        while t < horizon:
            on = float(rng.integers(2, 13))
            ids.append(device), starts.append(t), ends.append(min(t + on, horizon))
            t += on + float(rng.integers(2, 13))
    return Trace.from_intervals(np.array(ids), np.array(starts), np.array(ends), n_devices=n, horizon=horizon)


def test_async_arrivals_obey_the_trace_and_a_busy_device_is_never_invited_twice(events_of):
    trace = churning_trace(len(SPS), seed=1)
    run_dir, df, ev = events_of(25, trace, mode="async", concurrency=4, buffer=2, deadline=1e6)
    assert len(df) == 25
    index = AvailabilityIndex(trace)
    ev = ev.sort("device_id", "invited_at")
    arrived = ev.filter(pl.col("outcome") == "arrived")
    dropped = ev.filter(pl.col("outcome") == "dropped")
    assert arrived.height >= 50 and dropped.height > 10
    # an arrival was online from its invitation to its finish, exactly its task later
    np.testing.assert_array_equal(arrived["finished"] - arrived["invited_at"], TASK[arrived["device_id"]])
    for row in arrived.iter_rows(named=True):
        assert index.online_during([row["device_id"]], row["invited_at"], row["finished"])[0], row
    # a device offline before its finish never arrives: it drops when the trace takes it away
    for row in dropped.iter_rows(named=True):
        device, t0 = row["device_id"], row["invited_at"]
        assert index.online(t0)[device]  # invited online
        offline = index.next_offline([device], t0)[0]
        assert offline < t0 + TASK[device] and row["work_s"] == offline - t0, row
    # busy until its task ended (finished or dropped): the next invitation comes after
    end = ev["invited_at"] + ev["work_s"]
    same = ev["device_id"][1:].to_numpy() == ev["device_id"][:-1].to_numpy()
    assert (ev["invited_at"][1:].to_numpy()[same] >= end[:-1].to_numpy()[same]).all()


def test_a_looped_trace_of_decimals_keeps_its_clock_going_cycle_after_cycle(events_of):
    """Device 0 alone online, over [0.5, 8.3) of every 10.1 s (its tasks take 3 s): each cycle
    holds rounds at 0.5, 3.5 (arrived) and 6.5 (dropped when the session ends at 8.3 of the
    cycle); the next round waits for the next cycle. In most cycles the instant k x 10.1 + 8.3
    rounds down to below the session's end, and the device read as online there: the round
    after the drop started and closed at that instant, for ever (the clock stopped)."""
    trace = Trace.from_intervals([0], [0.5], [8.3], n_devices=len(SPS), horizon=10.1, wrap="loop")
    cycles = 20
    run_dir, df, ev = events_of(3 * cycles, trace=trace, clients_per_round=1, deadline=1e6)
    index = AvailabilityIndex(trace)
    assert (df["duration"] > 0).all()
    k = np.arange(cycles)
    np.testing.assert_allclose(df["t_start"], np.stack([k * 10.1 + 0.5, k * 10.1 + 3.5, k * 10.1 + 6.5], 1).ravel(),
                               rtol=0, atol=1e-9)
    assert df["arrived"].to_list() == [1, 1, 0] * cycles
    for end in df["t_end"].to_numpy()[2::3]:  # each cycle's drop: the first instant the device is offline
        assert not index.online(end)[0] and index.online(np.nextafter(end, -np.inf))[0]
