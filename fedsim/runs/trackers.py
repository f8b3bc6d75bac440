"""Experiment trackers as callbacks (`[run] trackers`): every round's row of rounds.parquet to
TensorBoard (RUN/tensorboard/) and/or MLflow, step = round.

The libraries are optional extras (`pip install 'fedsim[tensorboard]'`, `'fedsim[mlflow]'`),
imported only when a run asks for them. A resumed run continues the same TensorBoard log
(steps from the checkpoint on replace those written after it) and the same MLflow run (its id
is kept in RUN/mlflow.json). The points of a study are runs of one MLflow experiment, nested
under a parent run of the study (`FEDSIM_MLFLOW_PARENT`, set by `fedsim sweep`).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from fedsim.runs.callbacks import Callback
from fedsim.errors import FedsimError

PARENT = "FEDSIM_MLFLOW_PARENT"  # "experiment_id:run_id" of a study's parent run
SKIPPED = ("round",)  # the step itself


def tracker_callbacks(names: list[str]) -> list[Callback]:
    return [{"tensorboard": TensorBoardTracker, "mlflow": MlflowTracker}[name]() for name in names]


def _numbers(row: dict) -> dict[str, float]:
    """The row's numeric columns (booleans and text left out; None is not logged)."""
    return {k: float(v) for k, v in row.items()
            if k not in SKIPPED and isinstance(v, (int, float)) and not isinstance(v, bool) and v is not None}


def _missing(extra: str, library: str) -> FedsimError:
    return FedsimError(f"[run] trackers lists {extra!r}, which needs {library}: pip install 'fedsim[{extra}]' "
                       f"(or remove it from [run] trackers)")


class _RowTracker(Callback):
    """Logs each round's row once it is recorded, and at the end what the end added to the
    last row (the evaluation of a run stopped between two)."""

    def on_start(self, run, metrics):
        self.last: dict = {}
        self.open(run)
        return {}

    def on_round(self, run, outcome, metrics):
        row = run.recorder.rows[-1]
        self.log(row["round"], _numbers(row))
        self.last = dict(row)
        return False, {}

    def on_end(self, run, result, metrics):
        if run.recorder.rows:
            row = run.recorder.rows[-1]
            added = {k: v for k, v in _numbers(row).items() if self.last.get(k) is None and row.get(k) is not None}
            if added and self.last.get("round") == row["round"]:
                self.log(row["round"], added)
        return {}

    def open(self, run) -> None:
        raise NotImplementedError

    def log(self, step: int, values: dict[str, float]) -> None:
        raise NotImplementedError


class TensorBoardTracker(_RowTracker):
    """Scalars under RUN/tensorboard/, one tag per column (train_loss, test_acc, arrived, ...),
    as float32 scalars: TensorBoard's data server (what `tensorboard --logdir` shows by default)
    drops double-precision ones."""

    def open(self, run) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise _missing("tensorboard", "TensorBoard") from None
        # a resumed run starts over from its checkpoint: steps logged after it are purged
        self.writer = SummaryWriter(str(run.run_dir / "tensorboard"),
                                    purge_step=run.start_round if run.resumed else None)

    def log(self, step, values):
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def on_end(self, run, result, metrics):
        super().on_end(run, result, metrics)
        self.writer.close()
        return {}


class MlflowTracker(_RowTracker):
    """An MLflow run: the resolved config as params, every column as a metric with step =
    round, the run directory's files as artifacts at the end."""

    def open(self, run) -> None:
        try:
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise _missing("mlflow", "MLflow") from None
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:  # a local store beside the runs; MLflow keeps its file store for this opt-in
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            uri = (Path(run.config.run.out).resolve() / "mlruns").as_uri()
        self.client = MlflowClient(tracking_uri=uri)
        self.run_dir = run.run_dir
        kept = run.run_dir / "mlflow.json"
        if run.resumed and kept.exists():
            self.run_id = json.loads(kept.read_text())["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
            return
        parent = os.environ.get(PARENT, "")
        experiment_id, parent_id = parent.split(":") if parent else (self.experiment(run.config.run.name), None)
        tags = {"mlflow.parentRunId": parent_id} if parent_id else {}
        self.run_id = self.client.create_run(experiment_id, run_name=run.run_dir.name, tags=tags).info.run_id
        kept.write_text(json.dumps({"run_id": self.run_id, "tracking_uri": uri}))
        params = {f"{section}.{key}": str(value)[:500] for section, body in run.config.to_dict().items()
                  for key, value in body.items()}
        self.log_params(params)

    def experiment(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        return found.experiment_id if found else self.client.create_experiment(name)

    def log_params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = list(params.items())
        for lo in range(0, len(items), 100):  # MLflow takes at most 100 params a batch
            self.client.log_batch(self.run_id, params=[Param(k, v) for k, v in items[lo:lo + 100]])

    def log(self, step, values):
        from mlflow.entities import Metric

        now = 0  # timestamps are the host's; fedsim's time is the `t_end` metric
        metrics = [Metric(k, v, now, step) for k, v in values.items() if math.isfinite(v)]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def on_saved(self, run, result):
        for name in ("config.toml", "manifest.json", "rounds.parquet", "devices.parquet", "events.parquet",
                     "model.pt"):
            if (run.run_dir / name).is_file():
                self.client.log_artifact(self.run_id, str(run.run_dir / name))
        status = {"completed": "FINISHED", "interrupted": "KILLED"}.get(result.status, "FAILED")
        self.client.set_terminated(self.run_id, status=status)


def study_parent(study_name: str, out: Path):
    """A parent MLflow run for a study's points (in-process and local Ray workers inherit it
    through the environment); returns a function that ends it."""
    try:
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise _missing("mlflow", "MLflow") from None
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        uri = (Path(out).resolve() / "mlruns").as_uri()
    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(study_name)
    experiment_id = found.experiment_id if found else client.create_experiment(study_name)
    parent = client.create_run(experiment_id, run_name=study_name).info.run_id
    before = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ.update({PARENT: f"{experiment_id}:{parent}", "MLFLOW_TRACKING_URI": uri})  # the points' store

    def end(status: str = "FINISHED") -> None:
        os.environ.pop(PARENT, None)
        if before is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        client.set_terminated(parent, status=status)
    return end
