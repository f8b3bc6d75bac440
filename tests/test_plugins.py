"""Plugin algorithms from the CLI: by "module:Class" and by an installed package's entry point."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import json

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from conftest import final_x, quadratic_config  # noqa: E402
from test_custom_algorithm import HandMomentum  # noqa: E402

from fedsim.cli import main  # noqa: E402
from fedsim.config import dump_toml, read_toml  # noqa: E402

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


def test_a_selection_policy_plugin_runs_keeps_its_state_and_takes_its_own_keys(cli_run, tmp_path, monkeypatch):
    """`[algorithm] selection = "module:Class"`: 6 devices always online, 2 invited a round by
    fewest arrivals so far: after 9 rounds every device arrived 3 times; its table is
    checkpointed (a resumed run equals an uninterrupted one bit for bit) and counted in server
    memory; its own key is a config key (typo suggested)."""
    import polars as pl

    monkeypatch.chdir(tmp_path)
    plugin_module(tmp_path, "fewest", doc_blocks("fewest.py")[0])  # docs/extending.md's, as written
    targets = [[float(i), 0.0] for i in range(6)]

    def fewest(rounds_, **options):
        cfg = quadratic_config(targets, rounds=rounds_, algorithm="fedavg")
        cfg["algorithm"].update(selection="fewest:Fewest", **options)
        cfg["server"]["clients_per_round"] = 2
        return cfg

    whole = cli_run(fewest(9), name="whole")
    events = pl.read_parquet(whole / "events.parquet")
    assert sorted(events.group_by("device_id").len()["len"].to_list()) == [3] * 6
    half = cli_run(fewest(4), name="half")
    assert main(["run", "--resume", str(half), "--set", "run.rounds=9", "--quiet"]) == 0
    assert pl.read_parquet(half / "events.parquet").equals(events)
    uniform = cli_run({**fewest(9), "algorithm": {"name": "fedavg"}}, name="uniform")
    memory = {r: json.loads((r / "manifest.json").read_text())["server_memory_bytes"] for r in (whole, uniform)}
    assert memory[whole] == memory[uniform] + 6 * 8
    extra = cli_run(fewest(3, fewest_extra=1), name="extra")
    assert pl.read_parquet(extra / "events.parquet").group_by("round").len()["len"].to_list() == [3, 3, 3]
    cli_run(fewest(3, fewest_extar=1), name="typo", expect=2)
    assert "unknown key [algorithm] fewest_extar for 'fedavg'; did you mean 'fewest_extra'?" in cli_run.last_output.err
    # a policy's wrong answer is checked under a built-in algorithm too
    plugin_module(tmp_path, "twice", doc_blocks("fewest.py")[0].replace("np.sort(order[:", "np.sort(order[:1].repeat(2) "
                                                                                          "if rnd else order[:"))
    cli_run({**fewest(3), "algorithm": {"name": "fedavg", "selection": "twice:Fewest"}}, name="twice", expect=2)
    assert "error: algorithm 'fedavg': select(rnd=1, ...) returned device " in cli_run.last_output.err


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


def test_a_plugin_is_named_in_its_error_lines_as_the_config_names_it(cli_run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plugin_module(tmp_path, "plugin_h", FEDAVGM.replace('state = ("velocity",)', 'state = ("velocity", "nesterov")'))
    cli_run(config("plugin_h:FedAvgM"), name="bad", expect=2)
    assert cli_run.last_output.err == ("error: algorithm 'plugin_h:FedAvgM' declares state 'nesterov' but has no such "
                                       "attribute after init_state; set it there (or remove it from `state`) so that "
                                       "checkpoints keep it\n")


WRONG_ANSWERS = """
import numpy as np

from fedsim.algorithms import Strategy
from fedsim.algorithms.fedavg import FedAvg


class Twice(FedAvg):
    def select(self, rnd, online, rng):
        return np.concatenate([online[:2], online[:1]])


class Offline(FedAvg):
    def select(self, rnd, online, rng):
        return np.array([999])


class Fractional(FedAvg):
    def local_steps(self, rnd, ids):
        return np.full(len(ids), 2.5)


class Stacked(FedAvg):
    def aggregate(self, rnd, arrivals):
        super().aggregate(rnd, arrivals)
        self.params = self.params[None]


class Doubled(FedAvg):
    def aggregate(self, rnd, arrivals):
        super().aggregate(rnd, arrivals)
        self.params = self.params.double()


class Ruleless(Strategy):
    pass
