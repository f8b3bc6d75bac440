"""Ctrl-C and SIGTERM at any moment of a run or a study, and the resume command that fedsim
prints, run as printed (in a process of its own, from the same directory and from another, for
an interrupted and a finished study, and for a study folder that moved)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
import torch

from conftest import same_results
from fedsim.cli import main
from fedsim.config import dump_toml, read_toml
from fedsim.files import DirectoryLock

ROOT = Path(__file__).parents[1]

# The command, started as `python -m fedsim` is, after a prologue that may mark (a file) the
# moment the process reaches a phase and hold it there a while, so that a test can send its
# signal from outside into that phase: "start" (before fedsim is imported), "module.function"
# (on entering it), "round" (the server's round 1), "aggregation" (the async server's 2nd).
PROLOGUE = """
import pathlib, runpy, sys, time
marker, phase = pathlib.Path(sys.argv.pop(1)), sys.argv.pop(1)

def marking(fn, hold):
    def marked(*args, **kwargs):
        marker.touch()
        time.sleep(hold)
        return fn(*args, **kwargs)
    return marked

if phase in ("round", "aggregation"):
    from fedsim.sim.buffered import BufferedServer
    from fedsim.sim.server import Server
    server = Server if phase == "round" else BufferedServer
    original = server.round
    def round(self, rnd, max_time=0.0):
        if rnd == 1:
            marker.touch()
            time.sleep(1.0)
        return (yield from original(self, rnd, max_time))
    server.round = round
elif phase == "start":
    marker.touch()
elif phase == "own":  # the command's own input marks it (a user's module, as it is imported)
    pass
else:
    import importlib
    module, name = phase.rsplit(".", 1)
    marked = marking(getattr(importlib.import_module(module), name), 3.0)
    for home in {module, module.rsplit(".", 1)[0]}:  # the function, and its package's export
        if hasattr(importlib.import_module(home), name):
            setattr(importlib.import_module(home), name, marked)
sys.argv[0] = "fedsim"
runpy.run_module("fedsim", run_name="__main__", alter_sys=True)
"""


def environment() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def fedsim(argv: list[str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    """`fedsim ARGV` in a process of its own, as a user types it."""
    return subprocess.run([sys.executable, "-m", "fedsim", *argv], cwd=cwd, env=environment(),
                          capture_output=True, text=True, timeout=timeout)


def as_printed(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """A command line that fedsim printed (`fedsim sweep --resume /...`), run as printed."""
    argv = shlex.split(command)
    assert argv[0] == "fedsim", command
    return fedsim(argv[1:], cwd)


def hint(out: str, command: str) -> str:
    """The resume command in fedsim's `... run `fedsim COMMAND --resume DIR` to finish it` line."""
    found = re.findall(rf"run `(fedsim {command} --resume [^`]+)` to finish it", out)
    assert len(found) == 1, out
    return found[0]


def signalled(argv: list[str], cwd: Path, phase: str, sig: int, after: float = 0.0,
              ignore_sigint: bool = False, times: int = 1) -> subprocess.CompletedProcess:
    """`fedsim ARGV`, sent `sig` once it reached `phase` (and `after` seconds more), `times`
    times 0.2 s apart."""
    marker = cwd / f".reached-{phase}"
    marker.unlink(missing_ok=True)
    def inherit_ignored_sigint():  # as a job that a script starts with `&`
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    proc = subprocess.Popen([sys.executable, "-c", PROLOGUE, str(marker), phase, *argv], cwd=cwd,
                            env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=inherit_ignored_sigint if ignore_sigint else None)
    deadline = time.monotonic() + 180
    while not marker.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"never reached {phase}: {proc.communicate()}")
        time.sleep(0.02)
    time.sleep(after)
    for n in range(times):
        time.sleep(0.2 if n else 0)
        proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"{phase}: still running 120 s after the signal: {proc.communicate()}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


RUN = {"run": {"name": "r", "rounds": 6, "eval_every": 2, "progress": False, "plots": False},
       "data": {"dataset": "quadratic", "clients": 4},
       "trace": {"source": "bernoulli", "p": 0.5},
       "server": {"timing": "ideal", "clients_per_round": 2}}


@pytest.mark.parametrize("phase, sig, after", [
    ("start", signal.SIGINT, 0.5),  # importing fedsim, torch, ...
    ("start", signal.SIGTERM, 0.5),
    ("fedsim.traces.generators.generate", signal.SIGTERM, 0.5),  # generating the trace
    ("fedsim.training.build_task", signal.SIGINT, 0.5),  # loading the data
])
def test_a_signal_while_a_run_sets_up_stops_it_at_once_writing_nothing(tmp_path, phase, sig, after):
    (tmp_path / "r.toml").write_text(dump_toml(RUN))
    started = time.monotonic()
    proc = signalled(["run", "r.toml"], tmp_path, phase, sig, after)
    name = "Ctrl-C" if sig == signal.SIGINT else "SIGTERM"
    assert proc.returncode == (130 if sig == signal.SIGINT else 143), proc.stderr
    assert proc.stderr.startswith(f"stopped by {name}") and proc.stderr.count("\n") == 1, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (tmp_path / "runs" / "r").exists()  # nothing written
    assert time.monotonic() - started < 150


