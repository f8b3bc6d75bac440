"""Device time from the model's cost and sourced device classes ([devices], docs/timing.md),
checked through the whole engine: events.parquet against devices.parquet and closed forms."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from conftest import quadratic_config
from fedsim.config import config_from_dict
from fedsim.errors import FedsimError
from fedsim.sim import profiles
from fedsim.sim.timing import DeviceTiming
from fedsim.traces import Trace
from fedsim.traces.io import write_device_table

FMNIST = Path("/usr/share/datasets/fashion-mnist")


def image_config(model: str, *, dataset: str = "digits", rounds: int = 3, **sections) -> dict:
    config = {
        "run": {"rounds": rounds, "eval_every": rounds, "seed": 3},
        "data": {"dataset": dataset, "clients": 20},
        "model": {"name": model},
        "trace": {"source": "always"},
        "server": {"clients_per_round": 8},
        "client": {"local_steps": 2, "batch_size": 16},
    }
    for section, body in sections.items():
        config.setdefault(section, {}).update(body)
    return config


def frames(run_dir: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    return pl.read_parquet(run_dir / "devices.parquet"), pl.read_parquet(run_dir / "events.parquet")


def train_flops(model: str, dataset: str) -> float:
    import torch

    from fedsim.training import build_task

    cfg = config_from_dict({"data": {"dataset": dataset, "clients": 2}, "model": {"name": model}})
    return build_task(cfg.data, cfg.model, seed=0, device=torch.device("cpu")).train_flops_per_sample()


def test_compute_follows_the_models_cost_under_the_default_profiles(cli_run):
    small = cli_run(image_config("logreg"), name="logreg")
    large = cli_run(image_config("mlp"), name="mlp")
    (dev_s, ev_s), (dev_l, ev_l) = frames(small), frames(large)
    assert dev_s["class"].to_list() == dev_l["class"].to_list()  # one seed, one fleet
    np.testing.assert_allclose(dev_s["flops"], dev_l["flops"])
    # compute seconds per sample = training FLOPs per sample / the device's FLOP/s
    np.testing.assert_allclose(dev_s["seconds_per_sample"], train_flops("logreg", "digits") / dev_s["flops"])
    ratio = dev_l["seconds_per_sample"] / dev_s["seconds_per_sample"]
    np.testing.assert_allclose(ratio, train_flops("mlp", "digits") / train_flops("logreg", "digits"))
    # every task's compute is its samples at its device's speed (2 steps x 16)
    for dev, ev in ((dev_s, ev_s), (dev_l, ev_l)):
        joined = ev.join(dev.select("device_id", "seconds_per_sample"), on="device_id")
        assert (joined["samples"] == 32).all()
        np.testing.assert_allclose(joined["compute_s"], 32 * joined["seconds_per_sample"])


@pytest.mark.skipif(not FMNIST.exists(), reason="Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)")
def test_lenet5_and_logreg_differ_by_their_multiply_add_ratio(cli_run):
    runs = {m: cli_run(image_config(m, dataset="fashion-mnist", rounds=1), name=m) for m in ("lenet5", "logreg")}
    per_sample = {m: frames(d)[1].select((pl.col("compute_s") / pl.col("samples")).median()).item()
                  for m, d in runs.items()}
    # LeNet-5 on 28x28: 416,520 multiply-adds a sample forward; logistic regression: 7,840
    assert per_sample["lenet5"] / per_sample["logreg"] == pytest.approx(416_520 / 7_840, rel=1e-9)


def test_transfers_move_the_model_over_asymmetric_links(cli_run):
    run_dir = cli_run(image_config("mlp"))
    devices, events = frames(run_dir)
    model_bytes = 4 * json.loads((run_dir / "manifest.json").read_text())["model_dim"]
    joined = events.join(devices, on="device_id")
    np.testing.assert_allclose(joined["download_s"],
                               joined["latency_s"] + 8 * model_bytes / joined["downlink_bps"])
    np.testing.assert_allclose(joined["upload_s"], joined["latency_s"] + 8 * model_bytes / joined["uplink_bps"])
    assert (devices["uplink_bps"] < devices["downlink_bps"]).all()  # every class uploads slower


def test_a_strategy_that_sends_other_bytes_moves_them(cli_run, tmp_path, monkeypatch):
    (tmp_path / "compressing.py").write_text(
        "from fedsim.algorithms.fedavg import FedAvg\n"
        "class Compressing(FedAvg):\n"
        "    name = 'compressing'\n"
        "    def message_bytes(self):\n"
        "        return 4 * self.params.numel(), self.params.numel() // 4  # 16x smaller uploads\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    run_dir = cli_run(image_config("mlp", algorithm={"name": "compressing:Compressing"}))
    devices, events = frames(run_dir)
    dim = json.loads((run_dir / "manifest.json").read_text())["model_dim"]
    joined = events.join(devices, on="device_id")
    np.testing.assert_allclose(joined["upload_s"], joined["latency_s"] + 8 * (dim // 4) / joined["uplink_bps"])
    np.testing.assert_allclose(joined["download_s"], joined["latency_s"] + 8 * 4 * dim / joined["downlink_bps"])


def test_scaffold_moves_its_control_variate_with_the_model_each_way(cli_run):
    """SCAFFOLD's task carries the model and c down, the update and c_i's change up: 8 d bytes
    each way; FedDyn's h_i stays on the device: the model each way."""
    for name, factor in (("scaffold", 2), ("feddyn", 1)):
        run_dir = cli_run(image_config("mlp", algorithm={"name": name}), name=name)
        devices, events = frames(run_dir)
        size = factor * 4 * json.loads((run_dir / "manifest.json").read_text())["model_dim"]
        joined = events.join(devices, on="device_id")
        np.testing.assert_allclose(joined["download_s"], joined["latency_s"] + 8 * size / joined["downlink_bps"])
        np.testing.assert_allclose(joined["upload_s"], joined["latency_s"] + 8 * size / joined["uplink_bps"])


