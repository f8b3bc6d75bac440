"""Asynchronous buffered aggregation (server.mode = "async") through the whole engine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from conftest import final_x, quadratic_config, rounds, same_results
from fedsim.algorithms.base import REGISTRY
from fedsim.algorithms.fedavg import FedAvg
from fedsim.cli import main
from fedsim.config import dump_toml
from fedsim.traces import Trace

TARGETS = [[1.0, 0.0], [0.0, 1.0], [2.0, 2.0], [-1.0, 3.0]]


def always(n: int, horizon: float = 1e6) -> Trace:
    return Trace.from_intervals(np.arange(n), np.zeros(n), np.full(n, horizon), n_devices=n,
                                horizon=horizon)


@contextmanager
def finishes_within(seconds: int):
    """Fail (instead of hanging the suite) when a run loops forever."""

    def hung(signum, frame):
        raise TimeoutError(f"the run was still going after {seconds} s of host time")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def manifest(run_dir) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())


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


@pytest.mark.parametrize("algorithm", ["scaffold", "feddyn"])
def test_async_per_device_objectives_with_everyone_in_every_buffer_are_their_synchronous_runs(
        cli_run, monkeypatch, algorithm):
    """The trainers' per-device terms on the asynchronous path: with everyone in every buffer
    (all fresh), each aggregation is the synchronous round. Device i takes i + 1 local steps,
    so that the corrections move the model away from FedAvg's."""
    for name in (algorithm, "fedavg"):
        cls = type(f"Uneven{name}", (REGISTRY[name],), {"name": f"uneven-{name}",
                                                        "local_steps": lambda self, rnd, ids: ids + 1})
        monkeypatch.setitem(REGISTRY, cls.name, cls)
    sync = quadratic_config(TARGETS, lr=0.1, steps=3, rounds=20, algorithm=f"uneven-{algorithm}")
    x_sync = final_x(cli_run(sync, always(4), name="sync"))
    config = async_config(20, concurrency=4, buffer=4)
    config["algorithm"]["name"] = f"uneven-{algorithm}"
    run_dir = cli_run(config, always(4), name="async")
    np.testing.assert_allclose(final_x(run_dir), x_sync, atol=1e-6)
    assert (rounds(run_dir)["staleness"] == 0).all()
    config["algorithm"]["name"] = "uneven-fedavg"
    fedavg = final_x(cli_run(config, always(4), name="fedavg"))
    assert np.abs(fedavg - x_sync).max() > 1e-3  # (the terms made a difference)


def two_speeds_config(tmp_path) -> dict:
    """Devices 0, 1 take 3 s per task, devices 2, 3 take 9 s: the slow ones arrive stale."""
    from fedsim.traces.io import write_device_table

    write_device_table({"device_id": [0, 1, 2, 3], "seconds_per_sample": [1.0, 1.0, 3.0, 3.0],
                        "bandwidth_bps": [1e12] * 4}, tmp_path / "devices.parquet")
    config = async_config(12, concurrency=4, buffer=2)
    config["devices"] = {"model": "table", "latency_s": 0.0}
    config["trace"] = {"devices_table": str(tmp_path / "devices.parquet")}
    return config


def test_async_buffers_and_staleness(cli_run, tmp_path):
    config = two_speeds_config(tmp_path)
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


def replay_fedbuff(events: pl.DataFrame, x0: np.ndarray, lr: float, steps: int, discount) -> np.ndarray:
    """The aggregates computed by hand from the recorded arrivals: device i arriving in
    aggregation r with staleness τ started from the model before aggregation r − τ, and its
    exact quadratic update is (1 − (1 − lr)^steps)(u_i − x_start)."""
    U, shrink = np.asarray(TARGETS), 1.0 - (1.0 - lr) ** steps
    history = [np.asarray(x0, dtype=np.float64)]  # history[r]: the model before aggregation r
    arrived = events.filter(pl.col("outcome") == "arrived")
    for r in range(arrived["round"].max() + 1):
        rows = arrived.filter(pl.col("round") == r)
        tau, ids = rows["staleness"].to_numpy(), rows["device_id"].to_numpy()
        deltas = shrink * (U[ids] - np.stack([history[r - t] for t in tau]))
        history.append(history[r] + (discount(tau)[:, None] * deltas).sum(0) / len(rows))
    return history[-1]


