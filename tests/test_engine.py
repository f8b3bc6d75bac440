"""The whole engine (config file -> `fedsim run` -> run directory) against known answers."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch

from conftest import alternating_trace, final_x, quadratic_config, rounds
from fedsim.traces import Trace

E1, E2 = [1.0, 0.0], [0.0, 1.0]


def alternating_limit(gamma: float, t1: int, t2: int) -> np.ndarray:
    """ALGORITHMS.md §4: FedAvg's end-of-period iterate on the alternating two-client quadratic."""
    a = 1 - gamma
    e1, e2 = np.array(E1), np.array(E2)
    return (a**t2 * (e1 - e2) + e2 - e1 * a ** (t1 + t2)) / (1 - a ** (t1 + t2))


@pytest.mark.parametrize("t1,t2", [(3, 7), (5, 5)])
def test_fedavg_alternating_clients_reaches_closed_form_limit(cli_run, t1, t2):
    gamma, periods = 0.1, 60
    # The error contracts by a^(t1+t2) per period: 0.9^600 ~ 1e-28, far below float32 rounding.
    run_dir = cli_run(quadratic_config([E1, E2], lr=gamma, rounds=periods * (t1 + t2)),
                      alternating_trace(t1, t2, periods))
    np.testing.assert_allclose(final_x(run_dir), alternating_limit(gamma, t1, t2), atol=2e-6)
    # and it is not the optimum: the bias is the point of the example
    assert np.abs(final_x(run_dir) - 0.5).max() > 0.05


def test_mifa_alternating_clients_reaches_optimum(cli_run):
    t1, t2, periods = 3, 7, 60
    run_dir = cli_run(quadratic_config([E1, E2], lr=0.1, rounds=periods * (t1 + t2), algorithm="mifa"),
                      alternating_trace(t1, t2, periods))
    np.testing.assert_allclose(final_x(run_dir), [0.5, 0.5], atol=1e-5)


def test_dropped_mid_task_even_if_back_online_at_the_end(cli_run):
    # Device 0: online [0, 10) and [12, 1000): its 15 s task spans the gap -> dropped.
    # Device 1: online throughout, arrives.
    trace = Trace.from_intervals([0, 0, 1], [0.0, 12.0, 0.0], [10.0, 1000.0, 1000.0],
                                 n_devices=2, horizon=1000.0)
    config = quadratic_config([E1, E2], rounds=1, server={"timing": "model", "deadline": 100.0},
                              devices={"model": "constant", "seconds_per_sample": 15.0,
                                       "latency_s": 0.0, "bandwidth_bps": 1e12})
    config["client"]["batch_size"] = 1
    run_dir = cli_run(config, trace)
    row = rounds(run_dir).row(0, named=True)
    assert (row["invited"], row["arrived"], row["dropped"], row["late"]) == (2, 1, 1, 0)
    devices = pl.read_parquet(run_dir / "devices.parquet")
    assert devices["drops"].to_list() == [1, 0]
    assert devices["arrivals"].to_list() == [0, 1]
    # only device 1's update was applied: one exact step towards E2
    np.testing.assert_allclose(final_x(run_dir), [0.0, 0.1], atol=1e-7)


def test_late_devices_are_not_aggregated(cli_run):
    trace = Trace.from_intervals([0, 1], [0.0, 0.0], [1000.0, 1000.0], n_devices=2, horizon=1000.0)
    config = quadratic_config([E1, E2], rounds=1, server={"timing": "model", "deadline": 10.0},
                              devices={"model": "table", "latency_s": 0.0})
    table = {"device_id": [0, 1], "seconds_per_sample": [5.0, 50.0], "bandwidth_bps": [1e12, 1e12]}
    from fedsim.traces.io import write_device_table

    write_device_table(table, cli_run.tmp / "devices.parquet")
    config["trace"] = {"devices_table": str(cli_run.tmp / "devices.parquet")}
    config["client"]["batch_size"] = 1
    run_dir = cli_run(config, trace)
    row = rounds(run_dir).row(0, named=True)
    assert (row["arrived"], row["late"], row["dropped"]) == (1, 1, 0)
    assert row["t_end"] == pytest.approx(10.0)  # waited for the deadline, not for the straggler
    np.testing.assert_allclose(final_x(run_dir), [0.1, 0.0], atol=1e-7)