def test_profiles_draw_each_class_around_its_medians_in_its_share():
    n = 40_000
    names = list(profiles.NAMES)
    which = profiles.draw_classes(names, [], n, seed=1)
    shares = np.bincount(which, minlength=len(names)) / n
    np.testing.assert_allclose(shares, [c.share for c in profiles.CLASSES], atol=0.01)
    which = profiles.draw_classes(names, [1.0] * len(names), n, seed=1)  # every class, tablets too
    speeds = profiles.draw_speeds(names, which, seed=1)
    for k, c in enumerate(profiles.CLASSES):
        mine = which == k
        for column, median, sigma in (("flops", c.flops, c.flops_sigma), ("downlink_bps", c.downlink_bps, c.link_sigma),
                                      ("uplink_bps", c.uplink_bps, c.link_sigma),
                                      ("latency_s", c.latency_s, c.latency_sigma)):
            logs = np.log(speeds[column][mine])
            assert np.median(logs) == pytest.approx(np.log(median), abs=4 * sigma / np.sqrt(mine.sum()) * 1.3)
            assert logs.std() == pytest.approx(sigma, rel=0.05)
    # a device's links are one network: its uplink is its downlink times the class's ratio
    ratio = np.array([c.uplink_bps / c.downlink_bps for c in profiles.CLASSES])[which]
    np.testing.assert_allclose(speeds["uplink_bps"] / speeds["downlink_bps"], ratio)


def test_the_class_mix_and_the_seed_decide_the_fleet():
    cfg = config_from_dict({"devices": {"classes": ["phone-low", "tablet"], "class_weights": [3, 1]}})
    timing = DeviceTiming.build(cfg.devices, 8000, 5, train_flops=1e6)
    assert set(timing.labels["class"]) == {"phone-low", "tablet"}
    assert np.mean(timing.labels["class"] == "phone-low") == pytest.approx(0.75, abs=0.02)
    again = DeviceTiming.build(cfg.devices, 8000, 5, train_flops=1e6)
    other = DeviceTiming.build(cfg.devices, 8000, 6, train_flops=1e6)
    np.testing.assert_array_equal(timing.seconds_per_sample, again.seconds_per_sample)
    assert not np.array_equal(timing.seconds_per_sample, other.seconds_per_sample)