def test_fedbuff_discounts_stale_updates_by_one_over_sqrt_one_plus_staleness(cli_run, tmp_path):
    config = two_speeds_config(tmp_path)
    config["model"] = {"init": [0.5, -0.5]}
    got, events = {}, {}
    for name in ("fedbuff", "fedavg"):
        config["algorithm"] = {"name": name}
        run_dir = cli_run(config, always(4), name=name)
        got[name], events[name] = final_x(run_dir), pl.read_parquet(run_dir / "events.parquet")
    assert set(events["fedbuff"].filter(pl.col("outcome") == "arrived")["staleness"]) >= {0, 1, 2, 3}
    expected = replay_fedbuff(events["fedbuff"], [0.5, -0.5], 0.1, 3, lambda tau: 1.0 / np.sqrt(1.0 + tau))
    np.testing.assert_allclose(got["fedbuff"], expected, rtol=1e-5)
    # the same arrivals undiscounted are FedAvg's, and differ: the discount is what was checked
    np.testing.assert_allclose(got["fedavg"], replay_fedbuff(events["fedavg"], [0.5, -0.5], 0.1, 3, np.ones_like),
                               rtol=1e-5)
    assert np.abs(got["fedbuff"] - got["fedavg"]).max() > 1e-3


def replay_fedasync(events: pl.DataFrame, x0, lr: float, steps: int, alpha: float, s, rho=0.0) -> np.ndarray:
    """FedAsync by hand from the recorded arrivals, one per aggregation: device i arriving in
    aggregation r with staleness τ returns x_i = x_start + Δ_i, x_start the model before
    aggregation r − τ; the server mixes it in, x ← (1 − a) x + a x_i, a = alpha·s(τ). With the
    proximal term its local loss is ½‖w − u_i‖² + ρ/2‖w − x_start‖², minimised at
    (u_i + ρ x_start)/(1 + ρ), which exact steps approach by the factor 1 − lr(1 + ρ) each."""
    U, shrink = np.asarray(TARGETS), (1.0 - (1.0 - lr * (1 + rho)) ** steps) / (1 + rho)
    history = [np.asarray(x0, dtype=np.float64)]
    arrived = events.filter(pl.col("outcome") == "arrived").sort("round")
    assert arrived["round"].to_list() == list(range(len(arrived)))  # one arrival per aggregation
    for r, (i, tau) in enumerate(zip(arrived["device_id"], arrived["staleness"])):
        start = history[r - tau]
        returned = start + shrink * (U[i] - start)
        a = alpha * s(tau)
        history.append((1 - a) * history[r] + a * returned)
    return history[-1]


FEDASYNC_CASES = {  # staleness function and its keys -> s(τ) by hand
    "constant": ({"staleness": "constant"}, lambda tau: 1.0),
    "polynomial": ({"poly_a": 0.5}, lambda tau: (1.0 + tau) ** -0.5),
    "hinge": ({"staleness": "hinge", "hinge_a": 2.0, "hinge_b": 1.0},
              lambda tau: 1.0 if tau <= 1 else 1.0 / (2.0 * (tau - 1) + 1.0)),
    "polynomial-prox": ({"poly_a": 1.5, "rho": 0.5}, lambda tau: (1.0 + tau) ** -1.5),
}


def fedasync_config(tmp_path, options: dict) -> dict:
    config = two_speeds_config(tmp_path)
    config["server"]["buffer"] = 1
    config["run"]["rounds"] = 30
    config["model"] = {"init": [0.5, -0.5]}
    config["algorithm"] = {"name": "fedasync", "mixing": 0.7, **options}
    return config


