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


def test_auto_gives_one_thread_below_the_crossover_and_half_the_cores_from_it(restore_threads):
    """Training rules 2: a large call takes half the cores (so that a run beside other jobs never
    waits for a core at every kernel), at least one; a module through torch.func one."""
    torch.set_num_threads(4)
    policy = ThreadPolicy("auto", CPU)
    assert policy.threads_for(0) == 1
    assert policy.threads_for(CROSSOVER_FLOPS * 0.99) == 1
    assert policy.threads_for(CROSSOVER_FLOPS) == 2
    assert policy.threads_for(CROSSOVER_FLOPS * 100, module=True) == 1
    assert policy.choice(CROSSOVER_FLOPS)[1].endswith("crossover (half of 4 threads, at least one)")
    seen = []
    with policy.scope():
        assert torch.get_num_threads() == 1  # the server's own small work
        with policy.work(CROSSOVER_FLOPS * 10):
            seen.append(torch.get_num_threads())
        seen.append(torch.get_num_threads())
    assert seen == [2, 1]
    assert torch.get_num_threads() == 4  # restored after the run
    assert policy.summary() == {"setting": "auto", "max": 4, "calls_by_threads": {"2": 1}}
    torch.set_num_threads(2)
    assert ThreadPolicy("auto", CPU).threads_for(CROSSOVER_FLOPS * 100) == 1  # two cores: one


def test_a_run_started_under_rules_1_keeps_every_thread_for_a_large_call(restore_threads):
    torch.set_num_threads(4)
    policy = ThreadPolicy("auto", CPU, rules=1)
    assert policy.threads_for(CROSSOVER_FLOPS * 0.99) == 1
    assert policy.threads_for(CROSSOVER_FLOPS) == 4
    assert policy.threads_for(CROSSOVER_FLOPS, module=True) == 4


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


def test_a_shared_call_of_small_runs_is_cut_into_one_thread_parts(restore_threads):
    """Each member alone on one thread but the whole past the crossover: one part per thread;
    a member that alone gets all threads, a small whole, a pinned count or a GPU: one call."""
    torch.set_num_threads(4)
    small = CROSSOVER_FLOPS / 4
    assert ThreadPolicy("auto", CPU).parts([small] * 6) == 4
    assert ThreadPolicy("auto", CPU).parts([small, CROSSOVER_FLOPS]) == 1  # that member alone takes 2 threads
    torch.set_num_threads(2)
    auto = ThreadPolicy("auto", CPU)
    assert auto.parts([small] * 6) == 2
    assert auto.parts([small] * 3) == 1  # 0.75 x the crossover: one thread, as each run alone
    assert auto.parts([small, CROSSOVER_FLOPS]) == 2  # on two cores every member alone takes one thread
    assert auto.parts([CROSSOVER_FLOPS * 2]) == 1
    assert ThreadPolicy(2, CPU).parts([small] * 6) == 1
    assert ThreadPolicy("auto", torch.device("cuda")).parts([small] * 6) == 1
    torch.set_num_threads(1)
    assert ThreadPolicy("auto", CPU).parts([small] * 6) == 1
    torch.set_num_threads(2)
    ran = auto.run_parts([lambda: torch.get_num_threads(), lambda: torch.get_num_threads()])
    assert ran == [1, 1] and auto.summary()["calls_by_threads"] == {"1": 2}


def test_a_modules_calls_take_one_thread_and_its_shared_calls_parts_however_large(restore_threads):
    """A user's nn.Module (torch.func steps) stays on one thread under auto at any size, so a
    study's shared call of such runs goes in parts even where each run alone is large; a pinned
    count still pins it."""
    torch.set_num_threads(4)
    auto = ThreadPolicy("auto", CPU)
    large = CROSSOVER_FLOPS * 10
    assert auto.threads_for(large, module=True) == 1 and auto.threads_for(large) == 2
    assert auto.choice(large, module=True) == (1, "[run] threads = 'auto': an nn.Module's calls (many small kernels) on one thread")
    with auto.work(large, module=True):
        assert torch.get_num_threads() == 1
    assert auto.parts([large, large], module=True) == 2 and auto.parts([large, large]) == 1
    assert ThreadPolicy(2, CPU).threads_for(large, module=True) == 2


