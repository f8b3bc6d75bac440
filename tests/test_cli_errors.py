"""Bad input: one clear line on stderr, exit status 2, no traceback, nothing written."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fedsim.cli import main


def fails(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


def write(tmp_path, text: str, name: str = "c.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_unknown_key_suggests_the_nearest(tmp_path, capsys):
    err = fails(capsys, ["run", write(tmp_path, "[client]\nlocal_step = 3\n")])
    assert "unknown key [client] local_step" in err and "did you mean 'local_steps'" in err
    assert str(tmp_path / "c.toml") in err


def test_unknown_section_and_override(tmp_path, capsys):
    err = fails(capsys, ["run", write(tmp_path, "[clients]\nlr = 0.1\n")])
    assert "unknown section [clients]" in err and "'client'" in err
    err = fails(capsys, ["run", "quickstart", "--set", "server.dedline=5"])
    assert "did you mean 'deadline'" in err


def test_wrong_type_and_bad_choice(tmp_path, capsys):
    err = fails(capsys, ["run", write(tmp_path, "[run]\nrounds = 'many'\n")])
    assert "[run] rounds" in err and "expected an integer" in err
    err = fails(capsys, ["run", write(tmp_path, "[server]\ntiming = 'real'\n")])
    assert "one of: model, ideal" in err
    err = fails(capsys, ["run", write(tmp_path, "[client]\nlr = -1\n")])
    assert "[client] lr = -1.0 must be > 0" in err
    err = fails(capsys, ["run", write(tmp_path, "[client]\nlocal_steps = 0\n")])
    assert "[client] local_steps = 0 must be >= 1" in err


def test_unknown_algorithm_lists_the_valid_ones(tmp_path, capsys):
    err = fails(capsys, ["run", write(tmp_path, "[algorithm]\nname = 'fedavgg'\n")])
    assert "unknown algorithm 'fedavgg'" in err and "fedavg" in err and "mifa" in err


def test_missing_files(tmp_path, capsys):
    err = fails(capsys, ["run", str(tmp_path / "nope.toml")])
    assert "nope.toml" in err and "no such file" in err
    cfg = write(tmp_path, f"[trace]\nsource = 'file'\npath = '{tmp_path / 'missing.parquet'}'\n")
    err = fails(capsys, ["run", cfg])
    assert "missing.parquet" in err


def test_bad_trace_file_through_run(tmp_path, capsys):
    bad = tmp_path / "bad.parquet"
    bad.write_text("this is not parquet")
    err = fails(capsys, ["run", write(tmp_path, f"[trace]\nsource = 'file'\npath = '{bad}'\n")])
    assert "bad.parquet" in err


def test_trace_with_wrong_device_count(tmp_path, capsys):
    from fedsim.traces import Trace, write_trace

    write_trace(Trace.from_intervals([0], [0.0], [1.0], n_devices=3, horizon=1.0), tmp_path / "t.parquet")
    cfg = write(tmp_path, f"[run]\nout = '{tmp_path / 'runs'}'\n[data]\nclients = 5\n[trace]\nsource = 'file'\npath = '{tmp_path / 't.parquet'}'\n")
    err = fails(capsys, ["run", cfg])
    assert "3 devices" in err and "clients = 5" in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("argv", [
    ["run", "nope.toml"], ["run", "quickstart", "--set", "run.rounds=x"],
    ["run", "quickstart", "--set", "client.local_steps=0"], ["run", "quickstart", "--set", "run.name=a/b"],
    ["run", "quickstart", "--set", "devices.compute_sigma=-1"],
    ["run", "quickstart", "--set", 'run.algorithms=["mifa", "mifa"]'],
    ["run", "--resume", "runs/x", "--set", "client.lr=1"],
])
def test_no_traceback_from_the_console(tmp_path, argv):
    proc = subprocess.run([sys.executable, "-m", "fedsim", *argv], capture_output=True, text=True,
                          cwd=tmp_path)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