"""


@pytest.mark.parametrize("name, says", [
    ("Twice", "select(rnd=0, ...) returned device 0 twice ([0, 1, 0]); return distinct int ids among the `online` "
              "ids it is given"),
    ("Offline", "select(rnd=0, ...) returned device 999, which was not among the devices it was offered ([999])"),
    ("Fractional", "local_steps(rnd=0, ids) returned [2.5, 2.5, 2.5] for 3 devices; return one whole number of steps "
                   ">= 0 for each id (int64 [k])"),
    ("Stacked", "after round 0's aggregate, self.params is (1, 2) torch.float32 on cpu, not the flat model (2,) "
                "torch.float32 on cpu"),
    ("Doubled", "after round 0's aggregate, self.params is (2,) torch.float64 on cpu, not the flat model (2,) "
                "torch.float32 on cpu"),
    ("Ruleless", "has no aggregate(self, rnd, arrivals), the rule that moves the global model each round"),
])
def test_a_plugins_wrong_answer_to_the_engine_is_one_line_naming_it(cli_run, tmp_path, monkeypatch, name, says):
    """Where the wrong answer would otherwise train a device twice, count an offline device as
    dropped, truncate steps, or fail rounds later inside torch."""
    monkeypatch.chdir(tmp_path)
    plugin_module(tmp_path, "wrong_answers", WRONG_ANSWERS)
    cli_run(config(f"wrong_answers:{name}"), name="bad", expect=2)
    err = cli_run.last_output.err
    assert err.count("\n") == 1 and err.startswith(f"error: algorithm 'wrong_answers:{name}'") and says in err, err


LINEAR_MODEL = '''
import math

import torch
from torch import nn


def wide_linear(in_shape, n_classes, cfg):
    """Softmax regression as a plugin: flatten, one dense layer, initialised as the built-ins."""
    module = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(in_shape), n_classes))
    torch.manual_seed(torch.initial_seed())
    nn.init.kaiming_normal_(module[1].weight, nonlinearity="relu")
    nn.init.zeros_(module[1].bias)
    return module
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


def doc_blocks(*files: str) -> list[str]:
    """The Python blocks of docs/extending.md that are the files named (their first line: `# NAME`)."""
    import re

    text = (Path(__file__).parent.parent / "docs" / "extending.md").read_text()
    titled = [(block.split("\n", 1)[0].removeprefix("# "), block)
              for block in re.findall(r"```python\n(.*?)```", text, flags=re.S)]
    blocks = dict(titled)
    assert len(blocks) == len(titled), "two blocks of docs/extending.md name the same file"
    return [blocks[name] for name in files]


def test_the_extending_guide_examples_run_as_written(cli_run, tmp_path, monkeypatch):
    """docs/extending.md: its FedAvgM is fedavg + server momentum, resumes exactly, and its
    model trains on digits."""
    monkeypatch.chdir(tmp_path)
    algorithm, model = doc_blocks("my_fedavgm.py", "my_models.py")
    plugin_module(tmp_path, "my_fedavgm", algorithm)
    plugin_module(tmp_path, "my_models", model)
    guide = cli_run(config("my_fedavgm:FedAvgM", beta=0.8), name="guide")
    builtin = cli_run(config("fedavg", server_optimizer="momentum", server_momentum=0.8), name="builtin")
    np.testing.assert_allclose(final_x(guide), final_x(builtin), rtol=1e-5)
    half = cli_run(config("my_fedavgm:FedAvgM", rounds_=7, beta=0.8), name="half")
    assert main(["run", "--resume", str(half), "--set", "run.rounds=20", "--quiet"]) == 0
    assert np.array_equal(final_x(half), final_x(guide))
    digits = cli_run({"run": {"rounds": 5, "eval_every": 1}, "data": {"dataset": "digits", "clients": 10},
                      "model": {"name": "my_models:two_layer", "hidden": 32},
                      "client": {"local_steps": 2, "batch_size": 8, "lr": 0.1}}, name="model")
    loss = rounds_of(digits, "test_loss")
    assert len(loss) == 5 and loss[-1] < loss[0]  # it learns (torch's own init: slowly at first)
    saved = torch.load(digits / "model.pt")
    module = sys.modules["my_models"].two_layer((1, 8, 8), 10, type("Cfg", (), {"hidden": 32}))
    module.load_state_dict(saved)  # the module's own state_dict


def test_a_models_own_keys_are_config_keys_checked_shown_and_swept(cli_run, tmp_path, monkeypatch, capsys):
    """docs/extending.md's `deep` declares width and depth: given as [model] keys (a typo gets
    the nearest name), defaults filled in, listed by `config show`, swept by a study."""
    monkeypatch.chdir(tmp_path)
    plugin_module(tmp_path, "my_deep", doc_blocks("my_deep.py")[0])
    base = {"run": {"rounds": 2}, "data": {"dataset": "digits", "clients": 6},
            "server": {"timing": "ideal", "clients_per_round": 3}, "client": {"local_steps": 1, "batch_size": 8}}
    run_dir = cli_run({**base, "model": {"name": "my_deep:deep", "width": 24, "depth": 2}})
    shapes = {k: list(v.shape) for k, v in torch.load(run_dir / "model.pt").items()}
    assert shapes == {"1.weight": [24, 64], "1.bias": [24], "3.weight": [24, 24], "3.bias": [24],
                      "5.weight": [10, 24], "5.bias": [10]}
    assert read_toml(run_dir / "config.toml")["model"]["width"] == 24
    assert main(["run", "--resume", str(run_dir), "--set", "run.rounds=3", "--quiet"]) == 0  # its config reads back
    from test_stop_and_resume import fedsim
    (tmp_path / "elsewhere").mkdir()
    done = fedsim(["trace", "info", str(run_dir)], tmp_path / "elsewhere")  # its keys checked where it imported them
    assert done.returncode == 0, done.stderr
    cli_run({**base, "model": {"name": "my_deep:deep", "widht": 24}}, name="typo", expect=2)
    assert cli_run.last_output.err.endswith("unknown key [model] widht for 'my_deep:deep'; did you mean 'width'?\n")
    cli_run({**base, "model": {"name": "my_deep:deep", "width": "wide"}}, name="type", expect=2)
    assert "[model] width" in cli_run.last_output.err
    (tmp_path / "c.toml").write_text(dump_toml({**base, "model": {"name": "my_deep:deep", "depth": 3}}))
    assert main(["config", "show", str(tmp_path / "c.toml")]) == 0
    shown = capsys.readouterr().out
    assert "\ndepth = 3  # option of model 'my_deep:deep' (default 1)" in shown
    assert "\n# width = 32  # option of model 'my_deep:deep' (default 32)" in shown
    study = {**base, "run": {**base["run"], "name": "widths", "out": str(tmp_path / "runs")},
             "model": {"name": "my_deep:deep"}, "sweep": {"model.width": [8, 16]}}
    (tmp_path / "s.toml").write_text(dump_toml(study))
    assert main(["sweep", str(tmp_path / "s.toml"), "--quiet"]) == 0
    for width in (8, 16):
        assert list(torch.load(tmp_path / "runs" / "widths" / f"width-{width}" / "model.pt")["1.weight"].shape) == \
            [width, 64]


def test_a_resume_says_when_a_plugins_file_changed_since_the_runs_earlier_rounds(cli_run, tmp_path, monkeypatch,
                                                                                  capsys):
    monkeypatch.chdir(tmp_path)
    plugin_module(tmp_path, "my_deep_c", doc_blocks("my_deep.py")[0])
    base = {"run": {"rounds": 2}, "data": {"dataset": "digits", "clients": 6}, "model": {"name": "my_deep_c:deep"},
            "server": {"timing": "ideal", "clients_per_round": 3}, "client": {"local_steps": 1, "batch_size": 8}}
    run_dir = cli_run(base)
    assert main(["run", "--resume", str(run_dir), "--set", "run.rounds=3", "--quiet"]) == 0
    assert "warning" not in capsys.readouterr().err  # unchanged
    (tmp_path / "my_deep_c.py").write_text((tmp_path / "my_deep_c.py").read_text() + "# a fix\n")
    sys.modules.pop("my_deep_c")  # (a new process would import the file as it is now)
    assert main(["run", "--resume", str(run_dir), "--set", "run.rounds=4", "--quiet"]) == 0
    changed = (f"the plugin my_deep_c ({tmp_path / 'my_deep_c.py'}) changed after the run's first 3 rounds; the rounds "
               "from there on ran the new code")
    assert capsys.readouterr().err == f"warning: {run_dir}: {changed}\n"
    assert main(["run", "--resume", str(run_dir), "--set", "run.rounds=5", "--quiet"]) == 0
    assert "warning" not in capsys.readouterr().err  # (compared with the rounds just before)
    # the run directory keeps which code ran which rounds, and the warning
    manifest = json.loads((run_dir / "manifest.json").read_text())
    sessions = manifest["sessions"]
    assert [s["from_round"] for s in sessions] == [0, 2, 3, 4]
    assert sessions[1]["plugin_files"] == sessions[0]["plugin_files"] != sessions[2]["plugin_files"]
    assert [s["warnings"] for s in sessions] == [[], [], [changed], []] and changed in manifest["warnings"]
    assert {s["fedsim"] for s in sessions} == {manifest["fedsim"]} and "numpy" in sessions[0]


def trace_plugins(folder: Path) -> None:
    """docs/extending.md's generator and converter, as files in `folder`."""
    generator, converter = doc_blocks("my_traces.py", "my_converters.py")
    plugin_module(folder, "my_traces", generator)
    plugin_module(folder, "my_converters", converter)


