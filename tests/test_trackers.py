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
from fedsim.config import dump_toml

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


def test_a_run_resumed_from_another_directory_goes_on_in_its_mlflow_run(tmp_path, monkeypatch, capsys):
    """The default store (run.out/mlruns) is where the run began, whatever directory resumes it
    (with a relative run.out it was the resuming directory's: a second store, a new MLflow run,
    the first left RUNNING)."""
    config = tracked(rounds=3, trackers=("mlflow",))
    config["run"].update(out="runs", name="r", progress=False, plots=False)
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "c.toml").write_text(dump_toml(config))
    monkeypatch.chdir(tmp_path / "work")
    assert main(["run", "c.toml", "--quiet"]) == 0
    run_dir = tmp_path / "work" / "runs" / "r"
    first = json.loads((run_dir / "mlflow.json").read_text())
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--resume", str(run_dir), "--set", "run.rounds=6", "--quiet"]) == 0
    assert "warning" not in capsys.readouterr().err
    assert json.loads((run_dir / "mlflow.json").read_text()) == first
    assert [step for step, _ in mlflow_values(run_dir, "train_loss")] == list(range(6))
    assert not (tmp_path / "runs").exists()
    from mlflow.tracking import MlflowClient
    assert MlflowClient(first["tracking_uri"]).get_run(first["run_id"]).info.status == "FINISHED"


def test_a_missing_tracker_library_is_one_line(cli_run, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)  # as if not installed
    cli_run(tracked(trackers=["mlflow"]), expect=2)
    assert cli_run.last_output.err == ("error: [run] trackers lists 'mlflow', which needs MLflow: pip install "
                                       "'fedsim-avail[mlflow]' (or remove it from [run] trackers)\n")


def test_an_unknown_tracker_is_one_line(cli_run):
    config = tracked()
    config["run"]["trackers"] = ["wandb"]
    cli_run(config, expect=2)
    assert "[run] trackers = 'wandb' is not a tracker (one of: tensorboard, mlflow)" in cli_run.last_output.err


def test_a_study_is_one_experiment_with_a_run_per_point_under_a_parent(tmp_path, capsys):
    from mlflow.tracking import MlflowClient


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


# --- trackers never break a run ----------------------------------------------------------------

def warnings_of(err: str) -> list[str]:
    assert "Traceback" not in err
    return [line for line in err.splitlines() if line.startswith("warning:")]


def complete(run_dir, rounds: int) -> pl.DataFrame:
    """The run's own files: every round in rounds.parquet, a finished manifest."""
    table = pl.read_parquet(run_dir / "rounds.parquet")
    assert table["round"].to_list() == list(range(rounds))
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "completed"
    return table


def assert_tracked(run_dir, table: pl.DataFrame, tensorboard=True, mlflow=True) -> None:
    """TensorBoard and/or MLflow hold exactly the rows of rounds.parquet, each step once."""
    for column in ("train_loss", "t_end"):
        expected = dict(zip(table["round"].to_list(), table[column].to_list()))
        if tensorboard:
            assert tensorboard_values(run_dir, column) == as_float32(expected)
        if mlflow:
            assert mlflow_values(run_dir, column) == sorted(expected.items())


@pytest.fixture(scope="module")
def sqlite_template(tmp_path_factory):
    """An empty MLflow SQLite store (made once: MLflow's migrations take a while)."""
    from mlflow.tracking import MlflowClient

    db = tmp_path_factory.mktemp("store") / "mlflow.db"
    MlflowClient(f"sqlite:///{db}").search_experiments()
    return db


def test_mlflow_sqlite_store_as_its_docs_recommend(cli_run, tmp_path, monkeypatch, sqlite_template):
    import shutil

    db = tmp_path / "store" / "mlflow.db"
    db.parent.mkdir()
    shutil.copy(sqlite_template, db)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    run_dir = cli_run(tracked(rounds=4, trackers=["mlflow"]))
    assert_tracked(run_dir, complete(run_dir, 4), tensorboard=False)
    assert json.loads((run_dir / "mlflow.json").read_text())["tracking_uri"] == f"sqlite:///{db}"
    from mlflow.tracking import MlflowClient

    run_id = json.loads((run_dir / "mlflow.json").read_text())["run_id"]
    artifacts = {a.path for a in MlflowClient(f"sqlite:///{db}").list_artifacts(run_id)}
    assert {"rounds.parquet", "model.pt"} <= artifacts
    assert list(elsewhere.iterdir()) == []  # beside the database, not ./mlruns of the working folder
    assert (db.parent / "mlartifacts" / "t").is_dir()


