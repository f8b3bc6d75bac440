"""Every built-in algorithm and selection policy inside a lockstep study equals its `fedsim run`
alone (issue 40, part 3), bit for bit on the CPU: the same devices invited and arrived every round,
the same losses and the same model. (Training rules 3 put every device's parameters on a 64-byte
boundary in a call, so that MKL computes a device's products alike at any row of a shared call.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import polars as pl
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from conftest import rounds  # noqa: E402

from fedsim.cli import main  # noqa: E402
from fedsim.config import dump_toml  # noqa: E402
from fedsim.config.catalog import BUILT_IN_ALGORITHMS  # noqa: E402

SYNC_ALGORITHMS = [name for name in BUILT_IN_ALGORITHMS if name != "fedasync"]  # (async only: trains alone)


def study(folder: Path, base: dict, axes: dict) -> Path:
    raw = {**base, "run": {**base["run"], "name": "s", "out": str(folder / "runs")}, "sweep": axes}
    path = folder / "s.toml"
    path.write_text(dump_toml(raw))
    return path


def assert_points_equal_their_runs_alone(path: Path, tmp_path: Path) -> int:
    assert main(["sweep", str(path), "--quiet"]) == 0
    points = sorted(p for p in (tmp_path / "runs" / "s").iterdir() if (p / "manifest.json").exists())
    for point in points:
        alone = tmp_path / "alone" / point.name
        config = (point / "config.toml").read_text().replace(f'out = "{point.parent}"', f'out = "{alone.parent}"')
        (tmp_path / "alone.toml").write_text(config)
        assert main(["run", str(tmp_path / "alone.toml"), "--quiet"]) == 0
        assert rounds(point).drop("wall_s").equals(rounds(alone).drop("wall_s")), point.name
        for name in ("events.parquet", "devices.parquet"):
            assert pl.read_parquet(point / name).equals(pl.read_parquet(alone / name)), f"{point.name}: {name}"
        a, b = torch.load(point / "model.pt"), torch.load(alone / "model.pt")
        assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a), point.name
    return len(points)


def test_every_synchronous_algorithm_in_a_lockstep_study_equals_its_run_alone(tmp_path):
    base = {"run": {"rounds": 6, "eval_every": 3, "progress": False, "plots": False},
            "data": {"dataset": "digits", "clients": 12}, "model": {"name": "logreg"},
            "trace": {"source": "bernoulli", "p": 0.6},
            "server": {"clients_per_round": 4, "timing": "ideal"},
            "client": {"local_steps": 2, "batch_size": 8, "lr": 0.2}}
    assert assert_points_equal_their_runs_alone(study(tmp_path, base, {"algorithm.name": SYNC_ALGORITHMS}),
                                                tmp_path) == len(SYNC_ALGORITHMS)


def test_availability_aware_selection_and_partial_work_in_a_lockstep_study_equal_their_runs_alone(tmp_path):
    """Model timing: Oort learns reported durations, power-of-choice asks its candidates first,
    devices do the work that fits the deadline; beside FedNova and SCAFFOLD, which read the
    steps the devices managed. The runs end at max_time, where the round it cuts short is undone
    (what the selection learned in it too)."""
    base = {"run": {"rounds": 100, "max_time": 45.0, "eval_every": 3, "progress": False, "plots": False},
            "data": {"dataset": "digits", "clients": 16}, "model": {"name": "logreg"},
            "trace": {"source": "markov", "mean_on": 120.0, "mean_off": 30.0, "days": 1.0},
            "server": {"clients_per_round": 4, "deadline": 12.0},
            "devices": {"model": "lognormal", "seconds_per_sample": 0.1, "compute_sigma": 1.0},
            "client": {"local_steps": 6, "batch_size": 8, "lr": 0.2, "work": "fit-deadline"}}
    axes = {"algorithm.name": ["fedavg", "fednova", "scaffold"],
            "algorithm.selection": ["uniform", "oort", "power-of-choice"]}
    assert assert_points_equal_their_runs_alone(study(tmp_path, base, axes), tmp_path) == 9
    events = pl.read_parquet(tmp_path / "runs" / "s" / "algorithm-fednova_selection-power-of-choice" / "events.parquet")
    trained = events.filter(pl.col("outcome") == "arrived")["steps"]
    assert 1 <= trained.min() < trained.max() <= 6  # partial work: the slow devices did fewer steps
    assert (events["outcome"] == "answered").sum() > 0  # power-of-choice's question, in the log
    reasons = [json.loads(p.read_text())["reason"] for p in (tmp_path / "runs" / "s").glob("*/manifest.json")]
    assert sum("before the round in progress closed (it is not counted)" in r for r in reasons) >= 5, reasons


@pytest.mark.parametrize("name", ["fedasync"])
def test_the_asynchronous_algorithm_in_a_study_equals_its_run_alone(tmp_path, name):
    base = {"run": {"rounds": 8, "eval_every": 4, "progress": False, "plots": False},
            "data": {"dataset": "digits", "clients": 12}, "model": {"name": "logreg"},
            "trace": {"source": "markov", "mean_on": 120.0, "mean_off": 30.0, "days": 1.0},
            "server": {"mode": "async", "buffer": 1, "concurrency": 4, "deadline": 30.0},
            "devices": {"model": "lognormal", "seconds_per_sample": 0.1},
            "client": {"local_steps": 2, "batch_size": 8, "lr": 0.2}}
    assert assert_points_equal_their_runs_alone(study(tmp_path, base, {"algorithm.name": [name, "fedbuff"]}),
                                                tmp_path) == 2


def test_a_recorded_trace_with_flash_round_rules_in_a_lockstep_study_equals_its_runs_alone(tmp_path):
    """A diurnal trace generated to Parquet and replayed from the file (`source = "file"`), under
    FLASH's round rules (a drawn deadline, a minimum of devices online, a quorum) and overcommit:
    the algorithms with device tables and per-device terms step together and equal their runs alone."""
    trace = tmp_path / "diurnal.parquet"
    assert main(["trace", "generate", "diurnal", "--devices", "20", "--days", "2", "--seed", "3",
                 "--out", str(trace)]) == 0
    base = {"run": {"rounds": 8, "eval_every": 4, "progress": False, "plots": False},
            "data": {"dataset": "digits", "clients": 20}, "model": {"name": "mlp", "hidden": 16},
            "trace": {"source": "file", "path": str(trace), "offset": 36000.0},  # from 10 am: 4 online, then fewer
            "server": {"clients_per_round": 5, "overcommit": 0.4, "deadline": 300.0, "deadline_sigma": 60.0,
                       "min_selected": 6, "update_frac": 0.4},
            "devices": {"model": "lognormal", "seconds_per_sample": 1.0, "compute_sigma": 0.8},
            "client": {"local_steps": 3, "batch_size": 8, "lr": 0.2}}
    axes = {"algorithm.name": ["fedavg", "mifa", "fedvarp", "scaffold"], "run.seed": [0, 1]}
    assert assert_points_equal_their_runs_alone(study(tmp_path, base, axes), tmp_path) == 8
    shown = rounds(tmp_path / "runs" / "s" / "algorithm-mifa_seed-1")
    assert shown["wait_s"].max() > 3600  # the first round waited hours for min_selected devices online
    assert set(shown["close_reason"]) & {"quota", "deadline", "quorum"}
