"""A study's lockstep shares stepped by worker processes side by side (`fedsim sweep --processes N`,
fedsim/studies/processes.py): the same points as in one process, their progress shown by the
sweep, a stop signal passed on to the workers, and a worker that dies one error line whose
command finishes the study."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import QUADRATIC, manifest  # noqa: E402
from test_stop_and_resume import as_printed, environment  # noqa: E402
from test_study import write_study  # noqa: E402

from fedsim.cli import main  # noqa: E402
from fedsim.studies import processes  # noqa: E402


def test_points_in_worker_processes_equal_the_points_in_one_process(tmp_path, capsys):
    path = write_study(tmp_path, {"algorithm.name": ["fedavg", "mifa"], "run.seed": [0, 1]}, name="two",
                       model={"name": "mlp"})
    assert main(["sweep", str(path), "--processes", "2"]) == 0
    out = capsys.readouterr().out
    for point in ("algorithm-fedavg_seed-0", "algorithm-fedavg_seed-1", "algorithm-mifa_seed-0", "algorithm-mifa_seed-1"):
        assert out.count(f"  {point}: completed (") == 1, out  # the sweep shows what its workers did
    path = write_study(tmp_path, {"algorithm.name": ["fedavg", "mifa"], "run.seed": [0, 1]}, name="one",
                       model={"name": "mlp"})
    assert main(["sweep", str(path), "--processes", "1", "--quiet"]) == 0
    two, one = (pl.read_parquet(tmp_path / "runs" / name / "study.parquet").sort("point", "round")
                for name in ("two", "one"))
    assert two.drop("wall_s").equals(one.drop("wall_s"))  # bit for bit: each run's arithmetic is its own
    written = manifest(tmp_path / "runs" / "two" / "algorithm-mifa_seed-1")
    assert written["threads"]["max"] == 1  # two workers on this machine's cores: one thread each at most
    assert written["status"] == "completed"


def points(n: int, device: str = "cpu", trackers=(), mode: str = "sync") -> list:
    run = SimpleNamespace(device=device, trackers=list(trackers), rounds=10)
    return [SimpleNamespace(config=SimpleNamespace(run=run, server=SimpleNamespace(mode=mode))) for _ in range(n)]


def test_a_study_gets_a_worker_process_per_8_points_or_2_async_ones_at_most_one_per_core(monkeypatch):
    monkeypatch.setattr(processes, "usable_cores", lambda: 4)
    assert [processes.worker_processes(points(n)) for n in (1, 15, 16, 24, 64, 200)] == [1, 1, 2, 3, 4, 4]
    assert processes.worker_processes(points(64, device="cuda")) == 1  # one GPU: not measured shared yet
    assert processes.worker_processes(points(64, trackers=["mlflow"])) == 1  # the parent run is the sweep's
    assert processes.worker_processes(points(3), asked=8) == 3  # never more than the points
    assert processes.worker_processes(points(64), asked=1) == 1
    # asynchronous points share no call in lockstep: a worker per 2 of them
    assert [processes.worker_processes(points(n, mode="async")) for n in (1, 2, 4, 6, 64)] == [1, 1, 2, 3, 4]
    assert processes.worker_processes(points(8) + points(2, mode="async")) == 2


def test_shares_are_neighbours_of_about_equal_rounds():
    def point(rounds):
        return SimpleNamespace(config=SimpleNamespace(run=SimpleNamespace(rounds=rounds))), "new"

    sizes = [len(s) for s in processes.shares([point(10)] * 10, 3)]
    assert sizes == [4, 3, 3]
    cut = processes.shares([point(100), point(10), point(10), point(80)], 2)
    assert [[p.config.run.rounds for p, _ in share] for share in cut] == [[100], [10, 10, 80]]


# -- a sweep of worker processes stopped or hurt from outside -------------------------------------

STUDY = """
[run]
name = "long"
out = "runs"
eval_every = 1000
rounds = 4000
progress = false
plots = false
""" + QUADRATIC + """
[sweep]
"run.seed" = [0, 1, 2, 3]
"""


def start_sweep(folder: Path) -> subprocess.Popen:
    folder.mkdir(exist_ok=True)
    (folder / "s.toml").write_text(STUDY)
    return subprocess.Popen([sys.executable, "-m", "fedsim", "sweep", "s.toml", "--processes", "2"], cwd=folder,
                            env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_until_all_run(folder: Path, sweep: subprocess.Popen, timeout: float = 120.0) -> list[Path]:
    runs = [folder / "runs" / "long" / f"seed-{s}" for s in range(4)]
    end = time.monotonic() + timeout
    while not all(manifest(r).get("status") == "running" for r in runs):
        if sweep.poll() is not None or time.monotonic() > end:
            sweep.kill()
            pytest.fail(f"the sweep ended or hung first: {sweep.communicate()}")
        time.sleep(0.1)
    return runs


def test_sigterm_stops_the_workers_after_their_round_and_the_printed_resume_finishes_the_study(tmp_path):
    sweep = start_sweep(tmp_path / "stopped")
    runs = wait_until_all_run(tmp_path / "stopped", sweep)
    sweep.send_signal(signal.SIGTERM)
    out, err = sweep.communicate(timeout=120)
    assert sweep.returncode == 143, err
    assert err == ("stopping: the 4 running points finish their round, then save their results and checkpoint "
                   "(SIGTERM again to abort)\n")  # one line, the sweep's: the workers say nothing of their own
    folder = (tmp_path / "stopped" / "runs" / "long").absolute()
    command = f"fedsim sweep --resume {folder}"
    assert f"study interrupted by SIGTERM (0 of 4 runs finished); run `{command}` to finish it" in out
    assert all(manifest(r)["status"] == "interrupted" and (r / "checkpoint.pt").exists() for r in runs)
    assert all("SIGTERM" in manifest(r)["reason"] for r in runs)
    finished = as_printed(command, Path("/"))  # from another directory
    assert finished.returncode == 0, finished.stderr
    whole = start_sweep(tmp_path / "whole")
    assert whole.wait(timeout=300) == 0, whole.communicate()
    mine, theirs = (pl.read_parquet(f / "runs" / "long" / "study.parquet").sort("point", "round")
                    for f in (tmp_path / "stopped", tmp_path / "whole"))
    assert mine.drop("wall_s").equals(theirs.drop("wall_s"))


def test_a_killed_worker_is_one_error_line_whose_command_finishes_the_study(tmp_path):
    sweep = start_sweep(tmp_path)
    runs = wait_until_all_run(tmp_path, sweep)
    os.kill(manifest(runs[0])["pid"], signal.SIGKILL)  # the worker stepping seed-0 and seed-1
    out, err = sweep.communicate(timeout=120)
    assert sweep.returncode == 2, err
    folder = (tmp_path / "runs" / "long").absolute()
    command = f"fedsim sweep --resume {folder}"
    assert err == (f"error: the worker process of points seed-0, seed-1 ended without its results (killed, or out "
                   f"of memory?); run `{command}` to run them again from their last checkpoints, or `{command} "
                   "--processes 1` to run the study in one process (one copy of its data)\n")
    assert {manifest(r)["status"] for r in runs[2:]} == {"interrupted"}  # the other worker stopped at a round's end
    # (the first command, as a stopped sweep prints it, is run as printed by the SIGTERM test above)
    finished = as_printed(f"{command} --processes 1", Path("/"))
    assert finished.returncode == 0, finished.stderr
    assert {manifest(r)["status"] for r in runs} == {"completed"}
    assert all(manifest(r)["rounds"] == 4000 for r in runs)


def test_a_ctrl_c_while_the_workers_start_stops_the_sweep_in_one_line_and_its_command_finishes_it(tmp_path):
    """The signal reaches the workers before their handlers are in place: they hold it until
    then (no traceback), stop, and the sweep says what a stop before the rounds says."""
    from test_stop_and_resume import signalled

    (tmp_path / "s.toml").write_text(STUDY.replace("rounds = 4000", "rounds = 40"))
    proc = signalled(["sweep", "s.toml", "--processes", "2"], tmp_path, "fedsim.studies.processes._gather",
                     signal.SIGINT)
    assert proc.returncode == 130, proc.stderr
    command = f"fedsim sweep --resume {(tmp_path / 'runs' / 'long').absolute()}"
    assert "Traceback" not in proc.stderr
    assert proc.stderr.endswith(f"stopped by Ctrl-C; the runs finished are kept: run `{command}` to finish the study\n")
    finished = as_printed(command, Path("/"))
    assert finished.returncode == 0, finished.stderr
    assert all(manifest(tmp_path / "runs" / "long" / f"seed-{s}")["status"] == "completed" for s in range(4))


def test_workers_of_a_killed_sweep_stop_after_their_round_and_the_study_resumes(tmp_path):
    """SIGKILL of the sweep itself: its workers (sessions of their own) find nobody to report to,
    stop as a SIGTERM stops them (their points checkpoint), and leave nothing running."""
    sweep = start_sweep(tmp_path)
    runs = wait_until_all_run(tmp_path, sweep)
    workers = {manifest(r)["pid"] for r in runs}
    assert len(workers) == 2 and sweep.pid not in workers
    sweep.kill()
    sweep.communicate(timeout=60)
    def alive(pid: int) -> bool:  # (a zombie has ended: only its parent has yet to read its status)
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except (OSError, IndexError):
            return False

    end = time.monotonic() + 60
    while any(alive(pid) for pid in workers):
        assert time.monotonic() < end, "a worker outlived its sweep"
        time.sleep(0.2)
    assert all(manifest(r)["status"] == "interrupted" and (r / "checkpoint.pt").exists() for r in runs)
    finished = as_printed(f"fedsim sweep --resume {(tmp_path / 'runs' / 'long').absolute()}", Path("/"))
    assert finished.returncode == 0, finished.stderr
    assert {manifest(r)["status"] for r in runs} == {"completed"}
