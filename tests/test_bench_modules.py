"""benchmarks/bench_modules.py: its records (both timings of every row, as the script writes
them), that its plain loop does the local steps fedsim does, and its one-line errors. No
timed assertions: its numbers are in benchmarks/RESULTS.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPT = BENCHMARKS / "bench_modules.py"


@pytest.fixture(scope="module")
def bench():
    """The script as a module. Importing it registers its models (and bench_cohort's) by name in
    fedsim's model registry: they are taken out again, so that no other test sees them."""
    from fedsim.config.catalog import MODELS

    before = set(MODELS)
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import bench_modules

        yield bench_modules
    finally:
        sys.path.remove(str(BENCHMARKS))
        for name in set(MODELS) - before:
            del MODELS[name]


def test_quick_run_writes_both_timings_of_each_setting(tmp_path, bench):
    done = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--models", "user-transformer",
                           "--out", "out.json"], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["quick"] and result["repeats"] == 1 and result["busy"] == 0
    assert len(result["loadavg_before"]) == len(result["loadavg_after"]) == 3
    assert [(r["model"], r["setting"]) for r in result["records"]] == [("user-transformer", "steps"),
                                                                      ("user-transformer", "epochs")]
    steps, epochs = result["records"]
    quick = bench.QUICK
    assert steps["steps_per_round"] == quick["steps"].devices * quick["steps"].local_steps
    assert epochs["steps_per_round"] >= quick["epochs"].devices * quick["epochs"].local_epochs
    for rec in result["records"]:
        assert rec["kind"] == "module" and rec["dataset"] == "digits" and rec["fedsim_path"] in ("batched", "loop")
        assert len(rec["fedsim_s"]) == len(rec["plain_s"]) == 1
        assert rec["fedsim_median_s"] > 0 and rec["plain_median_s"] > 0
        assert rec["ratio"] == pytest.approx(rec["fedsim_median_s"] / rec["plain_median_s"], rel=0.01, abs=0.002)
        assert rec["over_promise"] == (rec["fedsim_median_s"] > rec["plain_median_s"])
    table = done.stdout.splitlines()
    assert table[0].startswith("machine: ") and "busy processes: 0" in table[0]
    assert sum(line.startswith("user-transformer ") for line in table) == 2


def test_the_trainer_a_user_names_is_the_one_measured(tmp_path):
    """`--trainer loop`: a module auto trains batched (the transformer) runs on the loop."""
    done = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--models", "user-transformer", "--settings",
                           "steps", "--trainer", "loop", "--out", "out.json"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["trainer"] == "loop" and [(r["trainer"], r["fedsim_path"]) for r in result["records"]] == \
        [("loop", "loop")]


def test_cohort_sizes_a_user_names_are_measured_each_with_a_client_per_device(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--models", "user-transformer", "--settings",
                           "steps", "--devices", "2,25", "--out", "out.json"], capture_output=True, text=True, cwd=tmp_path,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["device"] == "cpu"
    steps = [(r["devices"], r["steps_per_round"], r["device"]) for r in result["records"]]
    assert steps == [(2, 4, "cpu"), (25, 50, "cpu")]  # (--quick: 2 local steps; digits is cut in 20 clients, here 25)


