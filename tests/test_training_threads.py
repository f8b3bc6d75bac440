"""`[run] threads`: small calls on one thread, large ones on all, pinned counts, the manifest."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
import torch

from fedsim.config import ClientConfig, DataConfig, ModelConfig
from fedsim.training import ThreadPolicy, build_task, build_trainer
from fedsim.training.threads import CROSSOVER_FLOPS

CPU = torch.device("cpu")


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield before
    torch.set_num_threads(before)


def test_auto_gives_one_thread_below_the_crossover_and_all_from_it(restore_threads):
    torch.set_num_threads(4)
    policy = ThreadPolicy("auto", CPU)
    assert policy.threads_for(0) == 1
    assert policy.threads_for(CROSSOVER_FLOPS * 0.99) == 1
    assert policy.threads_for(CROSSOVER_FLOPS) == 4
    seen = []
    with policy.scope():
        assert torch.get_num_threads() == 1  # the server's own small work
        with policy.work(CROSSOVER_FLOPS * 10):
            seen.append(torch.get_num_threads())
        seen.append(torch.get_num_threads())
    assert seen == [4, 1]
    assert torch.get_num_threads() == 4  # restored after the run
    assert policy.summary() == {"setting": "auto", "max": 4, "calls_by_threads": {"4": 1}}


def test_a_pinned_count_is_used_for_every_call(restore_threads):
    policy = ThreadPolicy(3, CPU)
    with policy.scope():
        assert torch.get_num_threads() == 3
        for flops in (0, CROSSOVER_FLOPS * 100):
            with policy.work(flops):
                assert torch.get_num_threads() == 3
    assert torch.get_num_threads() == restore_threads
    assert policy.summary()["calls_by_threads"] == {"3": 2}


def test_a_trainer_sizes_its_calls_by_devices_per_call():
    """The batched path holds the whole cohort in one gradient call, the loop one device."""
    task = build_task(DataConfig(dataset="digits", clients=10), ModelConfig(name="mlp", hidden=32),
                      seed=0, device=CPU)
    ids = np.arange(10)
    batched = build_trainer(task, ClientConfig(batch_size=16, trainer="batched"), seed=0)
    loop = build_trainer(task, ClientConfig(batch_size=16, trainer="loop"), seed=0)
    one_device = 3 * (64 * 32 + 32 * 10) * 16  # forward + backward multiply-adds of 16 samples
    assert loop.call_flops(ids) == one_device
    assert batched.call_flops(ids) == 10 * one_device


def test_thread_count_does_not_change_a_small_run(cli_run):
    """auto puts every call of a small run on one thread: the same numbers as threads = 1,
    and the manifest says how many calls ran at each count."""
    config = {"run": {"rounds": 6, "eval_every": 3, "device": "cpu"},  # threads are a CPU matter
              "data": {"dataset": "digits", "clients": 20},
              "model": {"name": "logreg"},
              "server": {"timing": "ideal", "clients_per_round": 5},
              "client": {"local_steps": 2, "batch_size": 8}}
    auto_dir = cli_run(config, name="auto")
    one_dir = cli_run({**config, "run": {**config["run"], "threads": 1}}, name="one")
    columns = ["round", "arrived", "train_loss", "test_loss", "test_acc"]
    assert pl.read_parquet(auto_dir / "rounds.parquet")[columns].equals(
        pl.read_parquet(one_dir / "rounds.parquet")[columns])
    auto = json.loads((auto_dir / "manifest.json").read_text())["threads"]
    assert auto["setting"] == "auto" and set(auto["calls_by_threads"]) == {"1"}
    assert auto["calls_by_threads"]["1"] == 6 + 3  # six training calls, the initial and two evaluations
    assert json.loads((one_dir / "manifest.json").read_text())["threads"]["setting"] == 1


@pytest.mark.parametrize("value", [0, -2, '"many"'])
def test_a_bad_thread_setting_is_one_error_line(cli_run, value):
    cli_run({"run": {"rounds": 1}}, extra=["--set", f"run.threads={value}"], expect=2)
    err = cli_run.last_output.err.strip()
    assert err.count("\n") == 0
    assert "[run] threads" in err and '"auto"' in err and ">= 1" in err