@pytest.mark.parametrize("function", sorted(FEDASYNC_CASES))
def test_fedasync_mixes_each_returned_model_in_by_its_staleness(cli_run, tmp_path, function):
    options, s = FEDASYNC_CASES[function]
    run_dir = cli_run(fedasync_config(tmp_path, options), always(4), name=function)
    events = pl.read_parquet(run_dir / "events.parquet")
    arrived = events.filter(pl.col("outcome") == "arrived").sort("round")
    assert arrived["staleness"].min() == 0 and arrived["staleness"].max() >= 3  # stale, past the hinge's b = 1
    expected = replay_fedasync(events, [0.5, -0.5], 0.1, 3, 0.7, s, options.get("rho", 0.0))
    np.testing.assert_allclose(final_x(run_dir), expected, rtol=1e-5)
    # the recorded mixing weight of each aggregation is mixing·s(staleness) of its arrival
    expected = [0.7 * s(tau) for tau in arrived["staleness"]]
    np.testing.assert_allclose(rounds(run_dir)["mixing"].to_numpy(), expected, rtol=1e-12)
    # one arrival an aggregation is FedAsync's design, not a participation to warn about
    assert not any("fewer than 2 arrivals" in w for w in manifest(run_dir)["warnings"])


def test_fedasync_replayed_by_hand_holds_across_a_resume(cli_run, tmp_path):
    """Stopped with tasks in flight (their start models kept in the checkpoint), resumed: the
    same run as the uninterrupted one, and the same hand replay."""
    options, s = FEDASYNC_CASES["hinge"]
    config = fedasync_config(tmp_path, options)
    whole = cli_run(config, always(4), name="whole")
    config["run"]["rounds"] = 11
    run_dir = cli_run(config, always(4), name="resumed")
    server = torch.load(run_dir / "checkpoint.pt", weights_only=False)["server"]
    kept = [d for d in server["dispatches"] if not d["reported"].all() and d["result"] >= 0]
    assert kept and all(d["start"] is not None for d in kept)  # trained, still running: start kept
    assert main(["run", "--resume", str(run_dir), "--set", "run.rounds=30", "--quiet"]) == 0
    same_results(run_dir, whole)
    events = pl.read_parquet(run_dir / "events.parquet")
    np.testing.assert_allclose(final_x(run_dir), replay_fedasync(events, [0.5, -0.5], 0.1, 3, 0.7, s), rtol=1e-5)


def test_buffer_larger_than_the_devices_fills_with_repeats(cli_run):
    # 3 devices ever online, buffer 4: once all 3 ran on a version and nobody is training,
    # they run again
    trace = Trace.from_intervals([0, 1, 2], [0.0] * 3, [1e4] * 3, n_devices=4, horizon=1e4)
    config = async_config(6, concurrency=3, buffer=4)
    with finishes_within(60):
        run_dir = cli_run(config, trace)
    df = rounds(run_dir)
    assert len(df) == 6 and (df["arrived"] == 4).all()
    # v0: 3 arrive at 3 s, the repeats of 3 s fill the buffer at 6 s; the two leftover repeats
    # open the next buffers (staleness 1), and the pattern restarts every 3 aggregations
    np.testing.assert_allclose(df["t_end"].to_numpy(), [6, 9, 12, 18, 21, 24], atol=1e-6)
    np.testing.assert_allclose(df["staleness"].to_numpy(), [0, 0.5, 0.25, 0, 0.5, 0.25])