def test_nobody_online_the_server_sleeps_until_someone_is(cli_run):
    # Online [0, 5) then nobody until t = 5000: the round after the gap starts exactly then.
    trace = Trace.from_intervals([0, 0], [0.0, 5000.0], [5.0, 6000.0], n_devices=1, horizon=6000.0)
    config = quadratic_config([E1], rounds=3, server={"timing": "model", "deadline": 1.0},
                              devices={"model": "constant", "seconds_per_sample": 1.0,
                                       "latency_s": 0.0, "bandwidth_bps": 1e12})
    config["client"]["batch_size"] = 1
    run_dir = cli_run(config, trace)
    df = rounds(run_dir)
    # rounds at t = 0 ... (one per second while online) until the device drops off at t=5 ...
    assert df["t_start"].to_list() == [0.0, 1.0, 2.0]
    config["run"]["rounds"] = 7
    run_dir = cli_run(config, trace, name="gap")
    starts = rounds(run_dir)["t_start"].to_list()
    assert starts == [0.0, 1.0, 2.0, 3.0, 4.0, 5000.0, 5001.0]


def test_run_stops_when_the_trace_has_nobody_left(cli_run):
    trace = Trace.from_intervals([0], [0.0], [3.0], n_devices=1, horizon=3.0)
    config = quadratic_config([E1], rounds=50, server={"timing": "model", "deadline": 1.0},
                              devices={"model": "constant", "seconds_per_sample": 1.0,
                                       "latency_s": 0.0, "bandwidth_bps": 1e12})
    config["client"]["batch_size"] = 1
    run_dir = cli_run(config, trace)
    import json

    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "completed" and manifest["rounds"] == 3
    assert "nobody online" in manifest["reason"]


def test_clients_per_round_with_overcommit_keeps_the_first_k(cli_run):
    n = 6
    trace = Trace.from_intervals(np.arange(n), np.zeros(n), np.full(n, 1e6), n_devices=n, horizon=1e6)
    targets = [[float(i), 0.0] for i in range(n)]
    table = {"device_id": list(range(n)), "seconds_per_sample": [float(1 + i) for i in range(n)],
             "bandwidth_bps": [1e12] * n}
    from fedsim.traces.io import write_device_table

    write_device_table(table, cli_run.tmp / "devices.parquet")
    config = quadratic_config(targets, rounds=1,
                              server={"timing": "model", "deadline": 100.0, "clients_per_round": 2,
                                      "overcommit": 1.0},
                              devices={"model": "table", "latency_s": 0.0},
                              trace={"devices_table": str(cli_run.tmp / "devices.parquet")})
    config["client"]["batch_size"] = 1
    config["algorithm"]["selection"] = "uniform"
    run_dir = cli_run(config, trace)
    row = rounds(run_dir).row(0, named=True)
    # the two slower ones finished by the deadline, after the round had closed at K = 2
    assert (row["invited"], row["arrived"], row["late"], row["surplus"]) == (4, 2, 0, 2)
    assert row["close_reason"] == "quota"
    devices = pl.read_parquet(run_dir / "devices.parquet")
    invited = np.flatnonzero(devices["invitations"].to_numpy())
    arrived = np.flatnonzero(devices["arrivals"].to_numpy())
    np.testing.assert_array_equal(arrived, np.sort(invited)[:2])  # the two fastest
    assert row["t_end"] == pytest.approx(np.sort(invited)[1] + 1.0)  # the 2nd arrival closes it


def test_same_config_and_seed_give_identical_rounds(cli_run):
    config = {
        "run": {"rounds": 12, "eval_every": 4, "seed": 3},
        "data": {"dataset": "digits", "clients": 20, "partition": "dirichlet", "alpha": 0.3},
        "model": {"name": "mlp", "hidden": 16},
        "client": {"local_steps": 3, "batch_size": 8, "lr": 0.1},
        "trace": {"source": "bernoulli", "p": 0.5},
        "server": {"deadline": 120.0, "round_duration": 60.0, "clients_per_round": 5},
    }
    a = rounds(cli_run(config, name="a")).drop("wall_s")
    b = rounds(cli_run(config, name="b")).drop("wall_s")
    assert a.equals(b)
    assert a["arrived"].sum() > 0 and a["test_acc"].drop_nulls().len() == 3
    config["run"]["seed"] = 4
    c = rounds(cli_run(config, name="c")).drop("wall_s")
    assert not a.equals(c)


