"""Experiment trackers as callbacks (`[run] trackers`): every round's row of rounds.parquet to
TensorBoard (RUN/tensorboard/) and/or MLflow, step = round.

A tracker never breaks a run. Before anything is written, `check_trackers` makes sure each
one can log (its library is installed, MLflow's store opens or its server answers), else one
`error:` line. Once the run goes, a tracker that fails (disk full, server gone) says so in one
warning line (with --quiet too: an output not written is no progress chatter) and stops
logging; the run goes on, its own files stay the source of truth, and its manifest lists the
output under `incomplete_outputs` until a resume has logged every round to it again.

The libraries are optional extras (`pip install 'fedsim-avail[tensorboard]'`, `'fedsim-avail[mlflow]'`),
imported only when a run asks for them. A tracker holds what rounds.parquet holds: a resumed run
continues the same TensorBoard log (steps from the last recorded round on replace those written
after it; the log is flushed before each checkpoint, so nothing before it is lost to a kill) and
the same MLflow run (its id is kept in RUN/mlflow.json), logging only the rounds it lacks; the
evaluation a stop signal adds to the last round is left out, since a resume takes it back. Where
that log or run is gone, a new one gets the rounds so far first. The points of a study are runs of
one MLflow experiment, nested under one parent run of the study (its id kept in STUDY/mlflow.json,
so that a resumed study goes on with it), whose status says how the study's last sweep ended.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import socket
import sys
import time
from importlib.util import find_spec
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import getproxies, proxy_bypass

from tqdm import tqdm

from fedsim.errors import FedsimError, Stopped
from fedsim.results.recorder import write_json
from fedsim.runs.callbacks import Callback

PARENT = "FEDSIM_MLFLOW_PARENT"  # "experiment_id:run_id" of a study's parent run
SKIPPED = ("round",)  # the step itself
DATABASES = ("sqlite", "postgresql", "mysql", "mssql")  # MLflow's SQLAlchemy stores
SCHEMES = ("file", "http", "https", "databricks", "databricks-uc", "uc", *DATABASES)
# MLflow retries a failed request 7 times over about 4 minutes by default: a run asks less
# (the user's own MLFLOW_HTTP_REQUEST_* settings win), the check before it asks once
RUN_HTTP = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}
CHECK_HTTP = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
FIX = "or remove 'mlflow' from [run] trackers"


def tracker_callbacks(names: list[str]) -> list[Callback]:
    return [{"tensorboard": TensorBoardTracker, "mlflow": MlflowTracker}[name]() for name in names]


def check_trackers(config, kept: Path | None = None) -> None:
    """FedsimError (one line) for a tracker of `[run] trackers` that cannot log (`kept`: the
    mlflow.json of the run or study, which names the store it logs to)."""
    for name in config.run.trackers:
        if name == "tensorboard":
            _tensorboard_records()
        else:
            check_mlflow_store(tracking_uri(config.run.out, kept))


def _missing(extra: str, library: str) -> FedsimError:
    return FedsimError(f"[run] trackers lists {extra!r}, which needs {library}: pip install 'fedsim-avail[{extra}]' "
                       f"(or remove it from [run] trackers)")


def _reason(err: BaseException) -> str:
    """An exception in a line: its type and the first line of its message (but SQLAlchemy's note
    that a query flushed the session, which it puts before the database's own error)."""
    lines = str(err).strip().splitlines()
    if len(lines) > 1 and lines[0].startswith("(raised as a result of Query-invoked autoflush"):
        lines = lines[1:]
    text = f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def stopped_logging(entry: dict) -> str:
    """What a warning says of an entry of the manifest's `incomplete_outputs`."""
    label = {"tensorboard": "TensorBoard", "mlflow": "MLflow"}.get(entry.get("output"), entry.get("output"))
    return (f"{label} stopped logging to {entry.get('path')} ({entry.get('cause')}); the run goes on, its own files "
            "(rounds.parquet) are complete, and manifest.json lists the output as incomplete")


def warn(text: str) -> None:
    tqdm.write(f"warning: {text}", file=sys.stderr)  # (above a progress bar, if one is drawn)


@contextlib.contextmanager
def _environment(values: dict[str, str], override: bool):
    """`values` in os.environ for the block (where unset, unless `override`), then as before."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update({k: v for k, v in values.items() if override or before[k] is None})
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def _mlflow_calls(values: dict[str, str], override: bool):
    """Within: MLflow's calls, `values` in the environment (`_environment`) and MLflow's own log
    lines held back (its INFO lines as it makes a new database's tables, its ERROR tracebacks of a
    store that fails, dozens of lines a point): fedsim says what matters in one line."""
    logger = logging.getLogger("mlflow")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        with _environment(values, override):
            yield
    finally:
        logger.setLevel(level)


def _numbers(row: dict) -> dict[str, float]:
    """The row's numeric columns (booleans and text left out; None is not logged)."""
    return {k: float(v) for k, v in row.items()
            if k not in SKIPPED and isinstance(v, (int, float)) and not isinstance(v, bool) and v is not None}


class _RowTracker(Callback):
    """Logs each round's row once it is recorded (flushed before a checkpoint is written), and
    at the end what the end added to the last row (the evaluation of a run stopped between
    two, unless a stop signal stopped it: a resume takes that one back). Every call into the
    library goes through `guard`: the first failure is one warning, the output is recorded as
    incomplete (`run.incomplete_outputs`, written to manifest.json) and the tracker logs no
    more in this process."""

    output = ""  # its name in `incomplete_outputs`

    def on_start(self, run, metrics):
        self.last: dict = {}
        self.run, self.broken = run, False
        self.logged: set[int] = set()  # rounds the log already holds (not logged again)
        first = self.guard(self.open, run, self.output in run.incomplete_outputs)
        if first is not None:  # a resumed run: the rounds the log lacks, from `first` on
            self.guard(self.log_rows, [r for r in run.recorder.rows if r["round"] >= first])
            self.guard(self.flush)
        if not self.broken:  # every round so far is in the log
            run.incomplete_outputs.pop(self.output, None)
        return {}

    def on_round(self, run, outcome, metrics):
        row = run.recorder.rows[-1]
        self.guard(self.log_rows, [row])
        if run.checkpoint_due(outcome.round):
            self.guard(self.flush)
        self.last = dict(row)
        return False, {}

    def on_end(self, run, result, metrics):
        if run.recorder.rows and result.status != "interrupted":
            row = run.recorder.rows[-1]
            added = {k: v for k, v in row.items() if self.last.get(k) is None and v is not None}
            if added and self.last.get("round") == row["round"]:
                self.guard(self.log_rows, [{"round": row["round"], **added}], True)
        self.guard(self.close)
        return {}

    def on_failed(self, run, error):
        if hasattr(self, "run"):  # (it started)
            self.guard(self.close)

    def guard(self, action, *args):
        """`action(*args)`, or None once it or an earlier call failed."""
        if self.broken:
            return None
        try:
            with self.limits():
                return action(*args)
        except Exception as err:  # whatever the library raises, the run goes on
            self.broken = True
            with contextlib.suppress(Exception):
                self.close()  # what was logged before it, as far as it can be kept
            entry = {"output": self.output, "path": self.where(), "cause": _reason(err)}
            self.run.incomplete_outputs[self.output] = entry
            self.warn(stopped_logging(entry))
            return None

    def warn(self, text: str) -> None:
        warn(f"{self.run.run_dir}: {text}")

    def limits(self):
        return contextlib.nullcontext()

    def where(self) -> str:
        """The folder or store the tracker writes to, as its warning names it."""
        raise NotImplementedError

    def open(self, run, incomplete: bool) -> int | None:
        """Start logging (`incomplete`: an earlier process of the run failed to log every round
        here); the first of the rounds so far to log, or None (a new run has none)."""
        raise NotImplementedError

    def log_rows(self, rows: list[dict], again: bool = False) -> None:
        """Log `rows`, those of rounds the log holds only where `again` (what the end added)."""
        raise NotImplementedError

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def _tensorboard_records():
    """TensorBoard's event protos and record framing."""
    try:
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.record_writer import RecordWriter
    except ImportError:
        raise _missing("tensorboard", "TensorBoard") from None
    return Event, SessionLog, Summary, RecordWriter


EVENTS = "events.out.tfevents."


class TensorBoardTracker(_RowTracker):
    """Scalars under RUN/tensorboard/, one tag per column (train_loss, test_acc, arrived, ...),
    as float32 scalars: TensorBoard's data server (what `tensorboard --logdir` shows by default)
    drops double-precision ones. One event file per process, written here and now (not by a
    thread of its own), so that a failure reaches `guard`; TensorBoard reads the files in name
    order, so a new one is named after those already there."""

    output = "tensorboard"

    def where(self) -> str:
        return str(self.run.run_dir / "tensorboard")

    def open(self, run, incomplete):
        Event, SessionLog, self.Summary, RecordWriter = _tensorboard_records()
        self.Event = Event
        folder = run.run_dir / "tensorboard"
        stamps = [int(p.name.split(".")[3]) for p in folder.glob(EVENTS + "*") if p.name.split(".")[3].isdigit()]
        stamp = max([int(time.time()), *(s + 1 for s in stamps)])
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{EVENTS}{stamp:010d}.{socket.gethostname()}.{os.getpid()}.fedsim"
        self.records = RecordWriter(open(path, "wb"))
        # a resumed run logs again from its last recorded round (whose evaluation at a stop the
        # resume took back): the steps from there on are purged; a log lacking rounds, from 0
        rows = run.recorder.rows
        first = None
        if run.resumed:
            first = rows[-1]["round"] if rows and stamps and not incomplete else 0
        purge = first if stamps else None
        self.write(Event(wall_time=time.time(), step=purge or 0, file_version="brain.Event:2"))
        if purge is not None:
            self.write(Event(wall_time=time.time(), step=purge, session_log=SessionLog(status=SessionLog.START)))
        self.flush()
        return first

    def write(self, event) -> None:
        self.records.write(event.SerializeToString())

    def log_rows(self, rows, again=False):
        for row in rows:
            values = [self.Summary.Value(tag=tag, simple_value=value) for tag, value in _numbers(row).items()]
            if values:
                self.write(self.Event(wall_time=time.time(), step=row["round"], summary=self.Summary(value=values)))

    def flush(self):
        self.records.flush()

    def close(self):
        self.records.close()


def _mlflow_client():
    try:
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise _missing("mlflow", "MLflow") from None
    return MlflowClient


def tracking_uri(out: str | Path, kept: Path | None = None) -> str:
    """MLFLOW_TRACKING_URI (a SQLite file named relatively made absolute: `absolute_sqlite`), else
    a local store beside the runs (MLflow's file store, which it keeps for those who opt in:
    fedsim opts in for this one). `kept`: the mlflow.json of the run or study that goes on."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return absolute_sqlite(uri, kept)
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return (Path(out).resolve() / "mlruns").as_uri()


def absolute_sqlite(uri: str, kept: Path | None = None) -> str:
    """`sqlite:///mlflow.db` (MLflow's own example, relative to the working directory) as the
    absolute path it names, so that mlflow.json records one store and a resume typed from
    another directory goes on in it: where `kept` records the store of the run's start, under
    that name, that one; else against the working directory. Other URIs as they are."""
    if not uri.startswith("sqlite:///") or uri.startswith("sqlite:////") or ":memory:" in uri:
        return uri
    relative = os.path.normpath(uri[len("sqlite:///"):])
    recorded = _recorded_store(kept)
    if recorded.startswith("sqlite:////") and recorded.endswith(f"/{relative}"):
        return recorded
    return f"sqlite:///{Path(relative).resolve()}"


def _recorded_store(kept: Path | None) -> str:
    """The store that a run's or study's mlflow.json records ("" where none can be read)."""
    try:
        return _kept_record(kept)[1] if kept is not None and kept.exists() else ""
    except (OSError, ValueError, TypeError, KeyError):
        return ""


def _kept_record(kept: Path, uri: str = "") -> tuple[str, str]:
    """(run id, store) that a run's or study's mlflow.json records (the store: `uri` where it
    names none, as early releases wrote it); what reading it raises where it is unreadable."""
    record = json.loads(kept.read_text())
    return str(record["run_id"]), str(record.get("tracking_uri", uri))


def check_mlflow_store(uri: str) -> None:
    """FedsimError (one line, within seconds) unless MLflow can log to `uri`."""
    client = _mlflow_client()
    where = f"MLFLOW_TRACKING_URI={uri}" if os.environ.get("MLFLOW_TRACKING_URI") else f"the MLflow store {uri}"
    parts = urlparse(uri)
    scheme = parts.scheme.split("+")[0]  # postgresql+psycopg2://
    if len(scheme) > 1 and scheme not in SCHEMES:  # (one letter: a Windows drive)
        raise FedsimError(f"{where}: MLflow has no store for {scheme}:// (it takes a path or a URI of: "
                          f"{', '.join(SCHEMES)}); for a local store give sqlite:///PATH/mlflow.db, {FIX}")
    if scheme in DATABASES and not (find_spec("sqlalchemy") and find_spec("alembic")):
        raise FedsimError(f"{where}: MLflow's database stores need SQLAlchemy and Alembic: pip install "
                          f"'fedsim-avail[mlflow]', {FIX}")
    if scheme == "sqlite" and ":memory:" not in uri:  # (MLflow retries an unopenable file for minutes)
        _check_sqlite_file(uri[len("sqlite:///"):], where)
    if scheme in ("http", "https") and not (getproxies().get(scheme) and not proxy_bypass(parts.hostname or "")):
        port = parts.port or (443 if scheme == "https" else 80)
        try:
            socket.create_connection((parts.hostname, port), timeout=10).close()
        except OSError as err:
            raise FedsimError(f"{where}: no server answers at {parts.hostname}:{port} ({err.strerror or err}); "
                              f"start the MLflow server, correct MLFLOW_TRACKING_URI, {FIX}") from None
    try:
        with _mlflow_calls(CHECK_HTTP, override=True):
            client(tracking_uri=uri).search_experiments(max_results=1)
    except Exception as err:  # whatever the store raises: one line
        if "MLFLOW_ALLOW_FILE_STORE" in str(err):
            raise FedsimError(f"{where}: MLflow opens its file store only with MLFLOW_ALLOW_FILE_STORE=true; "
                              f"set that, or give sqlite:///PATH/mlflow.db (MLflow's local store), {FIX}") from None
        raise FedsimError(f"{where}: MLflow cannot log there ({_reason(err)}); correct MLFLOW_TRACKING_URI, "
                          f"{FIX}") from None


def _check_sqlite_file(path: str, where: str) -> None:
    """FedsimError (at once) unless the SQLite database `path` can be opened for writing (made,
    empty, where it is new: MLflow makes its tables in it next), where MLflow would retry for
    a minute or two before it said so."""
    import sqlite3

    try:
        database = sqlite3.connect(path, timeout=10)
        try:
            database.execute("BEGIN IMMEDIATE")
            database.rollback()
        finally:
            database.close()
    except sqlite3.Error as err:
        raise FedsimError(f"{where}: SQLite cannot open {path} for writing ({err}); give a file in a folder you can "
                          f"write to, {FIX}") from None


def _experiment(client, name: str, uri: str) -> str:
    """The id of the experiment `name`, made if new; on a SQLite store its artifacts go beside
    the database (MLflow's default is ./mlruns of whatever folder the run was started in)."""
    found = client.get_experiment_by_name(name)
    if found:
        return found.experiment_id
    location = None
    if uri.startswith("sqlite:///") and ":memory:" not in uri:
        location = (Path(uri[len("sqlite:///"):]).resolve().parent / "mlartifacts" / name).as_uri()
    return client.create_experiment(name, artifact_location=location)


def kept_run(client, kept: Path, uri: str, warn, fresh: str) -> str | None:
    """The MLflow run whose id `kept` (a run's or a study's mlflow.json) records, to go on
    logging to; None where there is none, or (with a warning ending in `fresh`) where it cannot
    be: the file is unreadable, the run is in another store or gone."""
    if not kept.exists():
        return None
    try:
        run_id, was = _kept_record(kept, uri)
    except (OSError, ValueError, TypeError, KeyError) as err:
        warn(f"{kept.name} is unreadable ({_reason(err)}): {fresh}")
        return None
    if was != uri:
        warn(f"{kept.name}: the MLflow run {run_id} is in {was}, this one logs to {uri}: {fresh}")
        return None
    from mlflow.exceptions import MlflowException

    try:
        stage = client.get_run(run_id).info.lifecycle_stage
    except MlflowException as err:
        if err.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        stage = "gone"
    if stage != "active":
        warn(f"{kept.name}: the MLflow run {run_id} is no longer in {uri} ({stage}): {fresh}")
        return None
    return run_id


class MlflowTracker(_RowTracker):
    """An MLflow run: the resolved config as params, every column as a metric with step =
    round, the run directory's files as artifacts at the end."""

    output = "mlflow"

    def limits(self):
        return _mlflow_calls(RUN_HTTP, override=False)

    def where(self) -> str:
        return tracking_uri(self.run.config.run.out, self.run.run_dir / "mlflow.json")

    def open(self, run, incomplete):
        uri = tracking_uri(run.config.run.out, run.run_dir / "mlflow.json" if run.resumed else None)
        self.client = _mlflow_client()(tracking_uri=uri)
        parent = os.environ.get(PARENT, "")
        experiment_id, parent_id = parent.split(":") if parent else (None, None)
        fresh = "a new MLflow run gets the rounds so far"
        self.run_id = kept_run(self.client, run.run_dir / "mlflow.json", uri, self.warn, fresh) if run.resumed else None
        if self.run_id:
            self.client.update_run(self.run_id, status="RUNNING")
            if parent_id:  # (the study's parent run may be a new one)
                self.client.set_tag(self.run_id, "mlflow.parentRunId", parent_id)
            self.logged = {m.step for m in self.client.get_metric_history(self.run_id, "t_end")}
            return 0
        experiment_id = experiment_id or _experiment(self.client, run.config.run.name, uri)
        tags = {"mlflow.parentRunId": parent_id} if parent_id else {}
        self.run_id = self.client.create_run(experiment_id, run_name=run.run_dir.name, tags=tags).info.run_id
        write_json(run.run_dir / "mlflow.json", {"run_id": self.run_id, "tracking_uri": uri})
        params = {f"{section}.{key}": str(value)[:500] for section, body in run.config.to_dict().items()
                  for key, value in body.items()}
        self.log_params(params)
        return 0 if run.resumed else None

    def log_params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = list(params.items())
        for lo in range(0, len(items), 100):  # MLflow takes at most 100 params a batch
            self.client.log_batch(self.run_id, params=[Param(k, v) for k, v in items[lo:lo + 100]])

    def log_rows(self, rows, again=False):
        from mlflow.entities import Metric

        now = 0  # timestamps are the host's; fedsim's time is the `t_end` metric
        metrics = [Metric(k, v, now, row["round"]) for row in rows if again or row["round"] not in self.logged
                   for k, v in _numbers(row).items() if math.isfinite(v)]
        for lo in range(0, len(metrics), 1000):  # MLflow takes at most 1000 metrics a batch
            self.client.log_batch(self.run_id, metrics=metrics[lo:lo + 1000])

    def on_saved(self, run, result):
        self.guard(self.save, run, result)

    def on_failed(self, run, error):
        if getattr(self, "run_id", None):  # (it started)
            self.guard(self.client.set_terminated, self.run_id, "FAILED")

    def save(self, run, result) -> None:
        for name in ("config.toml", "manifest.json", "rounds.parquet", "devices.parquet", "events.parquet",
                     "model.pt"):
            if (run.run_dir / name).is_file():
                self.client.log_artifact(self.run_id, str(run.run_dir / name))
        status = {"completed": "FINISHED", "interrupted": "KILLED"}.get(result.status, "FAILED")
        self.client.set_terminated(self.run_id, status=status)


@contextlib.contextmanager
def study_parent(study_name: str, folder: Path):
    """Within: the study's parent MLflow run, which its points are nested under (in-process
    and local Ray workers inherit it through the environment). One per study: its id is kept
    in STUDY/mlflow.json and a sweep that resumes the study goes on with it. Yields a dict whose
    "status" the caller sets to KILLED when a stop signal interrupted points; an exception
    through the block ends it KILLED (a stop signal) or FAILED. A store that fails once the
    check passed is a warning: the points are then runs of their own."""
    uri = tracking_uri(folder.parent, folder / "mlflow.json")
    check_mlflow_store(uri)
    kept, outcome = folder / "mlflow.json", {"status": "FINISHED"}
    try:
        with _mlflow_calls(RUN_HTTP, override=False):
            client = _mlflow_client()(tracking_uri=uri)
            experiment_id = _experiment(client, study_name, uri)
            parent = kept_run(client, kept, uri, lambda text: warn(f"study {study_name}: {text}"),
                              "a new parent run gets the points")
            if parent:
                client.update_run(parent, status="RUNNING")
            else:
                parent = client.create_run(experiment_id, run_name=study_name).info.run_id
                write_json(kept, {"run_id": parent, "tracking_uri": uri})
    except Exception as err:
        warn(f"study {study_name}: MLflow failed to make the study's parent run ({_reason(err)}); the points "
             "log without one")
        yield outcome
        return
    before = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ.update({PARENT: f"{experiment_id}:{parent}", "MLFLOW_TRACKING_URI": uri})  # the points' store
    try:
        yield outcome
    except (Stopped, KeyboardInterrupt):
        outcome["status"] = "KILLED"
        raise
    except BaseException:
        outcome["status"] = "FAILED"
        raise
    finally:
        os.environ.pop(PARENT, None)
        if before is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        try:
            with _mlflow_calls(RUN_HTTP, override=False):
                client.set_terminated(parent, status=outcome["status"])
        except Exception as err:
            warn(f"study {study_name}: MLflow failed to end the study's parent run ({_reason(err)})")