SLOW_MODULE = """
import pathlib, time
from torch import nn
pathlib.Path(".reached-own").touch()
time.sleep(IMPORT_SECONDS)
pathlib.Path("imported").touch()

def net(in_shape, n_classes, model_config):
    return nn.Sequential(nn.Flatten(), nn.Linear(64, n_classes))
"""


@pytest.mark.parametrize("signals", [1, 2])
def test_a_signal_while_a_module_imports_stops_the_run_once_it_returned_and_a_second_at_once(tmp_path, signals):
    """A first signal inside an import is held until the import returns (an exception raised where
    torch's import runs C++ aborts the process: "terminate called after throwing ..."); a second
    stops at once (a user's module may take long to import)."""
    (tmp_path / "slow_net.py").write_text(SLOW_MODULE.replace("IMPORT_SECONDS", "1.0" if signals == 1 else "60"))
    (tmp_path / "r.toml").write_text(dump_toml({**RUN, "data": {"dataset": "digits", "clients": 4},
                                                "model": {"name": "slow_net:net"}}))
    started = time.monotonic()
    proc = signalled(["run", "r.toml"], tmp_path, "own", signal.SIGINT, times=signals)
    assert (proc.returncode, proc.stderr) == (130, "stopped by Ctrl-C before the run started; nothing was written\n")
    assert (tmp_path / "imported").exists() == (signals == 1)  # the import finished, or not
    assert not (tmp_path / "runs" / "r").exists()
    assert time.monotonic() - started < 50


def test_a_signal_in_the_first_round_finishes_it_and_the_printed_resume_finishes_the_run(tmp_path):
    """Also where SIGINT came ignored (a job started with `&` by a script): it stops the run."""
    (tmp_path / "r.toml").write_text(dump_toml(RUN))
    proc = signalled(["run", "r.toml"], tmp_path, "round", signal.SIGINT, ignore_sigint=True)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr == "stopping after this round (Ctrl-C again to abort)\n"
    run_dir = tmp_path / "runs" / "r"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert (manifest["status"], manifest["rounds"]) == ("interrupted", 2)  # round 1 finished
    assert "\nfedavg: interrupted by Ctrl-C after 2 rounds\n" in proc.stdout, proc.stdout
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = as_printed(hint(proc.stdout, "run"), elsewhere)
    assert done.returncode == 0, done.stderr
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert (manifest["status"], manifest["rounds"]) == ("completed", 6)


MODULE_FILE = """
from torch import nn


class Net(nn.Module):
    def __init__(self, n_classes):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, 16), nn.Linear(16, n_classes)

    def forward(self, x):
        return self.fc2(self.fc1(x.flatten(1)).relu())


def make(in_shape, n_classes, cfg):
    return Net(n_classes)
"""
MODULE_RUN = {"run": {"name": "m", "rounds": 6, "eval_every": 2, "progress": False, "plots": False},
              "data": {"dataset": "digits", "clients": 8}, "model": {"name": "mynet:make"},
              "server": {"timing": "ideal", "clients_per_round": 3}, "client": {"local_steps": 2, "batch_size": 8}}


def test_a_run_of_a_module_beside_its_config_resumes_by_its_printed_command_from_another_directory(tmp_path):
    """`[model] name = "mynet:make"` is imported from the directory the run started in; the run
    records that folder (manifest.json's `plugin_folders`), so the printed resume imports it
    from anywhere, and finishes as the run would have uninterrupted."""
    (tmp_path / "mynet.py").write_text(MODULE_FILE)
    (tmp_path / "m.toml").write_text(dump_toml(MODULE_RUN))
    assert fedsim(["run", "m.toml", "--quiet", "--set", "run.name=whole"], tmp_path).returncode == 0
    proc = signalled(["run", "m.toml"], tmp_path, "round", signal.SIGINT)
    assert proc.returncode == 130, proc.stderr
    run_dir = tmp_path / "runs" / "m"
    assert json.loads((run_dir / "manifest.json").read_text())["plugin_folders"] == [str(tmp_path.resolve())]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = as_printed(hint(proc.stdout, "run"), elsewhere)
    assert done.returncode == 0, done.stderr
    same_results(run_dir, tmp_path / "runs" / "whole")
    for finished in (run_dir, tmp_path / "runs" / "whole"):  # resumed, and uninterrupted
        assert json.loads((finished / "manifest.json").read_text())["plugin_folders"] == [str(tmp_path.resolve())]
    # the run's own config.toml, run again from elsewhere (a study point checked against its run alone)
    again = fedsim(["run", str(run_dir / "config.toml"), "--quiet", "--set", f"run.out={tmp_path / 'again'}"], elsewhere)
    assert again.returncode == 0, again.stderr
    same_results(tmp_path / "again" / "m", tmp_path / "runs" / "whole")
    shown = fedsim(["config", "show", str(run_dir / "config.toml")], elsewhere)
    assert shown.returncode == 0 and "\n# the model: 1,210 parameters sent and averaged" in shown.stdout, shown.stdout


