"""`fedsim sweep --backend ray`: the points run as Ray tasks on a local Ray and give exactly the
run directories and summary of the in-process backend; failures come back as one line."""

import contextlib
import json
import os
import shutil
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pytest

ray = pytest.importorskip("ray")

from conftest import QUADRATIC, manifest  # noqa: E402
from fedsim.studies import ray_backend as study_ray
from fedsim.cli import main
from fedsim.config import read_toml
from fedsim.errors import FedsimError
from fedsim.runs.experiment import run_state
from fedsim.studies.study import load_study

STUDY = """
[run]
name = "digits-study"
out = "{out}"
rounds = 10
eval_every = 5
progress = false
plots = false
algorithms = ["fedavg", "mifa"]

[data]
dataset = "digits"
clients = 20

[server]
clients_per_round = 5
timing = "ideal"

[client]
local_steps = 2

[sweep]
{axis} = [0, 1]
"""


def write_study(path: Path, out: str, axis='"run.seed"') -> Path:
    path.write_text(STUDY.format(out=out, axis=axis))
    return path


def point_config(run_dir: Path) -> dict:
    config = read_toml(run_dir / "config.toml")
    config["run"].pop("out")  # the study folder, which differs between the two copies
    return config


def test_ray_backend_equals_inprocess_and_skips_done_points(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    on_ray = write_study(tmp_path / "ray.toml", "ray")
    here = write_study(tmp_path / "here.toml", "here")

    assert main(["sweep", str(on_ray), "--backend", "ray"]) == 0
    assert "(4/4, " in capsys.readouterr().out  # not a terminal: a line per finished point
    assert not ray.is_initialized()  # the sweep shut down the Ray it started
    assert main(["sweep", str(here), "--quiet"]) == 0

    points = [p.name for p in load_study(str(on_ray)).points]
    assert len(points) == 4
    for name in points:
        a, b = tmp_path / "ray/digits-study" / name, tmp_path / "here/digits-study" / name
        assert json.loads((a / "manifest.json").read_text())["status"] == "completed"
        assert point_config(a) == point_config(b)
        acc = pl.read_parquet(a / "rounds.parquet")["test_acc"]
        assert acc.drop_nulls().len() == 2
        assert acc.to_list() == pl.read_parquet(b / "rounds.parquet")["test_acc"].to_list()
    summary_ray = pl.read_parquet(tmp_path / "ray/digits-study/summary.parquet")
    summary_here = pl.read_parquet(tmp_path / "here/digits-study/summary.parquet")
    means = [c for c in summary_ray.columns if c.endswith("_mean")]
    assert {"final_acc_mean", "best_acc_mean", "final_loss_mean"} <= set(means)
    assert summary_ray.select("algorithm.name", "seeds", *means).equals(
        summary_here.select("algorithm.name", "seeds", *means))
    assert summary_ray["algorithm.name"].to_list() == ["fedavg", "mifa"]

    manifest = tmp_path / "ray/digits-study" / points[0] / "manifest.json"
    before = manifest.stat().st_mtime_ns
    assert main(["sweep", str(on_ray), "--backend", "ray", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert out.count("done, skipped") == 4 and "(1/4, " not in out  # nothing ran
    assert manifest.stat().st_mtime_ns == before


def test_a_point_that_fails_in_its_worker_is_one_line_naming_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    # more devices than digits has samples passes the config check (it needs the data), then
    # fails in the worker
    study = write_study(tmp_path / "s.toml", "runs", axis='"data.clients"')
    study.write_text(study.read_text().replace("[0, 1]", "[20, 3000]"))

    assert main(["sweep", str(study), "--backend", "ray", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: point algorithm-fedavg_clients-3000: [data] clients = 3000 is more than the "
                          "1347 training samples of 'digits'"), err
    assert "more points failed" in err  # mifa's point failed the same way
    done = tmp_path / "runs/digits-study/algorithm-fedavg_clients-20/manifest.json"
    assert json.loads(done.read_text())["status"] == "completed"  # the others still ran


def test_without_ray_the_backend_is_one_error_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "ray", None)
    study = write_study(tmp_path / "s.toml", "runs")
    assert main(["sweep", str(study), "--backend", "ray"]) == 2
    assert capsys.readouterr().err == "error: the Ray backend needs ray: pip install 'fedsim-avail[ray]'\n"


def test_worker_outcomes_come_back_as_plain_data(tmp_path, monkeypatch):
    monkeypatch.setattr("torch.set_num_threads", lambda n: None)  # not this test process's threads

    def boom(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(study_ray, "run_point", boom)
    config = load_study(str(write_study(tmp_path / "s.toml", str(tmp_path / "runs")))).points[0].config
    args = (config.to_dict(), config.source, str(tmp_path / "p"), "new", str(tmp_path))
    kind, message, trace = study_ray.run_task(*args)
    assert (kind, message) == ("bug", "RuntimeError: boom") and "Traceback" in trace
    bad = {**config.to_dict(), "run": {**config.to_dict()["run"], "rounds": 0}}
    kind, message = study_ray.run_task(bad, config.source, str(tmp_path / "p"), "new", str(tmp_path))
    assert kind == "error" and "rounds" in message

    # the driver: a bug is one line naming the point, its traceback kept in the point's folder
    study = SimpleNamespace(folder=tmp_path / "runs")
    point = SimpleNamespace(name="p1")
    fake_ray = SimpleNamespace(get=lambda ref: ("bug", "RuntimeError: boom", "Traceback ..."))
    status, line = study_ray.outcome(fake_ray, None, point, study)
    assert status is None and line.startswith("point p1: its run failed with RuntimeError: boom")
    assert (tmp_path / "runs/p1/error.txt").read_text() == "Traceback ..."


def test_a_point_whose_node_dies_again_and_again_is_one_error_line(tmp_path, capsys):
    """The driver runs a point whose node died again (from its folder: state None) three
    times, a warning each; the fourth death is the point's error line, with the resume command."""
    from ray.exceptions import NodeDiedError

    def died(ref):
        raise NodeDiedError("Task failed because the node it was running on is dead or unavailable. "
                            "Node IP: 10.0.0.7, node ID: 5f2e.")

    fake_ray = SimpleNamespace(get=died, wait=lambda left, num_returns, timeout: (left[:1], left[1:]))
    shown = SimpleNamespace(rounds_done=lambda n: None, point_finished=lambda name, status: None)
    submitted = []

    def submit(i: int, state):
        submitted.append((i, state))
        return f"task {len(submitted)}"

    study = SimpleNamespace(folder=tmp_path / "runs",
                            resume_command=lambda: f"fedsim sweep --resume {tmp_path / 'runs'} --backend ray")
    statuses = [None]
    failures = study_ray.gather(fake_ray, {"task 0": 0}, submit, [(SimpleNamespace(name="p1"), "new")], study,
                                statuses, shown, {"name": ""})
    assert submitted == [(0, None)] * 3 and statuses == [None]
    assert failures == [(0, f"point p1: its Ray node (10.0.0.7) died while it ran (4 times); run `fedsim sweep --resume "
                            f"{tmp_path / 'runs'} --backend ray` to run it again from its last checkpoint")]
    assert capsys.readouterr().err == 3 * ("warning: point p1: its Ray node (10.0.0.7) died while it ran; it runs "
                                           "again on a node that is left, from its last checkpoint\n")

def test_a_point_run_again_waits_until_its_lost_process_lets_go_of_its_folder(tmp_path, monkeypatch):
    import threading

    from fedsim.files import DirectoryLock

    monkeypatch.setattr("torch.set_num_threads", lambda n: None)  # not this test process's threads
    config = load_study(str(write_study(tmp_path / "s.toml", str(tmp_path / "runs")))).points[0].config
    run_dir = tmp_path / "p"
    lost = DirectoryLock(run_dir)
    lost.acquire("the point's process on the dead node")
    threading.Timer(1.0, lost.release).start()
    started = time.monotonic()
    assert study_ray.state_once_let_go(config, run_dir) == "new"
    assert time.monotonic() - started >= 1.0

    lost.acquire("the point's process on the dead node")  # and it never lets go
    monkeypatch.setattr(study_ray, "LOST_WRITER_S", 0.5)
    kind, message = study_ray.run_task(config.to_dict(), config.source, str(run_dir), None, str(tmp_path))
    assert kind == "error" and message == (f"{run_dir}: in use by process {os.getpid()} on {socket.gethostname()} "
                                           "(the point's process on the dead node); wait until it ends (or stop it), "
                                           "then try again")
    lost.release()

def test_more_gpus_per_task_than_the_cluster_has_is_refused():
    cpu_only = SimpleNamespace(cluster_resources=lambda: {"CPU": 2.0})
    study_ray.check_gpus(cpu_only, 0)
    with pytest.raises(FedsimError, match=r"gpus_per_task = 0.5, but the Ray cluster has 0 GPUs"):
        study_ray.check_gpus(cpu_only, 0.5)


def test_an_address_where_no_cluster_answers_is_one_line_not_a_hang(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    study = write_study(tmp_path / "s.toml", "runs")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["sweep", str(study), "--backend", "ray", "--address", f"127.0.0.1:{port}"]) == 2
    assert capsys.readouterr().err.startswith(f"error: --address 127.0.0.1:{port}: no Ray cluster "
                                              "answers there")
    monkeypatch.setenv("RAY_ADDRESS", "head-node")
    assert main(["sweep", str(study), "--backend", "ray"]) == 2
    assert capsys.readouterr().err.startswith("error: RAY_ADDRESS=head-node: not HOST:PORT")
    assert not ray.is_initialized()



def test_a_port_that_takes_connections_but_is_no_ray_head_is_one_line_within_10_s(tmp_path, monkeypatch, capsys):
    """Another service on the port, or a head killed a moment ago whose port still takes a
    connection: ray.init would try its GCS for minutes."""
    monkeypatch.chdir(tmp_path)
    study = write_study(tmp_path / "s.toml", "runs")
    with socket.socket() as listening:  # accepts TCP, answers nothing
        listening.bind(("127.0.0.1", 0))
        listening.listen(8)
        address = f"127.0.0.1:{listening.getsockname()[1]}"
        started = time.monotonic()
        assert main(["sweep", str(study), "--backend", "ray", "--address", address]) == 2
        assert time.monotonic() - started < 10
    err = capsys.readouterr().err
    assert err.startswith(f"error: --address {address}: no Ray cluster answers there (") and err.count("\n") == 1, err
    assert not (tmp_path / "runs").exists() and not ray.is_initialized()

# -- a sweep process stopped or hurt from outside ---------------------------------------------

LONG = """
[run]
name = "long"
out = "runs"
eval_every = 1000
progress = false
plots = false
""" + QUADRATIC + """
[sweep]
"run.seed" = [0, 1]
"run.rounds" = [2, 100000]
zip = [["run.seed", "run.rounds"]]
"""


def start_sweep(tmp_path: Path) -> subprocess.Popen:
    """`fedsim sweep --backend ray` of a tiny study in its own process: point seed-0 ends at
    once, seed-1 runs (a minute or more) until it is stopped."""
    (tmp_path / "s.toml").write_text(LONG)
    return subprocess.Popen([sys.executable, "-m", "fedsim", "sweep", "s.toml", "--backend", "ray"],
                            cwd=tmp_path, env=sweep_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def sweep_env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]),
                                                         os.environ.get("PYTHONPATH", "")])}


