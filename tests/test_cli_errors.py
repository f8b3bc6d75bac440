"""Bad input: one clear line on stderr, exit status 2, no traceback, nothing written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


def test_every_unknown_key_is_in_the_one_line_with_its_nearest_valid_key(tmp_path, capsys):
    config = write(tmp_path, "[run]\nroudns = 5\n[client]\nlrr = 0.1\nlocal_steps = 2\n[server]\nzzqqx = 1\n")
    err = fails(capsys, ["run", config, "--set", "client.batch_szie=3"])
    head, parts = err.split(": 4 unknown keys: ")
    assert head == f"error: {config}"
    assert parts.split("; ") == [
        "[run] roudns (did you mean 'rounds'?)", "[client] lrr (did you mean 'lr'?)",
        "--set client.batch_szie=3: [client] batch_szie (did you mean 'batch_size'?)",
        "[server] zzqqx (valid keys: buffer, clients_per_round, concurrency, deadline, deadline_sigma, "
        "min_selected, mode, overcommit, round_duration, timing, update_frac)"]
    assert not (tmp_path / "runs").exists()
    err = fails(capsys, ["run", "quickstart", "--set", "clients.lr=1", "--set", "server.dedline=5"])
    assert err == ("error: --set server.dedline=5: 2 unknown keys and sections: [server] dedline (did you mean "
                   "'deadline'?); --set clients.lr=1: section [clients] (did you mean 'client'?)")


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
    assert "[algorithm] name = 'fedavgg' is unknown" in err and "fedavg" in err and "mifa" in err


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


def test_unreadable_config_files(tmp_path, capsys):
    (tmp_path / "latin1.toml").write_bytes(b"\xff\xfe[run]\n")
    assert "not UTF-8" in fails(capsys, ["run", str(tmp_path / "latin1.toml")])
    assert "Is a directory" in fails(capsys, ["run", str(tmp_path)])


@pytest.mark.parametrize("override, says", [
    ("server.deadline=inf", "[server] deadline = inf must be a finite number"),
    ("client.lr=inf", "[client] lr = inf must be a finite number"),
    ("run.seed=99999999999999999999", "is too large (it must fit in a signed 64-bit integer: at most "
                                      "9223372036854775807)"),
    ("run.seed=4294967296", "[run] seed = 4294967296 must be below 2**32 = 4294967296 (torch draws the model's "
                            "initial weights from 32 bits of the seed, so seeds 2**32 apart would start from one model)"),
])
def test_values_that_no_run_can_use(capsys, override, says):
    assert says in fails(capsys, ["run", "quickstart", "--set", override])


def test_output_paths_that_cannot_be_written(tmp_path, capsys):
    trace = str(tmp_path / "t.parquet")
    generate = ["trace", "generate", "always", "--devices", "3", "--days", "1"]
    err = fails(capsys, [*generate, "--out", str(tmp_path)])
    assert f"--out {tmp_path}: is a folder" in err
    blocker = tmp_path / "file"
    blocker.write_text("")
    err = fails(capsys, [*generate, "--out", str(blocker / "t.parquet")])
    assert f"cannot create the folder {blocker}" in err
    assert main([*generate, "--out", trace]) == 0
    assert f"--out {tmp_path}: is a folder" in fails(capsys, ["trace", "plot", trace, "--out", str(tmp_path)])
    assert "cannot create the folder" in fails(
        capsys, ["run", "quickstart", "--set", f"run.out='{blocker}'", "--set", "run.rounds=1"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "t.parquet"]  # no temp files left


def test_outputs_are_ordinary_files(tmp_path):
    out = tmp_path / "t.parquet"
    assert main(["trace", "generate", "always", "--devices", "3", "--days", "1", "--out", str(out)]) == 0
    assert out.stat().st_mode & 0o777 == 0o666 & ~_umask()


def test_device_ids_beyond_any_memory(tmp_path, capsys):
    (tmp_path / "big.csv").write_text("device_id,start,end\n0,0,10\n99999999999,0,10\n")
    err = fails(capsys, ["trace", "convert", "--from", "csv", str(tmp_path / "big.csv"),
                         "--out", str(tmp_path / "big.parquet")])
    assert err.startswith(f"error: csv trace {tmp_path / 'big.csv'}: n_devices = 100,000,000,000 "
                          f"is above fedsim's limit")
    assert not (tmp_path / "big.parquet").exists()


def test_python_api_raises_fedsim_error():
    import fedsim

    with pytest.raises(fedsim.FedsimError, match="expected a config path"):
        fedsim.load_config(5)
    with pytest.raises(fedsim.FedsimError, match="overrides must be a list"):
        fedsim.load_config("quickstart", "run.rounds=5")
    with pytest.raises(fedsim.FedsimError, match="expected a Config"):
        fedsim.run("quickstart")


def _umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_more_clients_per_round_than_devices(cli_run):
    from conftest import quadratic_config

    config = quadratic_config([[1.0], [2.0], [3.0]], rounds=3, server={"clients_per_round": 4})
    run_dir = cli_run(config, expect=2)
    err = cli_run.last_output.err
    assert "[server] clients_per_round = 4 is more than the 3 devices" in err and "at most 3" in err
    assert run_dir == Path() and not (cli_run.tmp / "runs").exists()


def test_a_comparison_checks_every_algorithm_before_running_any(cli_run):
    from conftest import alternating_trace, quadratic_config

    config = quadratic_config([[1.0], [2.0]], rounds=3)
    config["run"]["algorithms"] = ["fedavg", "mifa", "fedavg-known-p"]
    cli_run(config, alternating_trace(1, 1, 4), expect=2)
    assert "fedavg-known-p needs a trace from one of" in cli_run.last_output.err
    assert not (cli_run.tmp / "runs").exists()  # fedavg and mifa did not run first


def test_more_clients_than_samples_is_refused_before_partitioning(capsys):
    err = fails(capsys, ["run", "quickstart", "--set", "data.clients=3000000", "--set", "run.rounds=1"])
    assert "[data] clients = 3000000 is more than the 1347 training samples of 'digits'" in err


def test_running_out_of_memory_is_one_line(capsys, monkeypatch):
    import fedsim.runs.experiment

    def too_big(*args, **kwargs):
        raise MemoryError
    monkeypatch.setattr(fedsim.runs.experiment, "build_task", too_big)
    err = fails(capsys, ["run", "quickstart", "--quiet"])
    assert err.startswith("error: out of memory; lower the sizes")


def test_out_of_gpu_memory_is_one_line(tmp_path, capsys, monkeypatch):
    """torch's CUDA out-of-memory error is a RuntimeError, not a MemoryError: one line too."""
    import torch

    from fedsim.runs.experiment import Experiment

    def oom(self, resume=None):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")

    monkeypatch.setattr(Experiment, "run", oom)
    monkeypatch.chdir(tmp_path)
    err = fails(capsys, ["run", "quickstart", "--set", "run.rounds=2", "--quiet"])
    assert "out of GPU memory" in err and 'run.device = "cpu"' in err


