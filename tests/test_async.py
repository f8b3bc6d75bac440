"""Asynchronous buffered aggregation (server.mode = "async") through the whole engine."""

from __future__ import annotations

import numpy as np
import polars as pl

from conftest import final_x, quadratic_config, rounds
from fedsim.traces import Trace

TARGETS = [[1.0, 0.0], [0.0, 1.0], [2.0, 2.0], [-1.0, 3.0]]


def always(n: int, horizon: float = 1e6) -> Trace:
    return Trace.from_intervals(np.arange(n), np.zeros(n), np.full(n, horizon), n_devices=n,
                                horizon=horizon)


def async_config(rounds_: int, concurrency: int, buffer: int, speeds=None):
    config = quadratic_config(TARGETS, lr=0.1, steps=3, rounds=rounds_,
                              server={"timing": "model", "mode": "async", "concurrency": concurrency,
                                      "buffer": buffer, "deadline": 1000.0},
                              devices={"model": "constant", "seconds_per_sample": 1.0,
                                       "latency_s": 0.0, "bandwidth_bps": 1e12})
    config["client"]["batch_size"] = 1
    return config


def test_async_with_everyone_in_every_buffer_is_synchronous_fedavg(cli_run):
    sync = quadratic_config(TARGETS, lr=0.1, steps=3, rounds=20)
    x_sync = final_x(cli_run(sync, always(4), name="sync"))
    run_dir = cli_run(async_config(20, concurrency=4, buffer=4), always(4), name="async")
    np.testing.assert_allclose(final_x(run_dir), x_sync, atol=1e-6)
    df = rounds(run_dir)
    assert (df["arrived"] == 4).all() and (df["staleness"] == 0).all()
    np.testing.assert_allclose(df["t_end"].to_numpy(), 3.0 * np.arange(1, 21))


def test_async_buffers_and_staleness(cli_run, tmp_path):
    from fedsim.traces.io import write_device_table

    # devices 0, 1 take 3 s per task, devices 2, 3 take 9 s: the slow ones arrive stale
    write_device_table({"device_id": [0, 1, 2, 3], "seconds_per_sample": [1.0, 1.0, 3.0, 3.0],
                        "bandwidth_bps": [1e12] * 4}, tmp_path / "devices.parquet")
    config = async_config(12, concurrency=4, buffer=2)
    config["devices"] = {"model": "table", "latency_s": 0.0}
    config["trace"] = {"devices_table": str(tmp_path / "devices.parquet")}
    run_dir = cli_run(config, always(4))
    df = rounds(run_dir)
    assert (df["arrived"] == 2).all()
    assert df["staleness"].max() > 0 and df["staleness"].min() >= 0
    devices = pl.read_parquet(run_dir / "devices.parquet")
    # fast devices ran about three times as often as slow ones
    arrivals = devices["arrivals"].to_numpy()
    assert arrivals[:2].min() > 2 * arrivals[2:].max()
    # never more than `concurrency` tasks at once: invitations minus resolutions stays <= 4
    resolved = (df["arrived"] + df["dropped"] + df["late"]).cum_sum()
    assert ((df["invited"].cum_sum() - resolved) <= 4).all()
