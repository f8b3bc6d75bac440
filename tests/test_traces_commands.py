"""The `fedsim trace` sub-commands, through their argparse handlers and once as a process."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedsim.errors import FedsimError
from fedsim.traces import Trace, read_trace
from fedsim.files import human_duration
from fedsim.traces.commands import add_trace_commands, parse_value
from fedsim.traces.io import read_device_table


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="fedsim")
    add_trace_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["trace", *argv])
    return args.func(args)


def test_generate_with_set_and_flag_options(tmp_path, capsys):
    out = tmp_path / "d.parquet"
    code = run(["generate", "diurnal", "--devices", "120", "--days", "3", "--seed", "4",
                "--out", str(out), "--set", "availability=0.4", "--set", "tz_offsets=[0, 8]",
                "--tz-weights", "[1, 3]", "--devices-out", str(tmp_path / "devices.parquet")])
    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and "diurnal, 120 devices" in lines[0] and str(out) in lines[0]
    assert lines[1] == f"wrote {tmp_path / 'devices.parquet'}: the device table (device_id, tz_offset) of the 120 devices"
    trace = read_trace(out)
    assert trace.n_devices == 120 and trace.horizon == 3 * 86400
    assert trace.generator["options"]["tz_weights"] == [1, 3]
    assert trace.availability().mean() == pytest.approx(0.4, abs=0.05)
    table = read_device_table(tmp_path / "devices.parquet")
    assert set(np.unique(table["tz_offset"])) <= {0.0, 8.0}


def test_generate_round_indexed(tmp_path):
    out = tmp_path / "b.parquet"
    run(["generate", "bernoulli", "--devices", "10", "--rounds", "50", "--round-duration", "60",
         "--seed", "0", "--out", str(out), "--set", "p=0.5", "--dynamics", "staircase"])
    trace = read_trace(out)
    assert trace.horizon == 3000.0 and trace.generator["dynamics"] == "staircase"
    assert np.all(trace.start % 60 == 0) and np.all(trace.end % 60 == 0)


@pytest.mark.parametrize("extra, match", [
    (["--set", "nope=1"], "unknown option 'nope'"),
    (["--set", "p"], "expected key=value"),
    (["--hours", "3"], "unknown option 'hours'"),
    (["--set", "gamma=high"], "option gamma = 'high' has the wrong type"),
])
def test_generate_errors(tmp_path, extra, match):
    with pytest.raises(FedsimError, match=match):
        run(["generate", "bernoulli", "--devices", "5", "--rounds", "5", "--seed", "0",
             "--out", str(tmp_path / "x.parquet"), "--set", "p=0.2", *extra])
    assert not (tmp_path / "x.parquet").exists()


def test_parse_value_reads_toml_literals():
    assert parse_value("0.3") == 0.3 and parse_value("20") == 20
    assert parse_value("[1, 0.5]") == [1, 0.5] and parse_value("true") is True
    assert parse_value("sine") == "sine" and parse_value('"sine"') == "sine"


@pytest.fixture
def diurnal_file(tmp_path):
    out = tmp_path / "d.parquet"
    run(["generate", "diurnal", "--devices", "300", "--days", "2", "--seed", "1", "--out", str(out)])
    return out


def test_info_json_and_table(diurnal_file, capsys):
    capsys.readouterr()
    assert run(["info", str(diurnal_file), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    trace = read_trace(diurnal_file)
    assert info["devices"] == 300 and info["intervals"] == trace.n_intervals
    assert info["availability"]["mean"] == pytest.approx(trace.availability().mean())
    assert info["availability"]["q0"] <= info["availability"]["q50"] <= info["availability"]["q100"]
    profile = info["hourly_profile"]
    assert len(profile) == 24 and all(0 <= v <= 1 for v in profile)
    # The mean over the hours equals the overall mean for a whole number of days.
    assert np.mean(profile) == pytest.approx(info["availability"]["mean"], rel=1e-9)
    assert info["session_s"]["q50"] > 0 and info["gap_s"]["q0"] > 0
    run(["info", str(diurnal_file)])
    text = capsys.readouterr().out
    assert "availability" in text and "hourly profile" in text and "23h" in text


@pytest.mark.parametrize("seconds, shown", [
    (0.003, "3 ms"), (0.0000031, "0.0031 ms"), (0.0, "0 s"), (1.0, "1 s"), (45.0, "45 s"),
    (59.44, "59.4 s"), (750.0, "12.5 min"), (1234.5678, "20.6 min"), (5400.0, "1.5 h"),
    (216000.0, "2.5 d"), (7 * 86400.0, "7 d"),
])
def test_durations_keep_three_significant_digits(seconds, shown):
    assert human_duration(seconds) == shown


def test_info_prints_millisecond_sessions(tmp_path, capsys):
    from fedsim.traces import write_trace

    trace = Trace.from_intervals([0, 0, 1], [0.0, 1.0, 0.0], [0.003, 1.005, 0.004], n_devices=2,
                                 horizon=10.0)
    write_trace(trace, tmp_path / "ms.parquet")
    assert run(["info", str(tmp_path / "ms.parquet")]) == 0
    lines = capsys.readouterr().out.splitlines()
    # lengths 3, 5 and 4 ms; the one gap 997 ms
    assert f"{'session':16}" + "".join(f"{cell:>10}" for cell in [
        "4 ms", "3 ms", "3.2 ms", "4 ms", "4.8 ms", "5 ms"]) in lines
    assert f"{'gap':16}" + f"{'997 ms':>10}" * 6 in lines
    assert "horizon    10 s  (10 s), wrap none" in lines


def test_plot_writes_png(diurnal_file, tmp_path, capsys):
    out = tmp_path / "plots" / "d.png"
    assert run(["plot", str(diurnal_file), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    assert "200 of 300 devices" in capsys.readouterr().out


def test_convert_command(tmp_path, capsys):
    (tmp_path / "in.csv").write_text("0,0,10\n1,5,20\n")
    assert run(["convert", "--from", "csv", str(tmp_path / "in.csv"), "--out",
                str(tmp_path / "c.parquet"), "--horizon", "30"]) == 0
    trace = read_trace(tmp_path / "c.parquet")
    assert trace.horizon == 30.0 and trace.availability().tolist() == pytest.approx([1 / 3, 0.5])


def test_info_on_a_bad_file_is_one_error_line_via_the_cli(tmp_path):
    (tmp_path / "bad.parquet").write_text("nope")
    result = subprocess.run([sys.executable, "-m", "fedsim", "trace", "info",
                             str(tmp_path / "bad.parquet")], capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip().startswith("error: trace ") and result.stderr.count("\n") == 1
    assert "not a readable Parquet file" in result.stderr


@pytest.mark.parametrize("kind, args, says", [
    ("diurnal", ["--set", 'tz_offsets=["a"]'], "option tz_offsets = ['a'] must be a list of finite numbers"),
    ("diurnal", ["--set", "tz_weights=[inf, 1]", "--set", "tz_offsets=[0, 1]"],
     "option tz_weights = [inf, 1] must be a list of finite numbers"),
    ("sleep-window", ["--set", "activity=[[1]]"], "option activity = [[1]] must be a list of finite numbers"),
    ("diurnal", ["--set", "night_start_h=nan"],
     "option night_start_h = nan has the wrong type or range; expected a finite number like 22.5"),
    ("diurnal", ["--set", "night_start_h=30"], "night_start_h = 30.0; give an hour of the day in [0, 24]"),
    ("sleep-window", ["--set", "start_h=1e300"], "start_h = 1e+300; give an hour of the day"),
    ("bernoulli", ["--set", "p=[[0.5], [0.5], [0.5]]"], "p must be a probability or a list of 3"),
    ("grid", ["--set", "half_period=9223372036854775807"], "an integer within +-9,007,199,254,740,992"),
    ("markov", ["--set", "spread=1e3"], "3 devices' sessions over 172800 s would make inf rows, above "
                                       "fedsim's limit of 50,000,000"),
    ("always", ["--days", "1e308"], "days x 86400 = inf; it must be a finite number of seconds"),
    ("always", ["--devices", "200000000"], "n_devices = 200,000,000 is above fedsim's limit of 100,000,000"),
    ("diurnal", ["--devices", "1000000", "--days", "365"],
     "1,000,000 devices over 365 days would make 371,000,000 rows, above fedsim's limit of 50,000,000; "
     "generate fewer devices or days"),
    ("bernoulli", ["--devices", "100000", "--rounds", "100000", "--set", "p=0.5"],
     "100,000 devices over 100,000 rounds would make 2,5"),
])
def test_generator_options_of_the_wrong_type_or_size_are_one_line(tmp_path, capsys, kind, args, says):
    from fedsim.cli import main

    extent = [] if {"--days", "--rounds"} & set(args) else ["--days", "2"]
    devices = [] if "--devices" in args else ["--devices", "3"]
    out = tmp_path / "x.parquet"
    assert main(["trace", "generate", kind, *devices, *extent, "--out", str(out), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: trace generator '{kind}': ") and "\n" not in err, err
    assert says in err, err
    assert not out.exists()


def test_plot_draws_its_own_picture_again_but_never_a_runs_files(diurnal_file, tmp_path, capsys):
    """In a run directory `trace plot --out` may write a new picture and, with --force, draw
    it again, but never write over what else is there; elsewhere --force overwrites."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.toml").write_text("[run]\n")
    (run_dir / "manifest.json").write_text("{}")
    picture = run_dir / "trace.png"
    assert run(["plot", str(diurnal_file), "--out", str(picture)]) == 0
    with pytest.raises(FedsimError, match="the file exists; give another path, or --force"):
        run(["plot", str(diurnal_file), "--out", str(picture)])
    picture.write_bytes(picture.read_bytes()[:-12])  # cut: drawn again below
    assert run(["plot", str(diurnal_file), "--out", str(picture), "--force"]) == 0
    assert picture.read_bytes().endswith(b"IEND\xaeB`\x82")
    for own in ("manifest.json", "config.toml"):
        with pytest.raises(FedsimError, match=f"--out {run_dir / own}: is a file of the run directory {run_dir}, "
                                              "which no other command writes over"):
            run(["plot", str(diurnal_file), "--out", str(run_dir / own), "--force"])
    assert (run_dir / "manifest.json").read_text() == "{}"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "old.png").write_text("mine")
    (mine / "study.toml").write_text("[sweep]\n")  # the user's own study file: not a study's folder
    assert run(["plot", str(diurnal_file), "--out", str(mine / "old.png"), "--force"]) == 0
    assert (mine / "old.png").read_bytes()[:4] == b"\x89PNG"
    for name, fmt, fixed in (("d.pdf", "PNG", "d.png"), ("t.csv", "PARQUET", "t.parquet")):  # a name says its format
        command = ["plot", str(diurnal_file)] if fmt == "PNG" else ["generate", "always", "--devices", "2", "--days", "1"]
        with pytest.raises(FedsimError, match=f"^--out {mine / name}: the file is written as {fmt}; name it {fixed}$"):
            run([*command, "--out", str(mine / name)])
        assert not (mine / name).exists()


