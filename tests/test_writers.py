"""One writer per run directory: runs started together get directories of their own, and a
run directory in use refuses a second writer with one line naming the holder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import quadratic_config  # noqa: E402

from fedsim.cli import main  # noqa: E402
from fedsim.config import dump_toml  # noqa: E402
from fedsim.files import DirectoryLock, claim_directory  # noqa: E402


def test_claiming_a_taken_directory_takes_the_next_name(tmp_path):
    first, second = claim_directory(tmp_path / "runs" / "x"), claim_directory(tmp_path / "runs" / "x")
    assert (first.name, second.name) == ("x", "x-2") and first.is_dir() and second.is_dir()


def test_two_runs_started_together_with_one_name_keep_both_results(tmp_path):
    config = quadratic_config([[1.0, 0.0], [0.0, 1.0]], rounds=300)
    config["run"].update(name="same", out=str(tmp_path / "runs"), progress=False, plots=False)
    (tmp_path / "c.toml").write_text(dump_toml(config))
    procs = [subprocess.Popen([sys.executable, "-m", "fedsim", "run", str(tmp_path / "c.toml"), "--quiet"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    dirs = sorted(line.split(": ", 1)[1] for out, _ in outs for line in out.splitlines()
                  if line.startswith("run directory: "))
    assert [Path(d).name for d in dirs] == ["same", "same-2"]
    for d in dirs:
        assert json.loads((Path(d) / "manifest.json").read_text())["status"] == "completed"


def test_a_run_directory_in_use_refuses_a_second_writer(cli_run, capsys):
    config = quadratic_config([[1.0, 0.0], [0.0, 1.0]], rounds=4)
    run_dir = cli_run(config)
    lock = DirectoryLock(run_dir)
    lock.acquire("a test")
    try:
        assert main(["run", "--resume", str(run_dir), "--set", "run.rounds=8", "--quiet"]) == 2
        out, err = capsys.readouterr()
        assert err == f"error: {run_dir}: in use by process {os.getpid()} on {os.uname().nodename} " \
                      "(a test); wait until it ends (or stop it), then try again\n"
        assert "resuming" not in out  # (nor "it crashed": another process runs it)
    finally:
        lock.release()
    assert main(["run", "--resume", str(run_dir), "--set", "run.rounds=8", "--quiet"]) == 0


def test_a_run_killed_before_any_periodic_checkpoint_resumes_and_says_it_crashed(cli_run, monkeypatch, capsys):
    """A hard stop (a second Ctrl-C) in round 3 of a run without periodic checkpoints: the
    checkpoint written before round 1 makes it resumable; its manifest says `running` while it
    goes, the report and the resume call it crashed; stale temporaries go at the resume."""
    import polars as pl
    import torch

    from fedsim.results.recorder import Recorder

    config = quadratic_config([[1.0, 0.0], [0.0, 2.0], [3.0, 1.0]], rounds=8, algorithm="mifa")
    whole = cli_run(config, name="whole")
    add_round = Recorder.add_round

    def abort_in_round_3(self, outcome, *args):
        if outcome.round == 3:
            raise KeyboardInterrupt
        return add_round(self, outcome, *args)

    monkeypatch.setattr(Recorder, "add_round", abort_in_round_3)
    cut = cli_run(config, name="cut", expect=130)
    monkeypatch.setattr(Recorder, "add_round", add_round)
    manifest = json.loads((cut / "manifest.json").read_text())
    assert manifest["status"] == "running" and manifest["rounds"] == 0 and manifest["pid"] == os.getpid()
    (cut / ".rounds.parquet.abc.tmp.parquet").write_bytes(b"half a file")
    capsys.readouterr()
    assert main(["report", str(cut), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["runs"][0]["status"] == "crashed (last checkpoint at round 0)"
    assert main(["run", "--resume", str(cut), "--quiet"]) == 0
    assert f"resuming {cut}: it crashed (last checkpoint at round 0)" in capsys.readouterr().out
    assert not list(cut.glob(".*.tmp*"))
    assert json.loads((cut / "manifest.json").read_text())["status"] == "completed"
    columns = ["round", "arrived", "train_loss", "test_loss"]
    assert pl.read_parquet(cut / "rounds.parquet")[columns].equals(pl.read_parquet(whole / "rounds.parquet")[columns])
    assert torch.equal(torch.load(cut / "model.pt")["x"], torch.load(whole / "model.pt")["x"])


def test_a_loss_far_above_the_start_is_divergence_and_a_diverged_run_resumes_only_by_force(cli_run, capsys):
    config = {"run": {"rounds": 6, "eval_every": 3}, "data": {"dataset": "digits", "clients": 10},
              "client": {"local_steps": 2, "batch_size": 8, "lr": 1e6}}
    run_dir = cli_run(config, expect=3)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    limit = 1000 * manifest["initial"]["test_loss"]
    assert manifest["status"] == "diverged" and manifest["rounds"] == 1
    assert manifest["reason"].startswith("training loss ") and f"above [run] diverge_loss {limit:.4g} after 1 round" \
        in manifest["reason"]
    assert main(["run", "--resume", str(run_dir), "--quiet"]) == 2
    assert "the run diverged (training loss" in capsys.readouterr().err
    assert main(["run", "--resume", str(run_dir), "--set", "run.diverge_loss=0", "--force", "--quiet"]) == 2
    assert "run.diverge_loss cannot be changed when resuming" in capsys.readouterr().err
    assert main(["run", "--resume", str(run_dir), "--force", "--quiet"]) == 3  # and diverges again
    off = cli_run({**config, "run": {**config["run"], "diverge_loss": 0}}, name="off")
    assert json.loads((off / "manifest.json").read_text())["status"] == "completed"


def test_a_diverged_comparison_resumes_its_diverged_runs_only_by_force(cli_run, capsys):
    config = {"run": {"rounds": 6, "eval_every": 3, "algorithms": ["fedavg", "mifa"]},
              "data": {"dataset": "digits", "clients": 10}, "client": {"local_steps": 2, "batch_size": 8, "lr": 1e6}}
    run_dir = cli_run(config, expect=3)
    assert main(["run", "--resume", str(run_dir), "--quiet"]) == 3
    err = capsys.readouterr().err
    for name in ("fedavg", "mifa"):
        assert (f"note: {run_dir / name}: the run diverged (training loss " in err and
                f"so it stays as it ended; resume it anyway with `fedsim run --resume {run_dir.absolute()} --force`" in err)
        assert json.loads((run_dir / name / "manifest.json").read_text())["rounds"] == 1
    from test_stop_and_resume import as_printed

    assert as_printed(f"fedsim run --resume {run_dir.absolute()} --force", Path("/")).returncode == 3  # (later)
    assert all(json.loads((run_dir / name / "manifest.json").read_text())["rounds"] > 1 for name in ("fedavg", "mifa"))


def comparison_config():
    config = quadratic_config([[1.0, 0.0], [0.0, 2.0], [3.0, 1.0]], rounds=10)
    config["run"]["algorithms"] = ["fedavg", "mifa", "fedau"]
    config["trace"] = {"source": "bernoulli", "p": [0.9, 0.6, 0.4]}
    return config


def same_summary(a, b) -> bool:
    import polars as pl

    columns = ["algorithm", "status", "rounds", "final_test_loss"]
    return pl.read_parquet(a / "summary.parquet")[columns].equals(pl.read_parquet(b / "summary.parquet")[columns])


def test_a_comparison_stopped_between_algorithms_resumes_as_a_whole(cli_run, monkeypatch, capsys):
    import signal

    from fedsim.runs.experiment import Experiment

    whole = cli_run(comparison_config(), name="whole")
    end = Experiment.end

    def end_then_sigterm(self):
        result = end(self)
        if self.config.algorithm.name == "fedavg":
            signal.raise_signal(signal.SIGTERM)  # after the first algorithm, before the second
        return result

    monkeypatch.setattr(Experiment, "end", end_then_sigterm)
    cut = cli_run(comparison_config(), name="cut", expect=143)
    monkeypatch.setattr(Experiment, "end", end)
    assert "\nnot started: mifa, fedau\n" in cli_run.last_output.out
    assert (cut / "fedavg" / "manifest.json").exists() and not (cut / "mifa").exists()
    assert (cut / "summary.parquet").exists() and (cut / "config.toml").exists()
    assert main(["run", "--resume", str(cut), "--quiet"]) == 0
    assert same_summary(cut, whole)
    assert main(["run", "--resume", str(cut), "--quiet"]) == 0  # nothing left: the same again
    assert same_summary(cut, whole)


def test_a_comparison_stopped_inside_an_algorithm_resumes_as_a_whole(cli_run, monkeypatch):
    import signal

    from fedsim.results.recorder import Recorder

    whole = cli_run(comparison_config(), name="whole")
    add_round, seen = Recorder.add_round, {"n": 0}

    def sigint_in_mifa(self, outcome, *args):
        row = add_round(self, outcome, *args)
        seen["n"] += 1
        if seen["n"] == 10 + 4:  # round 4 of the second algorithm
            signal.raise_signal(signal.SIGINT)
        return row

    monkeypatch.setattr(Recorder, "add_round", sigint_in_mifa)
    cut = cli_run(comparison_config(), name="cut", expect=130)
    monkeypatch.setattr(Recorder, "add_round", add_round)
    table = [line for line in cli_run.last_output.out.splitlines() if line.startswith(("algorithm ", "---", "fedavg ",
                                                                                        "mifa "))]
    assert len(table) == 4 and "interrupted" in table[-1] and len({len(line) for line in table}) == 1, table
    assert main(["run", "--resume", str(cut), "--quiet"]) == 0
    assert same_summary(cut, whole)


def test_resume_of_a_missing_directory_says_so(capsys, tmp_path):
    assert main(["run", "--resume", str(tmp_path / "nope"), "--quiet"]) == 2
    assert capsys.readouterr().err == (f"error: {tmp_path / 'nope'}: no such run directory; give the "
                                       "folder that `fedsim run` printed after 'run directory:'\n")


def test_trace_generate_keeps_an_existing_file_unless_forced(tmp_path, capsys):
    out = tmp_path / "t.parquet"
    out.write_bytes(b"precious")
    args = ["trace", "generate", "always", "--devices", "3", "--days", "1", "--out", str(out)]
    assert main(args) == 2
    assert capsys.readouterr().err == (f"error: --out {out}: the file exists; give another path, or "
                                       "--force to overwrite it\n")
    assert out.read_bytes() == b"precious"
    assert main([*args, "--force"]) == 0 and out.read_bytes() != b"precious"


def test_a_partition_on_the_quadratic_task_is_refused(cli_run):
    config = quadratic_config([[1.0, 0.0], [0.0, 1.0]], rounds=2)
    config["data"]["partition"] = "dirichlet"
    cli_run(config, expect=2)
    assert "[data] partition = 'dirichlet' does not apply to the quadratic task" in cli_run.last_output.err


def test_damaged_files_and_a_replaced_trace_are_one_line(cli_run, capsys, tmp_path):
    import torch

    from fedsim.traces import Trace, write_trace

    config = quadratic_config([[1.0, 0.0], [0.0, 1.0]], rounds=4)
    trace = Trace.from_intervals([0, 1], [0.0, 0.0], [100.0, 100.0], n_devices=2, horizon=100.0)
    run_dir = cli_run(config, trace, name="t")
    write_trace(Trace.from_intervals([0, 1], [0.0, 0.0], [50.0, 100.0], n_devices=2, horizon=100.0),
                cli_run.tmp / "t.parquet")  # the file the run replays, replaced
    assert main(["run", "--resume", str(run_dir), "--set", "run.rounds=8", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "the trace file changed since the run started" in err and err.count("\n") == 1
    torch.save({"round": 4}, run_dir / "checkpoint.pt")
    assert main(["run", "--resume", str(run_dir), "--quiet"]) == 2
    assert "not a fedsim checkpoint (no sim_time, strategy, recorder, host_s)" in capsys.readouterr().err
    rounds_file = run_dir / "rounds.parquet"
    rounds_file.write_bytes(rounds_file.read_bytes()[: len(rounds_file.read_bytes()) // 2])
    assert main(["plot", str(run_dir)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {rounds_file}: not a readable Parquet file")
    assert main(["trace", "convert", "--from", "csv", str(tmp_path), "--out", str(tmp_path / "o.parquet")]) == 2
    assert "is a folder; give the file to convert" in capsys.readouterr().err


NO_SPACE = ("no space left on device (the file needs {needed}, {free} free; the earlier file, if any, is intact); "
            "free some space, then run the command again")


def test_a_full_disk_is_one_line_saying_how_much_the_file_needs(tmp_path, monkeypatch):
    import errno
    import shutil
    from collections import namedtuple

    import pytest

    from fedsim.errors import FedsimError
    from fedsim.files import atomic_write

    target = tmp_path / "rounds.parquet"
    target.write_bytes(b"earlier")
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda folder: usage(10**9, 10**9 - 2500, 2500))

    def disk_full(tmp):  # fills the disk when given the temporary file, not when counted
        tmp.write_bytes(b"y" * 1_234_567)
        if isinstance(tmp, Path):
            raise OSError(errno.ENOSPC, "No space left on device")

    def paths_only(tmp):  # cannot be counted: what it wrote before the disk filled is a bound
        Path(tmp).write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    for write, needed in ((disk_full, "1.23 MB"), (paths_only, "more than 4 bytes")):
        with pytest.raises(FedsimError) as err:
            atomic_write(target, write)
        assert str(err.value) == f"{target}: " + NO_SPACE.format(needed=needed, free="2.5 kB")
        assert target.read_bytes() == b"earlier" and sorted(p.name for p in tmp_path.iterdir()) == ["rounds.parquet"]

    def refused(tmp):
        raise PermissionError(errno.EACCES, "Permission denied")

    with pytest.raises(FedsimError) as err:
        atomic_write(target, refused)
    assert str(err.value) == (f"{target}: cannot write it (Permission denied); check the folder's "
                              "permissions (the earlier file, if any, is intact)")


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs at tmp_path/disk (root only; skipped where it cannot be mounted)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)],
                                           capture_output=True).returncode != 0:
        pytest.skip("a real disk-full test needs root and `mount -t tmpfs`")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_run_on_a_full_disk_stops_with_one_line_and_resumes_once_there_is_space(cli_run, small_disk, capsys):
    """A run of 4 rounds fits on the 1 MiB disk; going on to 8 needs a second checkpoint.pt
    (487 kB) beside the first, which does not fit: one line, exit 2, the checkpoint, model and
    events of round 4 untouched, no temporary file left, the run shown as crashed after its
    checkpoint at round 4; with space, the resume completes as if the disk had never filled."""
    import hashlib
    import re

    import polars as pl
    import torch

    config = quadratic_config([[0.0] * 20000] * 3, rounds=4, algorithm="mifa")
    config["data"].pop("targets")
    config["data"]["dim"] = 20000
    whole = cli_run({**config, "run": {**config["run"], "rounds": 8}}, name="whole")
    run_dir = cli_run({**config, "run": {**config["run"], "out": str(small_disk)}}, name="full")
    kept = {name: hashlib.sha256((run_dir / name).read_bytes()).hexdigest()
            for name in ("checkpoint.pt", "model.pt", "events.parquet")}
    assert main(["run", "--resume", str(run_dir), "--set", "run.rounds=8", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(re.escape(f"error: {run_dir / 'checkpoint.pt'}: ") + re.escape(NO_SPACE).replace(
        r"\{needed\}", r"48\d kB").replace(r"\{free\}", r"4\d\d kB") + "\n", err), err
    assert kept == {name: hashlib.sha256((run_dir / name).read_bytes()).hexdigest() for name in kept}
    assert not list(run_dir.glob(".*.tmp*"))
    assert main(["report", str(run_dir), "--json"]) == 0  # the resume said `running` from its start
    assert json.loads(capsys.readouterr().out)["runs"][0]["status"] == "crashed (last checkpoint at round 4)"
    subprocess.run(["mount", "-o", "remount,size=4m", str(small_disk)], check=True)
    assert main(["run", "--resume", str(run_dir), "--set", "run.rounds=8", "--quiet"]) == 0
    columns = ["round", "arrived", "train_loss", "test_loss"]
    assert pl.read_parquet(run_dir / "rounds.parquet")[columns].equals(pl.read_parquet(whole / "rounds.parquet")[columns])
    assert torch.equal(torch.load(run_dir / "model.pt")["x"], torch.load(whole / "model.pt")["x"])


def test_trace_generate_on_a_full_disk_names_its_output(small_disk, capsys):
    (small_disk / "filler").write_bytes(b"\0" * (1024 * 1024 - 64 * 1024))
    out = small_disk / "t.parquet"
    argv = ["trace", "generate", "diurnal", "--devices", "2000", "--days", "7", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {out}: no space left on device (the file needs ") and err.count("\n") == 1
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]


def test_resume_without_config_toml_says_what_is_missing(cli_run, capsys):
    run_dir = cli_run(quadratic_config([[1.0, 0.0], [0.0, 1.0]], rounds=2))
    (run_dir / "config.toml").unlink()
    assert main(["run", "--resume", str(run_dir), "--quiet"]) == 2
    assert capsys.readouterr().err.startswith(f"error: {run_dir / 'config.toml'}: missing, so the run's settings")


def test_a_comparison_folder_has_one_writer(cli_run, monkeypatch, capsys):
    """The top folder of a comparison is locked for the whole comparison: a --resume of it
    while the comparison runs (here, from inside its second algorithm) gets the one line
    naming the holder, and nothing of the comparison is lost."""
    from fedsim.runs.experiment import Experiment

    whole = cli_run(comparison_config(), name="whole")
    top = cli_run.tmp / "runs" / "cmp"
    end, refusals = Experiment.end, []

    def end_and_try_a_second_writer(self):
        if self.config.algorithm.name == "mifa":
            refusals.append(main(["run", "--resume", str(top), "--quiet"]))
            seen = capsys.readouterr()
            print(seen.out, end="")  # the comparison's own output, for cli_run
            refusals.append(seen.err)
        return end(self)

    monkeypatch.setattr(Experiment, "end", end_and_try_a_second_writer)
    assert cli_run(comparison_config(), name="cmp") == top
    assert refusals == [2, f"error: {top}: in use by process {os.getpid()} on {os.uname().nodename} "
                           "(fedsim run, a comparison); wait until it ends (or stop it), then try again\n"]
    assert same_summary(top, whole)
    lock = DirectoryLock(top)
    lock.acquire("a test")
    try:
        assert main(["run", "--resume", str(top), "--quiet"]) == 2
        assert capsys.readouterr().err.startswith(f"error: {top}: in use by process {os.getpid()}")
    finally:
        lock.release()
    assert main(["run", "--resume", str(top), "--quiet"]) == 0 and same_summary(top, whole)