def test_a_plugin_generator_feeds_fedsim_run_and_trace_generate(cli_run, tmp_path, monkeypatch):
    """docs/extending.md's `alternate`: half of the devices online in each half period."""
    from fedsim.traces import read_trace

    monkeypatch.chdir(tmp_path)
    trace_plugins(tmp_path)
    assert main(["trace", "generate", "my_traces:ALTERNATE", "--devices", "6", "--days", "0.25",
                 "--set", "period=7200", "--out", "alt.parquet"]) == 0
    trace = read_trace(tmp_path / "alt.parquet")
    assert trace.horizon == 6 * 3600 and trace.generator["options"] == {"period": 7200.0}
    first = trace.device_id < 3
    assert np.array_equal(np.unique(trace.start[first] % 7200), [0.0])
    assert np.array_equal(np.unique(trace.start[~first] % 7200), [3600.0])
    cfg = config("fedavg", rounds_=4)
    cfg["data"]["clients"] = 4
    cfg["data"]["targets"] = [[1.0, 0.0], [0.0, 2.0], [3.0, 1.0], [1.0, 1.0]]
    cfg["server"] = {"timing": "ideal", "round_duration": 1800.0}
    cfg["trace"] = {"source": "my_traces:ALTERNATE", "period": 7200.0}
    run_dir = cli_run(cfg, name="alt")
    assert rounds_of(run_dir, "online").tolist() == [2, 2, 2, 2]
    invited = __import__("polars").read_parquet(run_dir / "devices.parquet")["invitations"].to_list()
    assert invited == [2, 2, 2, 2]  # rounds 0, 1 the first half, rounds 2, 3 the second
    cfg["trace"] = {"source": "my_traces:ALTERNATE", "perod": 7200.0}
    cli_run(cfg, name="typo", expect=2)
    assert "did you mean 'period'?" in cli_run.last_output.err


