"""The synchronous server's rules, through the whole engine: whom a round waits for, how ties
are broken, exact ideal-timing rounds, Ctrl-C at a round boundary, and resuming generated traces."""

from __future__ import annotations

import json
import signal

import numpy as np
import polars as pl
import pytest
import torch

from conftest import final_x, quadratic_config, rounds
from fedsim.cli import main
from fedsim.traces import Trace


def always(n: int, horizon: float = 1e6) -> Trace:
    return Trace.from_intervals(np.arange(n), np.zeros(n), np.full(n, horizon), n_devices=n,
                                horizon=horizon)


def timed(targets, rounds_, **server):
    """Model timing with equal, constant speeds: every task takes exactly 2 s."""
    config = quadratic_config(targets, rounds=rounds_,
                              server={"timing": "model", "deadline": 100.0, **server},
                              devices={"model": "constant", "seconds_per_sample": 1.0,
                                       "latency_s": 0.0, "bandwidth_bps": 1e12})
    config["client"].update(batch_size=1, local_steps=2)
    return config


def targets(n: int) -> list[list[float]]:
    return [[float(i), 1.0] for i in range(n)]


def test_a_round_waits_for_every_device_the_algorithm_invited(cli_run):
    """clients_per_round = 2 without overcommit: selection `all` invites all 5 online devices
    and all 5 updates are aggregated (the round does not close at the 2nd arrival)."""
    config = timed(targets(5), 3, clients_per_round=2)
    config["algorithm"]["selection"] = "all"
    df = rounds(cli_run(config, always(5)))
    assert df["invited"].to_list() == [5, 5, 5] and df["arrived"].to_list() == [5, 5, 5]


def test_overcommit_invites_the_ceiling_without_float_error(cli_run):
    config = timed(targets(20), 2, clients_per_round=10, overcommit=0.1)
    df = rounds(cli_run(config, always(20)))
    assert df["invited"].to_list() == [11, 11]  # 10 * 1.1 = 11.000000000000002 is 11, not 12
    assert df["arrived"].to_list() == [10, 10] and df["surplus"].to_list() == [1, 1]


def test_ideal_timing_ignores_overcommit(cli_run):
    config = quadratic_config(targets(8), rounds=2, server={"clients_per_round": 3, "overcommit": 1.0})
    df = rounds(cli_run(config, always(8)))
    assert df["invited"].to_list() == [3, 3] and df["arrived"].to_list() == [3, 3]


def test_ties_at_the_kth_arrival_do_not_favour_low_ids(cli_run):
    """Four equally fast devices, one kept per round: each wins about a quarter of 400 rounds
    (binomial sd 8.7), where scheduling order would give every win to device 0."""
    config = timed(targets(4), 400, clients_per_round=1, overcommit=3.0)
    run_dir = cli_run(config, always(4))
    wins = pl.read_parquet(run_dir / "devices.parquet")["arrivals"].to_numpy()
    assert wins.sum() == 400 and np.abs(wins - 100).max() < 40, wins


def test_ideal_rounds_look_at_the_trace_at_exactly_r_times_d(cli_run):
    """D = 0.1 s: ten additions of 0.1 are 0.9999999999999999, just before device 1's only
    interval [1.0, 1.1); round 10 must still see it online."""
    trace = Trace.from_intervals([0, 1], [0.0, 1.0], [10.0, 1.1], n_devices=2, horizon=10.0)
    config = quadratic_config(targets(2), rounds=20, server={"round_duration": 0.1})
    df = rounds(cli_run(config, trace))
    assert df["arrived"].to_list() == [1] * 10 + [2] + [1] * 9
    np.testing.assert_array_equal(df["t_start"].to_numpy(), np.arange(20) * 0.1)


def test_known_p_uses_the_trace_round_of_the_invitation_under_model_timing(cli_run):
    """Tasks of 2 s on a grid trace of 1 s rounds (groups take turns every 3 s, p is 0 or 1):
    fedavg-known-p weighs each arrival 1/(N p) = 1/N with p of the trace round the device was
    seen in, which is fedavg-all exactly. The server's round index points at other trace
    rounds, where an arrived device has p = 0."""
    config = timed(targets(6), 30, clients_per_round=0)
    config["server"]["round_duration"] = 1.0
    config["trace"] = {"source": "grid", "half_period": 3}
    config["run"]["algorithms"] = ["fedavg-known-p", "fedavg-all"]
    run_dir = cli_run(config)
    devices = pl.read_parquet(run_dir / "fedavg-known-p" / "devices.parquet")
    assert (devices["arrivals"].to_numpy() > 0).all()  # both groups contributed
    np.testing.assert_allclose(final_x(run_dir / "fedavg-known-p"), final_x(run_dir / "fedavg-all"),
                               rtol=1e-6)