def test_lognormal_and_constant_keep_the_numbers_of_earlier_versions():
    cfg = config_from_dict({"devices": {"model": "lognormal", "seconds_per_sample": 0.1, "latency_s": 0.2}})
    timing = DeviceTiming.build(cfg.devices, 50, 7, train_flops=123.0)
    rng = np.random.default_rng([7, 0x71AE])  # the draws of fedsim before device classes
    np.testing.assert_array_equal(timing.seconds_per_sample, 0.1 * rng.lognormal(0.0, 0.5, 50))
    bandwidth = 1e6 * rng.lognormal(0.0, 0.5, 50)
    np.testing.assert_array_equal(timing.downlink_bps, bandwidth)
    np.testing.assert_array_equal(timing.uplink_bps, bandwidth)
    ids = np.arange(50)
    np.testing.assert_allclose(timing.download_s(ids, 1000), 0.2 + 8000 / bandwidth)
    constant = DeviceTiming.build(config_from_dict({"devices": {"model": "constant"}}).devices, 3, 0,
                                  train_flops=123.0)
    np.testing.assert_array_equal(constant.seconds_per_sample, [0.002] * 3)
    assert "class" not in constant.columns() and "flops" not in constant.columns()


def test_halfnormal_is_the_fastest_time_plus_a_half_normal_tail():
    cfg = config_from_dict({"devices": {"model": "halfnormal", "seconds_per_sample": 0.1, "compute_sigma": 2.0}})
    sps = DeviceTiming.build(cfg.devices, 20000, 3, train_flops=1.0).seconds_per_sample
    tail = (sps / 0.1 - 1.0) / 2.0  # |z|: mean sqrt(2/pi), median 0.674 (the half-normal's)
    assert tail.min() >= 0 and tail.min() < 1e-3
    assert tail.mean() == pytest.approx(np.sqrt(2 / np.pi), abs=0.01)
    assert np.median(tail) == pytest.approx(0.6745, abs=0.015)
    again = DeviceTiming.build(cfg.devices, 20000, 3, train_flops=1.0).seconds_per_sample
    np.testing.assert_array_equal(sps, again)


def test_the_per_step_overhead_adds_to_every_task(cli_run):
    trace = Trace.from_intervals([0, 1], [0.0, 0.0], [1e6, 1e6], n_devices=2, horizon=1e6)
    config = quadratic_config([[1.0, 0.0], [0.0, 1.0]], steps=4, rounds=2,
                              server={"timing": "model", "deadline": 100.0},
                              devices={"model": "constant", "seconds_per_sample": 0.5, "step_overhead_s": 0.25,
                                       "latency_s": 0.0, "bandwidth_bps": 1e12})
    _, events = frames(cli_run(config, trace))
    # 4 steps on the device's one sample each (full batch): 4 x 0.5 s + 4 x 0.25 s
    np.testing.assert_allclose(events["compute_s"], 3.0)


def test_a_device_table_gives_classes_and_speeds_for_the_trace_devices_the_run_replays(cli_run):
    n_trace = 6
    trace = Trace.from_intervals(np.arange(n_trace), np.zeros(n_trace), np.full(n_trace, 1e6),
                                 n_devices=n_trace, horizon=1e6)
    table = {"device_id": np.arange(n_trace), "class": ["phone-low", "phone-mid", "phone-high", "tablet",
                                                         "phone-low", "phone-mid"],
             "flops": [1e9, 2e9, 3e9, 4e9, 5e9, 6e9], "tz_offset": [-5.0, 1.0, 8.0, 9.0, 0.0, -3.0]}
    write_device_table(table, cli_run.tmp / "devices.parquet")
    targets = [[float(i), 0.0] for i in range(3)]
    config = quadratic_config(targets, rounds=2, server={"timing": "model", "deadline": 100.0},
                              trace={"select": "random", "devices_table": str(cli_run.tmp / "devices.parquet")})
    devices, _ = frames(cli_run(config, trace))
    rows = devices["trace_device"].to_numpy()
    assert len(rows) == 3 and len(set(rows)) == 3
    assert devices["class"].to_list() == [table["class"][r] for r in rows]
    np.testing.assert_array_equal(devices["flops"], np.asarray(table["flops"])[rows])
    np.testing.assert_array_equal(devices["tz_offset"], np.asarray(table["tz_offset"])[rows])
    # what the table does not give (links, latency) is drawn for the table's class
    assert devices["downlink_bps"].null_count() == 0 and (devices["downlink_bps"] > 0).all()