def test_a_plugin_converter_runs_from_trace_convert(tmp_path, monkeypatch, capsys):
    from fedsim.traces import read_trace

    monkeypatch.chdir(tmp_path)
    trace_plugins(tmp_path)
    (tmp_path / "in.json").write_text('{"b": [[0, 10], [20, 30]], "a": [[5, 15]]}')
    assert main(["trace", "convert", "--from", "my_converters:json_intervals", "in.json",
                 "--out", "t.parquet"]) == 0
    trace = read_trace(tmp_path / "t.parquet")
    assert trace.device_id.tolist() == [0, 1, 1] and trace.start.tolist() == [5, 0, 20]
    assert trace.horizon == 30
    assert main(["trace", "convert", "--from", "my_converters:nope", "in.json", "--out", "u.parquet"]) == 2
    assert "module 'my_converters' has no 'nope'" in capsys.readouterr().err
    assert not (tmp_path / "u.parquet").exists()


def test_installed_plugins_of_every_kind_run_by_name_and_show_in_help(cli_run, tmp_path, monkeypatch, capsys):
    """One package declaring an algorithm, a model, a generator and a converter."""
    from fedsim.traces import read_trace

    site = tmp_path / "site"
    site.mkdir()
    plugin_module(site, "kit_algorithms")
    plugin_module(site, "kit_models", LINEAR_MODEL)
    trace_plugins(site)
    info = site / "fedsim_kit-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fedsim-kit\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[fedsim.algorithms]\nkit-momentum = kit_algorithms:FedAvgM\n\n"
        "[fedsim.models]\nkit-linear = kit_models:wide_linear\n\n"
        "[fedsim.generators]\nkit-alternate = my_traces:ALTERNATE\n\n"
        "[fedsim.converters]\nkit-json = my_converters:json_intervals\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    listing = capsys.readouterr().out
    for line, name in [("[algorithm] name", "kit-momentum"), ("[model] name", "kit-linear"),
                       ("[trace] source", "kit-alternate"), ("convert --from", "kit-json")]:
        assert any(line in row and name in row for row in listing.splitlines()), name
    cfg = config("kit-momentum", rounds_=4)
    cfg["server"]["round_duration"] = 1800.0
    cfg["trace"] = {"source": "kit-alternate", "period": 7200.0}
    cfg["data"]["targets"] = [[1.0, 0.0], [0.0, 2.0], [3.0, 1.0], [1.0, 1.0]]
    cfg["data"]["clients"] = 4
    assert rounds_of(cli_run(cfg, name="kit"), "online").tolist() == [2, 2, 2, 2]
    digits = cli_run({"run": {"rounds": 2, "eval_every": 2}, "data": {"dataset": "digits", "clients": 10},
                      "model": {"name": "kit-linear"}, "client": {"local_steps": 1, "batch_size": 8}},
                     name="model")
    assert 0.0 < rounds_of(digits, "test_acc")[-1] <= 1.0
    (tmp_path / "in.json").write_text('{"x": [[0, 1]]}')
    assert main(["trace", "convert", "--from", "kit-json", "in.json", "--out", "k.parquet"]) == 0
    assert read_trace(tmp_path / "k.parquet").n_devices == 1
    assert main(["trace", "generate", "kit-alternat", "--devices", "2", "--days", "1", "--out", "g.parquet"]) == 2
    assert "did you mean 'kit-alternate'?" in capsys.readouterr().err