def test_devices_that_always_drop_stop_at_max_time(cli_run):
    # online [0, 1) of every 10 s (looping), a task takes 3 s: every task drops, nothing arrives
    trace = Trace.from_intervals([0, 1, 2, 3], [0.0] * 4, [1.0] * 4, n_devices=4, horizon=10.0,
                                 wrap="loop")
    config = async_config(5, concurrency=4, buffer=2)
    config["run"]["max_time"] = 50.0
    with finishes_within(60):
        run_dir = cli_run(config, trace)
    info = manifest(run_dir)
    assert info["status"] == "completed" and info["rounds"] == 0
    # invited again in every online window (0, 10, .., 40) until the last drop at 41 s
    assert info["sim_time_s"] == pytest.approx(41.0)
    assert info["reason"].startswith("max_time 50 s reached") and "0 of 2 updates" in info["reason"]


class Shy(FedAvg):
    """Invites nobody the first `refusals` times it is asked (test-only algorithm)."""

    name = "test-shy"
    refusals = 3
    state = ("params", "left")  # (checkpointed: a resumed run goes on refusing as many times)

    def init_state(self, params):
        super().init_state(params)
        self.left = self.refusals

    def select(self, rnd, online, rng):
        if self.left:
            self.left -= 1
            return np.empty(0, dtype=np.int64)
        return super().select(rnd, online, rng)


class Mute(Shy):
    name = "test-mute"
    refusals = 10**9


def test_empty_selection_waits_round_duration(cli_run, monkeypatch):
    monkeypatch.setitem(REGISTRY, Shy.name, Shy)
    config = async_config(3, concurrency=4, buffer=4)
    config["server"]["round_duration"] = 10.0
    config["algorithm"] = {"name": Shy.name}
    with finishes_within(60):
        run_dir = cli_run(config, always(4))
    # three empty selections at 0, 10, 20 s; invited at 30 s, tasks of 3 s
    np.testing.assert_allclose(rounds(run_dir)["t_end"].to_numpy(), [33, 36, 39], atol=1e-6)


def test_selection_always_empty_stops_at_max_time(cli_run, monkeypatch):
    monkeypatch.setitem(REGISTRY, Mute.name, Mute)
    config = async_config(3, concurrency=4, buffer=4)
    config["server"]["round_duration"] = 30.0
    config["run"]["max_time"] = 100.0
    config["algorithm"] = {"name": Mute.name}
    with finishes_within(60):
        run_dir = cli_run(config, always(4))
    info = manifest(run_dir)
    assert info["rounds"] == 0 and info["sim_time_s"] == pytest.approx(100.0)
    assert info["reason"].startswith("max_time 100 s reached") and "0 of 4 updates" in info["reason"]


def test_drop_after_the_deadline_counts_as_late(cli_run, tmp_path):
    from fedsim.traces.io import write_device_table

    # device 0: 0.3 s tasks, always online. Device 1: 3 s tasks, online only [0, 1.1)
    write_device_table({"device_id": [0, 1, 2, 3], "seconds_per_sample": [0.1, 1.0, 1.0, 1.0],
                        "bandwidth_bps": [1e12] * 4}, tmp_path / "devices.parquet")
    config = async_config(8, concurrency=2, buffer=1)
    config["server"]["deadline"] = 1.0
    config["devices"] = {"model": "table", "latency_s": 0.0}
    config["trace"] = {"devices_table": str(tmp_path / "devices.parquet")}
    trace = Trace.from_intervals([0, 1], [0.0, 0.0], [1e6, 1.1], n_devices=4, horizon=1e6)
    run_dir = cli_run(config, trace)
    df = rounds(run_dir)
    # aggregations end every 0.3 s. Device 1's first task (from 0 s) goes offline at 1.1 s, after
    # its deadline (1 s): it was late before it dropped, reported at 1.0 s. Invited again at
    # 1.0 s, it goes offline at 1.1 s, before that task's deadline: dropped.
    assert df["late"].to_list() == [0, 0, 0, 1, 0, 0, 0, 0]
    assert df["dropped"].to_list() == [0, 0, 0, 1, 0, 0, 0, 0]
    assert (df["arrived"] == 1).all()
    devices = pl.read_parquet(run_dir / "devices.parquet").row(1, named=True)
    assert (devices["invitations"], devices["late"], devices["drops"]) == (2, 1, 1)