SCALED_FILE = """
from fedsim.algorithms import Strategy


class Scaled(Strategy):
    options = {"factor": 0.5}

    def aggregate(self, rnd, arrivals):
        if len(arrivals):
            self.apply_update(self.opt["factor"] * arrivals.deltas.mean(0))
"""


def test_a_comparison_stopped_before_its_plugin_algorithm_finishes_from_another_directory(tmp_path):
    """A comparison of fedavg and a plugin algorithm on a trace file beside the config, stopped
    in fedavg (the plugin not started): its config.toml names the trace absolutely and fedavg's
    manifest records the plugin's folder, so the printed resume finishes both from anywhere."""
    (tmp_path / "scaled.py").write_text(SCALED_FILE)
    trace = ["trace", "generate", "diurnal", "--devices", "8", "--days", "1", "--out", "t.parquet"]
    assert fedsim(trace, tmp_path).returncode == 0
    config = {**MODULE_RUN, "model": {"name": "logreg"}, "trace": {"source": "file", "path": "t.parquet"},
              "run": {**MODULE_RUN["run"], "name": "cmp", "algorithms": ["fedavg", "scaled:Scaled"]}}
    (tmp_path / "c.toml").write_text(dump_toml(config))
    assert fedsim(["run", "c.toml", "--quiet", "--set", "run.name=whole"], tmp_path).returncode == 0
    proc = signalled(["run", "c.toml"], tmp_path, "round", signal.SIGINT)
    assert proc.returncode == 130, proc.stderr
    cut = tmp_path / "runs" / "cmp"
    assert not (cut / "scaled.Scaled").exists()
    assert json.loads((cut / "fedavg" / "manifest.json").read_text())["plugin_folders"] == [str(tmp_path.resolve())]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = as_printed(hint(proc.stdout, "run"), elsewhere)
    assert done.returncode == 0, done.stderr
    for member in ("fedavg", "scaled.Scaled"):
        same_results(cut / member, tmp_path / "runs" / "whole" / member)
    # the test split, from another directory: the comparison's and the plugin's run's config name the plugin
    score = "import fedsim, sys; print(*(len(fedsim.test_data(f)[1]) for f in sys.argv[1:]))"
    scored = subprocess.run([sys.executable, "-c", score, str(cut), str(cut / "scaled.Scaled")], cwd=elsewhere,
                            env=environment(), capture_output=True, text=True, timeout=120)
    assert scored.returncode == 0 and scored.stdout.split() == ["450", "450"], scored.stderr


ASYNC = {"run": {"name": "a", "rounds": 12, "eval_every": 4, "progress": False, "plots": False},
         "data": {"dataset": "quadratic", "clients": 6},
         "trace": {"source": "markov", "mean_on": 12.0, "mean_off": 6.0, "days": 1.0},
         "client": {"local_steps": 3, "batch_size": 1},
         "devices": {"model": "lognormal", "seconds_per_sample": 1.0, "compute_sigma": 0.6},
         "server": {"timing": "model", "mode": "async", "concurrency": 4, "buffer": 2, "deadline": 4.0},
         "algorithm": {"name": "fedbuff"}}


def test_sigterm_stops_an_async_run_with_tasks_in_flight_and_the_printed_resume_finishes_it_identically(tmp_path):
    (tmp_path / "a.toml").write_text(dump_toml(ASYNC))
    assert fedsim(["run", "a.toml", "--quiet", "--set", "run.name=whole"], tmp_path).returncode == 0
    proc = signalled(["run", "a.toml"], tmp_path, "aggregation", signal.SIGTERM)
    assert proc.returncode == 143, proc.stderr
    assert proc.stderr == "stopping after this round (SIGTERM again to abort)\n"
    run_dir = tmp_path / "runs" / "a"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert (manifest["status"], manifest["rounds"]) == ("interrupted", 2)  # aggregation 1 finished
    dispatches = torch.load(run_dir / "checkpoint.pt", weights_only=False)["server"]["dispatches"]
    assert sum(int((~d["reported"]).sum()) for d in dispatches) > 0  # tasks in flight
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = as_printed(hint(proc.stdout, "run"), elsewhere)
    assert done.returncode == 0, done.stderr
    same_results(run_dir, tmp_path / "runs" / "whole")


STUDY = {"run": {"rounds": 4, "eval_every": 2, "progress": False, "plots": False},
         "data": {"dataset": "quadratic", "clients": 4},
         "server": {"timing": "ideal", "clients_per_round": 2},
         "sweep": {"run.seed": [0, 1], "algorithm.name": ["fedavg", "mifa"]}}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> pl.DataFrame:
    """The study's summary, uninterrupted."""
    folder = tmp_path_factory.mktemp("reference")
    (folder / "s.toml").write_text(dump_toml(STUDY))
    assert main(["sweep", str(folder / "s.toml"), "--quiet", "--set", f"run.out={folder}"]) == 0
    return pl.read_parquet(folder / "s" / "summary.parquet")