def test_run_directory_has_every_file_and_column(cli_run):
    config = {
        "run": {"rounds": 6, "eval_every": 3, "algorithms": ["fedavg", "mifa"], "plots": True},
        "data": {"dataset": "digits", "clients": 10},
        "client": {"local_steps": 2, "batch_size": 8},
        "trace": {"source": "bernoulli", "p": 0.7},
    }
    run_dir = cli_run(config)
    for algo in ("fedavg", "mifa"):
        sub = run_dir / algo
        for name in ("config.toml", "manifest.json", "rounds.parquet", "devices.parquet",
                     "model.pt", "checkpoint.pt"):
            assert (sub / name).exists(), name
        df = rounds(sub)
        for col in ("round", "t_start", "t_end", "online", "invited", "arrived", "dropped", "late",
                    "train_loss", "test_loss", "test_acc", "wall_s"):
            assert col in df.columns
        assert df["round"].to_list() == list(range(6))
        assert df["test_acc"].is_null().to_list() == [True, True, False, True, True, False]
        assert (df["t_end"] > df["t_start"]).all()
        assert (df["arrived"] + df["dropped"] + df["late"] + df["surplus"] == df["invited"]).all()
        devices = pl.read_parquet(sub / "devices.parquet")
        assert devices.columns[:7] == ["device_id", "invitations", "arrivals", "drops", "late",
                                       "surplus", "last_round"]
        assert devices["invitations"].sum() == df["invited"].sum()
        state = torch.load(sub / "model.pt")
        assert all(isinstance(v, torch.Tensor) for v in state.values())
    summary = pl.read_parquet(run_dir / "summary.parquet")
    assert summary["algorithm"].to_list() == ["fedavg", "mifa"]
    assert (run_dir / "plots" / "accuracy_vs_rounds.png").exists()
    assert not (run_dir / "fedavg" / "plots").exists()  # the comparison's plots show each member's
    import json

    mem = {a: json.loads((run_dir / a / "manifest.json").read_text())["server_memory_bytes"]
           for a in ("fedavg", "mifa")}
    assert mem["mifa"] > 10 * mem["fedavg"]  # MIFA stores an update per device


def test_resume_ends_with_the_same_results(cli_run):
    config = {
        "run": {"rounds": 10, "eval_every": 5, "checkpoint_every": 5},
        "data": {"dataset": "digits", "clients": 12},
        "client": {"local_steps": 2, "batch_size": 8},
        "server": {"clients_per_round": 4},
        "algorithm": {"name": "mifa"},
    }
    whole = cli_run(config, name="whole")
    config["run"]["rounds"] = 5
    half = cli_run(config, name="half")
    from fedsim.cli import main

    assert main(["run", "--resume", str(half), "--set", "run.rounds=10", "--quiet"]) == 0
    a, b = rounds(whole).drop("wall_s"), rounds(half).drop("wall_s")
    assert a.equals(b)
    model_a, model_b = torch.load(whole / "model.pt"), torch.load(half / "model.pt")
    assert all(torch.equal(model_a[k], model_b[k]) for k in model_a)


def test_a_diverging_model_stops_the_run_with_status_diverged(cli_run):
    import json

    # lr = 3 on f = 0.5||x - u||^2: x <- x - 3(x - u) multiplies the error by -2 every step.
    config = quadratic_config([E1, E2], lr=3.0, steps=50, rounds=100)
    trace = Trace.from_intervals([0, 1], [0.0, 0.0], [100.0, 100.0], n_devices=2, horizon=100.0)
    run_dir = cli_run(config, trace, expect=3)  # the CLI exits 3 for a diverged run
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "diverged"
    assert 0 < manifest["rounds"] < 100
    assert "diverged" in cli_run.last_output.out



def test_the_finite_model_check_answers_for_every_entry_not_for_the_sum():
    from fedsim.sim.receive import finite

    big = torch.full((4,), 3e38)  # finite entries whose float32 sum overflows to inf
    assert finite(big) and finite(torch.zeros(3)) and finite(torch.empty(0))
    for bad in (float("nan"), float("inf"), -float("inf")):
        assert not finite(torch.tensor([1.0, bad, 2.0]))
    assert not finite(torch.tensor([float("inf"), -float("inf")]))  # a NaN sum, too


@pytest.mark.parametrize("columns, says", [
    ({"device_id": [0, 1], "seconds_per_sample": [1.0, 1.0]}, "missing column 'downlink_bps'"),
    ({"device_id": [0, 1], "seconds_per_sample": [1.0, -1.0], "bandwidth_bps": [1e6, 1e6]},
     "seconds_per_sample = -1.0 on row 1 (device 1); it must be a finite number >= 0"),
    ({"device_id": [0, 1], "seconds_per_sample": [1.0, 1.0], "bandwidth_bps": [0.0, 1e6]},
     "bandwidth_bps = 0.0 on row 0 (device 0); it must be a finite number > 0"),
])
def test_a_bad_device_table_is_one_error_line(cli_run, capsys, columns, says):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), cli_run.tmp / "devices.parquet")
    config = quadratic_config([E1, E2], rounds=1, server={"timing": "model"},
                              devices={"model": "table"})
    config["trace"] = {"devices_table": str(cli_run.tmp / "devices.parquet")}
    cli_run(config, expect=2)
    err = cli_run.last_output.err.strip()
    assert err.startswith("error: ") and "\n" not in err and says in err, err
