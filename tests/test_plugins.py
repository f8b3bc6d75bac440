"""Plugin algorithms from the CLI: by "module:Class" and by an installed package's entry point."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import final_x, quadratic_config  # noqa: E402
from test_custom_algorithm import HandMomentum  # noqa: E402

from fedsim.cli import main  # noqa: E402

# FedAvg with hand-written server momentum (v <- 0.9 v + mean delta, x <- x + v) as a plugin file
FEDAVGM = "from fedsim.algorithms import Strategy\n\n\n" + inspect.getsource(HandMomentum).replace(
    "class HandMomentum", "class FedAvgM")
TARGETS = [[1.0, 0.0], [0.0, 2.0], [3.0, 1.0]]


def plugin_module(folder: Path, name: str, text: str = FEDAVGM) -> str:
    (folder / f"{name}.py").write_text(text)
    return name


def config(algorithm: str, rounds_: int = 20, **options) -> dict:
    cfg = quadratic_config(TARGETS, algorithm=algorithm, rounds=rounds_, lr=0.3)
    cfg["algorithm"].update(options)
    return cfg


def test_a_module_path_plugin_runs_resumes_and_equals_the_builtin_momentum(cli_run, tmp_path, monkeypatch):
    """Hand-written FedAvgM in the working directory == fedavg + server momentum (to float32
    rounding: a mean against a weighted sum), and a resumed plugin run == an uninterrupted one
    bit for bit."""
    monkeypatch.chdir(tmp_path)
    name = f"{plugin_module(tmp_path, 'hand_fedavgm_a')}:FedAvgM"
    plugin = cli_run(config(name), name="plugin")
    builtin = cli_run(config("fedavg", server_optimizer="momentum", server_momentum=0.9), name="builtin")
    np.testing.assert_allclose(final_x(plugin), final_x(builtin), rtol=1e-5)
    plain = cli_run(config("fedavg"), name="plain")
    assert not np.allclose(final_x(plugin), final_x(plain), atol=1e-3)  # momentum made a difference

    half = cli_run(config(name, rounds_=9), name="half")
    assert main(["run", "--resume", str(half), "--set", "run.rounds=20", "--quiet"]) == 0
    assert np.array_equal(final_x(half), final_x(plugin))


def test_an_installed_entry_point_plugin_runs_by_its_name(cli_run, tmp_path, monkeypatch):
    """A package that declares [fedsim.algorithms] demo-momentum = ... in its metadata."""
    site = tmp_path / "site"
    site.mkdir()
    plugin_module(site, "demo_plugin_b")
    info = site / "fedsim_demo_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fedsim-demo-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[fedsim.algorithms]\ndemo-momentum = demo_plugin_b:FedAvgM\n")
    monkeypatch.syspath_prepend(str(site))
    by_entry_point = cli_run(config("demo-momentum"), name="ep")
    builtin = cli_run(config("fedavg", server_optimizer="momentum", server_momentum=0.9), name="builtin")
    np.testing.assert_allclose(final_x(by_entry_point), final_x(builtin), rtol=1e-5)
    cli_run(config("demo-momentun"), name="typo", expect=2)
    err = cli_run.last_output.err
    assert "did you mean 'demo-momentum'?" in err and "fedavg" in err  # listed with the built-ins


@pytest.mark.parametrize("module_text, name, says", [
    (None, "no_such_module_c:Thing", "no module 'no_such_module_c' in the working directory or on PYTHONPATH"),
    ("1 / 0\n", "broken_plugin_d:Thing", "importing 'broken_plugin_d' failed (ZeroDivisionError"),
    (FEDAVGM, "plugin_e:FedAvgMM", "module 'plugin_e' has no 'FedAvgMM'"),
    ("class Thing:\n    pass\n", "plugin_f:Thing", "not a subclass of fedsim.algorithms.Strategy"),
    (None, "plugin_g:", "is not of the form 'package.module:Name'"),
])
def test_a_bad_plugin_is_one_error_line(cli_run, tmp_path, monkeypatch, module_text, name, says):
    monkeypatch.chdir(tmp_path)
    if module_text is not None:
        plugin_module(tmp_path, name.split(":")[0], module_text)
    cli_run(config(name), name="bad", expect=2)
    err = cli_run.last_output.err
    assert err.count("\n") == 1 and says in err and "[algorithm] name" in err, err
    assert not (tmp_path / "runs").exists()


LINEAR_MODEL = '''
from fedsim.training.models import Dense, Flatten


def wide_linear(in_shape, n_classes, cfg):
    """Softmax regression as a plugin: flatten, one dense layer."""
    n_in = 1
    for size in in_shape:
        n_in *= size
    return [Flatten(), Dense("out", n_in, n_classes)]
'''


def test_a_plugin_model_trains_like_the_builtin_it_copies(cli_run, tmp_path, monkeypatch):
    """A model defined in the user's own file, by "module:function", through `fedsim run`."""
    monkeypatch.chdir(tmp_path)
    plugin_module(tmp_path, "user_models_h", LINEAR_MODEL)
    base = {"run": {"rounds": 4, "eval_every": 4}, "data": {"dataset": "digits", "clients": 10},
            "server": {"timing": "ideal", "clients_per_round": 5},
            "client": {"local_steps": 2, "batch_size": 8, "trainer": "loop"}}
    plugin = cli_run({**base, "model": {"name": "user_models_h:wide_linear"}}, name="plugin")
    builtin = cli_run({**base, "model": {"name": "logreg"}}, name="builtin")
    np.testing.assert_allclose(rounds_of(plugin, "test_loss"), rounds_of(builtin, "test_loss"), rtol=1e-5)
    cli_run({**base, "model": {"name": "user_models_h:nope"}}, name="bad", expect=2)
    assert "[model] name" in cli_run.last_output.err and "has no 'nope'" in cli_run.last_output.err


def rounds_of(run_dir, column):
    import polars as pl

    return pl.read_parquet(run_dir / "rounds.parquet")[column].drop_nulls().to_numpy()


def doc_blocks(language: str) -> list[str]:
    """The fenced code blocks of docs/extending.md in `language`, in order."""
    import re

    text = (Path(__file__).parent.parent / "docs" / "extending.md").read_text()
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def test_the_extending_guide_examples_run_as_written(cli_run, tmp_path, monkeypatch):
    """docs/extending.md: its FedAvgM is fedavg + server momentum, resumes exactly, and its
    model trains on digits."""
    monkeypatch.chdir(tmp_path)
    algorithm, model = doc_blocks("python")[:2]
    plugin_module(tmp_path, "my_fedavgm", algorithm)
    plugin_module(tmp_path, "my_models", model)
    guide = cli_run(config("my_fedavgm:FedAvgM", beta=0.8), name="guide")
    builtin = cli_run(config("fedavg", server_optimizer="momentum", server_momentum=0.8), name="builtin")
    np.testing.assert_allclose(final_x(guide), final_x(builtin), rtol=1e-5)
    half = cli_run(config("my_fedavgm:FedAvgM", rounds_=7, beta=0.8), name="half")
    assert main(["run", "--resume", str(half), "--set", "run.rounds=20", "--quiet"]) == 0
    assert np.array_equal(final_x(half), final_x(guide))
    digits = cli_run({"run": {"rounds": 3, "eval_every": 3}, "data": {"dataset": "digits", "clients": 10},
                      "model": {"name": "my_models:two_layer", "hidden": 32},
                      "client": {"local_steps": 2, "batch_size": 8}}, name="model")
    assert 0.1 < rounds_of(digits, "test_acc")[-1] <= 1.0