def test_a_device_table_class_outside_the_built_in_ones_needs_its_speeds():
    cfg = config_from_dict({}).devices
    table = {"device_id": np.arange(2), "class": np.array(["phone-mid", "watch"], dtype=object)}
    with pytest.raises(FedsimError, match=r"^t.parquet: class 'watch' of device 1 is not a built-in class"):
        DeviceTiming.build(cfg, 2, 0, train_flops=1.0, table=table, where="t.parquet")
    table |= {"flops": np.array([1e9, 2e8]), "downlink_bps": np.array([1e7, 1e6]),
              "uplink_bps": np.array([1e6, 1e5]), "latency_s": np.array([0.05, 0.5])}
    timing = DeviceTiming.build(cfg, 2, 0, train_flops=1e6, table=table, where="t.parquet")
    np.testing.assert_allclose(timing.seconds_per_sample, [1e-3, 5e-3])
    assert timing.labels["class"].tolist() == ["phone-mid", "watch"]


@pytest.mark.parametrize("columns, says", [
    ({"flops": [1e9], "seconds_per_sample": [0.1]}, "gives both flops and seconds_per_sample; keep flops"),
    ({"bandwidth_bps": [1e6], "uplink_bps": [1e6]}, "gives both bandwidth_bps and uplink_bps"),
])
def test_two_columns_that_say_one_thing_are_refused(columns, says):
    table = {"device_id": np.arange(1), **{k: np.asarray(v) for k, v in columns.items()}}
    with pytest.raises(FedsimError, match=f"^t.parquet: {says}"):
        DeviceTiming.build(config_from_dict({}).devices, 1, 0, train_flops=1.0, table=table, where="t.parquet")


@pytest.mark.parametrize("devices, says", [
    ({"seconds_per_sample": 0.1}, "[devices] seconds_per_sample applies to model = 'constant', 'lognormal' "
                                  "or 'halfnormal', not 'profiles'; remove it or set [devices] model; to keep the numbers of a "
                                  "config written before 'profiles' became the default, set [devices] model = "
                                  "\"lognormal\" (docs/timing.md)"),
    ({"model": "lognormal", "classes": ["phone-low"]}, "[devices] classes applies to model = 'profiles', not "
                                                        "'lognormal'; remove it or set [devices] model (docs/timing.md)"),
    ({"classes": ["phone-mdi"]}, "[devices] classes = 'phone-mdi' is not a device class; did you mean 'phone-mid'? "
                                 "(one of: phone-low, phone-mid, phone-high, tablet)"),
    ({"class_weights": [1.0, 2.0]}, "[devices] class_weights has 2 shares for 4 classes (phone-low, phone-mid, "
                                    "phone-high, tablet); give one share per class"),
    ({"class_weights": [1.0, -1.0, 1.0, 1.0]}, "[devices] class_weights = [1.0, -1.0, 1.0, 1.0] must be shares "
                                               ">= 0 with a positive sum, one per class"),
    ({"classes": ["phone-low", "phone-low"]}, "[devices] classes lists 'phone-low' more than once; name each class once"),
])
def test_bad_devices_keys_are_one_line(devices, says):
    with pytest.raises(FedsimError) as err:
        config_from_dict({"devices": devices}, origin="c.toml")
    assert str(err.value) == f"c.toml: {says}"


def always_online(n: int) -> Trace:
    """(a short loop: the runs below cover most of it, so no short-clock warning)"""
    return Trace.from_intervals(np.arange(n), np.zeros(n), np.full(n, 100.0), n_devices=n, horizon=100.0,
                                wrap="loop")


def test_devices_too_slow_for_the_deadline_are_named_by_a_warning(cli_run):
    n = 10
    table = {"device_id": np.arange(n), "seconds_per_sample": [1.0] * 3 + [100.0] * 7,
             "bandwidth_bps": [1e12] * n, "latency_s": [0.0] * n}
    write_device_table(table, cli_run.tmp / "devices.parquet")
    config = quadratic_config([[float(i), 0.0] for i in range(n)], rounds=5,
                              server={"timing": "model", "deadline": 10.0},
                              trace={"devices_table": str(cli_run.tmp / "devices.parquet")},
                              devices={"model": "table"})
    run_dir = cli_run(config, always_online(n))
    warning = ("never arrived: 7 of 10 devices invited at least 5 times never arrived (35 late, 0 dropped, 0 surplus); "
               "mostly late: too slow for the deadline (their median task takes 1.67 min, the deadline is "
               "10 s); raise [server] deadline or see [devices] in docs/timing.md")
    assert json.loads((run_dir / "manifest.json").read_text())["warnings"] == [warning]
    assert f"warning: fedavg: {warning}" in cli_run.last_output.out
    # four invitations each: not yet a pattern
    config["run"]["rounds"] = 4
    assert json.loads((cli_run(config, always_online(n), name="short") / "manifest.json").read_text())["warnings"] == []