@pytest.mark.parametrize("argv, says", [
    (["run", "--force", "--quiet"], "--force: resumes a diverged run, with --resume RUN_DIR; a new run needs no --force"),
    (["sweep", "S", "--processes", "0"], "--processes 0: not a number of processes; give 1 or more, or leave it out "
                                         "(one per 8 points, at most one per core)"),
    (["sweep", "S", "--address", "foo:1"], "--address foo:1: joins a Ray cluster, for --backend ray; add --backend "
                                           "ray, or leave --address out"),
])
def test_flags_that_would_be_ignored_are_one_line(tmp_path, capsys, argv, says):
    (tmp_path / "s.toml").write_text('[run]\nname = "s"\nrounds = 2\n[sweep]\n"run.seed" = [0, 1]\n')
    assert main([str(tmp_path / "s.toml") if a == "S" else a for a in argv]) == 2
    assert capsys.readouterr().err == f"error: {says}\n"
    assert not (tmp_path / "runs").exists()


def test_a_file_of_the_wrong_kind_says_what_it_is(tmp_path, capsys):
    from fedsim.traces import Trace, write_trace

    (tmp_path / "top.toml").write_text("rounds = 5\n")
    write_trace(Trace.from_intervals([0], [0.0], [10.0], n_devices=1, horizon=10.0), tmp_path / "t.parquet")
    cases = [
        (["run", str(tmp_path / "top.toml")], f"{tmp_path / 'top.toml'}: unknown key rounds outside any section; it "
                                              "is a [run] key: write it under [run]"),
        (["config", "show", str(tmp_path / "t.parquet")],
         f"config {tmp_path / 't.parquet'}: is a Parquet file (a trace, or a dataset's table), not a TOML config; a "
         "trace goes in a config as [trace] path (--set trace.path=FILE --set trace.source=file)"),
        (["run", "--resume", str(tmp_path / "top.toml")],
         f"{tmp_path / 'top.toml'}: a file, not a run directory; give the folder that `fedsim run` printed after "
         "'run directory:'"),
        (["report", str(tmp_path / "top.toml")],
         f"{tmp_path / 'top.toml'}: a file, not a run's folder; pass the folder that `fedsim run` printed after "
         "'results:'"),
    ]
    for argv, says in cases:
        assert main(argv) == 2
        assert capsys.readouterr() == ("", f"error: {says}\n"), argv