@pytest.mark.parametrize("algorithm, options", [
    ("sequential-sgd", {}), ("fedavg-wait", {}), ("mifa", {"warmup": True}),
])
def test_async_refuses_algorithms_that_cannot_run_there(cli_run, algorithm, options):
    config = async_config(2, concurrency=2, buffer=2)
    config["algorithm"] = {"name": algorithm, **options}
    cli_run(config, always(4), expect=2)
    err = cli_run.last_output.err.strip()
    assert err.startswith("error: ") and "\n" not in err
    assert f"'{algorithm}'" in err and "mode = 'async'" in err and "mode = 'sync'" in err


def test_async_refuses_them_in_a_comparison_too(cli_run):
    config = async_config(2, concurrency=2, buffer=2)
    config["run"]["algorithms"] = ["fedavg", "fedavg-wait"]
    cli_run(config, always(4), expect=2)
    assert "'fedavg-wait'" in cli_run.last_output.err
    config["run"]["algorithms"] = ["fedavg", "mifa"]  # mifa without warm-up runs asynchronously
    assert (cli_run(config, always(4), name="ok") / "mifa" / "rounds.parquet").exists()


def flaky_config(rounds_: int) -> dict:
    """Devices of lognormal speeds on a Markov trace, more training than the buffer takes: tasks
    drop, run late, arrive stale, and every aggregation leaves tasks in flight."""
    config = async_config(rounds_, concurrency=3, buffer=2)
    config["algorithm"] = {"name": "fedbuff"}
    config["server"]["deadline"] = 4.0
    config["devices"] = {"model": "lognormal", "seconds_per_sample": 1.0, "compute_sigma": 0.6,
                         "latency_s": 0.0, "bandwidth_bps": 1e12}
    config["trace"] = {"source": "markov", "mean_on": 12.0, "mean_off": 6.0, "days": 1.0}
    config["run"].update(eval_every=4, checkpoint_every=3)
    return config


def in_step_config(rounds_: int) -> dict:
    """Four devices of one speed, three updates a buffer: every task of a wave ends at the same
    instant, so an aggregation leaves a report that arrived and was not read yet."""
    return async_config(rounds_, concurrency=4, buffer=3)


def in_flight(run_dir) -> dict:
    """What the checkpoint of `run_dir` holds of the async server: tasks still running, reports
    not read, updates buffered (an aggregation cut by max_time)."""
    server = torch.load(run_dir / "checkpoint.pt", weights_only=False)["server"]
    return {"running": sum(int((~d["reported"]).sum()) for d in server["dispatches"]),
            "unread": len(server["reports"]), "buffered": len(server["buffer"])}


@pytest.mark.parametrize("make, stop, resume, held", [
    (flaky_config, ["--set", "run.rounds=7"], [], {"running": 2}),
    (flaky_config, ["--set", "run.max_time=21.0"], ["--set", "run.max_time=0"], {"buffered": 1, "running": 2}),
    (in_step_config, ["--set", "run.rounds=5"], [], {"unread": 1}),
], ids=["rounds", "max-time-mid-aggregation", "reports-unread"])
def test_an_async_run_stopped_with_tasks_in_flight_resumes_to_the_uninterrupted_run(cli_run, make, stop, resume, held):
    whole = cli_run(make(24), always(4) if make is in_step_config else None, name="whole")
    stopped = cli_run(make(24), always(4) if make is in_step_config else None, name="stopped", extra=stop)
    assert manifest(stopped)["rounds"] < 24
    assert {key: in_flight(stopped)[key] for key in held} == held
    assert main(["run", "--resume", str(stopped), "--set", "run.rounds=24", *resume, "--quiet"]) == 0
    same_results(stopped, whole)