def test_a_trace_file_written_into_a_run_directory_is_not_the_runs_trace(tmp_path, monkeypatch):
    """`fedsim trace generate --out RUN/trace.parquet` (a new file: no command writes over the
    run's own) is not taken for the trace.parquet that runs of earlier releases kept: the run
    resumes with its own trace, as an uninterrupted run ends."""
    sys.path.insert(0, str(Path(__file__).parent))
    from conftest import quadratic_config, same_results

    from fedsim.cli import main
    from fedsim.config import dump_toml

    monkeypatch.chdir(tmp_path)
    config = quadratic_config([[1.0, 0.0], [0.0, 1.0], [2.0, 1.0], [1.0, 1.0]], rounds=10,
                              trace={"source": "periodic", "groups": 2, "rounds_per_group": 3})
    for name, rounds in (("m", 10), ("whole", 20)):
        config["run"].update(name=name, out="runs", rounds=rounds, progress=False, plots=False)
        (tmp_path / f"{name}.toml").write_text(dump_toml(config))
        assert main(["run", f"{name}.toml", "--quiet"]) == 0
    assert main(["trace", "generate", "periodic", "--devices", "2", "--rounds", "10",
                 "--out", "runs/m/trace.parquet"]) == 0
    assert main(["run", "--resume", "runs/m", "--set", "run.rounds=20", "--quiet"]) == 0
    same_results(tmp_path / "runs" / "m", tmp_path / "runs" / "whole")