def test_a_plugin_in_a_comparison_gets_a_plain_folder_and_an_aligned_table(cli_run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    name = f"{plugin_module(tmp_path, 'my_algos')}:FedAvgM"
    cfg = config("fedavg", rounds_=3)
    cfg["run"].update(algorithms=["fedavg", name], plots=True)
    run_dir = cli_run(cfg, name="cmp")
    assert sorted(p.name for p in run_dir.iterdir() if p.is_dir() and p.name != "plots") == [
        "fedavg", "my_algos.FedAvgM"]
    assert json.loads((run_dir / "my_algos.FedAvgM" / "manifest.json").read_text())["algorithm"] == name
    assert all(":" not in p.name for p in (run_dir / "plots").iterdir())
    table = [line for line in cli_run.last_output.out.splitlines() if line.startswith(("algorithm", "fedavg ", name))]
    assert len(table) == 3 and len({line.index("completed") if "completed" in line else line.index("status")
                                    for line in table}) == 1  # the status column lines up


def test_recorded_plugin_folders_read_every_run_of_a_folder_and_skip_what_this_release_cannot_read(tmp_path):
    """A study's points and warm starts each list the folders their plugin files came from; a
    damaged manifest or one of a newer release adds none (the command's own check refuses it)."""
    import json

    from fedsim.results.run_format import RUN_FORMAT, recorded_plugin_folders

    runs = {"a": ["/x"], "warm-start/seed-0": ["/y", "/x"], "b": None}
    for name, folders in runs.items():
        (tmp_path / name).mkdir(parents=True)
        manifest = {"run_format": RUN_FORMAT} | ({"plugin_folders": folders} if folders else {})
        (tmp_path / name / "manifest.json").write_text(json.dumps(manifest))
    (tmp_path / "newer").mkdir()
    (tmp_path / "newer" / "manifest.json").write_text(json.dumps({"run_format": 99, "plugin_folders": ["/z"]}))
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "manifest.json").write_text('{"plugin_folders": ["/w"')
    assert recorded_plugin_folders(tmp_path) == ["/x", "/y"]


def test_a_model_of_a_scripts_main_is_refused_elsewhere_with_what_to_do(tmp_path, capsys):
    """A factory defined in a script (`__main__:make`) runs from that script; its run resumed
    from the command line says to move the factory into a module file."""
    import subprocess
    import sys

    script = tmp_path / "nb.py"
    script.write_text(
        "import fedsim\nfrom torch import nn\n\n"
        "def make(in_shape, n_classes, cfg):\n    return nn.Sequential(nn.Flatten(), nn.Linear(64, n_classes))\n\n"
        "config = fedsim.load_config(None, ['model.name=__main__:make', 'data.dataset=digits', 'data.clients=10', "
        "'run.rounds=2', 'run.algorithms=[]', 'run.plots=false', 'run.progress=false', 'run.name=nb', "
        f"'run.out={tmp_path / 'runs'}'])\n"
        "fedsim.run(config)\n")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert main(["run", "--resume", str(tmp_path / "runs" / "nb"), "--set", "run.rounds=3", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'__main__:make': the script or notebook that defined it (__main__) is not what " \
        "runs now; move 'make' into a module file (my_models.py: 'my_models:make')" in err, err