def interrupted_study(tmp_path: Path) -> tuple[str, Path]:
    """`fedsim sweep s.toml --set run.name=mine`, Ctrl-C in round 1: its printed resume command
    and its folder."""
    (tmp_path / "s.toml").write_text(dump_toml(STUDY))
    proc = signalled(["sweep", "s.toml", "--set", "run.name=mine"], tmp_path, "round", signal.SIGINT)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr == ("stopping: the 4 running points finish their round, then save their results "
                           "and checkpoint (Ctrl-C again to abort)\n")
    lines = [line.strip() for line in proc.stdout.splitlines()]
    assert [line for line in lines if line.endswith(" s)")] and \
        all(re.fullmatch(r".*: interrupted \(0/4, \d+ s\)", line) for line in lines if line.endswith(" s)"))
    assert "study interrupted by Ctrl-C (0 of 4 runs finished); run `" in proc.stdout
    return hint(proc.stdout, "sweep"), tmp_path / "runs" / "mine"


def test_an_interrupted_studys_report_says_so_and_its_plots_and_claims_wait_for_its_end(tmp_path, capsys, monkeypatch):
    """The report compares the points where they stopped and says so, with the command that
    finishes them (run here as printed, from another directory); plots and claims, which read
    the study's tables, are one line until then."""
    _, folder = interrupted_study(tmp_path)
    assert main(["report", str(folder)]) == 0
    line = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert re.fullmatch(r"unfinished: 4 of 4 points \(4 interrupted, after [\d-]+ rounds\), compared above where they "
                        r"stopped; `fedsim sweep --resume (.+)` finishes them", line), line
    for command in (["plot", str(folder)], ["report", str(folder), "--claims"]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {folder}: the study has not finished, and its ") and err.endswith(
            f": `fedsim sweep --resume {folder.resolve()}` finishes it; `fedsim report {folder.absolute()}` compares its points "
            "where they stopped\n"), err
        assert main(shlex.split(re.findall(r"`(fedsim report [^`]+)`", err)[0])[1:]) == 0  # as printed
        capsys.readouterr()
    monkeypatch.chdir(tmp_path.parent)
    assert main(shlex.split(re.search(r"`(fedsim sweep --resume .+)`", line).group(1))[1:] + ["--quiet"]) == 0
    assert main(["report", str(folder)]) == 0 and "unfinished" not in capsys.readouterr().out