def test_devices_left_over_by_overcommitted_rounds_are_named_as_surplus(cli_run):
    """All 10 invited (K = 3, overcommit 2.4), no deadline to miss: the 3 fast devices are the
    K kept each round, the 7 slow ones surplus every time (not late, nor a question's wait)."""
    n = 10
    table = {"device_id": np.arange(n), "seconds_per_sample": [1.0] * 3 + [100.0] * 7,
             "bandwidth_bps": [1e12] * n, "latency_s": [0.0] * n}
    write_device_table(table, cli_run.tmp / "devices.parquet")
    config = quadratic_config([[float(i), 0.0] for i in range(n)], rounds=5,
                              server={"timing": "model", "deadline": 1e6, "clients_per_round": 3, "overcommit": 2.4},
                              trace={"devices_table": str(cli_run.tmp / "devices.parquet")},
                              devices={"model": "table"})
    warnings = json.loads((cli_run(config, always_online(n)) / "manifest.json").read_text())["warnings"]
    assert warnings == ["never arrived: 7 of 10 devices invited at least 5 times never arrived (0 late, 0 dropped, "
                        "35 surplus); mostly surplus: over-committed rounds ([server] overcommit) kept the first "
                        "arrivals, and these devices finished after them each time (the slow tail of the cohort); "
                        "lower overcommit if the slow devices should count"]


def test_devices_that_go_offline_before_finishing_are_named_by_a_warning(cli_run):
    # 3 devices always online; 7 online 2 s out of every 10 s; every task takes 5 s
    n, period = 10, 10.0
    starts = np.arange(0, 1000, period)
    ids = np.concatenate([np.arange(3), np.repeat(np.arange(3, n), len(starts))])
    start = np.concatenate([np.zeros(3), np.tile(starts, 7)])
    end = np.concatenate([np.full(3, 1000.0), np.tile(starts + 2.0, 7)])
    trace = Trace.from_intervals(ids, start, end, n_devices=n, horizon=1000.0, wrap="loop")
    config = quadratic_config([[float(i), 0.0] for i in range(n)], rounds=60,
                              server={"timing": "model", "deadline": 10.0},
                              devices={"model": "constant", "seconds_per_sample": 0.5, "latency_s": 0.0,
                                       "bandwidth_bps": 1e12, "step_overhead_s": 0.0})
    config["client"]["local_steps"] = 10
    warnings = json.loads((cli_run(config, trace) / "manifest.json").read_text())["warnings"]
    # rounds of 5 s from t = 0: the seven are online at the start of every other one
    assert warnings == ["never arrived: 7 of 10 devices invited at least 5 times never arrived (0 late, 210 "
                        "dropped, 0 surplus); mostly dropped: offline before finishing (availability: their online "
                        "sessions are shorter than their tasks)"]


def test_the_quickstart_scenario_gives_no_warning(tmp_path, capsys):
    from fedsim.cli import main

    code = main(["run", "quickstart", "--quiet", "--set", "run.algorithms=[]", "--set", f"run.out='{tmp_path}'",
                 "--set", "run.plots=false"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "warning" not in out.out + out.err
    manifest = json.loads((tmp_path / "quickstart" / "manifest.json").read_text())
    assert manifest["warnings"] == [] and manifest["rounds"] == 300


def test_participation_is_judged_against_the_devices_the_rounds_could_reach():
    """200 devices, 10 rounds of 2 invitations: at most 20 can ever arrive; 15 arriving is no
    degenerate participation, 1 is (of the 20 reachable); with every online device invited
    (0), all 200 count."""
    from types import SimpleNamespace

    from fedsim.results.warnings import participation_warnings

    def run(ever: int):
        return SimpleNamespace(rows=[{"arrived": 2}] * 10,
                               counters={"arrivals": np.r_[np.ones(ever, dtype=np.int64), np.zeros(200 - ever, dtype=np.int64)]})

    assert participation_warnings(run(15), per_round=2) == []
    assert participation_warnings(run(1), per_round=2) == [
        "degenerate participation: only 1 of 200 devices (0.5%) ever arrived (its 10 rounds of 2 could reach 20 of "
        "them)"]
    assert participation_warnings(run(15), per_round=0) == [
        "degenerate participation: only 15 of 200 devices (7.5%) ever arrived"]
