"""How a run records its trace: a generated trace by its generator's call and a fingerprint
(no trace.parquet, which was 146 MB for 5,000 devices x 30,000 rounds), checked on resume; a
file trace by its path and fingerprint, a moved or changed file one error line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from conftest import final_x, quadratic_config, rounds
from fedsim.cli import main
from fedsim.traces import generate, write_trace


def manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())


def targets(n: int) -> list[list[float]]:
    return [[float(i), 1.0] for i in range(n)]


def bernoulli_run(rounds_: int) -> dict:
    config = quadratic_config(targets(4), rounds=rounds_, algorithm="mifa")
    config["trace"] = {"source": "bernoulli", "p": [0.9, 0.7, 0.5, 0.3]}
    return config


def test_a_generated_trace_is_recorded_by_its_call_and_fingerprint_not_its_intervals(cli_run):
    run_dir = cli_run(bernoulli_run(12))
    assert not (run_dir / "trace.parquet").exists()
    trace = manifest(run_dir)["trace"]
    assert trace["generator"]["kind"] == "bernoulli" and trace["generator"]["version"] == 1
    assert trace["generator"]["rounds"] == 12 and trace["generator"]["seed"] == 0
    assert len(trace["fingerprint"]) == 64 and trace["file"] is None and trace["fingerprint_of"] == "bits"
    # the same call makes the same trace: the fingerprint is that of the generator's output
    from fedsim.runs.replay import trace_fingerprint

    again = generate("bernoulli", 4, seed=0, rounds=12, round_duration=1.0, p=[0.9, 0.7, 0.5, 0.3], as_bits=True)
    assert trace_fingerprint(again) == trace["fingerprint"]


def test_a_wall_clock_trace_that_a_longer_max_time_redraws_is_replayed_as_recorded(cli_run, capsys):
    """markov covers max_time: a resume with a larger one would draw another trace, so the
    run goes on with the one it started with, generated again from its record."""
    config = quadratic_config(targets(4), rounds=6, server={"timing": "model", "deadline": 100.0})
    config["run"]["max_time"] = 86400.0
    config["trace"] = {"source": "markov"}
    run_dir = cli_run(config)
    before = manifest(run_dir)["trace"]
    assert main(["run", "--resume", str(run_dir), "--set", "run.rounds=12", "--set", "run.max_time=172800",
                 "--quiet"]) == 0
    after = manifest(run_dir)["trace"]
    assert (after["fingerprint"], after["horizon"]) == (before["fingerprint"], before["horizon"]) == \
        (before["fingerprint"], 86400.0)
    assert len(rounds(run_dir)) == 12


def test_a_generator_that_now_draws_another_trace_is_one_error_line(cli_run, capsys):
    run_dir = cli_run(bernoulli_run(6))
    recorded = manifest(run_dir)
    recorded["trace"]["fingerprint"] = "0" * 64  # as if a later release drew other traces
    (run_dir / "manifest.json").write_text(json.dumps(recorded))
    kept = (run_dir / "rounds.parquet").read_bytes()
    assert main(["run", "--resume", str(run_dir), "--set", "run.rounds=9", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: {run_dir / 'config.toml'}: [trace] source = 'bernoulli' now generates another "
                   "trace than the run started with (generator version 1, fingerprint sha256 000000000000...); "
                   "resume it with the release that started it (its manifest.json names it), or start a new run")
    assert (run_dir / "rounds.parquet").read_bytes() == kept


def test_a_moved_or_changed_trace_file_is_one_error_line_naming_path_and_fingerprint(cli_run, capsys, tmp_path):
    trace = generate("always", 4, seed=0, rounds=50, round_duration=60.0)
    run_dir = cli_run(quadratic_config(targets(4), rounds=5), trace=trace)
    path = tmp_path / "t.parquet"
    recorded = manifest(run_dir)["trace"]["file"]
    assert recorded["bytes"] == path.stat().st_size and manifest(run_dir)["trace"]["fingerprint"] is None
    path.rename(tmp_path / "moved.parquet")
    assert main(["run", "--resume", str(run_dir), "--set", "run.rounds=8", "--quiet"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {path}: the run's trace file is gone (moved or deleted; it had {recorded['bytes']} bytes, "
        f"sha256 {recorded['sha256'][:12]}...); put it back at that path, or give its new place to the resume with "
        "--set trace.path=NEW (its bytes are checked to be the run's)")
    write_trace(generate("always", 4, seed=0, rounds=60, round_duration=60.0), path)
    assert main(["run", "--resume", str(run_dir), "--set", "run.rounds=8", "--quiet"]) == 2
    assert "the trace file changed since the run started" in capsys.readouterr().err
    assert main(["run", "--resume", str(run_dir), "--set", "run.rounds=8", "--set", f"trace.path={path}",
                 "--quiet"]) == 2  # (another file at the new place: refused alike)
    assert "the trace file changed since the run started" in capsys.readouterr().err
    whole = cli_run(quadratic_config(targets(4), rounds=8), trace=trace, name="whole")
    moved = tmp_path / "moved.parquet"
    assert main(["run", "--resume", str(run_dir), "--set", "run.rounds=8", "--set", f"trace.path={moved}",
                 "--quiet"]) == 0
    assert len(rounds(run_dir)) == 8 and np.array_equal(final_x(run_dir), final_x(whole))
    assert f'path = "{moved}"' in (run_dir / "config.toml").read_text()  # where it is now


def test_trace_info_and_plot_of_a_run_directory_show_the_trace_it_replays(cli_run, capsys, tmp_path):
    """What `fedsim trace info runs/X/trace.parquet` showed before: the generated trace, made
    again from the run's record (a comparison: its first algorithm's)."""
    config = bernoulli_run(12)
    config["run"]["algorithms"] = ["fedavg", "mifa"]
    run_dir = cli_run(config)
    assert main(["trace", "info", str(run_dir), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    write_trace(generate("bernoulli", 4, seed=0, rounds=12, round_duration=1.0, p=[0.9, 0.7, 0.5, 0.3]),
                tmp_path / "same.parquet")
    assert main(["trace", "info", str(tmp_path / "same.parquet"), "--json"]) == 0
    same = json.loads(capsys.readouterr().out)
    assert (shown["wrap"], same["wrap"]) == ("loop", "none")  # a run's generated trace repeats
    assert {**shown, "wrap": "none"} == same
    assert main(["trace", "plot", str(run_dir / "mifa"), "--out", str(tmp_path / "t.png")]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {tmp_path / 't.png'}: 4 of 4 devices"
    assert main(["trace", "info", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {tmp_path}: is a directory; give the path of a .parquet file, or a run directory that "
        "`fedsim run` made (this one has no manifest.json)")


OWN_NET = '''
from torch import nn


def make(in_shape, n_classes, cfg):
    return nn.Sequential(nn.Flatten(), nn.Linear(64, n_classes))
'''


def test_the_trace_of_a_run_is_read_without_its_model(tmp_path, monkeypatch, capsys):
    """`fedsim trace info RUN_DIR` of a run whose model is the user's module, from a folder where
    that module cannot be imported: the trace comes from the run's data (the grid generator
    groups devices by their labels) and its record, never from its model."""
    import sys

    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir(), elsewhere.mkdir()
    (project / "own_net.py").write_text(OWN_NET)
    (project / "c.toml").write_text('[run]\nrounds = 3\nname = "m"\nprogress = false\nplots = false\n'
                                    '[data]\ndataset = "digits"\nclients = 6\n[model]\nname = "own_net:make"\n'
                                    '[trace]\nsource = "grid"\n[server]\ntiming = "ideal"\n')
    monkeypatch.chdir(project)
    monkeypatch.syspath_prepend(str(project))
    assert main(["run", "c.toml", "--quiet"]) == 0
    run_dir = project / "runs" / "m"
    capsys.readouterr()
    assert main(["trace", "info", str(run_dir), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    (project / "own_net.py").unlink()
    monkeypatch.delitem(sys.modules, "own_net")
    monkeypatch.chdir(elsewhere)
    assert main(["trace", "info", str(run_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == shown
    assert shown["devices"] == 6 and shown["generator"].startswith("grid")


def test_a_damaged_trace_record_is_one_line_and_the_fix_it_names_works(cli_run, capsys):
    """A manifest whose trace record is not what a run writes: `trace info RUN` says so; with the
    record's entry deleted (as the line says) it reads the same trace, unchecked."""
    run_dir = cli_run(bernoulli_run(6))
    capsys.readouterr()
    assert main(["trace", "info", str(run_dir), "--json"]) == 0
    before = json.loads(capsys.readouterr().out)
    body = manifest(run_dir)
    (run_dir / "manifest.json").write_text(json.dumps({**body, "trace": {**body["trace"], "horizon": "six"}}))
    assert main(["trace", "info", str(run_dir), "--json"]) == 2
    assert capsys.readouterr().err == (f"error: {run_dir / 'manifest.json'}: damaged (trace.horizon = 'six' is not a "
                                       "number of seconds); restore it, or delete its \"trace\" entry to read the "
                                       "run's trace without checking it against the record\n")
    del body["trace"]
    (run_dir / "manifest.json").write_text(json.dumps(body))
    assert main(["trace", "info", str(run_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == before
