"""Config validation: every bad value is one line naming the key (exit status 2), and the
`fedsim run` lines about runs that stopped early or resumes that change the wrong keys."""

from __future__ import annotations

import dataclasses
import json

import pytest

import fedsim.config as config_module
from fedsim.cli import RESUME_KEYS, main
from fedsim.config import RESUME_KEYS as CONFIG_RESUME_KEYS, config_from_dict, dump_toml, rule, suggest
from fedsim.config.schema import _SECTION_CLASSES
from fedsim.errors import FedsimError

from conftest import alternating_trace, quadratic_config, rounds

TARGETS = [[1.0, 0.0], [0.0, 1.0]]


def fails(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


@pytest.fixture
def tiny(tmp_path) -> str:
    """A quadratic config file that would run in a blink (and write under tmp_path/runs)."""
    config = quadratic_config(TARGETS, rounds=3)
    config["run"].update(out=str(tmp_path / "runs"), name="tiny", progress=False)
    path = tmp_path / "tiny.toml"
    path.write_text(dump_toml(config))
    return str(path)


BAD = [
    # (--set override, the key as the message names it, what the message says)
    ("client.lr_step_every=0", "[client] lr_step_every", ">= 1"),
    ("client.lr_step_gamma=0", "[client] lr_step_gamma", "in (0, 1]"),
    ("client.lr_step_gamma=5", "[client] lr_step_gamma", "in (0, 1]"),
    ("data.targets=[[1.0, 0.0], [\"a\", 2.0]]", "[data] targets", "entry 2 = ['a', 2.0] is not a list of finite numbers"),
    ("data.targets=[[1.0, 0.0], [2.0]]", "[data] targets", "entry 2 has 1 numbers but entry 1 has 2"),
    ("devices.compute_sigma=-0.1", "[devices] compute_sigma", ">= 0"),
    ("devices.bandwidth_sigma=-1", "[devices] bandwidth_sigma", ">= 0"),
    ("data.size_sigma=-0.5", "[data] size_sigma", ">= 0"),
    ("run.seed=-1", "[run] seed", ">= 0"),
    ("client.lr=0", "[client] lr", "> 0"),
    ("client.lr=nan", "[client] lr", "must be a finite number"),
    ("client.local_steps=0", "[client] local_steps", ">= 1"),
    ("client.batch_size=-1", "[client] batch_size", "0 = the full local data"),
    ("run.rounds=0", "[run] rounds", ">= 1"),
    ("run.eval_every=0", "[run] eval_every", ">= 1"),
    ("run.checkpoint_every=-5", "[run] checkpoint_every", "0 = only at the end"),
    ("run.max_time=-1", "[run] max_time", "0 = no limit"),
    ("server.deadline=0", "[server] deadline", "> 0"),
    ("server.round_duration=-1", "[server] round_duration", "> 0"),
    ("server.overcommit=-0.5", "[server] overcommit", ">= 0"),
    ("server.clients_per_round=-1", "[server] clients_per_round", "0 = every online device"),
    ("algorithm.server_lr=0", "[algorithm] server_lr", "> 0"),
    ("data.clients=0", "[data] clients", ">= 1"),
    ("data.alpha=0", "[data] alpha", "> 0"),
    ("data.majority=1.5", "[data] majority", "in [0, 1]"),
    ("data.test_fraction=1", "[data] test_fraction", "in (0, 1)"),
    ("model.dropout=1", "[model] dropout", "in [0, 1)"),
    ("model.hidden=0", "[model] hidden", ">= 1"),
    ("devices.latency_s=-0.1", "[devices] latency_s", ">= 0"),
    ('algorithm.server_optimizer="adamw"', "[algorithm] server_optimizer", "'adam'"),
    ("algorithm.server_momentum=1", "[algorithm] server_momentum", "in [0, 1)"),
    ("algorithm.server_beta2=-0.1", "[algorithm] server_beta2", "in [0, 1)"),
    ("algorithm.server_eps=0", "[algorithm] server_eps", "> 0"),
]


@pytest.mark.parametrize("override,key,says", BAD, ids=[b[0] for b in BAD])
def test_bad_number_is_one_line_naming_the_key(tmp_path, capsys, tiny, override, key, says):
    err = fails(capsys, ["run", tiny, "--quiet", "--set", override])
    assert key in err and f"--set {override}: " in err and says in err, err  # the command line, not the file
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("name", ["a/b", "..", ".", "", "  ", "runs\\x", "/abs"])
def test_run_name_must_be_a_plain_folder_name(tmp_path, capsys, tiny, name):
    err = fails(capsys, ["run", tiny, "--quiet", "--set", f"run.name={json.dumps(name)}"])
    assert "[run] name" in err and "[run] out" in err, err
    assert not (tmp_path / "runs").exists()


def test_repeated_algorithm_is_named(tmp_path, capsys, tiny):
    err = fails(capsys, ["run", tiny, "--quiet", "--set", 'run.algorithms=["fedavg", "mifa", "mifa"]'])
    assert "[run] algorithms" in err and "'mifa' more than once" in err, err
    err = fails(capsys, ["run", tiny, "--quiet", "--set", "run.algorithms=[1, 2]"])
    assert "[run] algorithms" in err and "strings" in err, err
    assert not (tmp_path / "runs").exists()


def test_zero_means_something_for_these_keys():
    raw = quadratic_config(TARGETS)
    raw["run"].update(max_time=0, checkpoint_every=0, seed=0)
    raw["server"].update(clients_per_round=0, overcommit=0)
    raw["client"].update(batch_size=0, clip=0, weight_decay=0)
    raw["devices"] = {"model": "lognormal", "compute_sigma": 0, "bandwidth_sigma": 0, "latency_s": 0,
                      "seconds_per_sample": 0}
    raw["data"].update(size_sigma=0, noise=0, majority=0)
    raw["model"] = {"dropout": 0}
    config = config_from_dict(raw)
    assert config.server.clients_per_round == 0 and config.devices.compute_sigma == 0.0


FIELDS = [(section, f) for section, cls in _SECTION_CLASSES.items() for f in dataclasses.fields(cls)]


@pytest.mark.parametrize("section,f", FIELDS, ids=[f"{s}.{f.name}" for s, f in FIELDS])
def test_every_key_carries_a_meaning_and_a_rule_that_fits_its_default(section, f):
    """The rules live in each field's metadata (fedsim.config.key): a one-line meaning for every
    key, exactly one sign/range rule for every number, and a default that passes them."""
    ruled = rule(f)
    assert ruled.meaning and "\n" not in ruled.meaning and ruled.meaning == ruled.meaning.strip()
    default = getattr(_SECTION_CLASSES[section](), f.name)
    if isinstance(default, (int, float)) and not isinstance(default, bool) or ruled.text:
        # (a number key that also takes a word, like diverge_loss = "auto", has a number rule)
        assert [ruled.positive, ruled.non_negative, ruled.within is not None].count(True) == 1
    else:
        assert not (ruled.positive or ruled.non_negative or ruled.within)
    assert not (ruled.zero and ruled.positive)  # 0 cannot mean anything where 0 is refused
    if ruled.choices is not None:
        assert default in ruled.choice_names() or (default == "" and ruled.zero)


def _breaking(ruled, default):
    """A value that breaks a numeric rule, and what the error line says about it."""
    if ruled.positive:
        return (0, "must be >= 1") if isinstance(default, int) else (0.0, "must be > 0")
    if ruled.non_negative:
        return type(default)(-1), "must be >= 0" + (f" (0 = {ruled.zero})" if ruled.zero else "")
    low, high, low_in, _ = ruled.within
    return (low - 0.5 if low_in else low), "must be in"


NUMERIC = [(s, f) for s, f in FIELDS if type(getattr(_SECTION_CLASSES[s](), f.name)) in (int, float)]


@pytest.mark.parametrize("section,f", NUMERIC, ids=[f"{s}.{f.name}" for s, f in NUMERIC])
def test_each_numeric_rule_is_checked_from_the_metadata(section, f):
    ruled = rule(f)
    default = getattr(_SECTION_CLASSES[section](), f.name)
    value, says = _breaking(ruled, default)
    with pytest.raises(FedsimError) as err:
        config_from_dict({section: {f.name: value}}, origin="c.toml")
    assert str(err.value).startswith(f"c.toml: [{section}] {f.name} = {value!r} {says}"), err.value


@pytest.mark.parametrize("raw, line", [
    ({"data": {"majority": 1.5}}, "c.toml: [data] majority = 1.5 must be in [0, 1]"),
    ({"data": {"test_fraction": 0}}, "c.toml: [data] test_fraction = 0.0 must be in (0, 1)"),
    ({"trace": {"days": -2}}, "c.toml: [trace] days = -2.0 must be >= 0 (0 = long enough for the run)"),
    ({"run": {"threads": 0}}, 'c.toml: [run] threads = 0 must be "auto" (chosen by each call\'s work) '
                              "or a number of threads >= 1"),
    ({"algorithm": {"selection": "uniformm"}}, "c.toml: [algorithm] selection = 'uniformm' is "
     "unknown; did you mean 'uniform'? (one of: all, uniform, regularized, longest-absent, power-of-choice, oort)"),
    ({"devices": {"model": "fixed"}}, "c.toml: [devices] model = 'fixed' is not valid (one of: "
     "profiles, constant, lognormal, halfnormal, table)"),
])
def test_rule_errors_are_the_exact_lines(raw, line):
    with pytest.raises(FedsimError) as err:
        config_from_dict(raw, origin="c.toml")
    assert str(err.value) == line


def test_empty_selection_means_the_algorithms_own_policy():
    assert config_from_dict({"algorithm": {"selection": ""}}).algorithm.selection == ""
    assert config_from_dict({"run": {"threads": 3}}).run.threads == 3


# --- [run] targets --------------------------------------------------------------------------

def test_targets_are_accuracies_kept_as_floats():
    assert config_from_dict({}).run.targets == []
    config = config_from_dict({"run": {"targets": [0.5, 1, 0.925]}})
    assert config.run.targets == [0.5, 1.0, 0.925] and all(type(t) is float for t in config.run.targets)
    assert config.to_dict()["run"]["targets"] == [0.5, 1.0, 0.925]


@pytest.mark.parametrize("targets, bad", [
    ([0.8, 80], "80"), ([0], "0"), ([-0.1], "-0.1"), ([1.01], "1.01"), (["0.8"], "'0.8'"),
    ([True], "True"), ([float("nan")], "nan"), ([[0.5]], "[0.5]"),
])
def test_a_target_outside_0_1_is_one_line_naming_the_entry(targets, bad):
    with pytest.raises(FedsimError) as err:
        config_from_dict({"run": {"targets": targets}}, origin="config.toml")
    assert str(err.value) == (f"config.toml: [run] targets: {bad} is not an accuracy in (0, 1]; "
                              "give fractions like 0.8")


def test_targets_from_the_command_line(capsys):
    err = fails(capsys, ["run", "quickstart", "--quiet", "--set", "run.targets=[0.9, 80]"])
    assert err.endswith("--set run.targets=[0.9, 80]: [run] targets: 80 is not an accuracy in (0, 1]; "
                        "give fractions like 0.8")
    err = fails(capsys, ["run", "quickstart", "--quiet", "--set", "run.targets=0.8"])
    assert err.endswith("[run] targets: expected a list, got 0.8 (float)")


def test_targets_only_change_what_is_reported_so_a_resume_may_set_them():
    assert "run.targets" in CONFIG_RESUME_KEYS and RESUME_KEYS is CONFIG_RESUME_KEYS


def test_defaults_and_scenarios_pass_the_rules():
    from fedsim.config import config_scenarios, load_config

    config_from_dict({})
    for name in config_scenarios():
        load_config(name)


def test_suggest_is_public():
    assert suggest("deadlin", ["deadline", "timing"]) == "did you mean 'deadline'?"
    assert not hasattr(config_module, "_suggest")
    with pytest.raises(FedsimError, match="did you mean 'local_steps'"):
        config_from_dict({"client": {"local_step": 1}})


# --- runs that stop before run.rounds ------------------------------------------------------

def test_max_time_stop_is_reported(cli_run):
    config = quadratic_config(TARGETS, rounds=20, run={"max_time": 5.0})
    run_dir = cli_run(config)
    assert rounds(run_dir).height == 5
    assert "fedavg: stopped after 5 of 20 rounds (max_time 5 s reached)" in cli_run.last_output.out


def test_end_of_trace_stop_is_reported_for_every_algorithm(cli_run):
    """Model timing on a 6 s trace (no wrap): the rounds end with the trace, long before 100."""
    config = quadratic_config(TARGETS, rounds=100, run={"algorithms": ["fedavg", "mifa"]},
                              server={"timing": "model"}, devices={"model": "constant"})
    run_dir = cli_run(config, trace=alternating_trace(1, 1, 3))
    out = cli_run.last_output.out
    for algorithm in ("fedavg", "mifa"):
        done = rounds(run_dir / algorithm).height
        assert 0 < done < 100
        assert f"{algorithm}: stopped after {done} of 100 rounds (the trace has nobody online" in out


def test_no_stop_line_when_all_rounds_ran(cli_run):
    cli_run(quadratic_config(TARGETS, rounds=4))
    assert "stopped after" not in cli_run.last_output.out


# --- what --resume may change ---------------------------------------------------------------

def test_resume_refuses_keys_that_change_the_experiment(cli_run, capsys):
    run_dir = cli_run(quadratic_config(TARGETS, rounds=20, run={"max_time": 5.0}))
    before = (run_dir / "config.toml").read_text()
    err = fails(capsys, ["run", "--resume", str(run_dir), "--set", "run.rounds=30",
                         "--set", "client.lr=0.5", "--quiet"])
    assert "client.lr" in err and "cannot be changed when resuming" in err
    assert ", ".join(RESUME_KEYS) in err
    err = fails(capsys, ["run", "--resume", str(run_dir), "--set", "run.seed=3", "--quiet"])
    assert "run.seed" in err
    err = fails(capsys, ["run", "--resume", str(run_dir), "--set", "algorithm.mu=0.1", "--quiet"])
    assert "algorithm.mu" in err
    assert (run_dir / "config.toml").read_text() == before
    assert rounds(run_dir).height == 5


def test_resume_accepts_the_allowed_keys(cli_run, capsys):
    run_dir = cli_run(quadratic_config(TARGETS, rounds=20, run={"max_time": 5.0}))
    assert main(["run", "--resume", str(run_dir), "--set", "run.max_time=0", "--set", "run.rounds=8",
                 "--set", "run.eval_every=2", "--set", "run.checkpoint_every=4",
                 "--set", "run.progress=false", "--set", "run.device=cpu", "--set", "run.targets=[0.5]",
                 "--quiet"]) == 0
    out = capsys.readouterr().out
    assert rounds(run_dir).height == 8 and "stopped after" not in out


def test_resume_refuses_a_hand_edited_config(cli_run, capsys):
    run_dir = cli_run(quadratic_config(TARGETS, rounds=20, run={"max_time": 5.0}))
    config_toml = run_dir / "config.toml"
    started = config_toml.read_text()
    assert "lr = 0.1\n" in started and "max_time = 5.0\n" in started
    config_toml.write_text(started.replace("lr = 0.1\n", "lr = 0.5\n"))
    err = fails(capsys, ["run", "--resume", str(run_dir), "--quiet"])
    assert f"{config_toml}: [client] lr = 0.5, but the run started with 0.1" in err
    assert rounds(run_dir).height == 5
    config_toml.write_text(started.replace("max_time = 5.0\n", "max_time = 8.0\n"))
    assert main(["run", "--resume", str(run_dir), "--quiet"]) == 0  # how long it runs may change
    assert rounds(run_dir).height == 8


ACROSS_KEYS = [  # rules over several keys, broken by the one --set: the line names that --set
    ("model.name=lenet", "--set model.name=lenet: [model] name = 'lenet' is unknown; did you mean 'lenet5'?"),
    ("server.clients_per_round=500", "--set server.clients_per_round=500: [server] clients_per_round = 500 is "
                                     "more than the 100 devices"),
    ("trace.source=file", "--set trace.source=file: [trace] source = 'file' needs [trace] path"),
    ("trace.path=t.parquet", "--set trace.path=t.parquet: [trace] path is read only with source = 'file', and the "
                             "trace here is 'bernoulli'; add --set trace.source=file"),
    ("server.update_frac=0.5", "--set server.update_frac=0.5: [server] update_frac is a rule of synchronous rounds",
     ["--set", 'server.mode="async"', "--set", 'server.timing="model"']),
    ('client.work="fit-deadline"', """--set client.work="fit-deadline": [client] work = 'fit-deadline' needs device """
                                   "speeds", ["--set", 'server.timing="ideal"']),
    ("run.algorithms=[fedavg,mifa]", "--set 'run.algorithms=[fedavg,mifa]': [fedavg,mifa] is not a TOML list; "
                                     "quote its words, as in --set 'run.algorithms=[\"fedavg\", \"mifa\"]'"),
]


@pytest.mark.parametrize("override,says,before", [(*a, [])[:3] for a in ACROSS_KEYS], ids=[a[0] for a in ACROSS_KEYS])
def test_a_rule_across_keys_broken_by_a_set_names_that_set(tmp_path, monkeypatch, capsys, override, says, before):
    monkeypatch.chdir(tmp_path)
    err = fails(capsys, ["run", "quickstart", "--quiet", *before, "--set", override])
    assert err.startswith(f"error: {says}"), err
    assert not (tmp_path / "runs").exists()


def test_the_fixes_those_lines_print_run_as_printed(tmp_path, monkeypatch, capsys):
    """`quote its words, as in --set '...'` and `add --set trace.source=file`, typed as printed."""
    import shlex

    import numpy as np

    from fedsim.traces import Trace, write_trace

    monkeypatch.chdir(tmp_path)
    short = ["run", "quickstart", "--quiet", "--set", "run.rounds=2"]
    err = fails(capsys, [*short, "--set", "run.algorithms=[fedavg,mifa]"])
    assert main([*short, *shlex.split(err.split("as in ")[1]), "--set", "run.name=quoted"]) == 0
    always = Trace.from_intervals(np.arange(100), np.zeros(100), np.full(100, 1e6), n_devices=100, horizon=1e6)
    write_trace(always, tmp_path / "t.parquet")
    err = fails(capsys, [*short, "--set", "trace.path=t.parquet"])
    assert main([*short, "--set", "trace.path=t.parquet", *shlex.split(err.split("; add ")[1]),
                 "--set", "run.name=file"]) == 0
    assert (tmp_path / "runs" / "quoted" / "mifa" / "rounds.parquet").exists()
    assert (tmp_path / "runs" / "file" / "fedavg" / "rounds.parquet").exists()


def test_a_mistyped_scenario_or_model_attribute_gets_a_did_you_mean(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert fails(capsys, ["run", "quickstartt"]) == "error: config quickstartt: no such file or scenario; did you mean 'quickstart'?"
    assert fails(capsys, ["sweep", "paper-mifaa"]) == "error: config paper-mifaa: no such file or scenario; did you mean 'paper-mifa'?"
    (tmp_path / "my_cnn.py").write_text("def make(in_shape, n_classes, model_config):\n    pass\n")
    err = fails(capsys, ["run", "quickstart", "--set", "model.name=my_cnn:mak"])
    assert err.endswith("module 'my_cnn' has no 'mak'; did you mean 'make'?"), err


def test_an_algorithm_set_where_run_algorithms_take_its_place_says_how_and_each_way_runs(tmp_path, monkeypatch, capsys):
    import re
    import shlex

    monkeypatch.chdir(tmp_path)
    argv = ["run", "quickstart", "--quiet", "--set", "run.rounds=2", "--set", "algorithm.name=fedprox",
            "--set", "algorithm.mu=0.1"]
    err = fails(capsys, argv)
    assert err.startswith("error: --set algorithm.name=fedprox: this config runs [run] algorithms = "
                          '["fedavg", "mifa"], which take the place of [algorithm] name'), err
    ways = re.findall(r"(--set '[^']+')", err)
    assert ways == ["--set 'run.algorithms=[]'", """--set 'run.algorithms=["fedavg", "mifa", "fedprox"]'"""]
    for way, ran in zip(ways, (["fedprox"], ["fedavg", "mifa", "fedprox"])):
        assert main([*argv, *shlex.split(way), "--set", f"run.name=r{len(ran)}"]) == 0
        summary = capsys.readouterr().out
        assert [line.split()[0] for line in summary.splitlines() if line.split()[:1] and line.split()[0] in
                ("fedavg", "mifa", "fedprox")] == ran, summary


def test_a_set_written_with_a_space_says_to_write_the_equals_sign(capsys):
    with pytest.raises(SystemExit) as exit:  # (argparse's, in the process)
        main(["run", "quickstart", "--set", "client.lr", "0.1"])
    assert exit.value.code == 2
    assert capsys.readouterr().err == ("error: fedsim run: unrecognized arguments: 0.1 (write --set client.lr=0.1, "
                                       "with '='); see `fedsim run --help`\n")
    for command in ("run", "sweep"):  # without a config before it, the value is read as the config
        assert main([command, "--set", "client.lr", "0.1"]) == 2
        assert capsys.readouterr().err == ("error: --set 'client.lr': expected section.key=value; write --set "
                                           "client.lr=0.1, with '=' ('0.1' was read as the config file)\n")


def test_a_dataset_called_by_its_nickname_gets_its_name(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    err = fails(capsys, ["run", "quickstart", "--quiet", "--set", "data.dataset=fmnist"])
    assert err.startswith("error: [data] dataset = 'fmnist' is unknown; did you mean 'fashion-mnist'?"), err


def test_resume_with_a_config_too_is_refused(cli_run, capsys, tiny):
    run_dir = cli_run(quadratic_config(TARGETS, rounds=2))
    err = fails(capsys, ["run", tiny, "--resume", str(run_dir), "--quiet"])
    assert "--resume" in err and "not both" in err


def test_resume_cannot_take_rounds_back_or_read_a_damaged_checkpoint(cli_run, capsys):
    run_dir = cli_run(quadratic_config(TARGETS, rounds=20, run={"max_time": 5.0}))
    before = (run_dir / "config.toml").read_text()
    err = fails(capsys, ["run", "--resume", str(run_dir), "--set", "run.rounds=3", "--quiet"])
    assert "already has 5 rounds; resume can only add rounds" in err
    (run_dir / "checkpoint.pt").write_bytes(b"garbage\n")
    err = fails(capsys, ["run", "--resume", str(run_dir), "--quiet"])
    assert "checkpoint.pt: not a readable checkpoint" in err
    assert (run_dir / "config.toml").read_text() == before and rounds(run_dir).height == 5


def test_a_comparison_and_a_study_cannot_take_rounds_back_either(tmp_path, capsys):
    """As a run's: their config.toml / study.toml would no longer say what their runs ran."""
    comparison = quadratic_config(TARGETS, rounds=6, run={"algorithms": ["fedavg", "mifa"], "name": "c",
                                                         "out": str(tmp_path / "runs"), "progress": False,
                                                         "plots": False})
    (tmp_path / "c.toml").write_text(dump_toml(comparison))
    assert main(["run", str(tmp_path / "c.toml"), "--quiet"]) == 0
    folder = tmp_path / "runs" / "c"
    before = (folder / "config.toml").read_text()
    err = fails(capsys, ["run", "--resume", str(folder), "--set", "run.rounds=4", "--quiet"])
    assert err == (f"error: run.rounds = 4: algorithm fedavg already has 6 rounds ({folder / 'fedavg'}); "
                   "resume can only add rounds: give run.rounds >= 6")
    assert (folder / "config.toml").read_text() == before

    study = {**comparison, "run": {**comparison["run"], "name": "s", "algorithms": []},
             "sweep": {"run.seed": [0, 1]}}
    (tmp_path / "s.toml").write_text(dump_toml(study))
    assert main(["sweep", str(tmp_path / "s.toml"), "--quiet"]) == 0
    folder = tmp_path / "runs" / "s"
    before = (folder / "study.toml").read_text()
    for argv in (["sweep", "--resume", str(folder)], ["sweep", str(tmp_path / "s.toml")]):
        err = fails(capsys, [*argv, "--set", "run.rounds=5", "--quiet"])
        assert err == (f"error: run.rounds = 5: point seed-0 already has 6 rounds ({folder / 'seed-0'}); "
                       "resume can only add rounds: give run.rounds >= 6")
    assert (folder / "study.toml").read_text() == before


# --- model-dependent defaults -------------------------------------------------------------

def test_cnn_cinic_has_the_papers_dropout_unless_given():
    assert config_from_dict({"model": {"name": "cnn-cinic"}}).model.dropout == 0.2
    assert config_from_dict({"model": {"name": "cnn-cinic", "dropout": 0.0}}).model.dropout == 0.0
    assert config_from_dict({"model": {"name": "cnn-cifar"}}).model.dropout == 0.0


def test_dropout_on_logreg_is_refused(capsys):
    err = fails(capsys, ["run", "quickstart", "--set", "model.dropout=0.5", "--quiet"])
    assert "[model] dropout = 0.5: logreg has no hidden layer" in err


def test_a_bad_choice_lists_the_valid_ones_once(capsys):
    err = fails(capsys, ["run", "quickstart", "--set", "client.lr_schedule=foo"])
    assert err.endswith("[client] lr_schedule = 'foo' is not valid (one of: constant, inverse, "
                        "inverse-sqrt, step)")
    err = fails(capsys, ["run", "quickstart", "--set", "client.lr_schedule=invers"])
    assert "is not valid; did you mean 'inverse'? (one of: constant," in err


def test_a_run_folder_with_a_newline_round_trips_through_config_toml(tmp_path, capsys, tiny):
    """The run's config.toml is written by tomli-w: any string value reads back as written, and
    the run resumes from it. (A run's name is one plain folder name: no line breaks.)"""
    import tomllib

    from fedsim.cli import main

    out = tmp_path / "two\nlines"
    assert main(["run", tiny, "--quiet", "--set", f"run.out={json.dumps(str(out))}", "--set", "run.rounds=2"]) == 0
    run_dir = out / "tiny"
    assert tomllib.loads((run_dir / "config.toml").read_text())["run"]["out"] == str(out)
    assert main(["run", "--resume", str(run_dir), "--set", "run.rounds=3", "--quiet"]) == 0


def test_date_times_written_unquoted_are_taken_as_their_text(tmp_path, capsys):
    """TOML reads 2024-03-04T08:00:00 as a date-time; fedsim's keys take times as ISO 8601 text,
    so an unquoted one in a file, a --set or a generator option is the same as a quoted one."""
    from fedsim.config import parse_override, read_toml

    assert parse_override("trace.offset=2024-03-04T08:00:00+02:00") == ("trace", "offset", "2024-03-04T08:00:00+02:00")
    (tmp_path / "c.toml").write_text('[trace]\nsource = "diurnal"\norigin = 2024-03-04T08:00:00Z\n')
    assert read_toml(tmp_path / "c.toml")["trace"]["origin"] == "2024-03-04T08:00:00+00:00"
    out = tmp_path / "o.parquet"
    assert main(["trace", "generate", "diurnal", "--devices", "4", "--days", "1", "--origin",
                 "2024-03-04T08:00:00+02:00", "--out", str(out)]) == 0, capsys.readouterr().err
    from fedsim.traces.io import read_trace

    assert read_trace(out).origin == "2024-03-04T08:00:00+02:00"
