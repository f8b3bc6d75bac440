"""Composable configs: `extends` chains, what a base gave for an unselected generator or
algorithm dropped, where each value came from, and errors that name their true source."""

from __future__ import annotations

import pytest

from fedsim.cli import main
from fedsim.config import load_config
from fedsim.config.show import show_config
from fedsim.errors import FedsimError
from fedsim.traces import Trace, write_trace


def write(path, text: str):
    path.write_text(text)
    return path


def test_a_chain_of_extends_merges_base_then_file_then_set(tmp_path):
    write(tmp_path / "mine.toml", 'extends = "quickstart"\n[run]\nrounds = 20\n[client]\nlr = 0.2\n')
    two = write(tmp_path / "two.toml", 'extends = "mine.toml"\n[client]\nlr = 0.05\n')
    config = load_config(str(two), ["client.local_steps=3"])
    assert (config.run.rounds, config.client.lr, config.client.local_steps) == (20, 0.05, 3)
    assert config.data.classes_per_client == 2 and config.trace.options == {"p_min": 0.05}  # the quickstart's
    assert config.origins[("run", "rounds")] == str(tmp_path / "mine.toml")
    assert config.origins[("client", "lr")] == str(two)
    assert config.origins[("client", "local_steps")] == "--set client.local_steps=3"
    assert config.origins[("data", "clients")] == "quickstart (built-in scenario)"
    shown = show_config(config)
    assert "rounds = 20  # rounds to run (>= 1); default 100 [from " + str(tmp_path / "mine.toml") + "]" in shown
    assert "[from --set client.local_steps=3]" in shown and "lr = 0.05  # client learning rate (> 0); default 0.05\n" not in shown


def test_a_circle_of_extends_is_one_line(tmp_path):
    write(tmp_path / "a.toml", 'extends = "b.toml"\n')
    write(tmp_path / "b.toml", 'extends = "a.toml"\n')
    with pytest.raises(FedsimError) as err:
        load_config(str(tmp_path / "a.toml"))
    assert str(err.value) == (f"{tmp_path / 'a.toml'}: extends goes round in a circle (a.toml -> b.toml -> a.toml); "
                              "remove one of the extends")
    write(tmp_path / "c.toml", 'extends = "nowhere"\n')
    with pytest.raises(FedsimError, match=r"extends = 'nowhere' is neither a file .* nor a scenario \([^)]*compare,"):
        load_config(str(tmp_path / "c.toml"))


def test_a_scenario_switches_to_a_trace_file_by_set(tmp_path, capsys):
    """The quickstart's own generator key (p_min) is dropped once the trace is a file."""
    write_trace(Trace.from_intervals(list(range(100)), [0.0] * 100, [1e6] * 100, n_devices=100, horizon=1e6),
                tmp_path / "t.parquet")
    code = main(["run", "quickstart", "--quiet", "--set", "trace.source=file", "--set", f"trace.path='{tmp_path / 't.parquet'}'",
                 "--set", "run.algorithms=[]", "--set", "run.rounds=3", "--set", f"run.out='{tmp_path}'"])
    assert code == 0, capsys.readouterr().err


def test_a_scenario_switches_its_device_model_and_the_bases_speeds_go(tmp_path):
    """The quickstart's lognormal speeds (seconds_per_sample, sigmas, ...) are dropped once the
    file or --set chooses another [devices] model; written in the user's own file they stay
    errors."""
    for model in ("profiles", "constant", "halfnormal"):
        config = load_config("quickstart", [f"devices.model={model}"])
        assert config.devices.model == model
    mine = write(tmp_path / "mine.toml", 'extends = "quickstart"\n[devices]\nmodel = "profiles"\n')
    assert load_config(str(mine)).devices.seconds_per_sample == load_config(None, ["devices.model=profiles"]
                                                                              ).devices.seconds_per_sample
    wrong = write(tmp_path / "wrong.toml", 'extends = "quickstart"\n[devices]\nmodel = "profiles"\n'
                                           'seconds_per_sample = 0.5\n')
    with pytest.raises(FedsimError, match=r"wrong.toml: \[devices\] seconds_per_sample applies to model = "):
        load_config(str(wrong))


def test_keys_the_user_wrote_for_an_unselected_generator_stay_errors(tmp_path):
    mine = write(tmp_path / "mine.toml", 'extends = "quickstart"\n[trace]\nsource = "always"\np_min = 0.1\n')
    with pytest.raises(FedsimError) as err:
        load_config(str(mine))
    assert str(err.value).startswith(f"{mine}: unknown key [trace] p_min for 'always'")
    with pytest.raises(FedsimError) as err:
        load_config("quickstart", ["trace.source=always", "trace.p_min=0.1"])
    assert str(err.value).startswith("--set trace.p_min=0.1: unknown key [trace] p_min for 'always'")


def test_a_typo_in_set_names_the_command_line(capsys):
    assert main(["run", "quickstart", "--set", "client.lrr=0.1"]) == 2
    assert capsys.readouterr().err == ("error: --set client.lrr=0.1: unknown key [client] lrr; did you mean "
                                       "'lr'?\n")
    assert main(["run", "quickstart", "--set", "client.lr=-1"]) == 2
    assert capsys.readouterr().err == "error: --set client.lr=-1: [client] lr = -1.0 must be > 0\n"


def test_a_study_extends_a_chain_of_bases(tmp_path):
    from fedsim.studies.study import load_study

    write(tmp_path / "mine.toml", 'extends = "quickstart"\n[run]\nrounds = 4\n')
    study = write(tmp_path / "s.toml", 'extends = "mine.toml"\n[run]\nname = "s"\nalgorithms = []\n'
                                       '[sweep]\n"run.seed" = [0, 1]\n')
    points = load_study(str(study)).points
    assert [p.config.run.rounds for p in points] == [4, 4] and points[0].config.data.classes_per_client == 2


def test_a_chain_of_64_files_is_followed_and_one_more_is_refused(tmp_path, capsys):
    """MAX_EXTENDS files in one chain (the config and 63 bases, the last of which extends the
    quickstart scenario, which counts too): every value reaches the config."""
    for k in range(63):
        base = f"e{k + 1}.toml" if k < 62 else "quickstart"
        write(tmp_path / f"e{k}.toml", f'extends = "{base}"\n[run]\nrounds = {k + 2}\n')
    write(tmp_path / "c.toml", 'extends = "e0.toml"\n')
    with pytest.raises(FedsimError, match="extends goes deeper than 64 files"):
        load_config(str(tmp_path / "c.toml"))
    write(tmp_path / "e62.toml", "[run]\nrounds = 64\n")  # the 64th file: the end of the chain
    config = load_config(str(tmp_path / "c.toml"))
    assert config.run.rounds == 2 and config.origins[("run", "rounds")] == str(tmp_path / "e0.toml")
    assert main(["config", "show", str(tmp_path / "c.toml")]) == 0
    assert "rounds = 2" in capsys.readouterr().out


def test_a_trace_offset_given_by_set_is_blamed_on_the_set(capsys):
    """Checked once the trace is read (its horizon), the line still names the --set."""
    assert main(["run", "quickstart", "--set", "trace.source=always", "--set", "trace.offset=200000"]) == 2
    assert capsys.readouterr().err == ("error: --set trace.offset=200000: [trace] offset = 200000.0 is beyond the "
                                       "trace's horizon (18000 s); give an offset below it\n")