def test_a_study_of_small_runs_trains_in_parts_and_equals_each_run_alone(tmp_path, restore_threads):
    """Eight mlp points of 10 devices (4.5 M multiply-adds a call each, 36 M together): the shared
    call goes in two one-thread parts, and every point (FedAvg, MIFA, FedAU, FedAWE) is bit for
    bit its `fedsim run` alone."""
    from fedsim.cli import main
    from fedsim.config import dump_toml

    torch.set_num_threads(2)
    study = {"run": {"name": "s", "out": str(tmp_path / "runs"), "rounds": 4, "eval_every": 2,
                     "progress": False, "plots": False, "device": "cpu"},
             "data": {"dataset": "digits", "clients": 30}, "model": {"name": "mlp"},
             "server": {"timing": "ideal", "clients_per_round": 10},
             "client": {"local_steps": 3, "batch_size": 32, "lr": 0.1},
             "sweep": {"algorithm.name": ["fedavg", "mifa", "fedau", "fedawe"], "run.seed": [0, 1]}}
    (tmp_path / "s.toml").write_text(dump_toml(study))
    assert main(["sweep", str(tmp_path / "s.toml"), "--quiet"]) == 0
    points = sorted((tmp_path / "runs" / "s").glob("algorithm-*"))
    assert len(points) == 8
    for point in points:
        threads = json.loads((point / "manifest.json").read_text())["threads"]["calls_by_threads"]
        assert set(threads) == {"1"}, point.name  # no call of the study ran on both threads
        raw = (point / "config.toml").read_text().replace(str(tmp_path / "runs" / "s"), str(tmp_path / "alone"))
        (tmp_path / f"{point.name}.toml").write_text(raw)
        assert main(["run", str(tmp_path / f"{point.name}.toml"), "--quiet"]) == 0
        alone = tmp_path / "alone" / point.name
        columns = ["round", "arrived", "train_loss", "test_loss", "test_acc"]
        assert pl.read_parquet(alone / "rounds.parquet")[columns].equals(
            pl.read_parquet(point / "rounds.parquet")[columns]), point.name
        a, b = torch.load(alone / "model.pt"), torch.load(point / "model.pt")
        assert all(torch.equal(a[k], b[k]) for k in a), point.name


def test_a_resume_warns_of_threads_only_where_a_call_may_get_another_count(restore_threads):
    """Under auto a large call gets half the threads, at least one: a study point's earlier
    rounds in a worker process of one thread and its resume in one process of two threads give
    every call one thread (no warning: a sweep resumed after --processes 2 warned for every
    point); four threads now would give a large call two."""
    from fedsim.runs.experiment import other_threads

    before = {"max": 1, "calls_by_threads": {"1": 14}}
    policy = ThreadPolicy("auto", CPU)
    policy.most = 2
    assert other_threads(before, policy, 114) == []
    policy.most = 4
    (warning,) = other_threads(before, policy, 114)
    assert warning.startswith("the run's first 114 rounds trained with up to 1 threads a call, the rounds from there "
                              "on with up to 2 ([run] threads = 'auto' on this machine)")
    pinned = ThreadPolicy(2, CPU)
    assert other_threads({"max": 1, "calls_by_threads": {"1": 3}}, pinned, 3) != []  # every call: 1, now 2


def test_a_resume_that_trains_with_another_thread_count_says_so_and_keeps_it(tmp_path, capsys):
    """The run's earlier rounds had calls of 4 threads (another machine, as its manifest says);
    resumed here with up to 2 (or 1), sums may round differently: one warning, kept. Where the
    earlier calls had no more threads than now and their limit did not hold them (a study's
    points resumed in two worker processes, one thread each, after one process of two threads
    whose calls took one), nothing."""
    from fedsim.cli import main
    from fedsim.config import dump_toml

    config = {"run": {"rounds": 2, "name": "r", "out": str(tmp_path / "runs"), "progress": False, "plots": False},
              "data": {"dataset": "digits", "clients": 6}, "server": {"timing": "ideal", "clients_per_round": 3},
              "client": {"local_steps": 1, "batch_size": 8}}
    (tmp_path / "c.toml").write_text(dump_toml(config))
    assert main(["run", str(tmp_path / "c.toml"), "--quiet"]) == 0
    run_dir = tmp_path / "runs" / "r"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    here = manifest["threads"]["max"]  # (under auto a large call gets half of them, at least one)
    manifest["threads"].update(max=4 * here, calls_by_threads={"1": 2, str(2 * here): 2})
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    assert main(["run", "--resume", str(run_dir), "--set", "run.rounds=3", "--quiet"]) == 0
    warning = (f"the run's first 2 rounds trained with up to {2 * here} threads a call, the rounds from there on with "
               f"up to {max(1, here // 2)} ([run] threads = 'auto' on this machine): sums over other thread counts round "
               "differently, so they may differ in the last bits from the run uninterrupted there")
    assert f"warning: {run_dir}: {warning}\n" in capsys.readouterr().err
    assert warning in json.loads((run_dir / "manifest.json").read_text())["warnings"]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["threads"].update(max=4 * here, calls_by_threads={"1": 3})  # its calls took one thread of their 2 x here
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    assert main(["run", "--resume", str(run_dir), "--set", "run.rounds=4", "--quiet"]) == 0
    assert "threads a call" not in capsys.readouterr().err
