"""Trackers: TensorBoard's event reader and MLflow's client read back exactly the values of
rounds.parquet, through a run, a resumed run and a study."""

from __future__ import annotations

import json
import os

import numpy as np
import polars as pl
import pytest

from conftest import quadratic_config
from fedsim.cli import main

pytest.importorskip("tensorboard")
mlflow = pytest.importorskip("mlflow")

TARGETS = [[1.0, 0.0], [0.0, 1.0], [2.0, 1.0]]


def tracked(rounds: int = 6, trackers=("tensorboard", "mlflow")) -> dict:
    config = quadratic_config(TARGETS, rounds=rounds)
    config["run"].update(trackers=list(trackers), eval_every=2)
    return config


def tensorboard_values(run_dir, tag: str) -> dict[int, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    return {e.step: e.value for e in events.Scalars(tag)}


def as_float32(values: dict) -> dict:
    """TensorBoard keeps float32 scalars: the parquet values rounded so."""
    return {k: float(np.float32(v)) for k, v in values.items()}


def mlflow_values(run_dir, metric: str) -> list[tuple[int, float]]:
    from mlflow.tracking import MlflowClient

    kept = json.loads((run_dir / "mlflow.json").read_text())
    history = MlflowClient(kept["tracking_uri"]).get_metric_history(kept["run_id"], metric)
    return sorted((m.step, m.value) for m in history)


@pytest.fixture(autouse=True)
def no_outside_store(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def test_both_trackers_read_back_exactly_the_rounds(cli_run):
    run_dir = cli_run(tracked())
    rounds = pl.read_parquet(run_dir / "rounds.parquet")
    for column in ("train_loss", "t_end", "arrived", "duration"):
        expected = dict(zip(rounds["round"].to_list(), rounds[column].cast(pl.Float64).to_list()))
        assert tensorboard_values(run_dir, column) == as_float32(expected)
        assert mlflow_values(run_dir, column) == sorted(expected.items())
    evaluated = rounds.drop_nulls("test_loss")
    assert tensorboard_values(run_dir, "test_loss") == as_float32(dict(zip(evaluated["round"], evaluated["test_loss"])))
    from mlflow.tracking import MlflowClient

    kept = json.loads((run_dir / "mlflow.json").read_text())
    run = MlflowClient(kept["tracking_uri"]).get_run(kept["run_id"])
    assert run.data.params["client.lr"] == "0.1" and run.info.status == "FINISHED"
    artifacts = {a.path for a in MlflowClient(kept["tracking_uri"]).list_artifacts(kept["run_id"])}
    assert {"rounds.parquet", "model.pt", "manifest.json", "config.toml"} <= artifacts


def test_a_resumed_run_continues_both_without_a_step_twice(cli_run):
    run_dir = cli_run(tracked(rounds=3))
    first = json.loads((run_dir / "mlflow.json").read_text())["run_id"]
    assert main(["run", "--resume", str(run_dir), "--set", "run.rounds=6", "--quiet"]) == 0
    assert json.loads((run_dir / "mlflow.json").read_text())["run_id"] == first
    rounds = pl.read_parquet(run_dir / "rounds.parquet")
    expected = dict(zip(rounds["round"].to_list(), rounds["train_loss"].to_list()))
    assert tensorboard_values(run_dir, "train_loss") == as_float32(expected)
    steps = [step for step, _ in mlflow_values(run_dir, "train_loss")]
    assert steps == sorted(set(steps)) == list(range(6))


def test_a_missing_tracker_library_is_one_line(cli_run, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)  # as if not installed
    cli_run(tracked(trackers=["mlflow"]), expect=2)
    assert cli_run.last_output.err == ("error: [run] trackers lists 'mlflow', which needs MLflow: pip install "
                                       "'fedsim[mlflow]' (or remove it from [run] trackers)\n")


def test_an_unknown_tracker_is_one_line(cli_run):
    config = tracked()
    config["run"]["trackers"] = ["wandb"]
    cli_run(config, expect=2)
    assert "[run] trackers = 'wandb' is not a tracker (one of: tensorboard, mlflow)" in cli_run.last_output.err


def test_a_study_is_one_experiment_with_a_run_per_point_under_a_parent(tmp_path, capsys):
    from mlflow.tracking import MlflowClient

    from fedsim.config import dump_toml

    study = tracked(rounds=2, trackers=["mlflow"])
    study["run"].update(name="st", out=str(tmp_path / "runs"), progress=False, plots=False)
    study["sweep"] = {"run.seed": [0, 1]}
    (tmp_path / "st.toml").write_text(dump_toml(study))
    assert main(["sweep", str(tmp_path / "st.toml"), "--quiet"]) == 0
    client = MlflowClient((tmp_path / "runs" / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("st")
    runs = client.search_runs([experiment.experiment_id])
    parent = next(r for r in runs if r.info.run_name == "st")
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(r.info.run_name for r in children) == ["seed-0", "seed-1"]
    assert "MLFLOW_TRACKING_URI" not in os.environ
