"""`[client] work = "fit-deadline"` and FedNova through the whole engine (config -> `fedsim run`
-> Parquet), against the closed forms of docs/algorithms.md ("FedNova"): the quadratic task
f_i(x) = ½‖x − u_i‖² with exact gradients (batch_size = 0), devices of known speeds from a
device table. A task is 1 s download + τ x seconds_per_sample + 1 s upload (the model's 64 bits
over 64 bit/s), so with deadline D device i fits τ_i = min(K, max(1, ⌊(D − 2) / sps_i⌋)) steps.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import final_x, quadratic_config, rounds, same_results  # noqa: E402
from test_server_rules import always  # noqa: E402

from fedsim.algorithms import REGISTRY  # noqa: E402
from fedsim.algorithms.fedavg import FedAvg  # noqa: E402
from fedsim.algorithms.fednova import FedNova  # noqa: E402
from fedsim.cli import main  # noqa: E402
from fedsim.sim.partial_work import steps_that_fit  # noqa: E402
from fedsim.traces.io import write_device_table  # noqa: E402

U = np.array([[4.0, -1.0], [-2.0, 3.0], [1.0, 2.0], [0.0, -4.0]])
SPS = np.array([0.5, 1.0, 2.0, 8.0])  # dyadic: the task times are exact
DEADLINE, FULL = 10.0, 12
TAU = np.array([12, 8, 4, 1])  # ⌊8 / sps⌋ = 16, 8, 4, 1 capped at 12: device 3 fits only its minimum


def fixed_point(tau: np.ndarray, lr: float, normalised: bool) -> np.ndarray:
    """Σ w_i u_i / Σ w_i, w_i = p_i (1 − (1 − η)^τ_i) (FedAvg) or that over τ_i (FedNova)."""
    w = (1 - (1 - lr) ** tau) / len(tau)
    w = w / tau if normalised else w
    return (w[:, None] * U).sum(0) / w.sum()


def speeds_config(cli_run, algorithm: str, *, lr: float = 0.1, rounds_: int = 60, work: str = "fit-deadline",
                  **server) -> dict:
    n = len(SPS)
    write_device_table({"device_id": np.arange(n), "seconds_per_sample": SPS, "bandwidth_bps": np.full(n, 64.0),
                        "latency_s": np.zeros(n)}, cli_run.tmp / "speeds.parquet")
    config = quadratic_config(U.tolist(), lr=lr, steps=FULL, rounds=rounds_, algorithm=algorithm,
                              server={"timing": "model", "deadline": DEADLINE, **server},
                              devices={"model": "table"},
                              trace={"devices_table": str(cli_run.tmp / "speeds.parquet")})
    config["client"]["work"] = work
    return config


def test_steps_that_fit_is_the_largest_count_that_ends_by_the_deadline():
    per_step = np.array([0.5, 1.0, 3.0, 100.0, 0.1])
    full = np.array([12, 12, 12, 12, 7])
    steps = steps_that_fit(lambda s: 2.0 + s * per_step, full, 10.0)
    np.testing.assert_array_equal(steps, [12, 8, 2, 1, 7])  # capped, fitted, fitted, the minimum, capped


@pytest.mark.parametrize("algorithm,normalised", [("fedavg", False), ("fednova", True)])
def test_fit_deadline_steps_and_the_fixed_point_of_fedavg_and_fednova(cli_run, algorithm, normalised):
    """Every device arrives by the deadline with the steps that fit it (events.parquet's steps
    column, the Strategy's arrivals.steps), and the model goes to the closed-form fixed point."""
    run_dir = cli_run(speeds_config(cli_run, algorithm), always(len(SPS)), name=algorithm)
    ev = pl.read_parquet(run_dir / "events.parquet")
    np.testing.assert_array_equal(ev["steps"], TAU[ev["device_id"]])
    assert set(ev["outcome"]) == {"arrived"}
    np.testing.assert_allclose(ev["compute_s"], TAU[ev["device_id"]] * SPS[ev["device_id"]])
    np.testing.assert_allclose(rounds(run_dir)["duration"], DEADLINE)  # the slowest fitted task ends at it
    x = final_x(run_dir)
    np.testing.assert_allclose(x, fixed_point(TAU, 0.1, normalised), atol=1e-6)
    other = fixed_point(TAU, 0.1, not normalised)
    assert np.abs(x - other).max() > 0.1  # the two fixed points are apart: the test tells them apart


CHOSEN = np.array([1, 3, 6, 15])  # τ_i of our choosing, each device's every round


class ChosenSteps:
    """A device's local steps fixed per device (what unequal data sizes under local_epochs give)."""

    def local_steps(self, rnd, ids):
        return CHOSEN[ids]


@pytest.mark.parametrize("base,normalised", [(FedAvg, False), (FedNova, True)])
def test_the_fixed_points_for_steps_of_our_choosing_under_ideal_timing(cli_run, monkeypatch, base, normalised):
    cls = type(f"Chosen{base.__name__}", (ChosenSteps, base), {"name": f"chosen-{base.name}"})
    monkeypatch.setitem(REGISTRY, cls.name, cls)
    config = quadratic_config(U.tolist(), lr=0.1, steps=FULL, rounds=80, algorithm=cls.name)
    run_dir = cli_run(config, always(len(U)), name=cls.name)
    assert set(pl.read_parquet(run_dir / "events.parquet")["steps"]) == set(CHOSEN)
    np.testing.assert_allclose(final_x(run_dir), fixed_point(CHOSEN, 0.1, normalised), atol=1e-6)


def test_fednova_tends_to_the_mean_of_the_targets_as_the_learning_rate_falls(cli_run):
    """w_i / τ_i → η p_i as η → 0: FedNova's fixed point → Σ p_i u_i (a tenth as far from it at
    η = 0.01 as at 0.1); FedAvg's goes to the τ-weighted Σ τ_i u_i / Σ τ_i instead."""
    lr, far = 0.01, np.abs(fixed_point(TAU, 0.1, True) - U.mean(0)).max()
    nova = final_x(cli_run(speeds_config(cli_run, "fednova", lr=lr, rounds_=300), always(len(SPS)), name="nova"))
    avg = final_x(cli_run(speeds_config(cli_run, "fedavg", lr=lr, rounds_=300), always(len(SPS)), name="avg"))
    np.testing.assert_allclose(nova, fixed_point(TAU, lr, True), atol=1e-6)
    np.testing.assert_allclose(avg, fixed_point(TAU, lr, False), atol=1e-6)
    assert np.abs(nova - U.mean(0)).max() < 0.13 * far
    assert np.abs(avg - (TAU[:, None] * U).sum(0) / TAU.sum()).max() < 0.03


def test_fednova_with_equal_steps_is_fedavg(cli_run):
    """Full work: every τ_i = K, FedNova's weights are FedAvg's mean (the same float32 model)."""
    runs = {a: final_x(cli_run(speeds_config(cli_run, a, work="full", deadline=1e6, rounds_=20), always(len(SPS)),
                               name=a)) for a in ("fedavg", "fednova")}
    np.testing.assert_allclose(runs["fednova"], runs["fedavg"], atol=1e-6)
    np.testing.assert_allclose(runs["fedavg"], U.mean(0), atol=1e-5)


def test_full_work_trains_every_step_and_misses_the_deadline(cli_run):
    """The default: devices 1, 2 and 3 (12 steps at 1, 2 and 8 s a step, 14 s and more) are late,
    device 0 (0.5 s a step: 8 s) arrives; every invitation asks for all 12 steps."""
    run_dir = cli_run(speeds_config(cli_run, "fedavg", work="full", rounds_=3), always(len(SPS)))
    ev = pl.read_parquet(run_dir / "events.parquet")
    np.testing.assert_array_equal(ev["steps"], np.full(len(ev), FULL))
    late = ev.filter(pl.col("outcome") == "late")["device_id"].unique().sort().to_list()
    assert late == [1, 2, 3] and set(ev.filter(pl.col("device_id") == 0)["outcome"]) == {"arrived"}


def test_fit_deadline_in_async_mode_fits_each_task_to_its_invitation_plus_the_deadline(cli_run):
    config = speeds_config(cli_run, "fedbuff", mode="async", buffer=2, concurrency=4, rounds_=6)
    run_dir = cli_run(config, always(len(SPS)))
    ev = pl.read_parquet(run_dir / "events.parquet")
    np.testing.assert_array_equal(ev["steps"], TAU[ev["device_id"]])
    assert set(ev["outcome"]) <= {"arrived"}


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_fednova_run_of_fitted_steps_resumes_to_the_uninterrupted_run(cli_run, mode):
    """Lognormal speeds and an on/off trace: fitted steps vary, some devices drop; a run stopped
    after 5 rounds (aggregations) and resumed ends as the whole run (the checkpoint's shape is
    that of full work: the steps are the timing's, drawn again)."""
    config = quadratic_config(U.tolist(), lr=0.1, steps=FULL, rounds=12, algorithm="fednova",
                              server={"timing": "model", "deadline": 10.0, "mode": mode, "buffer": 2,
                                      "concurrency": 3},
                              devices={"model": "lognormal", "seconds_per_sample": 1.0, "compute_sigma": 1.0,
                                       "latency_s": 0.0, "bandwidth_bps": 1e12},
                              trace={"source": "markov", "mean_on": 30.0, "mean_off": 10.0, "days": 1.0})
    config["client"]["work"] = "fit-deadline"
    config["run"].update(eval_every=3)
    whole = cli_run(config, name="whole")
    steps = pl.read_parquet(whole / "events.parquet")["steps"]
    assert steps.n_unique() > 2 and steps.max() <= FULL and steps.min() >= 1
    stopped = cli_run(config, name="stopped", extra=["--set", "run.rounds=5"])
    assert main(["run", "--resume", str(stopped), "--set", "run.rounds=12", "--quiet"]) == 0
    same_results(stopped, whole)


def test_a_device_too_slow_for_one_step_is_named_with_its_one_step_task(cli_run):
    """Under fit-deadline a late device attempted one step: the warning times that task (1.67
    min at 100 s a step), not the full work of 5 steps."""
    n = 10
    table = {"device_id": np.arange(n), "seconds_per_sample": [1.0] * 3 + [100.0] * 7,
             "bandwidth_bps": [1e12] * n, "latency_s": [0.0] * n}
    write_device_table(table, cli_run.tmp / "devices.parquet")
    config = quadratic_config([[float(i), 0.0] for i in range(n)], steps=5, rounds=5,
                              server={"timing": "model", "deadline": 10.0},
                              trace={"devices_table": str(cli_run.tmp / "devices.parquet")},
                              devices={"model": "table"})
    config["client"]["work"] = "fit-deadline"
    run_dir = cli_run(config, always(n, horizon=100.0))
    warnings = json.loads((run_dir / "manifest.json").read_text())["warnings"]
    assert warnings == ["never arrived: 7 of 10 devices invited at least 5 times never arrived (35 late, 0 dropped, 0 surplus); "
                        "mostly late: too slow for the deadline (their median task takes 1.67 min, the deadline is "
                        "10 s); raise [server] deadline or see [devices] in docs/timing.md"]
    ev = pl.read_parquet(run_dir / "events.parquet")
    assert set(ev.filter(pl.col("device_id") >= 3)["steps"]) == {1} and set(ev.filter(pl.col("device_id") < 3)["steps"]) == {5}


def test_part_of_its_epochs_trains_alike_in_the_batched_and_the_loop_trainer(cli_run):
    """local_epochs = 2 of 16-sample minibatches (5 a pass over 67-68 samples: 10 steps); the
    slow devices fit fewer, a part of an epoch, whose samples are its minibatches'."""
    config = {"run": {"rounds": 4, "eval_every": 2}, "data": {"dataset": "digits", "clients": 20},
              "model": {"name": "logreg"}, "trace": {"source": "always"},
              "server": {"timing": "model", "deadline": 3.0},
              "devices": {"model": "lognormal", "seconds_per_sample": 0.01, "compute_sigma": 1.0},
              "client": {"local_epochs": 2, "batch_size": 16, "work": "fit-deadline"}}
    runs = {}
    for trainer in ("batched", "loop"):
        config["client"]["trainer"] = trainer
        runs[trainer] = cli_run(config, name=trainer)
    ev = pl.read_parquet(runs["batched"] / "events.parquet").filter(pl.col("outcome") == "arrived")
    assert ev["steps"].max() == 10 and ev["steps"].min() < 5
    partial = ev.filter(pl.col("steps") < 5)
    assert (partial["samples"] == 16 * partial["steps"]).all()
    assert ev.equals(pl.read_parquet(runs["loop"] / "events.parquet").filter(pl.col("outcome") == "arrived"))
    losses = [rounds(runs[t])["test_loss"].drop_nulls().to_numpy() for t in ("batched", "loop")]
    np.testing.assert_allclose(*losses, rtol=1e-6)
