"""[model] init_from: a run starts from a saved model.pt (or a run directory's), and every
file that does not fit this run's model is one error line before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
import torch

from fedsim.config import DataConfig, ModelConfig
from fedsim.training import build_task

QUADRATIC = {
    "data": {"dataset": "quadratic", "clients": 3,
             "targets": [[1.0, 0.0, 0.25], [0.0, 1.0, -3.0], [0.3, 0.7, 2.0]]},
    "model": {"init": [0.5, 2.0, -1.0]},
    "client": {"batch_size": 0, "local_steps": 2, "lr": 0.1, "lr_schedule": "constant"},
    "server": {"timing": "ideal"},
    "algorithm": {"name": "fedavg"},
    "run": {"eval_every": 5},
}
DIGITS = {
    "data": {"dataset": "digits", "clients": 10},
    "model": {"name": "logreg"},
    "client": {"local_steps": 3, "batch_size": 16, "lr": 0.1},
    "server": {"timing": "ideal", "clients_per_round": 5},
    "run": {"eval_every": 5},
}


def with_keys(config: dict, **sections: dict) -> dict:
    """`config` with some keys of its sections replaced."""
    out = {section: dict(body) for section, body in config.items()}
    for section, body in sections.items():
        out.setdefault(section, {}).update(body)
    return out


def saved_model(tmp_path, name: str, data: dict, model: dict) -> str:
    """A model.pt as a run of these [data] and [model] settings writes it (its initial parameters)."""
    task = build_task(DataConfig(**data), ModelConfig(**model), seed=0, device=torch.device("cpu"))
    path = tmp_path / name
    torch.save(task.state_dict(task.init_params()), path)
    return str(path)


def test_ten_plus_ten_rounds_from_init_from_equal_one_twenty_round_run(cli_run):
    first = cli_run(with_keys(QUADRATIC, run={"rounds": 10}), name="first")
    second = cli_run(with_keys(QUADRATIC, run={"rounds": 10}, model={"init_from": str(first)}),
                     name="second")
    whole = cli_run(with_keys(QUADRATIC, run={"rounds": 20}), name="whole")
    x10 = torch.load(first / "model.pt")["x"]
    x20 = torch.load(whole / "model.pt")["x"]
    assert not torch.equal(x10, x20)  # the second half moved the model
    assert torch.equal(torch.load(second / "model.pt")["x"], x20)
    # the second run's initial evaluation is that of the first run's final x
    targets = torch.tensor(QUADRATIC["data"]["targets"]).double()  # as the task holds them
    loss = float(0.5 * ((x10.double() - targets) ** 2).sum(dim=1).mean())
    assert json.loads((second / "manifest.json").read_text())["initial"]["test_loss"] == loss


def test_digits_warm_start_begins_at_the_saved_runs_accuracy(cli_run):
    first = cli_run(with_keys(DIGITS, run={"rounds": 10}), name="first")
    final_acc = pl.read_parquet(first / "rounds.parquet")["test_acc"].drop_nulls()[-1]
    # another seed and partition: the test split and the saved parameters decide the start
    second = cli_run(with_keys(DIGITS, run={"rounds": 2, "seed": 5}, data={"partition": "dirichlet"},
                               model={"init_from": str(first / "model.pt")}), name="second")
    initial = json.loads((second / "manifest.json").read_text())["initial"]
    fresh = json.loads((first / "manifest.json").read_text())["initial"]
    assert initial["test_acc"] == final_acc and initial["test_acc"] > fresh["test_acc"] + 0.3


def test_a_relative_path_is_looked_up_beside_the_config(cli_run, tmp_path, monkeypatch):
    saved_model(tmp_path, "start.pt", {"dataset": "quadratic", "clients": 3, "dim": 3},
                {"init": [7.0, 7.0, 7.0]})
    monkeypatch.chdir(tmp_path / "..")
    config = with_keys(QUADRATIC, run={"rounds": 1}, model={"init_from": "start.pt", "init": []})
    run_dir = cli_run(config, name="relative")
    targets = torch.tensor(QUADRATIC["data"]["targets"]).double()  # as the task holds them
    loss = float(0.5 * ((7.0 - targets) ** 2).sum(dim=1).mean())
    # (float64 on the CPU; a GPU sums in another order: equal to the last bits)
    assert json.loads((run_dir / "manifest.json").read_text())["initial"]["test_loss"] == pytest.approx(loss, rel=1e-12)


def error_line(cli_run, config: dict, name: str = "bad") -> str:
    """The one error line of a run of `config`, which must write nothing."""
    cli_run(config, name=name, expect=2)
    err = cli_run.last_output.err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (cli_run.tmp / "runs" / name).exists()
    return err.strip()


def test_a_missing_path_and_a_comparison_directory(cli_run, tmp_path):
    cfg = tmp_path / "bad.toml"
    assert error_line(cli_run, with_keys(QUADRATIC, model={"init_from": "nowhere"})) == (
        f"error: {cfg}: [model] init_from = 'nowhere': no such file or run directory; give a run's "
        "model.pt or its run directory (relative: to the working directory or the config file)")
    both = cli_run(with_keys(QUADRATIC, run={"rounds": 1, "algorithms": ["fedavg", "mifa"]}), name="both")
    assert error_line(cli_run, with_keys(QUADRATIC, model={"init_from": str(both)})) == (
        f"error: {cfg}: [model] init_from = '{both}' is a comparison of fedavg, mifa; name the "
        f"algorithm's sub-folder, e.g. '{both / 'fedavg'}'")
    (tmp_path / "empty").mkdir()
    assert error_line(cli_run, with_keys(QUADRATIC, model={"init_from": str(tmp_path / "empty")})) == (
        f"error: {cfg}: [model] init_from = '{tmp_path / 'empty'}': the directory holds no model.pt; "
        "give the directory of a run that finished, or a model.pt file")


@pytest.mark.parametrize("content, why", [
    (b"not a checkpoint", "UnpicklingError"),
    ([torch.zeros(3)], "not a dict of named tensors"),
    ({"x": torch.zeros(3), "note": "text"}, "not a dict of named tensors"),
])
def test_a_file_that_is_not_a_state_dict(cli_run, tmp_path, content, why):
    path = tmp_path / "model.pt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        torch.save(content, path)
    assert error_line(cli_run, with_keys(QUADRATIC, model={"init_from": str(path)})) == (
        f"error: {tmp_path / 'bad.toml'}: [model] init_from = '{path}': {path} is not a readable "
        f"checkpoint ({why}); give a model.pt that a fedsim run wrote")


def test_a_runs_checkpoint_pt_is_refused_without_running_its_code(cli_run):
    path = cli_run(with_keys(QUADRATIC, run={"rounds": 1}), name="first") / "checkpoint.pt"
    assert error_line(cli_run, with_keys(QUADRATIC, model={"init_from": str(path)})) == (
        f"error: {cli_run.tmp / 'bad.toml'}: [model] init_from = '{path}': {path} is not a readable "
        "checkpoint (UnpicklingError); give a model.pt that a fedsim run wrote")


DIGITS_DATA = {"dataset": "digits", "clients": 10}


@pytest.mark.parametrize("saved, model, message", [
    ({"name": "mlp", "hidden": 8}, {"name": "mlp", "hidden": 16},
     ("parameter 'fc1.weight' has shape [8, 64] in the file but [16, 64] in this run's model; "
      "set [model] name and hidden and [data] dataset as in the run that saved it")),
    ({"name": "logreg"}, {"name": "mlp", "hidden": 16},
     ("the file has no parameter 'fc2.weight', which this run's model has; "
      "set [model] name and hidden and [data] dataset as in the run that saved it")),
    ({"name": "mlp", "hidden": 10}, {"name": "logreg"},
     ("the file has a parameter 'fc2.weight', which this run's model lacks; "
      "set [model] name and hidden and [data] dataset as in the run that saved it")),
])
def test_parameters_that_do_not_fit_this_model(cli_run, tmp_path, saved, model, message):
    path = saved_model(tmp_path, "model.pt", DIGITS_DATA, saved)
    config = with_keys(DIGITS, model={**model, "init_from": path})
    assert error_line(cli_run, config) == (
        f"error: {tmp_path / 'bad.toml'}: [model] init_from = '{path}': {message}")


def test_a_quadratic_of_another_dimension(cli_run, tmp_path):
    path = saved_model(tmp_path, "model.pt", {"dataset": "quadratic", "clients": 3, "dim": 2}, {})
    assert error_line(cli_run, with_keys(QUADRATIC, model={"init_from": path})) == (
        f"error: {tmp_path / 'bad.toml'}: [model] init_from = '{path}': parameter 'x' has shape [2] in "
        "the file but [3] in this run's model; set [data] dim and targets as in the run that saved it")


def test_a_warm_started_run_resumes_without_its_init_file(tmp_path, monkeypatch):
    """The checkpoint holds the model: the init_from file may be gone by the resume."""
    import shutil

    from fedsim.cli import main
    from fedsim.config import dump_toml

    monkeypatch.chdir(tmp_path)
    base = {"run": {"rounds": 4, "eval_every": 2, "progress": False, "plots": False},
            "data": {"dataset": "quadratic", "clients": 3, "targets": [[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]]},
            "client": {"batch_size": 0, "local_steps": 1, "lr": 0.1}, "server": {"timing": "ideal"}}
    Path("a.toml").write_text(dump_toml({**base, "run": {**base["run"], "name": "a"}}))
    assert main(["run", "a.toml", "--quiet"]) == 0
    warm = {**base, "run": {**base["run"], "name": "b"}, "model": {"init_from": "runs/a"}}
    Path("b.toml").write_text(dump_toml(warm))
    assert main(["run", "b.toml", "--quiet"]) == 0
    shutil.rmtree("runs/a")
    assert main(["run", "--resume", "runs/b", "--set", "run.rounds=8", "--quiet"]) == 0