def wait_until(condition, sweep: subprocess.Popen, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        if sweep.poll() is not None or time.monotonic() > end:
            sweep.kill()
            pytest.fail(f"the sweep ended or hung first: {sweep.communicate()}")
        time.sleep(0.2)


def test_sigterm_stops_a_ray_sweep_with_143_keeping_what_it_finished(tmp_path):
    sweep = start_sweep(tmp_path)
    done, running = tmp_path / "runs/long/seed-0_rounds-2", tmp_path / "runs/long/seed-1_rounds-100000"
    wait_until(lambda: manifest(done).get("status") == "completed" and manifest(running).get("status") == "running",
               sweep)
    sweep.send_signal(signal.SIGTERM)
    out, err = sweep.communicate(timeout=60)
    assert sweep.returncode == 143, err
    printed = f"fedsim sweep --resume {tmp_path / 'runs/long'} --backend ray"  # (finished on Ray, as started)
    assert "Traceback" not in err and f"run `{printed}` to finish it" in out, out
    assert err == "stopping: the running points finish their round (SIGTERM again to abort)\n"
    assert manifest(done)["status"] == "completed"
    assert manifest(running)["status"] == "interrupted" and (running / "checkpoint.pt").exists()
    assert "SIGTERM" in manifest(running)["reason"] and "Ctrl-C" not in manifest(running)["reason"]
    points = {p.name: p for p in load_study(str(tmp_path / "runs/long")).points}
    assert run_state(done, points[done.name].config) == "done"
    assert run_state(running, points[running.name].config) == "resume"
    # the printed command, as printed from another directory: the point goes on as a Ray task
    (tmp_path / "elsewhere").mkdir()
    first_node = manifest(running).get("ray_node")
    again = subprocess.Popen([sys.executable, "-m", *shlex.split(printed)], cwd=tmp_path / "elsewhere",
                             env=sweep_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: manifest(running).get("status") == "running", again)
    again.send_signal(signal.SIGTERM)
    out, err = again.communicate(timeout=60)
    assert again.returncode == 143 and f"{running.name}: resuming" in out, err
    assert manifest(running).get("ray_node") not in (None, first_node)  # (a new local Ray's node ran it)


def test_a_killed_ray_worker_is_one_error_line_naming_its_point(tmp_path):
    sweep = start_sweep(tmp_path)
    running = tmp_path / "runs/long/seed-1_rounds-100000"
    wait_until(lambda: manifest(running).get("pid"), sweep)
    os.kill(manifest(running)["pid"], signal.SIGKILL)
    out, err = sweep.communicate(timeout=60)
    assert sweep.returncode == 2, err
    assert err.startswith("error: point seed-1_rounds-100000: its Ray worker died while it ran") and \
        err.count("\n") == 1, err
    # the command it prints is the one a stopped sweep prints (run as printed in test_stop_and_resume.py)
    assert f"run `fedsim sweep --resume {(tmp_path / 'runs/long').absolute()} --backend ray` to run it again" in err, err
    assert "raylet" not in out + err and "seed-0_rounds-2: completed" in out


def test_sigterm_once_ray_started_is_143_and_one_line_as_in_process(tmp_path):
    """ray.init puts in a SIGTERM handler of its own (exit 15, no word): fedsim keeps its own."""
    sys.path.insert(0, str(Path(__file__).parent))
    from test_stop_and_resume import signalled

    (tmp_path / "s.toml").write_text(LONG)
    proc = signalled(["sweep", "s.toml", "--backend", "ray"], tmp_path,
                     "fedsim.studies.ray_backend.check_gpus", signal.SIGTERM, after=0.5)
    assert proc.returncode == 143, proc.stderr
    assert proc.stderr == (f"stopped by SIGTERM; the runs finished are kept: run `fedsim sweep --resume "
                           f"{tmp_path / 'runs/long'} --backend ray` to finish the study\n")


def test_a_tracker_that_fails_in_a_ray_worker_is_warned_by_the_sweep(tmp_path, capsys):
    """Ray does not pass on what its workers print: the sweep prints the warning of each
    tracker that a point's manifest lists as incomplete."""
    import shutil

    from fedsim.config import dump_toml

    study = {"run": {"name": "q", "out": str(tmp_path / "runs"), "rounds": 2, "progress": False, "plots": False,
                     "trackers": ["tensorboard"]},
             "data": {"dataset": "quadratic", "clients": 3, "targets": [[1.0, 0.0], [0.0, 1.0], [2.0, 1.0]]},
             "client": {"batch_size": 0, "local_steps": 1, "lr": 0.1},
             "server": {"timing": "ideal", "round_duration": 1.0}, "sweep": {"run.seed": [0, 1]}}
    (tmp_path / "q.toml").write_text(dump_toml(study))
    assert main(["sweep", str(tmp_path / "q.toml"), "--quiet"]) == 0
    folder = tmp_path / "runs" / "q"
    shutil.rmtree(folder / "seed-0" / "tensorboard")
    (folder / "seed-0" / "tensorboard").write_text("not a folder")
    capsys.readouterr()
    assert main(["sweep", "--resume", str(folder), "--set", "run.rounds=4", "--backend", "ray", "--quiet"]) == 0
    board = folder / "seed-0" / "tensorboard"
    assert capsys.readouterr().err == (
        f"warning: {folder / 'seed-0'}: TensorBoard stopped logging to {board} (FileExistsError: [Errno 17] File "
        f"exists: '{board}'); the run goes on, its own files (rounds.parquet) are complete, and manifest.json lists "
        "the output as incomplete\n")


# -- a real cluster of two Ray nodes on this machine (`ray start`, as on real machines) -------

CLUSTER_STUDY = """
[run]
name = "on-a-cluster"
out = "{out}"
rounds = {rounds}
eval_every = {every}
checkpoint_every = {every}
progress = false
plots = false
""" + QUADRATIC + """
[sweep]
"run.seed" = [0, 1]
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """A Ray head and a worker node, each `ray start --block` with one CPU and its own resource
    in a session of its own: stopped by killing its process group (never `ray stop`, which
    stops every Ray on the machine). Token authentication with a token of its own, as a user's
    cluster has it where Ray enables it."""

    def __init__(self, folder: Path):
        import secrets
        import tempfile

        self.folder = folder
        self.temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must fit
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
                    "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
        self.env.pop("RAY_ADDRESS", None)
        self.head = self.worker = None

    def node(self, name: str, *args: str) -> subprocess.Popen:
        ray_cli = [sys.executable, "-m", "ray.scripts.scripts"]  # `ray`, of this Python's Ray
        with open(self.folder / f"{name}.log", "w") as log:
            proc = subprocess.Popen([*ray_cli, "start", "--block", "--num-cpus=1", f'--resources={{"{name}": 1}}',
                                     "--object-store-memory=78643200", "--disable-usage-stats",
                                     f"--dashboard-agent-listen-port={free_port()}", *args],
                                    env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        end = time.monotonic() + 60
        while "Ray runtime started" not in (self.folder / f"{name}.log").read_text():
            if proc.poll() is not None or time.monotonic() > end:
                self.stop()
                pytest.fail(f"`ray start` of the {name} failed: {(self.folder / f'{name}.log').read_text()[-3000:]}")
            time.sleep(0.2)
        return proc

    def up(self) -> "Cluster":
        """Both nodes running (started again where a test took one down)."""
        if self.head is None or self.head.poll() is not None:
            self.stop()
            self.head = self.node("head", "--head", f"--port={self.port}", f"--temp-dir={self.temp}",
                                  "--include-dashboard=false", f"--dashboard-port={free_port()}",
                                  f"--ray-client-server-port={free_port()}")
        if self.worker is None or self.worker.poll() is not None:
            self.worker = self.node("worker", f"--address={self.address}")
        return self

    def worker_raylet(self) -> int:
        return next(pid for pid in session(self.worker.pid)
                    if Path(f"/proc/{pid}/comm").read_text().strip() == "raylet")

    def stop(self) -> None:
        """Both nodes killed, and the head's port closed (its GCS dies a moment after the kill)."""
        for proc in (self.worker, self.head):
            if proc is not None:
                for pid in session(proc.pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                proc.wait()
        end = time.monotonic() + 10
        while self.head is not None and time.monotonic() < end:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
            except OSError:
                break
            time.sleep(0.05)
        self.head = self.worker = None

    def sweep(self, study: Path, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "fedsim", "sweep", str(study), "--backend", "ray",
                               "--address", self.address, *args],
                              cwd=study.parent, env=self.env, capture_output=True, text=True, timeout=120)


def session(sid: int) -> list[int]:
    """The processes of session `sid` (a node's `ray start` and all it started)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.getsid(int(entry)) == sid:
                    found.append(int(entry))
    return found


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if sys.platform != "linux":
        pytest.skip("the nodes' processes are found in /proc")
    made = Cluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield made
    finally:
        made.stop()
        shutil.rmtree(made.temp, ignore_errors=True)


def write_cluster_study(folder: Path, out: str, rounds: int, every: int) -> Path:
    path = folder / f"{out}.toml"
    path.write_text(CLUSTER_STUDY.format(out=folder / out, rounds=rounds, every=every))
    return path


def same_tables(a: Path, b: Path) -> None:
    """The study's tables and each point's rounds equal, but for the host seconds a round took."""
    for table in ("study.parquet", "summary.parquet", "seed-0/rounds.parquet", "seed-1/rounds.parquet"):
        ours, theirs = (pl.read_parquet(folder / table).drop("wall_s", strict=False) for folder in (a, b))
        assert ours.equals(theirs), table


def test_a_study_on_a_two_node_cluster_spreads_its_points_and_equals_in_process(cluster, tmp_path):
    cluster.up()
    study = write_cluster_study(tmp_path, "ray", rounds=200, every=50)
    done = cluster.sweep(study)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    folder = tmp_path / "ray/on-a-cluster"
    manifests = [json.loads((folder / p / "manifest.json").read_text()) for p in ("seed-0", "seed-1")]
    assert [m["status"] for m in manifests] == ["completed", "completed"]
    # one CPU a node: the two points ran side by side, one on each node
    assert len({m["ray_node"] for m in manifests}) == 2 and all(len(m["ray_node"]) == 56 for m in manifests)

    assert main(["sweep", str(write_cluster_study(tmp_path, "here", rounds=200, every=50)), "--quiet"]) == 0
    same_tables(folder, tmp_path / "here/on-a-cluster")


def test_a_worker_node_killed_mid_study_loses_nothing(cluster, tmp_path):
    """SIGKILL of the worker node's raylet while a point runs there, past its first checkpoint:
    the point runs again on the head from that checkpoint, and the study equals an undisturbed one.
    (Its rounds take 0.4 ms: 12,000 of them leave the point seconds of work after its first
    checkpoint, so that it cannot finish before Ray sees its node die; 4,000 once did.)"""
    cluster.up()
    study = write_cluster_study(tmp_path, "ray", rounds=12000, every=500)
    sweep = subprocess.Popen([sys.executable, "-m", "fedsim", "sweep", str(study), "--backend", "ray",
                              "--address", cluster.address], cwd=tmp_path, env=cluster.env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    folder = tmp_path / "ray/on-a-cluster"
    doomed_session = cluster.worker.pid

    def doomed() -> str | None:
        """The point running on the worker node past its first checkpoint."""
        for point in ("seed-0", "seed-1"):
            m = manifest(folder / point)
            with contextlib.suppress(OSError):
                if m.get("status") == "running" and m["rounds"] >= 500 and os.getsid(m["pid"]) == doomed_session:
                    return point
        return None

    wait_until(doomed, sweep, timeout=90)
    lost = doomed()
    os.kill(cluster.worker_raylet(), signal.SIGKILL)
    out, err = sweep.communicate(timeout=90)
    assert sweep.returncode == 0, err
    assert err.startswith(f"warning: point {lost}: its Ray node (") and err.endswith(
        ") died while it ran; it runs again on a node that is left, from its last checkpoint\n"), err
    assert err.count("\n") == 1 and f"{lost}: completed" in out

    manifests = {p: manifest(folder / p) for p in ("seed-0", "seed-1")}
    assert {m["status"] for m in manifests.values()} == {"completed"}
    assert manifests[lost]["trainer"]["from_round"] >= 500  # resumed from its checkpoint, not run afresh
    assert len({m["ray_node"] for m in manifests.values()}) == 1  # both finished on the head
    assert main(["sweep", str(write_cluster_study(tmp_path, "here", rounds=12000, every=500)), "--quiet"]) == 0
    same_tables(folder, tmp_path / "here/on-a-cluster")


def test_a_cluster_that_refuses_this_process_its_token_is_one_line_within_10_s(cluster, tmp_path, monkeypatch, capfd):
    """The cluster has token authentication; this process has no token (RAY_AUTH_MODE unset)."""
    cluster.up()
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    study = write_cluster_study(tmp_path, "ray", rounds=2, every=1)
    started = time.monotonic()
    assert main(["sweep", str(study), "--backend", "ray", "--address", cluster.address]) == 2
    assert time.monotonic() - started < 10
    assert capfd.readouterr().err == (f"error: --address {cluster.address}: the Ray cluster there uses token "
                                      "authentication and refused this process; set RAY_AUTH_MODE=token and give it "
                                      "the head's token (the same ~/.ray/auth_token, or RAY_AUTH_TOKEN)\n")
    assert not (tmp_path / "ray").exists()
    # as the message says (cluster.env: RAY_AUTH_MODE=token, RAY_AUTH_TOKEN), in a process of its
    # own, as a user's sweep is (Ray reads the mode once a process)
    done = cluster.sweep(study, "--quiet")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert manifest(tmp_path / "ray/on-a-cluster/seed-0")["status"] == "completed"


def test_the_address_of_a_stopped_head_is_one_line_within_10_s(cluster, tmp_path, capsys):
    cluster.up()
    cluster.stop()
    study = write_cluster_study(tmp_path, "ray", rounds=2, every=1)
    started = time.monotonic()
    assert main(["sweep", str(study), "--backend", "ray", "--address", cluster.address]) == 2
    assert time.monotonic() - started < 10
    err = capsys.readouterr().err
    assert err.startswith(f"error: --address {cluster.address}: no Ray cluster answers there") and err.count("\n") == 1
    assert not (tmp_path / "ray").exists()


def test_a_second_signal_inside_rays_wait_aborts_as_the_signal_it_is(tmp_path):
    """The second Ctrl-C's Stopped, raised by its handler while `ray.wait` ran in Ray's C code,
    comes out of it as a SystemError: the sweep cancels its tasks and stops as that signal (exit
    130 and one line), not with a traceback; any other SystemError is left alone."""
    from fedsim.errors import Stopped

    def wait(left, num_returns, timeout):
        try:
            raise Stopped("Ctrl-C")
        except Stopped:
            raise SystemError("<cyfunction CoreWorker.wait> returned a result with an exception set")

    cancelled = []
    fake_ray = SimpleNamespace(wait=wait, cancel=lambda ref, force=False: cancelled.append((ref, force)))
    shown = SimpleNamespace(rounds_done=lambda n: None, point_finished=lambda name, status: None)
    with pytest.raises(Stopped, match="Ctrl-C"):
        study_ray.gather(fake_ray, {"task 0": 0}, None, [(SimpleNamespace(name="p1"), "new")],
                         SimpleNamespace(folder=tmp_path), [None], shown, {"name": "Ctrl-C"})
    assert ("task 0", True) in cancelled
    assert study_ray.stopped_within(SystemError("another")) is None


def test_a_task_ray_loses_after_a_stop_signal_was_interrupted(tmp_path):
    """A SIGTERM to the sweep's process group stops a local Ray's raylet too: its tasks come back
    as Ray's errors. Once a stop signal came they count as interrupted (the point keeps its last
    checkpoint; the sweep prints its resume command), not as the point's failure."""
    from ray.exceptions import RaySystemError, WorkerCrashedError

    study = SimpleNamespace(folder=tmp_path, resume_command=lambda: f"fedsim sweep --resume {tmp_path} --backend ray")
    point = SimpleNamespace(name="p1")
    for error in (RaySystemError("The task's local raylet died. Check raylet.out for more information."),
                  WorkerCrashedError()):
        def get(ref, error=error):
            raise error

        fake_ray = SimpleNamespace(get=get)
        assert study_ray.outcome(fake_ray, None, point, study, stopping=True) == ("interrupted", None)
        status, line = study_ray.outcome(fake_ray, None, point, study)
        assert status is None and line.startswith("point p1: its Ray")