@pytest.mark.parametrize("algorithm", [{"name": "fedavg-wait", "S": 4}, {"name": "mifa", "warmup": True}])
def test_waiting_algorithms_invite_only_online_devices_under_model_timing(cli_run, algorithm):
    """fedavg-wait and MIFA's warm-up compute each device's update from the unchanged model
    the first time it is online: nobody offline is invited (and falsely dropped)."""
    config = timed(targets(8), 60, clients_per_round=4)
    config["algorithm"].update(algorithm)
    config["server"]["round_duration"] = 2.0
    config["trace"] = {"source": "bernoulli", "p": [0.9, 0.8, 0.6, 0.5, 0.4, 0.3, 0.3, 0.2]}
    run_dir = cli_run(config)
    df = rounds(run_dir)
    assert (df["invited"] <= df["online"]).all()
    assert df["dropped"].sum() > 0  # (tasks end just after their 2 s trace round: some drop)
    assert not np.allclose(final_x(run_dir), 0.0)  # waits ended and the model moved


def interrupt_at(monkeypatch, round_: int, signum: int = signal.SIGINT) -> None:
    """Press Ctrl-C (or send `signum`) to this process while round `round_` is being recorded."""
    from fedsim.results.recorder import Recorder

    add_round = Recorder.add_round

    def add_round_then_interrupt(self, outcome, *args):
        row = add_round(self, outcome, *args)
        if outcome.round == round_:
            signal.raise_signal(signum)
        return row

    monkeypatch.setattr(Recorder, "add_round", add_round_then_interrupt)


@pytest.mark.parametrize("signum, name", [(signal.SIGINT, "Ctrl-C"), (signal.SIGTERM, "SIGTERM")])
def test_stop_signal_stops_at_a_round_boundary_and_resume_finishes_the_same_run(
        cli_run, monkeypatch, signum, name):
    config = quadratic_config(targets(4), rounds=30, algorithm="mifa")
    config["trace"] = {"source": "bernoulli", "p": [0.9, 0.5, 0.3, 0.2]}
    whole = cli_run(config, name="whole")
    found = signal.getsignal(signum)  # (a background job's shell may have set SIGINT to be ignored)
    with monkeypatch.context() as patch:
        interrupt_at(patch, 11, signum)
        stopped = cli_run(config, name="stopped", expect=128 + signum)  # 130 Ctrl-C, 143 SIGTERM
    assert signal.getsignal(signum) == found  # the run gives the signal back as it found it
    manifest = json.loads((stopped / "manifest.json").read_text())
    assert manifest["status"] == "interrupted" and manifest["rounds"] == 12
    assert manifest["reason"] == f"interrupted by {name} after 12 rounds"
    assert torch.load(stopped / "checkpoint.pt", weights_only=False)["round"] == 12
    assert len(rounds(stopped)) == 12
    assert main(["run", "--resume", str(stopped), "--quiet"]) == 0
    assert rounds(stopped).drop("wall_s").equals(rounds(whole).drop("wall_s"))
    np.testing.assert_array_equal(final_x(stopped), final_x(whole))


def test_ctrl_c_stops_a_comparison_too(cli_run, monkeypatch):
    config = quadratic_config(targets(3), rounds=10)
    config["run"]["algorithms"] = ["fedavg", "mifa"]
    interrupt_at(monkeypatch, 4)
    run_dir = cli_run(config, always(3), expect=130)
    summary = pl.read_parquet(run_dir / "summary.parquet")
    assert summary["algorithm"].to_list() == ["fedavg"] and summary["status"].to_list() == ["interrupted"]
    assert not (run_dir / "mifa").exists()


def test_extending_a_generated_trace_run_matches_the_longer_run(cli_run):
    """A resumed run with more rounds generates the (prefix-stable) Bernoulli trace for the
    longer extent instead of replaying the shorter one from its start."""
    config = quadratic_config(targets(5), rounds=40, algorithm="mifa")
    config["trace"] = {"source": "bernoulli", "p": [0.9, 0.7, 0.5, 0.3, 0.1]}
    whole = cli_run(config, name="whole")
    config["run"]["rounds"] = 20
    short = cli_run(config, name="short")
    assert main(["run", "--resume", str(short), "--set", "run.rounds=40", "--quiet"]) == 0
    assert rounds(short).drop("wall_s").equals(rounds(whole).drop("wall_s"))
    np.testing.assert_array_equal(final_x(short), final_x(whole))
