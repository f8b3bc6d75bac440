"""`fedsim config show`: the resolved config as commented TOML that reads back as the same config,
with every key of every section, and the generator's and algorithms' options."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import tomllib

import pytest

from fedsim.config.catalog import ALGORITHMS
from fedsim.cli import main
from fedsim.config import config_from_dict, config_scenarios, dump_toml, load_config, rule
from fedsim.config.schema import _SECTION_CLASSES
from fedsim.config.show import show_config

KEY_LINE = re.compile(r'^(# )?("[^"]*"|[A-Za-z0-9_-]+) = (.+?)  # (.+)$')


def reads_back(config) -> None:
    text = show_config(config)
    assert config_from_dict(tomllib.loads(text), origin=config.source) == config


def key_lines(text: str) -> dict[tuple[str, str], tuple[bool, str, str]]:
    """(section, key) -> (commented out, value text, comment) of every key line."""
    found, section = {}, None
    for line in text.splitlines():
        if line.startswith("["):
            section = line.strip("[]")
        elif match := KEY_LINE.match(line):
            found[(section, match[2])] = (bool(match[1]), match[3], match[4])
        else:
            assert line == "" or line.startswith("# "), line
    return found


@pytest.mark.parametrize("name", config_scenarios())
def test_every_scenario_reads_back_as_the_same_config(name):
    reads_back(load_config(name))


def test_overrides_and_awkward_values_read_back(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(dump_toml({
        "run": {"name": 'we"ird name', "out": 'ru\nns', "algorithms": ["fedavg", "fedprox", "amplified"],
                "targets": [0.5, 1]},
        "data": {"dataset": "quadratic", "clients": 2, "targets": [[1.0, 0.0], [0.0, 1.0]]},
        "trace": {"source": "bernoulli", "p": {}, "phi_max": [0.25] * 10},
        "algorithm": {"mu": 0.1, "period": 7},
    }))
    config = load_config(path, ["run.rounds=7", "trace.dynamics='sine'", "model.init=[0.5, 2]"])
    reads_back(config)
    lines = key_lines(show_config(config))
    assert lines[("trace", "p")] == (False, "{}", "option of generator 'bernoulli' (default unset)")
    assert lines[("run", "targets")][:2] == (False, "[0.5, 1.0]")
    assert lines[("run", "name")][1] == '"we\\"ird name"'
    assert lines[("run", "out")][1] == '"ru\\nns"'
    assert lines[("data", "targets")][1] == "[[1.0, 0.0], [0.0, 1.0]]"
    reads_back(load_config(path, ["trace.p={ a = 1, 'b c' = [2] }"]))


def test_every_key_of_every_section_with_its_meaning_and_rule():
    config = load_config("quickstart")
    lines = key_lines(show_config(config))
    for section, cls in _SECTION_CLASSES.items():
        for f in dataclasses.fields(cls):
            if f.name == "options":
                continue
            commented, _, comment = lines[(section, f.name)]
            assert not commented and comment.startswith(rule(f).meaning)
    # the scenario's own values say fedsim's default beside them
    assert lines[("run", "rounds")] == (False, "300", "rounds to run (>= 1); default 100")
    assert lines[("devices", "seconds_per_sample")][2].endswith("(>= 0); default 0.002")
    assert lines[("run", "max_time")] == (False, "0.0", "simulated seconds before the run stops "
                                                        "(>= 0; 0 = no limit)")
    assert lines[("server", "deadline")][2].endswith("(> 0); default 600.0")
    assert lines[("data", "majority")][2].endswith("(in [0, 1])")
    assert lines[("algorithm", "selection")] == (
        False, '""', 'whom the server invites among the online devices (all, uniform, regularized, '
                     'longest-absent, power-of-choice, oort, or a plugin\'s \'module:Name\'; "" = the algorithm\'s '
                     'default policy)')
    assert lines[("run", "targets")][1] == "[]" and lines[("model", "init")][1] == "[]"
    assert "or a plugin's 'module:Name'" in lines[("algorithm", "name")][2]


def test_options_set_are_keys_and_the_others_commented_out_defaults():
    config = config_from_dict({"trace": {"source": "diurnal", "availability": 0.4},
                               "run": {"algorithms": ["fedavg", "mifa"]}})
    text = show_config(config)
    lines = key_lines(text)
    assert lines[("trace", "availability")] == (False, "0.4", "option of generator 'diurnal' (default 0.3)")
    assert lines[("trace", "skip_prob")] == (True, "0.1", "option of generator 'diurnal' (default 0.1)")
    assert lines[("algorithm", "warmup")] == (True, "false", "option of algorithm 'mifa' (default false)")
    assert "# generator 'diurnal': time-zone mixture" in text
    # uncommented, the defaults make a config that runs the same generator settings
    uncommented = re.sub(r"^# (\w+ = )", r"\1", text, flags=re.MULTILINE)
    template = config_from_dict(tomllib.loads(uncommented))
    assert template.trace.options["skip_prob"] == 0.1 and template.algorithm.options == {"warmup": False}


def test_an_option_two_algorithms_declare_is_shown_once_with_both_defaults(monkeypatch):
    from fedsim.algorithms.fedavg import FedProx

    class Other(FedProx):
        options = {"mu": 0.5, "odd key": 1}

    monkeypatch.setitem(ALGORITHMS, "other", Other)
    config = config_from_dict({"run": {"algorithms": ["fedprox", "other"]}, "algorithm": {"odd key": 2}})
    lines = key_lines(show_config(config))
    assert lines[("algorithm", "mu")] == (
        True, "0.01", "option of algorithm 'fedprox' (default 0.01), algorithm 'other' (default 0.5)")
    assert lines[("algorithm", '"odd key"')] == (False, "2", "option of algorithm 'other' (default 1)")
    reads_back(config)


def test_a_trace_file_has_no_generator_options():
    config = config_from_dict({"trace": {"source": "file", "path": "t.parquet"}})
    lines = key_lines(show_config(config))
    assert sorted(key for section, key in lines if section == "trace") == [
        "days", "devices_table", "offset", "path", "select", "source"]
    reads_back(config)


# --- the command --------------------------------------------------------------------------

def test_config_show_prints_the_quickstart_by_default(capsys):
    assert main(["config", "show"]) == 0
    out = capsys.readouterr().out
    config = load_config(None)
    assert config_from_dict(tomllib.loads(out), origin=config.source) == config


def test_config_show_with_a_scenario_and_overrides(capsys):
    sets = ["--set", "run.targets=[0.8, 0.9]", "--set", "algorithm.beta=0.2"]
    assert main(["config", "show", "compare", *sets]) == 0
    config = load_config("compare", sets[1::2])
    assert config_from_dict(tomllib.loads(capsys.readouterr().out), origin=config.source) == config
    assert config.run.targets == [0.8, 0.9] and config.algorithm.options["beta"] == 0.2


@pytest.mark.parametrize("argv", [["nope"], ["quickstart", "--set", "run.rounds=0"],
                                  ["--set", "run.targets=[80]"], ["--set", "clientt.lr=1"]])
def test_bad_input_is_the_same_line_as_fedsim_run(capsys, argv):
    assert main(["config", "show", *argv]) == 2
    shown = capsys.readouterr()
    assert shown.out == ""
    assert main(["run", *argv, "--quiet"]) == 2
    ran = capsys.readouterr().err
    assert shown.err == ran and shown.err.startswith("error: ") and shown.err.count("\n") == 1


def test_no_traceback_from_the_console(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fedsim", "config", "show", "compare", "--set",
                           "run.targets=[0.5, 2]"], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == ("error: --set run.targets=[0.5, 2]: [run] targets: 2 is not an "
                           "accuracy in (0, 1]; give fractions like 0.8\n")
    proc = subprocess.run([sys.executable, "-m", "fedsim", "config"], capture_output=True, text=True)
    assert proc.returncode == 2 and "{show}" in proc.stderr
