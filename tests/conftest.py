"""Shared helpers: write a trace and a config into tmp_path, run `fedsim run` in-process."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from fedsim.cli import main
from fedsim.config import dump_toml
from fedsim.traces import Trace, write_trace


def alternating_trace(t1: int, t2: int, periods: int, round_duration: float = 1.0) -> Trace:
    """Device 0 online the first t1 rounds of each period, device 1 the next t2."""
    period = t1 + t2
    starts = np.arange(periods) * period * round_duration
    ids = np.repeat([0, 1], periods)
    start = np.concatenate([starts, starts + t1 * round_duration])
    end = np.concatenate([starts + t1 * round_duration, starts + period * round_duration])
    return Trace.from_intervals(ids, start, end, n_devices=2,
                                horizon=periods * period * round_duration)


class CliRun:
    """Runs `fedsim run` on a config dict (and an optional trace) inside a tmp folder."""

    def __init__(self, tmp_path: Path, capsys):
        self.tmp = tmp_path
        self.capsys = capsys

    def __call__(self, config: dict, trace: Trace | None = None, name: str = "t",
                 extra: list[str] = (), expect: int = 0) -> Path:
        config = {section: dict(body) for section, body in config.items()}
        run = config.setdefault("run", {})
        run.setdefault("out", str(self.tmp / "runs"))
        run.setdefault("name", name)
        run.setdefault("progress", False)
        run.setdefault("plots", False)  # drawn where a test asks for them (plots: True)
        if trace is not None:
            write_trace(trace, self.tmp / f"{name}.parquet")
            config.setdefault("trace", {}).update(source="file", path=str(self.tmp / f"{name}.parquet"))
        cfg_path = self.tmp / f"{name}.toml"
        cfg_path.write_text(dump_toml(config))
        code = main(["run", str(cfg_path), "--quiet", *extra])
        out = self.capsys.readouterr()
        assert code == expect, out.err
        self.last_output = out
        found = re.search(r"run directory: (.+)", out.out)
        return Path(found.group(1).strip()) if found else Path()


@pytest.fixture
def cli_run(tmp_path, capsys):
    return CliRun(tmp_path, capsys)


def final_x(run_dir: Path) -> np.ndarray:
    return torch.load(run_dir / "model.pt")["x"].double().numpy()


def rounds(run_dir: Path) -> pl.DataFrame:
    return pl.read_parquet(run_dir / "rounds.parquet")


def quadratic_config(targets, *, lr=0.1, steps=1, rounds=100, algorithm="fedavg", **sections):
    """A quadratic-task config under ideal timing with exact gradients."""
    config = {
        "run": {"rounds": rounds, "eval_every": rounds},
        "data": {"dataset": "quadratic", "clients": len(targets), "targets": targets},
        "client": {"batch_size": 0, "local_steps": steps, "lr": lr},
        "server": {"timing": "ideal", "round_duration": 1.0},
        "algorithm": {"name": algorithm},
    }
    for section, body in sections.items():
        config.setdefault(section, {}).update(body)
    return config


def same_results(run_dir: Path, whole: Path) -> None:
    """Every table (host time aside), the final model and the manifest's ending equal."""
    rounds = pl.read_parquet(run_dir / "rounds.parquet").drop("wall_s")
    assert rounds.equals(pl.read_parquet(whole / "rounds.parquet").drop("wall_s"))
    for table in ("devices.parquet", "events.parquet"):
        assert pl.read_parquet(run_dir / table).equals(pl.read_parquet(whole / table)), table
    model, wanted_model = torch.load(run_dir / "model.pt"), torch.load(whole / "model.pt")
    assert list(model) == list(wanted_model) and all(torch.equal(model[k], wanted_model[k]) for k in model)
    ended, wanted = (json.loads((d / "manifest.json").read_text()) for d in (run_dir, whole))
    assert (ended["status"], ended["rounds"], ended["sim_time_s"]) == \
        (wanted["status"], wanted["rounds"], wanted["sim_time_s"])
    assert not list(run_dir.glob(".*.tmp*"))


# the body of a study (or run) of the quadratic task, its rounds cost nothing: for tests that stop
# or hurt a sweep from outside
QUADRATIC = """
[data]
dataset = "quadratic"
clients = 2
targets = [[1.0, 0.0], [0.0, 1.0]]

[client]
batch_size = 0

[server]
timing = "ideal"
"""


def manifest(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "manifest.json").read_text())
    except (OSError, ValueError):  # not written yet, or being replaced
        return {}