def test_an_async_run_killed_after_a_periodic_checkpoint_resumes_to_the_uninterrupted_run(cli_run, tmp_path):
    """kill -9 right after the checkpoint of aggregation 6 (checkpoint_every = 3), then resumed
    in two steps."""
    whole = cli_run(flaky_config(24), name="whole")
    config = flaky_config(24)
    config["run"].update(out=str(tmp_path / "runs"), name="killed", progress=False, plots=False)
    (tmp_path / "killed.toml").write_text(dump_toml(config))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1]), "FEDSIM_TEST_KILL_AT": "after:checkpoint.pt:3"}
    proc = subprocess.run([sys.executable, "-m", "fedsim", "run", "killed.toml", "--quiet"], cwd=tmp_path,
                          env=env, capture_output=True, timeout=300)
    assert proc.returncode == -9, proc.stderr
    run_dir = tmp_path / "runs" / "killed"
    assert torch.load(run_dir / "checkpoint.pt", weights_only=False)["round"] == 6
    assert in_flight(run_dir)["running"] > 0
    assert main(["run", "--resume", str(run_dir), "--set", "run.rounds=13", "--quiet"]) == 0
    assert main(["run", "--resume", str(run_dir), "--set", "run.rounds=24", "--quiet"]) == 0
    same_results(run_dir, whole)


def test_fedbuffs_update_replayed_by_hand_holds_across_a_resume(cli_run, tmp_path):
    config = two_speeds_config(tmp_path)
    config["model"] = {"init": [0.5, -0.5]}
    config["algorithm"] = {"name": "fedbuff"}
    whole = cli_run(config, always(4), name="whole")
    config["run"]["rounds"] = 5
    run_dir = cli_run(config, always(4), name="resumed")
    assert in_flight(run_dir)["running"] > 0
    assert main(["run", "--resume", str(run_dir), "--set", "run.rounds=12", "--quiet"]) == 0
    events = pl.read_parquet(run_dir / "events.parquet")
    assert set(events.filter(pl.col("outcome") == "arrived")["staleness"]) >= {0, 1, 2, 3}
    expected = replay_fedbuff(events, [0.5, -0.5], 0.1, 3, lambda tau: 1.0 / np.sqrt(1.0 + tau))
    np.testing.assert_allclose(final_x(run_dir), expected, rtol=1e-5)
    same_results(run_dir, whole)


def test_a_retry_that_max_time_cut_short_goes_on_where_it_would_have(cli_run, monkeypatch):
    """Shy invites nobody at 0, 10 and 20 s; a stop at 15 s is in the middle of a retry's wait."""
    monkeypatch.setitem(REGISTRY, Shy.name, Shy)
    config = async_config(3, concurrency=4, buffer=4)
    config["server"]["round_duration"] = 10.0
    config["algorithm"] = {"name": Shy.name}
    whole = cli_run(config, always(4), name="whole")
    config["run"]["max_time"] = 15.0
    stopped = cli_run(config, always(4), name="stopped")
    assert (manifest(stopped)["rounds"], manifest(stopped)["sim_time_s"]) == (0, 15.0)
    assert main(["run", "--resume", str(stopped), "--set", "run.max_time=0", "--quiet"]) == 0
    np.testing.assert_allclose(rounds(stopped)["t_end"].to_numpy(), [33, 36, 39], atol=1e-6)
    same_results(stopped, whole)


def test_a_restarted_task_ends_at_the_very_instant_it_would_have_ended():
    """now + (at - now) can miss `at`: from 2^-57, a delay of 0.0625 + 2^-56 - 2^-57 rounds (a
    tie, to even) to 0.0625, and so does the sum; `timeout_at` lands on `at` itself."""
    from fedsim.sim.engine import new_environment

    now, at = 2.0**-57, 0.0625 + 2.0**-56
    landed = {}
    for way in ("timeout", "timeout_at"):
        env = new_environment(now)
        env.run(until=env.timeout(at - now) if way == "timeout" else env.timeout_at(at))
        landed[way] = env.now
    assert landed == {"timeout": 0.0625, "timeout_at": at}