def free_loopback_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("uri, says", [
    ("http://127.0.0.1:{port}", "no server answers at 127.0.0.1:{port} (Connection refused); start the MLflow server"),
    ("bogus://somewhere", "MLflow has no store for bogus:// (it takes a path or a URI of: file, http, https"),
    ("file://{tmp}/mlruns", "MLflow opens its file store only with MLFLOW_ALLOW_FILE_STORE=true; set that, or give "
                            "sqlite:///PATH/mlflow.db"),
    # (MLflow retried such a file for 1 min 45 s before its error)
    ("sqlite:///{tmp}/no/such/folder/mlflow.db", "SQLite cannot open {tmp}/no/such/folder/mlflow.db for writing "
                                                 "(unable to open database file); give a file in a folder you can"),
])
def test_a_store_that_cannot_log_is_one_line_before_anything_is_written(cli_run, tmp_path, monkeypatch, uri, says):
    import time

    port = free_loopback_port()
    uri = uri.format(port=port, tmp=tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)  # (a default store opted in before)
    started = time.monotonic()
    cli_run(tracked(trackers=["tensorboard", "mlflow"]), expect=2)
    assert time.monotonic() - started < 60
    err = cli_run.last_output.err
    assert err.count("\n") == 1 and err.startswith(f"error: MLFLOW_TRACKING_URI={uri}: ")
    assert says.format(port=port, tmp=tmp_path) in err and err.endswith("or remove 'mlflow' from [run] trackers\n")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlruns").exists()


def test_a_resume_checks_the_store_first_too(cli_run, tmp_path, monkeypatch):
    run_dir = cli_run(tracked(rounds=2, trackers=["mlflow"]))
    before = {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()}
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_loopback_port()}")
    assert main(["run", "--resume", str(run_dir), "--set", "run.rounds=4", "--quiet"]) == 2
    assert {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()} == before


def failing_after(calls: int, error: Exception):
    """A stand-in for a library call that works `calls` times, then raises `error` (and
    records the MLflow HTTP settings it was called under)."""
    seen = {"calls": 0, "retries": []}

    def wrap(original):
        def call(*args, **kwargs):
            seen["calls"] += 1
            seen["retries"].append(os.environ.get("MLFLOW_HTTP_REQUEST_MAX_RETRIES"))
            if seen["calls"] > calls:
                raise error
            return original(*args, **kwargs)
        return call
    return wrap, seen


def test_a_full_disk_under_tensorboard_mid_run_is_one_warning(cli_run, monkeypatch):
    import errno

    from tensorboard.summary.writer.record_writer import RecordWriter

    wrap, seen = failing_after(3, OSError(errno.ENOSPC, "No space left on device"))  # the header, rounds 0-1
    monkeypatch.setattr(RecordWriter, "write", wrap(RecordWriter.write))
    run_dir = cli_run(tracked(rounds=6))
    table = complete(run_dir, 6)
    assert warnings_of(cli_run.last_output.err) == [
        f"warning: {run_dir}: TensorBoard stopped logging to {run_dir / 'tensorboard'} (OSError: [Errno 28] No space "
        "left on device); the run goes on, its own files (rounds.parquet) are complete, and manifest.json lists the "
        "output as incomplete"]
    assert seen["calls"] == 4  # and no more after the failure
    assert_tracked(run_dir, table, tensorboard=False)  # MLflow got everything
    assert sorted(tensorboard_values(run_dir, "train_loss")) == [0, 1]


