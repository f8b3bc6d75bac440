"""benchmarks/bench_published.py: its arithmetic (the lower bound, the extrapolation), its
configs (valid fedsim configs of the published settings), its records and table, and its
--rounds errors. The timed `fedsim run` itself is replaced by a canned one here (its CPU
smoke, `--quick`, is in benchmarks/RESULTS.md). Also bench_plane.py's one-line error for a
folder that is not a checkout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
import bench_published as bench  # noqa: E402

from fedsim.config import dump_toml  # noqa: E402
from fedsim.config.layers import load_config  # noqa: E402


def test_the_lower_bound_is_fedsims_training_flops_times_the_samples_over_the_rate():
    femnist = bench.SETTINGS["femnist-cnn"]
    # LEAF's CNN by hand: conv 5x5 1->32 on 28x28, conv 5x5 32->64 on 14x14, dense 7*7*64 -> 2048 -> 62
    macs = 28 * 28 * 32 * 25 + 14 * 14 * 64 * 32 * 25 + 3136 * 2048 + 2048 * 62
    assert bench.train_flops_per_sample(femnist) == 6 * macs == 103_271_424
    assert bench.samples_per_round(femnist) == 10 * 198  # one epoch over 10 writers of 198 samples
    # 1,500 rounds on an H100's 67 TFLOP/s: 4.58 s, 1.8 % of FLUTE's 502 s
    assert bench.lower_bound_s(6 * macs, 1980 * 1500, 67e12) == pytest.approx(4.5779, abs=1e-4)
    blazefl = bench.SETTINGS["cifar10-blazefl"]  # every one of 100 clients, 5 epochs of 8 batches of 50
    assert bench.samples_per_round(blazefl) == 100 * 5 * 400


def test_extrapolation_is_round_zero_plus_the_later_rounds_mean_and_exact_when_all_were_timed():
    wall = [2.0, 0.5, 0.7, 0.6]
    # 0.5 s besides the rounds: 3 evaluations (before round 1, after round 4, each device's own tests)
    assert bench.evaluations(4, 50) == 3 and bench.evaluations(100, 50) == 4 and bench.evaluations(101, 50) == 5
    full = bench.extrapolate(wall, loop_s=4.3, rounds=100, eval_every=50)
    assert full["steady_s_per_round"] == pytest.approx(0.6)
    assert full["rounds_s"] == pytest.approx(2.0 + 99 * 0.6)
    assert full["loop_s"] == pytest.approx(61.4 + 0.5 * 4 / 3)
    same = bench.extrapolate(wall, loop_s=4.3, rounds=4, eval_every=50)
    assert (same["rounds_s"], same["loop_s"]) == (pytest.approx(3.8), pytest.approx(4.3))


@pytest.mark.parametrize("key", list(bench.SETTINGS))
def test_each_setting_is_a_valid_fedsim_config_of_its_published_shape(tmp_path, key):
    setting = bench.SETTINGS[key]
    data = {"dataset": "parquet", "root": str(tmp_path), "client_column": "client", "label_column": "label",
            "feature_column": "image", "clients": setting.clients}
    path = tmp_path / "c.toml"
    path.write_text(dump_toml(bench.config(setting, key, data, 300, "cpu", tmp_path)))
    cfg = load_config(path, ["client.trainer=batched"])  # what --set passes on
    assert (cfg.model.name, cfg.data.clients, cfg.server.clients_per_round) == (setting.model, setting.clients,
                                                                                setting.per_round)
    assert (cfg.client.local_epochs, cfg.client.batch_size, cfg.run.rounds) == (setting.epochs, setting.batch, 300)
    assert cfg.server.timing == "ideal" and cfg.client.trainer == "batched"
    assert setting.epochs == (5 if key == "cifar10-blazefl" else 1)  # the published local epochs


def test_generated_clients_have_the_published_mean_size():
    sizes = bench.client_sizes(bench.SETTINGS["femnist-cnn"])
    assert len(sizes) == 3400 and sizes.min() >= 2
    assert sizes.mean() * 0.9 == pytest.approx(198, rel=0.01)  # 198 training samples a writer
    assert set(bench.client_sizes(bench.SETTINGS["cifar10-blazefl"])) == {500}  # 400 trained + 100 held out


def test_records_and_table_from_a_timed_run(tmp_path, monkeypatch, capsys):
    """A canned run of 4 timed rounds: what the record and the printed row make of it."""
    monkeypatch.setattr(bench, "fp32_rate", lambda device: (1e9, "test rate"))
    canned = {"wall_s": [2.0, 0.5, 0.7, 0.6], "host_s": 4.3, "process_s": 10.3}
    seen = []
    monkeypatch.setattr(bench, "time_run", lambda setting, name, data, rounds, device, sets, out:
                        seen.append((rounds, sets, data)) or canned)
    records = bench.main(["--settings", "cifar10-blazefl", "--quick", "--rounds", "cifar10-blazefl=4",
                          "--set", "client.trainer=loop", "--data", str(tmp_path / "d"),
                          "--json", str(tmp_path / "out.json")])
    quick = bench.SETTINGS["cifar10-blazefl"].scaled(**bench.SETTINGS["cifar10-blazefl"].quick)
    rounds, sets, data = seen[0]
    assert rounds == quick.rounds == 3 and sets == ["client.trainer=loop"]  # capped at the setting's count
    assert (tmp_path / "d" / "cifar10-blazefl-4x40" / "train.parquet").is_file() and data["test_fraction"] == 0.2
    record = json.loads((tmp_path / "out.json").read_text())[0]
    assert record == records[0]
    flops = bench.train_flops_per_sample(quick)
    assert record["lower_bound_s"] == pytest.approx(flops * 4 * 1 * 40 * 3 / 1e9)  # 4 clients, 1 epoch of 40, 3 rounds
    assert record["rounds_s"] == pytest.approx(2.0 + 2 * 0.6) and record["startup_s"] == pytest.approx(6.0)
    assert record["fraction_of_bound"] == pytest.approx(record["lower_bound_s"] / record["loop_s"])
    assert record["published_s"] == {"BlazeFL": pytest.approx(15.0), "Flower": pytest.approx(3 * 60 / 4.6)}
    assert record["meets_target"] is None and record["quick"] is True
    out = capsys.readouterr().out
    assert "GENERATED" in out and "n/a (--quick)" in out and "BlazeFL 15.0 s" in out


@pytest.mark.parametrize("value, problem", [("0", "positive whole number"),
                                            ("femnist=300", "unknown setting 'femnist'"),
                                            ("femnist-cnn=ten", "positive whole number")])
def test_bad_rounds_is_one_error_line(value, problem, capsys):
    with pytest.raises(SystemExit) as exit:
        bench.main(["--rounds", value])
    assert exit.value.code == 2
    assert problem in capsys.readouterr().err.splitlines()[-1]


def test_a_negative_population_cap_is_one_error_line(capsys):
    with pytest.raises(SystemExit) as exit:
        bench.main(["--max-clients", "-5"])
    assert exit.value.code == 2
    assert capsys.readouterr().err.strip() == ("error: --max-clients -5: give a positive number of clients, or 0 "
                                               "for the published population")


def test_a_failed_setting_is_one_error_line_and_the_others_still_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "fp32_rate", lambda device: (1e9, "test rate"))

    def time_run(setting, name, data, rounds, device, sets, out):
        if name == "femnist-cnn":
            raise bench.RunFailed("femnist-cnn: fedsim run failed: error: [client] cuda_graphs: no such key")
        return {"wall_s": [1.0, 0.5], "host_s": 1.6, "process_s": 3.0}

    monkeypatch.setattr(bench, "time_run", time_run)
    with pytest.raises(SystemExit) as exit:
        bench.main(["--settings", "cifar10-blazefl,femnist-cnn", "--quick", "--data", str(tmp_path / "d"),
                    "--json", str(tmp_path / "out.json")])
    assert exit.value.code == 1
    written = json.loads((tmp_path / "out.json").read_text())
    assert [r["setting"] for r in written] == ["cifar10-blazefl", "femnist-cnn"]
    assert "no such key" in written[1]["error"]
    out = capsys.readouterr().out
    assert "error: femnist-cnn: fedsim run failed" in out and "cifar10-blazefl" in out.splitlines()[-1]


def test_bad_settings_as_typed_is_one_line_exit_2_from_any_folder(tmp_path):
    """The script as a user types it, from another folder: one error line, nothing written."""
    script = Path(bench.__file__).resolve()
    done = subprocess.run([sys.executable, str(script), "--settings", "femnist-cnn,cifar10",
                           "--json", "out.json"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 2 and not (tmp_path / "out.json").exists()
    assert done.stderr.strip().splitlines() == [
        "error: --settings: unknown setting 'cifar10'; choose from femnist-cnn, shakespeare-lstm, "
        "resnet18-cifar100, cifar10-blazefl"]


@pytest.mark.parametrize("key, shape, classes", [("femnist-cnn", (1, 28, 28), 62), ("shakespeare-lstm", (80,), 80),
                                                 ("resnet18-cifar100", (3, 32, 32), 100)])
def test_generated_data_reads_as_the_published_shape(tmp_path, key, shape, classes):
    from fedsim.config import DataConfig
    from fedsim.data.datasets import load_dataset

    setting = bench.SETTINGS[key].scaled(**bench.SETTINGS[key].quick)
    keys, _ = bench.generate(setting, tmp_path)
    data = load_dataset(DataConfig(**keys), seed=0)
    assert (data.shape, data.n_classes) == (shape, classes)
    assert len(data.users) == setting.clients
    assert len(data.y_train) / setting.clients == pytest.approx(setting.samples, rel=0.15)
    assert len(data.y_test) / (len(data.y_train) + len(data.y_test)) == pytest.approx(setting.test_share, rel=0.3)


def test_bench_plane_given_a_folder_that_is_no_checkout_is_one_line_exit_2(tmp_path):
    """bench_plane.py --alternate as a user types it, from another folder: one error line that
    says how to make a checkout, nothing written."""
    script = Path(bench.__file__).resolve().parent / "bench_plane.py"
    done = subprocess.run([sys.executable, str(script), "--alternate", "before", str(script.parent.parent),
                           "--json", "out.json"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 2 and not (tmp_path / "out.json").exists()
    assert done.stderr.strip().splitlines() == [
        "error: before is not a fedsim checkout (no fedsim/__init__.py); give a folder made by "
        "`git worktree add DIR COMMIT`"]
