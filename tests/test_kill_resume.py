"""kill -9 at each atomic rename of a run (through the FEDSIM_TEST_KILL_AT hook of
fedsim/files.py, not timing luck), then `fedsim run --resume`: the results equal those of a
run never interrupted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import quadratic_config, same_results  # noqa: E402

from fedsim.cli import main  # noqa: E402
from fedsim.config import dump_toml  # noqa: E402

# A run of 8 rounds checkpointing every 3 renames, in order: config.toml; at the
# checkpoints before round 1 and after rounds 3, 6 and 8 rounds.parquet, devices.parquet (from
# round 3 an events part), checkpoint.pt, manifest.json; at the end events.parquet, model.pt
# and manifest.json (its 5th).
FRESH = ["before:checkpoint.pt:1", "after:checkpoint.pt:1", "before:rounds.parquet:2",
         "after:rounds.parquet:2", "before:part-000000.parquet:1", "before:checkpoint.pt:2",
         "after:checkpoint.pt:2", "before:manifest.json:2", "after:manifest.json:2",
         "before:events.parquet:1", "after:events.parquet:1", "before:model.pt:1",
         "after:manifest.json:5"]
# A resume of the finished 8 rounds to 12: its manifest says `running` from its start, then a
# checkpoint at round 9 (its 1st) and at the end.
RESUMED = ["after:manifest.json:1", "before:checkpoint.pt:1", "after:checkpoint.pt:1",
           "before:events.parquet:1"]


def config(root: Path) -> dict:
    config = quadratic_config([[1.0, 0.0], [0.0, 2.0], [3.0, 1.0]], rounds=8, algorithm="mifa")
    config["run"].update(checkpoint_every=3, eval_every=2, out=str(root / "runs"), name="t",
                         progress=False, plots=False)
    config["trace"] = {"source": "bernoulli", "p": [0.9, 0.6, 0.4]}
    return config


# Loads fedsim and torch once, then runs each job in a fork of itself (a subprocess that starts
# in milliseconds) with the hook armed as FEDSIM_TEST_KILL_AT arms it; prints each return code.
# (No plot worker: these runs draw no plots, and each would start one.)
FORKS = """
import json, os, sys
import fedsim.cli, fedsim.runs.comparison, fedsim.files, fedsim.results.plot_worker
fedsim.results.plot_worker.shared_worker = lambda: None
for point, argv in json.loads(sys.argv[1]):
    pid = os.fork()
    if pid == 0:
        sys.stdout = open(os.devnull, "w")
        fedsim.files._KILL_AT = point
        os._exit(fedsim.cli.main(argv))
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


def environment(**extra) -> dict:
    """This process's environment, with this checkout first on the path."""
    path = os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, **extra}


def killed_at(jobs: list[tuple[str, list[str]]]) -> list[int]:
    """Run each `fedsim ARGV` in a process that SIGKILLs itself at its point; the return codes."""
    proc = subprocess.run([sys.executable, "-c", FORKS, json.dumps(jobs)], env=environment(), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=300)
    return [int(line) for line in proc.stdout.split()]


def test_the_hook_kills_a_fresh_process_at_its_point(tmp_path):
    """FEDSIM_TEST_KILL_AT, read when fedsim starts: the run is killed at its first checkpoint."""
    (tmp_path / "c.toml").write_text(dump_toml(config(tmp_path)))
    proc = subprocess.run([sys.executable, "-m", "fedsim", "run", str(tmp_path / "c.toml"), "--quiet"],
                          env=environment(FEDSIM_TEST_KILL_AT="after:checkpoint.pt:1"),
                          capture_output=True, timeout=300)
    assert proc.returncode == -9
    run_dir = tmp_path / "runs" / "t"
    assert (run_dir / "checkpoint.pt").exists() and not (run_dir / "manifest.json").exists()


def run_in_process(argv: list[str]) -> None:
    assert main([*argv, "--quiet"]) == 0


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The uninterrupted runs of 8 and 12 rounds, and a run directory killed at each point."""
    root = tmp_path_factory.mktemp("kill")
    (root / "c.toml").write_text(dump_toml(config(root)))
    cfg = str(root / "c.toml")
    run_in_process(["run", cfg, "--set", "run.name='whole8'"])
    run_in_process(["run", cfg, "--set", "run.name='whole12'", "--set", "run.rounds=12"])
    jobs = {}
    for point in FRESH:
        jobs[("fresh", point)] = ["run", cfg, "--quiet", "--set", f"run.name='{point.replace(':', '-')}'"]
    for point in RESUMED:
        run_dir = root / "runs" / f"resumed-{point.replace(':', '-')}"
        shutil.copytree(root / "runs" / "whole8", run_dir)
        jobs[("resumed", point)] = ["run", "--resume", str(run_dir), "--set", "run.rounds=12", "--quiet"]
    codes = killed_at([(point, argv) for (_, point), argv in jobs.items()])
    return root / "runs", dict(zip(jobs, codes))


@pytest.mark.parametrize("point", FRESH)
def test_a_run_killed_at_a_rename_resumes_to_the_same_results(runs, point):
    folder, codes = runs
    assert codes[("fresh", point)] == -9
    run_dir = folder / point.replace(":", "-")
    run_in_process(["run", "--resume", str(run_dir)])
    same_results(run_dir, folder / "whole8")


@pytest.mark.parametrize("point", RESUMED)
def test_a_resume_killed_at_a_rename_resumes_to_the_same_results(runs, point, capsys):
    folder, codes = runs
    assert codes[("resumed", point)] == -9
    run_dir = folder / f"resumed-{point.replace(':', '-')}"
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "running"
    capsys.readouterr()
    run_in_process(["run", "--resume", str(run_dir), "--set", "run.rounds=12"])
    assert f"resuming {run_dir}: it crashed (last checkpoint at round" in capsys.readouterr().out
    same_results(run_dir, folder / "whole12")


@pytest.mark.parametrize("point", ["before:study.toml:1", "after:study.toml:1"])
def test_a_sweep_killed_while_it_writes_study_toml_runs_again_to_the_same_summary(tmp_path, point):
    """study.toml is written atomically: killed before its rename there is none (the sweep
    writes it), after it the whole file; either way running the sweep again finishes the study."""
    study = config(tmp_path)
    study["run"].update(rounds=4, name="st")
    study["sweep"] = {"run.seed": [0, 1]}
    (tmp_path / "s.toml").write_text(dump_toml(study))
    argv = ["sweep", str(tmp_path / "s.toml"), "--quiet"]
    assert killed_at([(point, argv)]) == [-9]
    folder = tmp_path / "runs" / "st"
    assert (folder / "study.toml").exists() == point.startswith("after")
    run_in_process(argv[:-1])
    whole = dict(study, run={**study["run"], "name": "whole"})
    (tmp_path / "w.toml").write_text(dump_toml(whole))
    run_in_process(["sweep", str(tmp_path / "w.toml")])
    mine, theirs = (pl.read_parquet(tmp_path / "runs" / n / "summary.parquet") for n in ("st", "whole"))
    assert mine.equals(theirs)
