"""Simulated time does not depend on how the simulation runs: the same config gives the same
rounds.parquet and events.parquet times with the batched and the loop trainer, and alone or
as a point of a study whose runs train in lockstep (shared batched calls), and on the CPU and
a CUDA GPU (time is numpy on the host, never torch; that test is skipped without a GPU)."""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from test_study import sweep, write_study  # noqa: E402

from fedsim.cli import main  # noqa: E402
from fedsim.config import dump_toml  # noqa: E402

TIME_COLUMNS = ["round", "t_start", "t_end", "duration", "online", "invited", "arrived", "dropped", "late",
                "surplus", "close_reason", "deadline", "wait_s", "wasted_s"]

# every rule that moves the clock: churn, lognormal speeds, overcommit, a drawn deadline, a minimum
# of devices online, a quorum
CHURN = {
    "run": {"rounds": 12, "eval_every": 6, "seed": 2},
    "data": {"dataset": "digits", "clients": 30},
    "client": {"local_steps": 3, "batch_size": 16, "lr": 0.3},
    "server": {"timing": "model", "clients_per_round": 6, "overcommit": 0.5, "deadline": 1.2,
               "deadline_sigma": 0.3, "min_selected": 16, "update_frac": 0.4},
    "devices": {"model": "lognormal", "seconds_per_sample": 0.01, "compute_sigma": 1.0,
                "bandwidth_bps": 2e6, "latency_s": 0.05},
    "trace": {"source": "markov", "mean_on": 4.0, "mean_off": 4.0, "days": 0.05},
}


def config(**client) -> dict:
    body = {section: dict(values) for section, values in CHURN.items()}
    body["client"].update(client)
    return body


def times(run_dir: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The time columns of rounds.parquet (those of its mode: async has staleness, no deadline)."""
    rounds = pl.read_parquet(run_dir / "rounds.parquet")
    return (rounds.select(c for c in [*TIME_COLUMNS, "staleness"] if c in rounds.columns),
            pl.read_parquet(run_dir / "events.parquet"))


@pytest.fixture(scope="module")
def batched(tmp_path_factory) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The reference: the batched trainer, alone (run once for the module)."""
    folder = tmp_path_factory.mktemp("batched")
    body = config(trainer="batched")
    body["run"].update(out=str(folder / "runs"), name="t", progress=False, plots=False)
    (folder / "t.toml").write_text(dump_toml(body))
    assert main(["run", str(folder / "t.toml"), "--quiet"]) == 0
    return times(folder / "runs" / "t")


def test_the_clock_rules_all_play_in_the_reference_run(batched):
    rounds, events = batched
    assert len(rounds) == 12
    assert {"quota", "quorum"} <= set(rounds["close_reason"]) or {"deadline", "quorum"} <= set(rounds["close_reason"])
    assert rounds["deadline"].n_unique() == 12 and (rounds["wait_s"] > 0).any()
    assert set(events["outcome"]) >= {"arrived", "dropped", "late"}


def test_batched_and_loop_trainers_give_the_same_times(cli_run, batched):
    loop = times(cli_run(config(trainer="loop")))
    assert loop[0].equals(batched[0]) and loop[1].equals(batched[1])


def test_a_point_of_a_lockstep_study_has_the_times_of_the_run_alone(tmp_path, batched):
    """Two algorithms in lockstep: the fedavg point trains in calls shared with FedAU's."""
    sections = config(trainer="batched")
    path = write_study(tmp_path, {"algorithm.name": ["fedavg", "fedau"]}, **sections)
    sweep(path)
    point = times(tmp_path / "runs" / "s" / "algorithm-fedavg")
    assert point[0].equals(batched[0]) and point[1].equals(batched[1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run this file on a machine with one)")
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_cpu_and_cuda_give_the_same_times(cli_run, mode):
    """The same config on either device, synchronous with every clock rule and asynchronous."""
    got = []
    for device in ("cpu", "cuda"):
        body = config(trainer="batched")
        body["run"]["device"] = device
        if mode == "async":
            body["server"] = {"timing": "model", "mode": "async", "concurrency": 6, "buffer": 3, "deadline": 1.2}
        got.append(times(cli_run(body, name=f"{mode}-{device}")))
    cpu, cuda = got
    assert len(cpu[0]) == 12 and (cpu[1]["outcome"] == "arrived").any()
    assert cuda[0].equals(cpu[0]) and cuda[1].equals(cpu[1])