def test_an_mlflow_server_gone_mid_run_is_one_warning_within_bounded_retries(cli_run, monkeypatch):
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    gone = MlflowException("API request to http://127.0.0.1:5000/api/2.0/mlflow/runs/log-batch failed with "
                           "exception HTTPConnectionPool(host='127.0.0.1', port=5000): Max retries exceeded\nmore")
    wrap, seen = failing_after(3, gone)  # the params, rounds 0 and 1
    monkeypatch.setattr(MlflowClient, "log_batch", wrap(MlflowClient.log_batch))
    run_dir = cli_run(tracked(rounds=6))
    table = complete(run_dir, 6)
    [line] = warnings_of(cli_run.last_output.err)
    assert line.startswith(f"warning: {run_dir}: MLflow stopped logging to {(run_dir.parent / 'mlruns').as_uri()} (MlflowException: "
                           "API request to http://127.0.0.1:5000/api/2.0/mlflow/runs/log-batch failed")
    assert seen["retries"] == ["2"] * 4 and "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ
    assert_tracked(run_dir, table, mlflow=False)  # TensorBoard got everything
    assert [step for step, _ in mlflow_values(run_dir, "train_loss")] == [0, 1]


def test_a_tensorboard_folder_that_is_a_file_on_resume_is_one_warning(cli_run):
    run_dir = cli_run(tracked(rounds=3))
    import shutil

    shutil.rmtree(run_dir / "tensorboard")
    (run_dir / "tensorboard").write_text("not a folder")
    assert main(["run", "--resume", str(run_dir), "--set", "run.rounds=6", "--quiet"]) == 0
    out = cli_run.capsys.readouterr()
    [line] = warnings_of(out.err)
    assert line.startswith(f"warning: {run_dir}: TensorBoard stopped logging to {run_dir / 'tensorboard'} (FileExistsError: ")
    assert_tracked(run_dir, complete(run_dir, 6), tensorboard=False)


def fedsim_process(argv: list[str], cwd, code: int = 0, **env):
    """`fedsim ARGV` as typed, in a process of its own, from `cwd`."""
    import subprocess
    import sys

    from test_kill_resume import environment

    proc = subprocess.run([sys.executable, "-m", "fedsim", *argv], env=environment(**env), cwd=cwd,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == code, proc.stderr
    return proc


@pytest.mark.parametrize("damage, says", [
    ("empty", "mlflow.json is unreadable (JSONDecodeError: Expecting value: line 1 column 1 (char 0)): a new "
              "MLflow run gets the rounds so far"),
    ("store deleted", "mlflow.json: the MLflow run {run_id} is no longer in {uri} (gone): a new MLflow run gets "
                      "the rounds so far"),
])
def test_a_resume_whose_mlflow_run_is_lost_makes_a_new_one_with_every_round(cli_run, tmp_path, damage, says):
    import shutil

    run_dir = cli_run(tracked(rounds=3))
    kept = json.loads((run_dir / "mlflow.json").read_text())
    if damage == "empty":
        (run_dir / "mlflow.json").write_text("")
        assert main(["run", "--resume", str(run_dir), "--set", "run.rounds=6", "--quiet"]) == 0
        err = cli_run.capsys.readouterr().err
    else:  # (a new process: MLflow keeps the store it opened for the process)
        shutil.rmtree(run_dir.parent / "mlruns")
        err = fedsim_process(["run", "--resume", str(run_dir), "--set", "run.rounds=6", "--quiet"], tmp_path).stderr
    assert warnings_of(err) == [f"warning: {run_dir}: " + says.format(run_id=kept["run_id"],
                                                                          uri=kept["tracking_uri"])]
    assert json.loads((run_dir / "mlflow.json").read_text())["run_id"] != kept["run_id"]
    assert_tracked(run_dir, complete(run_dir, 6))


def test_tensorboard_added_on_resume_gets_the_rounds_before_too(cli_run):
    run_dir = cli_run(tracked(rounds=3, trackers=[]))
    assert main(["run", "--resume", str(run_dir), "--set", "run.rounds=5", "--set", 'run.trackers=["tensorboard"]',
                 "--quiet"]) == 0
    assert_tracked(run_dir, complete(run_dir, 5), mlflow=False)


def test_kill_9_after_a_checkpoint_loses_no_tensorboard_step(tmp_path):
    """Killed right after the checkpoint of round 4 (FEDSIM_TEST_KILL_AT), the run resumes
    from it: TensorBoard holds every step once, none lost (flushed before the checkpoint)."""

    config = tracked(rounds=6, trackers=["tensorboard"])
    config["run"].update(checkpoint_every=2, name="k", out=str(tmp_path / "runs"), progress=False, plots=False)
    (tmp_path / "k.toml").write_text(dump_toml(config))
    proc = fedsim_process(["run", str(tmp_path / "k.toml"), "--quiet"], tmp_path, code=-9,
                          FEDSIM_TEST_KILL_AT="after:checkpoint.pt:3")
    run_dir = tmp_path / "runs" / "k"
    assert sorted(tensorboard_values(run_dir, "train_loss")) == [0, 1, 2, 3]
    assert main(["run", "--resume", str(run_dir), "--quiet"]) == 0
    assert_tracked(run_dir, complete(run_dir, 6), mlflow=False)


def test_a_study_checks_the_store_before_any_point(tmp_path, capsys, monkeypatch):

    study = tracked(rounds=2, trackers=["mlflow"])
    study["run"].update(name="st", out=str(tmp_path / "runs"), progress=False, plots=False)
    study["sweep"] = {"run.seed": [0, 1]}
    (tmp_path / "st.toml").write_text(dump_toml(study))
    uri = f"http://127.0.0.1:{free_loopback_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert main(["sweep", str(tmp_path / "st.toml"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: MLFLOW_TRACKING_URI={uri}: no server answers at ")
    assert not (tmp_path / "runs").exists()  # nothing written: not the study's folder either