def test_the_plain_loop_takes_fedsims_local_steps_on_each_devices_own_data(bench):
    """Local epochs of unequal devices: the plain loop's minibatches are each device's samples,
    each once an epoch, as many as fedsim's steps (epochs x ceil(n / batch))."""
    setting = bench.QUICK["epochs"]
    pair = bench.Pair(bench.MODELS["user-mlp"], setting)
    sizes = pair.task.data.sizes_np[pair.ids]
    assert len(set(sizes)) > 1  # unequal devices
    np.testing.assert_array_equal(pair.steps, setting.local_epochs * -(-sizes // setting.batch))
    for (x, y), n, steps in zip(pair.local, sizes, pair.steps):
        assert len(x) == len(y) == n
        batches = pair._minibatches(int(n), int(steps), setting.batch)
        assert len(batches) == steps
        assert sorted(torch.cat(batches).tolist()) == sorted(list(range(n)) * setting.local_epochs)
    assert pair._plain(warm_up=False).shape == (setting.devices, pair.task.dim)


@pytest.mark.parametrize("args, says", [
    (["--models", "logreg,resnet"], "error: --models: unknown name 'resnet'; choose from logreg, mlp, lenet5, "
                                    "cnn-fmnist, user-mlp, user-lenet5, user-lenet5-class, user-resnet-gn, "
                                    "user-transformer, user-bn-cnn, user-gn-cnn, user-mnist-example, user-lstm, "
                                    "user-vit, user-gelu-mlp, user-wide-mlp, user-padded-wide, user-conv-wide, "
                                    "user-layer-norm-mlp, user-tanh-mlp, user-residual-mlp, user-elu-mlp, "
                                    "user-bn-mlp"),
    (["--settings", "epoch"], "error: --settings: unknown name 'epoch'; choose from steps, epochs"),
    (["--repeats", "-1"], "error: --repeats -1: give a number of timed rounds >= 1 (0: the default)"),
    (["--devices", "10,ten"], "error: --devices 10,ten: give cohort sizes >= 1, comma-separated (10,100,1000)"),
    (["--devices", "0"], "error: --devices 0: give cohort sizes >= 1, comma-separated (10,100,1000)"),
])
def test_bad_arguments_are_one_line_exit_2_and_nothing_written(tmp_path, args, says):
    done = subprocess.run([sys.executable, str(SCRIPT), *args, "--out", "out.json"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 2 and not (tmp_path / "out.json").exists()
    assert done.stderr.strip().splitlines() == [says]


def test_bench_dropout_writes_each_trainers_share_with_and_without_dropout(tmp_path):
    """benchmarks/bench_dropout.py: a round of each trainer with and without dropout, the share
    and (fedsim's) the draws alone; fedsim's rounds without dropout draw no numbers."""
    done = subprocess.run([sys.executable, str(BENCHMARKS / "bench_dropout.py"), "--repeats", "1", "--threads", "1",
                           "--out", "out.json"], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["threads"] == "1" and len(result["loadavg_after"]) == 3
    assert [r["row"] for r in result["records"]] == ["batched", "loop", "plain"]
    for rec in result["records"]:
        assert len(rec["with_s"]) == len(rec["without_s"]) == 1 and rec["threads"] == 1
        assert rec["dropout_share"] == pytest.approx(1 - rec["without_median_s"] / rec["with_median_s"], abs=0.002)
        assert (rec["draws_median_s"] is None) == (rec["row"] == "plain")
    # as a GPU draws them: the cohort's 10 steps in one call, the loop's each device's in one
    batched, loop = (r["draw_ops"]["as_on_gpu"] for r in result["records"][:2])
    assert 5 * batched < loop and result["records"][2]["draw_ops"] is None
    # 2 layers x (attention 4 heads x 8 x 8 + 3 dropouts of 8 tokens x (32, 64, 32)) per sample, x 16
    assert result["records"][0]["dropout_numbers_per_step"] == 16 * 2 * (4 * 8 * 8 + 8 * (32 + 64 + 32))


def test_bench_loop_step_times_three_ways_to_the_same_gradients(tmp_path):
    """benchmarks/bench_loop_step.py: a row per model of the module's autograd, the kernels'
    autograd and the written-out step, which it checks give the same gradients bit for bit
    before timing them; the pools' table with --pools."""
    done = subprocess.run([sys.executable, str(BENCHMARKS / "bench_loop_step.py"), "--models", "logreg,lenet5",
                           "--steps", "1", "--repeat", "1", "--pools", "--json", "out.json"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "out.json").read_text())
    assert [r["model"] for r in result["steps"]] == ["logreg", "lenet5"]
    assert all(r["module"] > 0 and r["autograd"] > 0 and r["written out"] > 0 for r in result["steps"])
    assert [tuple(r["shape"]) for r in result["pools"]] == [(16, 32, 28, 28), (16, 32, 14, 14), (16, 6, 28, 28),
                                                           (16, 16, 10, 10)]
    assert sum(line.startswith(("logreg ", "lenet5 ")) for line in done.stdout.splitlines()) == 2