def test_an_interrupted_study_finishes_by_its_printed_command_from_another_directory(tmp_path, reference):
    command, folder = interrupted_study(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = as_printed(command, elsewhere)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("resuming") == 4
    assert pl.read_parquet(folder / "summary.parquet").equals(reference)
    again = as_printed(command, tmp_path)  # finished: from the directory it was made in
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("done, skipped") == 4 and "results:" in again.stdout


def test_a_study_of_a_module_beside_it_finishes_by_its_printed_command_from_another_directory(tmp_path):
    """Each point records the folder its model's file was imported from; `fedsim sweep --resume`
    puts the folders its points recorded on the import path (before the study is read)."""
    (tmp_path / "mynet.py").write_text(MODULE_FILE)
    (tmp_path / "s.toml").write_text(dump_toml({**STUDY, "data": MODULE_RUN["data"], "model": MODULE_RUN["model"],
                                                "client": MODULE_RUN["client"]}))
    proc = signalled(["sweep", "s.toml", "--set", "run.name=mine"], tmp_path, "round", signal.SIGINT)
    assert proc.returncode == 130, proc.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = as_printed(hint(proc.stdout, "sweep"), elsewhere)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("resuming") == 4
    assert fedsim(["sweep", "s.toml", "--quiet", "--set", "run.name=whole"], tmp_path).returncode == 0
    assert pl.read_parquet(tmp_path / "runs" / "mine" / "summary.parquet").equals(
        pl.read_parquet(tmp_path / "runs" / "whole" / "summary.parquet"))
    # other seeds: a new study from this one, by the command fedsim prints, from elsewhere too
    refused = fedsim(["sweep", "--resume", str(tmp_path / "runs" / "mine"), "--set", "sweep.run.seed=[2]"], elsewhere)
    assert refused.returncode == 2
    command = re.search(r"new folder: `(fedsim sweep [^`]+)`", refused.stderr).group(1)
    again = as_printed(command, elsewhere)
    assert again.returncode == 0, again.stderr
    manifests = [json.loads(m.read_text()) for m in (tmp_path / "runs").glob("mine*/*/manifest.json")]
    assert len(manifests) == 6 and all(m["status"] == "completed" for m in manifests)
    # a resumed point records its folder again (for a resume of the new study, from anywhere)
    assert all(m["plugin_folders"] == [str(tmp_path.resolve())] for m in manifests)


def test_a_moved_study_folder_resumes_where_it_is_now(tmp_path, reference):
    command, folder = interrupted_study(tmp_path)
    moved = tmp_path / "archive" / "moved"
    moved.parent.mkdir()
    shutil.move(folder, moved)
    done = fedsim(["sweep", "--resume", str(moved.relative_to(tmp_path))], tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("study moved: 4 points in archive/moved")
    assert pl.read_parquet(moved / "summary.parquet").equals(reference)
    assert not folder.exists()
    for point in moved.glob("*_algorithm-*"):
        assert json.loads((point / "manifest.json").read_text())["status"] == "completed"


def test_resume_takes_a_study_folder_not_a_file(tmp_path, capsys):
    (tmp_path / "s.toml").write_text(dump_toml(STUDY))
    assert main(["sweep", "--resume", str(tmp_path / "s.toml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --resume {tmp_path / 's.toml'}: a file; --resume takes the folder of a "
                          "study") and err.count("\n") == 1
    assert not (tmp_path / "runs").exists()
    assert main(["sweep", "--resume", str(tmp_path / "nowhere")]) == 2
    assert "nowhere: no such folder; --resume takes the folder" in capsys.readouterr().err


def test_a_study_resumed_with_another_setting_is_one_line_naming_the_key(tmp_path, capsys):
    (tmp_path / "s.toml").write_text(dump_toml(STUDY))
    assert main(["sweep", str(tmp_path / "s.toml"), "--quiet", "--set", f"run.out={tmp_path}"]) == 0
    assert main(["sweep", "--resume", str(tmp_path / "s"), "--set", "client.lr=0.5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --set 'client.lr=0.5': client.lr cannot be changed when resuming")
    study = read_toml(tmp_path / "s.toml")
    study["client"] = {"lr": 0.5}
    (tmp_path / "s.toml").write_text(dump_toml(study))
    assert main(["sweep", str(tmp_path / "s.toml"), "--quiet", "--set", f"run.out={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "holds a different study (base.client.lr is unset in its study.toml, 0.5 in" in err
    command = re.search(r"run `(fedsim sweep --resume [^`]+)` to go on with it as it was, or give this one another "
                        r"\[run\] name\n$", err)[1]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = as_printed(command, elsewhere)
    assert done.returncode == 0 and "done, skipped" in done.stdout, done.stderr


def test_a_study_file_with_more_rounds_grows_the_study_and_says_so(tmp_path, capsys):
    (tmp_path / "s.toml").write_text(dump_toml(STUDY))
    assert main(["sweep", str(tmp_path / "s.toml"), "--quiet", "--set", f"run.out={tmp_path}"]) == 0
    rounds = STUDY["run"]["rounds"]
    capsys.readouterr()
    assert main(["sweep", str(tmp_path / "s.toml"), "--quiet", "--set", f"run.out={tmp_path}",
                 "--set", f"run.rounds={rounds + 2}"]) == 0
    assert capsys.readouterr().err == (
        f"note: {tmp_path / 's'}: {tmp_path / 's.toml'} gives run.rounds = {rounds + 2} (was {rounds}): the study's "
        "points go on to it from where they are, as `fedsim sweep --resume` with that --set would\n")
    assert {json.loads(m.read_text())["rounds"] for m in (tmp_path / "s").glob("*/manifest.json")} == {rounds + 2}


def test_resume_keys_reach_every_point_of_a_study_and_are_recorded(tmp_path, capsys):
    (tmp_path / "s.toml").write_text(dump_toml(STUDY))
    assert main(["sweep", str(tmp_path / "s.toml"), "--quiet", "--set", f"run.out={tmp_path}"]) == 0
    assert main(["sweep", "--resume", str(tmp_path / "s"), "--quiet", "--set", "run.rounds=20",
                 "--set", "run.max_time=600"]) == 0
    for point in (tmp_path / "s").glob("seed-*"):
        assert read_toml(point / "config.toml")["run"]["max_time"] == 600.0
        manifest = json.loads((point / "manifest.json").read_text())
        assert manifest["rounds"] == 10 and manifest["reason"].startswith("max_time 600 s reached")


def test_a_finished_study_resumed_with_a_later_max_time_and_new_targets_goes_on_and_times_them(tmp_path, capsys):
    """Points that max_time ended go on to the later one (as the study given it from the start
    ends, bit for bit: the round the first max_time cut short was not counted); targets given
    on resume reach the finished points' config.toml and the study's tables."""
    study = {"run": {"rounds": 500, "max_time": 8.0, "eval_every": 3, "progress": False, "plots": False,
                     "out": str(tmp_path)},
             "data": {"dataset": "digits", "clients": 30},
             "client": {"local_steps": 2, "batch_size": 16},
             "server": {"timing": "model", "clients_per_round": 6, "overcommit": 0.5, "deadline": 1.2},
             "devices": {"model": "lognormal", "seconds_per_sample": 0.01, "compute_sigma": 1.0},
             "trace": {"source": "markov", "mean_on": 4.0, "mean_off": 4.0, "days": 0.01},
             "sweep": {"algorithm.name": ["fedavg", "mifa"]}}
    for name, max_time in (("cut", 8.0), ("whole", 16.0)):
        (tmp_path / f"{name}.toml").write_text(dump_toml({**study, "run": {**study["run"], "name": name,
                                                                            "max_time": max_time}}))
        assert main(["sweep", str(tmp_path / f"{name}.toml"), "--quiet"]) == 0
    assert main(["sweep", "--resume", str(tmp_path / "cut"), "--quiet", "--set", "run.max_time=16",
                 "--set", "run.targets=[0.3]"]) == 0
    for point in ("algorithm-fedavg", "algorithm-mifa"):
        same_results(tmp_path / "cut" / point, tmp_path / "whole" / point)
    assert main(["sweep", "--resume", str(tmp_path / "cut"), "--quiet", "--set", "run.targets=[0.3, 0.4]"]) == 0
    for point in ("algorithm-fedavg", "algorithm-mifa"):
        assert read_toml(tmp_path / "cut" / point / "config.toml")["run"]["targets"] == [0.3, 0.4]
    summary = pl.read_parquet(tmp_path / "cut" / "summary.parquet")
    assert {"time_to_0.3_s_mean", "time_to_0.4_s_mean"} <= set(summary.columns)
    capsys.readouterr()
    assert main(["report", str(tmp_path / "cut")]) == 0 and "time to 40%" in capsys.readouterr().out


def ctrl_c_in_round(config_toml: Path, rnd: int, monkeypatch) -> None:
    """`fedsim run CONFIG --quiet` with a Ctrl-C as round `rnd` is recorded (exit 130)."""
    from fedsim.results.recorder import Recorder

    add_round = Recorder.add_round

    def sigint(self, outcome, *args):
        if outcome.round == rnd:
            signal.raise_signal(signal.SIGINT)
        return add_round(self, outcome, *args)

    monkeypatch.setattr(Recorder, "add_round", sigint)
    assert main(["run", str(config_toml), "--quiet"]) == 130
    monkeypatch.setattr(Recorder, "add_round", add_round)


def test_resume_keys_reach_every_algorithm_of_a_comparison_and_are_recorded(tmp_path, monkeypatch, capsys):
    """Interrupted in its first algorithm, a comparison resumed with a time limit applies it to
    both: the one that was interrupted too, and each config.toml records it."""
    config = {**RUN, "run": {**RUN["run"], "rounds": 30, "algorithms": ["fedavg", "mifa"],
                             "out": str(tmp_path / "runs")}}
    (tmp_path / "c.toml").write_text(dump_toml(config))
    ctrl_c_in_round(tmp_path / "c.toml", 15, monkeypatch)
    cut = tmp_path / "runs" / "r"
    assert json.loads((cut / "fedavg" / "manifest.json").read_text())["rounds"] == 16
    assert main(["run", "--resume", str(cut), "--quiet", "--set", "run.max_time=1200"]) == 0
    assert read_toml(cut / "config.toml")["run"]["max_time"] == 1200.0
    for algorithm in ("fedavg", "mifa"):
        assert read_toml(cut / algorithm / "config.toml")["run"]["max_time"] == 1200.0
        manifest = json.loads((cut / algorithm / "manifest.json").read_text())
        assert manifest["sim_time_s"] <= 1200.0 + 60.0, algorithm  # fedavg had reached 16 x 60 s
        assert manifest["reason"].startswith("max_time 1200 s reached"), manifest["reason"]


def test_a_sweep_refuses_a_point_folder_that_another_process_holds(tmp_path, capsys):
    (tmp_path / "s.toml").write_text(dump_toml(STUDY))
    point = tmp_path / "s" / "seed-0_algorithm-fedavg"
    point.mkdir(parents=True)
    (point / "config.toml").write_text("# the other process's\n")
    holder = DirectoryLock(point)
    holder.acquire("fedsim run")
    try:
        assert main(["sweep", str(tmp_path / "s.toml"), "--quiet", "--set", f"run.out={tmp_path}"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {point}: in use by process {os.getpid()}") and err.count("\n") == 1
        assert sorted(p.name for p in point.iterdir()) == [".lock", "config.toml"]
        assert (point / "config.toml").read_text() == "# the other process's\n"
        assert not [p for p in (tmp_path / "s").iterdir() if p.is_dir() and p != point]
    finally:
        holder.release()
    assert main(["sweep", str(tmp_path / "s.toml"), "--quiet", "--set", f"run.out={tmp_path}"]) == 0


def test_a_signal_while_the_run_writes_its_first_files_stops_it_before_its_first_round(tmp_path):
    (tmp_path / "r.toml").write_text(dump_toml(RUN))
    proc = signalled(["run", "r.toml"], tmp_path, "fedsim.runs.experiment.remove_stale_temporaries", signal.SIGTERM,
                      after=0.5)
    assert proc.returncode == 143, proc.stderr
    run_dir = tmp_path / "runs" / "r"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert (manifest["status"], manifest["rounds"], manifest["reason"]) == \
        ("interrupted", 0, "interrupted by SIGTERM before round 0")
    done = as_printed(hint(proc.stdout, "run"), tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads((run_dir / "manifest.json").read_text())["rounds"] == 6


def test_run_resume_of_a_study_folder_prints_the_sweep_that_resumes_it_and_that_runs_as_printed(tmp_path, capsys):
    (tmp_path / "s.toml").write_text(dump_toml({**STUDY, "run": {**STUDY["run"], "out": str(tmp_path / "runs")}}))
    assert main(["sweep", str(tmp_path / "s.toml"), "--quiet"]) == 0
    folder = tmp_path / "runs" / "s"
    capsys.readouterr()
    assert main(["run", "--resume", str(folder), "--set", "run.rounds=6"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a study's folder, which `fedsim sweep` resumes" in err, err
    printed = re.findall(r"run `(fedsim sweep --resume [^`]+)`", err)
    assert printed == [f"fedsim sweep --resume {folder} --set run.rounds=6"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = as_printed(printed[0], elsewhere)
    assert done.returncode == 0, done.stderr
    assert pl.read_parquet(folder / "seed-0_algorithm-fedavg" / "rounds.parquet").height == 6


def test_sigterm_cuts_an_async_aggregation_that_goes_on_a_deadline_past_it_and_the_resume_goes_on_identically(tmp_path):
    """Two tasks at a time for a buffer of four: an aggregation takes at least two waves, longer than
    the deadline the signal gives it, so it is cut where it is (an aggregation whose updates never
    came would never end); the resume goes on from inside it."""
    config = {**ASYNC, "server": {**ASYNC["server"], "concurrency": 2, "buffer": 4}}
    (tmp_path / "a.toml").write_text(dump_toml(config))
    assert fedsim(["run", "a.toml", "--quiet", "--set", "run.name=whole"], tmp_path).returncode == 0
    proc = signalled(["run", "a.toml"], tmp_path, "aggregation", signal.SIGTERM)
    assert proc.returncode == 143, proc.stderr
    run_dir = tmp_path / "runs" / "a"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert (manifest["status"], manifest["rounds"]) == ("interrupted", 1), manifest  # aggregation 1 cut
    assert manifest["reason"].startswith("interrupted by SIGTERM (aggregation 1 unfinished: "), manifest["reason"]
    assert "\nfedavg" not in proc.stdout and "fedbuff: interrupted by SIGTERM (aggregation 1 unfinished" in proc.stdout
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = as_printed(hint(proc.stdout, "run"), elsewhere)
    assert done.returncode == 0, done.stderr
    same_results(run_dir, tmp_path / "runs" / "whole")


def test_a_run_whose_output_goes_to_a_file_prints_progress_lines_not_bars(tmp_path):
    """No terminal (a log file, a batch job): a line at every tenth of the rounds on stdout, and
    no progress bar's carriage returns in either stream."""
    config = {**STUDY, "run": {**STUDY["run"], "rounds": 20, "progress": True, "name": "logged"}}
    config.pop("sweep")
    (tmp_path / "c.toml").write_text(dump_toml(config))
    done = fedsim(["run", "c.toml"], tmp_path)
    assert done.returncode == 0 and "\r" not in done.stdout + done.stderr, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("  fedavg: ")]
    assert [line.split()[1] for line in lines] == [f"{k}/20" for k in range(2, 21, 2)], done.stdout
    assert all(re.fullmatch(r"  fedavg: \d+/20 rounds \(simulated [0-9.]+(s|min|h), test acc -\)", line)
               for line in lines)  # (the quadratic task: no accuracy), the time as the tables write it
    resumed = fedsim(["run", "--resume", "runs/logged", "--set", "run.rounds=30"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    lines = [line for line in resumed.stdout.splitlines() if line.startswith("  fedavg: ")]
    assert [line.split()[1] for line in lines] == ["21/30", "22/30", "23/30", "24/30", "25/30", "26/30", "27/30",
                                                   "28/30", "29/30", "30/30"], resumed.stdout


def test_a_plugins_bug_mid_run_ends_its_traceback_with_the_resume_that_goes_on_once_fixed(tmp_path):
    """A traceback (exit 1) for a bug, whose last line says what the run keeps and how to go on;
    fixed, that command (run as printed, from another directory) ends the run as an undisturbed one."""
    (tmp_path / "fragile.py").write_text(SCALED_FILE.replace(
        "        if len(arrivals):", "        if rnd == 4 and self.opt['factor'] == 0.5:\n"
                                    "            raise ValueError('boom')\n        if len(arrivals):"))
    config = {**MODULE_RUN, "model": {"name": "logreg"}, "algorithm": {"name": "fragile:Scaled"},
              "run": {**MODULE_RUN["run"], "checkpoint_every": 3}}
    (tmp_path / "c.toml").write_text(dump_toml(config))
    failed = fedsim(["run", "c.toml", "--quiet"], tmp_path)
    assert failed.returncode == 1 and "ValueError: boom\n" in failed.stderr
    run_dir = tmp_path / "runs" / "m"
    command = f"fedsim run --resume {run_dir}"
    assert failed.stderr.endswith(f"fedsim: the run stopped; runs/m keeps its last checkpoint: fix that, then run "
                                  f"`{command}` to go on\n"), failed.stderr
    (tmp_path / "fragile.py").write_text((tmp_path / "fragile.py").read_text().replace("rnd == 4", "rnd == -1"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = as_printed(command, elsewhere)
    assert done.returncode == 0, done.stderr
    assert fedsim(["run", "c.toml", "--quiet", "--set", "run.name=whole"], tmp_path).returncode == 0
    same_results(run_dir, tmp_path / "runs" / "whole")
    # a bug in the first round: nothing kept, so the next run takes the name
    (tmp_path / "fragile.py").write_text((tmp_path / "fragile.py").read_text().replace("rnd == -1", "rnd == 0"))
    early = fedsim(["run", "c.toml", "--quiet", "--set", "run.name=early"], tmp_path)
    assert early.returncode == 1
    assert early.stderr.endswith(f"fedsim: the run stopped (nothing was kept: runs/early removed)\n"), early.stderr
    assert not (tmp_path / "runs" / "early").exists()


@pytest.mark.parametrize("command", ["run", "sweep"])
def test_a_reader_that_goes_away_ends_the_lines_not_the_work(tmp_path, command):
    """`fedsim run | head -1`: the run goes on to its end (exit 0, its files complete); a study too."""
    config = {**MODULE_RUN, "model": {"name": "logreg"}, "run": {**MODULE_RUN["run"], "rounds": 30, "name": "piped"}}
    if command == "sweep":
        config["sweep"] = {"run.seed": [0, 1]}
    (tmp_path / "c.toml").write_text(dump_toml(config))
    shell = f"{shlex.quote(sys.executable)} -m fedsim {command} c.toml | head -1; exit ${{PIPESTATUS[0]}}"
    proc = subprocess.run(["bash", "-c", shell], cwd=tmp_path, env=environment(), capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0 and proc.stdout.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    runs = [tmp_path / "runs" / "piped"] if command == "run" else \
        [tmp_path / "runs" / "piped" / f"seed-{seed}" for seed in (0, 1)]
    assert all(json.loads((r / "manifest.json").read_text())["status"] == "completed" for r in runs)
    assert command == "run" or (tmp_path / "runs" / "piped" / "summary.parquet").exists()


def test_ctrl_c_as_a_studys_points_save_stops_it_there_and_its_resume_draws_what_was_left(tmp_path, capsys,
                                                                                       monkeypatch):
    """The points had done their rounds when Ctrl-C came (as the first of them saved): the others
    save without drawing their plots, the study stops before its tables (exit 130), and the
    printed resume draws the plots left out and the tables."""
    from fedsim.runs.experiment import Experiment

    end, ended = Experiment.end, []

    def end_then_ctrl_c(self, *args, **kwargs):
        if not ended:
            os.kill(os.getpid(), signal.SIGINT)
        ended.append(self.run_dir.name)
        return end(self, *args, **kwargs)

    monkeypatch.setattr(Experiment, "end", end_then_ctrl_c)
    study = {**STUDY, "run": {**STUDY["run"], "plots": True}}
    (tmp_path / "s.toml").write_text(dump_toml(study))
    assert main(["sweep", str(tmp_path / "s.toml"), "--quiet", "--set", f"run.out={tmp_path}"]) == 130
    out = capsys.readouterr().out
    folder = tmp_path / "s"
    assert f"study interrupted by Ctrl-C (4 of 4 runs finished); run `fedsim sweep --resume {folder}` to finish it" in out
    assert [(folder / name / "plots").is_dir() for name in ended] == [True, False, False, False]
    assert {json.loads(m.read_text())["status"] for m in folder.glob("*/manifest.json")} == {"completed"}
    assert not (folder / "summary.parquet").exists()
    monkeypatch.setattr(Experiment, "end", end)
    (tmp_path / "elsewhere").mkdir()
    done = as_printed(hint(out, "sweep"), tmp_path / "elsewhere")
    assert done.returncode == 0, done.stderr
    assert all((folder / name / "plots" / "accuracy_vs_rounds.png").is_file() for name in ended)
    assert (folder / "summary.parquet").is_file()


def test_a_resumed_runs_progress_lines_start_from_its_last_accuracy(tmp_path):
    """Resumed after round 4 (evaluated), round 5 (not evaluated) shows round 4's accuracy, not '-'."""
    config = {"run": {"rounds": 4, "eval_every": 2, "progress": True, "plots": False, "name": "acc"},
              "data": {"dataset": "digits", "clients": 10}, "server": {"timing": "ideal", "clients_per_round": 5},
              "client": {"local_steps": 2, "batch_size": 8}}
    (tmp_path / "c.toml").write_text(dump_toml(config))
    assert fedsim(["run", "c.toml"], tmp_path).returncode == 0
    last = pl.read_parquet(tmp_path / "runs" / "acc" / "rounds.parquet")["test_acc"][-1]
    resumed = fedsim(["run", "--resume", "runs/acc", "--set", "run.rounds=6"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    lines = [line for line in resumed.stdout.splitlines() if line.startswith("  fedavg: ")]
    assert lines[0].startswith("  fedavg: 5/6 rounds (simulated ") and lines[0].endswith(
        f", test acc {100 * last:.1f}%)"), resumed.stdout