class VanishingMlflowServer:
    """Just enough of MLflow's REST API on a loopback port for a run to start logging; after
    `answers` metric batches it goes away (drops the connection, stops listening)."""

    def __init__(self, answers: int):
        import http.server
        import threading

        self.answers, self.paths = answers, []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self.do_POST()

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                endpoint = self.path.split("?")[0].rsplit("/mlflow/", 1)[-1]
                server.paths.append(endpoint)
                if endpoint == "runs/log-batch" and server.paths.count(endpoint) > server.answers:
                    self.server.socket.close()  # gone: this request unanswered, no new connection
                    self.close_connection = True
                    return
                info = {"run_id": "r1", "run_uuid": "r1", "experiment_id": "1", "status": "RUNNING",
                        "lifecycle_stage": "active", "artifact_uri": "file:///nowhere"}
                code, body = {
                    "experiments/get-by-name": (404, {"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "no"}),
                    "experiments/create": (200, {"experiment_id": "1"}),
                    "runs/create": (200, {"run": {"info": info, "data": {}}}),
                }.get(endpoint, (200, {}))
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.uri = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self):
        self.httpd.shutdown()


def test_a_real_mlflow_client_whose_server_goes_away_costs_seconds_and_one_warning(cli_run, monkeypatch):
    import time

    server = VanishingMlflowServer(answers=3)  # the params, rounds 0 and 1
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
    try:
        started = time.monotonic()
        run_dir = cli_run(tracked(rounds=6))
        elapsed = time.monotonic() - started
    finally:
        server.stop()
    assert server.paths.count("runs/log-batch") == 4  # no request after the failure
    [line] = warnings_of(cli_run.last_output.err)
    assert line.startswith(f"warning: {run_dir}: MLflow stopped logging to {server.uri} (MlflowException: API request "
                           f"to {server.uri}/api/2.0/mlflow/runs/log-batch failed with exception")
    assert elapsed < 40  # MLflow's own retries would take about 4 minutes
    assert_tracked(run_dir, complete(run_dir, 6), mlflow=False)


# --- an output not written is said, recorded and reported; a resume completes it ---------------

def test_a_failed_tracker_under_quiet_is_one_warning_recorded_reported_and_completed_by_the_printed_command(
        cli_run, tmp_path):
    import re
    import shlex
    import shutil

    run_dir = cli_run(tracked(rounds=3, trackers=["tensorboard"]))
    folder = run_dir / "tensorboard"
    shutil.rmtree(folder)
    folder.write_text("not a folder")
    proc = fedsim_process(["run", "--resume", str(run_dir), "--set", "run.rounds=6", "--quiet"], tmp_path)
    cause = f"FileExistsError: [Errno 17] File exists: '{folder}'"
    assert proc.stderr == (f"warning: {run_dir}: TensorBoard stopped logging to {folder} ({cause}); the run goes on, "
                           "its own files (rounds.parquet) are complete, and manifest.json lists the output as "
                           "incomplete\n")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "completed"
    assert manifest["incomplete_outputs"] == [{"output": "tensorboard", "path": str(folder), "cause": cause}]
    [line] = [line for line in fedsim_process(["report", str(run_dir)], tmp_path).stdout.splitlines()
              if line.startswith("incomplete:")]
    assert line.startswith(f"incomplete: fedavg: its tensorboard output ({folder}) lacks rounds ({cause}); "
                           "rounds.parquet has them all: once that is fixed, `fedsim run --resume ")
    doc = json.loads(fedsim_process(["report", str(run_dir), "--json"], tmp_path).stdout)
    assert doc["runs"][0]["incomplete_outputs"] == manifest["incomplete_outputs"]
    folder.unlink()  # fixed: the printed command logs every round
    command = re.search(r"`(fedsim run --resume [^`]+)` logs them", line).group(1)
    assert fedsim_process(shlex.split(command)[1:], tmp_path).stderr == ""
    assert_tracked(run_dir, complete(run_dir, 6), mlflow=False)
    assert json.loads((run_dir / "manifest.json").read_text())["incomplete_outputs"] == []
    assert "incomplete" not in fedsim_process(["report", str(run_dir)], tmp_path).stdout


def test_an_mlflow_store_that_fails_is_recorded_and_a_resume_logs_each_missing_round_once(cli_run, monkeypatch):
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    log_batch = MlflowClient.log_batch
    wrap, seen = failing_after(3, MlflowException("(sqlite3.OperationalError) database or disk is full"))
    monkeypatch.setattr(MlflowClient, "log_batch", wrap(log_batch))  # the params, rounds 0 and 1
    run_dir = cli_run(tracked(rounds=4, trackers=["mlflow"]))
    uri = (run_dir.parent / "mlruns").as_uri()
    assert json.loads((run_dir / "manifest.json").read_text())["incomplete_outputs"] == [
        {"output": "mlflow", "path": uri, "cause": "MlflowException: (sqlite3.OperationalError) database or disk is full"}]
    assert [step for step, _ in mlflow_values(run_dir, "t_end")] == [0, 1]
    monkeypatch.setattr(MlflowClient, "log_batch", log_batch)  # the disk has room again
    assert main(["run", "--resume", str(run_dir), "--set", "run.rounds=6", "--quiet"]) == 0
    assert_tables(run_dir, tensorboard=False)  # rounds 2 and 3 too, each round once
    assert json.loads((run_dir / "manifest.json").read_text())["incomplete_outputs"] == []


# --- Ctrl-C and a resumed study: one parent run, the right statuses, the tables' values ---------

def assert_tables(run_dir, tensorboard=True, mlflow=True, host_time=True) -> None:
    """Every numeric column of rounds.parquet, and nothing else, in the trackers: each step once
    (`host_time`: `wall_s` too, which a round run again after a kill does not repeat)."""
    table = pl.read_parquet(run_dir / "rounds.parquet")
    for column, dtype in table.schema.items():
        if column == "round" or not dtype.is_numeric():
            continue
        if column == "wall_s" and not host_time and mlflow:
            assert [step for step, _ in mlflow_values(run_dir, column)] == table["round"].to_list()
            continue
        known = table.select("round", column).drop_nulls(column).filter(pl.col(column).cast(pl.Float64).is_finite())
        expected = dict(zip(known["round"].to_list(), known[column].cast(pl.Float64).to_list()))
        if mlflow:
            assert mlflow_values(run_dir, column) == sorted(expected.items()), column
        if tensorboard and expected:
            assert tensorboard_values(run_dir, column) == as_float32(expected), column


def test_a_study_stopped_by_ctrl_c_and_resumed_is_one_parent_run_and_its_points_equal_their_tables(
        tmp_path, capsys, monkeypatch, sqlite_template):
    import shutil
    import signal

    from mlflow.tracking import MlflowClient

    from fedsim.results.recorder import Recorder

    db = tmp_path / "mlflow.db"
    shutil.copy(sqlite_template, db)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    study = tracked(rounds=8)
    study["run"].update(name="st", out=str(tmp_path / "runs"), eval_every=3, progress=False, plots=False)
    study["sweep"] = {"run.seed": [0, 1]}
    (tmp_path / "st.toml").write_text(dump_toml(study))
    add_round, fired = Recorder.add_round, []

    def ctrl_c_in_round_4(self, outcome, *args):  # once: the first point to reach round 4
        if outcome.round == 4 and not fired:
            fired.append(True)
            signal.raise_signal(signal.SIGINT)
        return add_round(self, outcome, *args)

    monkeypatch.setattr(Recorder, "add_round", ctrl_c_in_round_4)
    assert main(["sweep", str(tmp_path / "st.toml"), "--quiet"]) == 130
    monkeypatch.setattr(Recorder, "add_round", add_round)
    client = MlflowClient(f"sqlite:///{db}")
    experiment = client.get_experiment_by_name("st").experiment_id
    folder = tmp_path / "runs" / "st"

    def runs() -> tuple:
        found = client.search_runs([experiment])
        [parent] = [r for r in found if r.info.run_name == "st"]
        return parent, sorted((r for r in found if r is not parent), key=lambda r: r.info.run_name)

    parent, points = runs()
    assert parent.info.status == "KILLED" and [r.info.status for r in points] == ["KILLED", "KILLED"]
    for point in ("seed-0", "seed-1"):  # logged: every round; not the stop's evaluation
        rounds = pl.read_parquet(folder / point / "rounds.parquet")
        assert rounds["round"].to_list() == [0, 1, 2, 3, 4] and rounds["test_loss"][4] is not None
        assert [step for step, _ in mlflow_values(folder / point, "test_loss")] == [2]
    assert main(["sweep", "--resume", str(folder), "--quiet"]) == 0
    again, points = runs()
    assert again.info.run_id == parent.info.run_id and again.info.status == "FINISHED"
    assert json.loads((folder / "mlflow.json").read_text())["run_id"] == parent.info.run_id
    assert [(r.info.run_name, r.info.status, r.data.tags["mlflow.parentRunId"]) for r in points] == [
        ("seed-0", "FINISHED", parent.info.run_id), ("seed-1", "FINISHED", parent.info.run_id)]
    for point in ("seed-0", "seed-1"):
        assert pl.read_parquet(folder / point / "rounds.parquet")["test_loss"].drop_nulls().len() == 3  # 2, 5, 7
        assert_tables(folder / point)


def bug_in_round_3(monkeypatch):
    """The recorder raises in round 3 (a bug), until the returned function puts it back."""
    from fedsim.results.recorder import Recorder

    add_round = Recorder.add_round

    def failing_in_round_3(self, outcome, *args):
        if outcome.round == 3:
            raise RuntimeError("a bug in round 3")
        return add_round(self, outcome, *args)

    monkeypatch.setattr(Recorder, "add_round", failing_in_round_3)
    return lambda: monkeypatch.setattr(Recorder, "add_round", add_round)


def test_a_study_whose_point_fails_ends_its_parent_run_failed_and_is_no_completed_point(
        tmp_path, capsys, monkeypatch):
    from mlflow.tracking import MlflowClient

    study = tracked(rounds=6, trackers=["mlflow"])
    study["run"].update(name="st", out=str(tmp_path / "runs"), progress=False, plots=False)
    study["sweep"] = {"run.seed": [0, 1]}
    (tmp_path / "st.toml").write_text(dump_toml(study))
    fixed = bug_in_round_3(monkeypatch)
    assert main(["sweep", str(tmp_path / "st.toml"), "--quiet"]) == 2  # each point failed alone
    assert "error: point seed-0: its run failed with RuntimeError: a bug in round 3 (traceback: " in \
        capsys.readouterr().err
    fixed()
    client = MlflowClient((tmp_path / "runs" / "mlruns").as_uri())
    [parent] = [r for r in client.search_runs([client.get_experiment_by_name("st").experiment_id])
                if r.info.run_name == "st"]
    assert parent.info.status == "FAILED"

    def point_status(point):  # its MLflow run's
        return client.get_run(json.loads((tmp_path / "runs" / "st" / point / "mlflow.json").read_text())["run_id"]
                              ).info.status

    for point in ("seed-0", "seed-1"):  # left as a crash leaves a run: not completed, resumable
        assert json.loads((tmp_path / "runs" / "st" / point / "manifest.json").read_text())["status"] == "running"
        assert point_status(point) == "FAILED"  # not RUNNING for ever
    assert main(["sweep", "--resume", str(tmp_path / "runs" / "st"), "--quiet"]) == 0
    for point in ("seed-0", "seed-1"):
        assert json.loads((tmp_path / "runs" / "st" / point / "manifest.json").read_text())["rounds"] == 6
        assert point_status(point) == "FINISHED"


@pytest.mark.parametrize("store", ["default", "sqlite"])
def test_a_run_that_raises_ends_its_mlflow_run_failed_and_its_resume_finished(cli_run, tmp_path, monkeypatch,
                                                                               sqlite_template, store):
    """In the default store beside the runs, and in a SQLite store as MLflow's docs recommend."""
    import shutil

    from mlflow.tracking import MlflowClient

    if store == "sqlite":
        shutil.copy(sqlite_template, tmp_path / "mlflow.db")
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    fixed = bug_in_round_3(monkeypatch)
    config = tracked(rounds=6, trackers=["mlflow"])
    config["run"]["checkpoint_every"] = 2
    with pytest.raises(RuntimeError, match="a bug in round 3"):
        cli_run(config)
    [run_dir] = [p for p in (cli_run.tmp / "runs").iterdir() if (p / "mlflow.json").is_file()]
    kept = json.loads((run_dir / "mlflow.json").read_text())
    assert kept["tracking_uri"].startswith("sqlite:///") == (store == "sqlite")
    client = MlflowClient(kept["tracking_uri"])
    assert client.get_run(kept["run_id"]).info.status == "FAILED"
    fixed()
    assert main(["run", "--resume", str(run_dir), "--quiet"]) == 0
    assert client.get_run(kept["run_id"]).info.status == "FINISHED"
    assert [step for step, _ in mlflow_values(run_dir, "t_end")] == \
        pl.read_parquet(run_dir / "rounds.parquet")["round"].to_list()  # each round once


def test_kill_9_between_checkpoints_leaves_no_step_twice_in_either_tracker(tmp_path, monkeypatch):
    """Killed before the checkpoint of round 3, the run resumes from that of round 1: rounds 2
    and 3, logged by the killed process, are logged again to neither tracker."""

    config = tracked(rounds=6)
    config["run"].update(checkpoint_every=2, name="k", out=str(tmp_path / "runs"), progress=False, plots=False)
    (tmp_path / "k.toml").write_text(dump_toml(config))
    fedsim_process(["run", str(tmp_path / "k.toml"), "--quiet"], tmp_path, code=-9,
                   FEDSIM_TEST_KILL_AT="before:checkpoint.pt:3")
    run_dir = tmp_path / "runs" / "k"
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # (fedsim's local store, read here first)
    assert [step for step, _ in mlflow_values(run_dir, "t_end")] == [0, 1, 2, 3]
    assert main(["run", "--resume", str(run_dir), "--quiet"]) == 0
    assert_tables(run_dir, host_time=False)  # MLflow's wall_s of rounds 2 and 3: the killed process's


def test_a_study_report_names_each_point_whose_tracker_failed(tmp_path, capsys, monkeypatch):
    import errno
    import re
    import shlex

    from tensorboard.summary.writer.record_writer import RecordWriter


    study = tracked(rounds=3, trackers=["tensorboard"])
    study["run"].update(name="st", out=str(tmp_path / "runs"), progress=False, plots=False)
    study["sweep"] = {"run.seed": [0, 1]}
    (tmp_path / "st.toml").write_text(dump_toml(study))
    wrap, _ = failing_after(0, OSError(errno.EROFS, "Read-only file system"))
    monkeypatch.setattr(RecordWriter, "write", wrap(RecordWriter.write))
    assert main(["sweep", str(tmp_path / "st.toml"), "--quiet"]) == 0
    folder = tmp_path / "runs" / "st"
    assert warnings_of(capsys.readouterr().err) == [
        f"warning: {folder / point}: TensorBoard stopped logging to {folder / point / 'tensorboard'} (OSError: [Errno 30] "
        "Read-only file system); the run goes on, its own files (rounds.parquet) are complete, and manifest.json "
        "lists the output as incomplete" for point in ("seed-0", "seed-1")]
    assert main(["report", str(folder)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("incomplete:")]
    assert lines == [f"incomplete: {point}: its tensorboard output ({folder / point / 'tensorboard'}) lacks rounds "
                     "(OSError: [Errno 30] Read-only file system); rounds.parquet has them all: once that is fixed, "
                     f"`fedsim sweep --resume {folder}` logs them" for point in ("seed-0", "seed-1")]
    # fixed, the printed command (a point's own resume is refused: only its sweep writes to a study),
    # typed from another directory, resumes the finished points to log their rounds
    monkeypatch.undo()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    command = re.search(r"`(fedsim sweep --resume [^`]+)` logs them", lines[0]).group(1)
    assert main(shlex.split(command)[1:]) == 0
    assert "seed-0: resuming" in capsys.readouterr().out
    for point in ("seed-0", "seed-1"):
        assert json.loads((folder / point / "manifest.json").read_text())["incomplete_outputs"] == []
        assert_tracked(folder / point, complete(folder / point, 3), mlflow=False)
    assert main(["report", str(folder)]) == 0
    assert "incomplete:" not in capsys.readouterr().out


def test_a_relative_sqlite_store_is_one_store_for_a_resume_from_another_directory(tmp_path, monkeypatch,
                                                                                    sqlite_template):
    """`MLFLOW_TRACKING_URI=sqlite:///mlflow.db` (MLflow's own example) names a file in the working
    directory: recorded absolutely, so that the printed resume, typed from another directory with
    the same variable, goes on with the same MLflow run in the same database (it made a second
    database there and a second run)."""
    import shutil

    from mlflow.tracking import MlflowClient

    start, other = tmp_path / "start", tmp_path / "other"
    start.mkdir(), other.mkdir()
    shutil.copy(sqlite_template, start / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db")
    monkeypatch.chdir(start)
    config = tracked(rounds=3, trackers=["mlflow"])
    config["run"].update(name="rel", out=str(tmp_path / "runs"), progress=False, plots=False)
    (start / "rel.toml").write_text(dump_toml(config))
    assert main(["run", "rel.toml", "--quiet"]) == 0
    run_dir = tmp_path / "runs" / "rel"
    kept = json.loads((run_dir / "mlflow.json").read_text())
    assert kept["tracking_uri"] == f"sqlite:///{start / 'mlflow.db'}"
    monkeypatch.chdir(other)
    assert main(["run", "--resume", str(run_dir), "--set", "run.rounds=6", "--quiet"]) == 0
    assert json.loads((run_dir / "mlflow.json").read_text()) == kept and list(other.iterdir()) == []
    history = MlflowClient(kept["tracking_uri"]).get_metric_history(kept["run_id"], "t_end")
    assert sorted(m.step for m in history) == list(range(6))


def test_mlflows_own_log_lines_are_held_back(cli_run, tmp_path, monkeypatch):
    """A new SQLite store: MLflow's INFO lines as it makes the tables (and its ERROR tracebacks of
    a store that fails, dozens of lines) do not reach the run's output, where fedsim speaks."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'new.db'}")
    run_dir = cli_run(tracked(rounds=2, trackers=["mlflow"]))
    assert cli_run.last_output.err == ""
    assert_tracked(run_dir, complete(run_dir, 2), tensorboard=False)


def test_a_reason_skips_sqlalchemys_autoflush_note():
    from fedsim.runs.trackers import _reason

    err = RuntimeError("(raised as a result of Query-invoked autoflush; consider using a session.no_autoflush block "
                       "if this flush is occurring prematurely)\n(sqlite3.OperationalError) attempt to write a readonly "
                       "database\n[SQL: INSERT ...]")
    assert _reason(err) == "RuntimeError: (sqlite3.OperationalError) attempt to write a readonly database"
