"""A user's own Strategy, registered from Python, runs through the whole engine like a built-in."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from conftest import final_x, quadratic_config  # noqa: E402

import fedsim  # noqa: E402
from fedsim.algorithms import REGISTRY, Strategy, register  # noqa: E402
from fedsim.config import dump_toml  # noqa: E402


class ScaledFedAvg(Strategy):
    """x <- x + factor · mean of the arrived deltas."""

    name = "scaled-fedavg"
    options = {"factor": 0.5}

    def aggregate(self, rnd, arrivals):
        if len(arrivals):
            self.params = self.params + self.opt["factor"] * arrivals.deltas.mean(0)


@pytest.fixture
def scaled_fedavg(monkeypatch):
    monkeypatch.setitem(REGISTRY, ScaledFedAvg.name, ScaledFedAvg)
    return ScaledFedAvg


def test_registered_algorithm_reaches_its_closed_form(tmp_path, scaled_fedavg):
    # every device always online, one exact gradient step of lr 0.1 per round:
    # x_{r+1} = x_r - factor·lr·(x_r - ū), so x_R = ū + (1 - factor·lr)^R (x_0 - ū) with x_0 = 0.
    targets = [[1.0, 0.0], [0.0, 2.0], [3.0, 1.0]]
    config = quadratic_config(targets, algorithm="scaled-fedavg", rounds=30)
    config["algorithm"]["factor"] = 0.25
    config["run"].update(out=str(tmp_path / "runs"), name="custom", progress=False)
    path = tmp_path / "custom.toml"
    path.write_text(dump_toml(config))

    result = fedsim.run(fedsim.load_config(path))

    mean = np.mean(targets, axis=0)
    expected = mean * (1 - (1 - 0.25 * 0.1) ** 30)
    assert result.status == "completed"
    np.testing.assert_allclose(final_x(result.run_dir), expected, atol=2e-6)


def test_register_returns_the_class_and_unknown_options_are_refused(tmp_path, scaled_fedavg):
    assert register(ScaledFedAvg) is ScaledFedAvg
    config = quadratic_config([[1.0], [0.0]], algorithm="scaled-fedavg")
    config["algorithm"]["factr"] = 0.25
    path = tmp_path / "bad.toml"
    path.write_text(dump_toml(config))
    with pytest.raises(fedsim.FedsimError, match="factr.*did you mean 'factor'"):
        fedsim.load_config(path)


class HandMomentum(Strategy):
    """FedAvgM written by hand, whose `state` names only its own velocity: the global model is
    checkpointed all the same."""

    name = "hand-momentum"
    state = ("velocity",)

    def init_state(self, params):
        super().init_state(params)
        self.velocity = params.new_zeros(params.shape)

    def aggregate(self, rnd, arrivals):
        if len(arrivals):
            self.velocity = 0.9 * self.velocity + arrivals.deltas.mean(0)
            self.params = self.params + self.velocity


class ForgetfulState(HandMomentum):
    name = "forgetful"
    state = ("velocity", "nesterov")


def run_config(tmp_path, name, rounds, algorithm):
    config = quadratic_config([[1.0, 0.0], [0.0, 2.0], [3.0, 1.0]], algorithm=algorithm, rounds=rounds)
    config["run"].update(out=str(tmp_path / "runs"), name=name, progress=False, eval_every=rounds)
    path = tmp_path / f"{name}.toml"
    path.write_text(dump_toml(config))
    return fedsim.load_config(path)


def test_a_user_algorithm_with_its_own_state_resumes_bit_identically(tmp_path, monkeypatch):
    from fedsim.runs.experiment import resume

    monkeypatch.setitem(REGISTRY, HandMomentum.name, HandMomentum)
    whole = fedsim.run(run_config(tmp_path, "whole", 20, "hand-momentum"), progress=False)
    half = fedsim.run(run_config(tmp_path, "half", 10, "hand-momentum"), progress=False)
    assert not np.allclose(final_x(half.run_dir), final_x(whole.run_dir))
    resumed = resume(half.run_dir, ["run.rounds=20"], progress=False)  # (in half's directory)
    assert np.array_equal(final_x(resumed.run_dir), final_x(whole.run_dir))


def test_declared_state_that_init_state_does_not_set_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setitem(REGISTRY, ForgetfulState.name, ForgetfulState)
    with pytest.raises(fedsim.FedsimError, match="declares state 'nesterov' but has no such attribute"):
        fedsim.run(run_config(tmp_path, "bad", 5, "forgetful"), progress=False)


class UndeclaredTable(Strategy):
    """Keeps each device's last update in a table that `state` forgets to name: checkpoints would
    not keep it (a resume would start it from zeros, silently other numbers)."""

    name = "undeclared-table"

    def init_state(self, params):
        super().init_state(params)
        self.rows = params.new_zeros((self.n, params.numel()))
        self.echo = params.new_zeros(0)  # (an empty metric placeholder is no state)

    def aggregate(self, rnd, arrivals):
        if len(arrivals):
            self.rows[arrivals.ids] = arrivals.deltas
            self.params = self.params + self.rows.mean(0)


def test_numbers_init_state_sets_but_state_does_not_name_are_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(REGISTRY, UndeclaredTable.name, UndeclaredTable)
    with pytest.raises(fedsim.FedsimError) as err:
        fedsim.run(run_config(tmp_path, "bad", 5, "undeclared-table"), progress=False)
    assert str(err.value) == ("algorithm 'undeclared-table' sets self.rows in init_state, but `state` does not name "
                              "it: checkpoints would not keep it, and a resumed run would start it again as init_state "
                              "makes it; add 'rows' to `state` (a constant may be named too)")
    monkeypatch.setattr(UndeclaredTable, "state", ("rows",))
    assert fedsim.run(run_config(tmp_path, "good", 5, "undeclared-table"), progress=False).status == "completed"


class Bounded(ScaledFedAvg):
    name = "bounded"
    ranges = {"factor": (0.0, 1.0, False, "the share of the mean update taken")}


def test_a_plugin_options_range_error_names_where_it_was_set_and_the_plugin(tmp_path, monkeypatch):
    monkeypatch.setitem(REGISTRY, Bounded.name, Bounded)
    config = quadratic_config([[1.0], [0.0]], algorithm="bounded")
    config["run"].update(out=str(tmp_path / "runs"))
    (tmp_path / "b.toml").write_text(dump_toml(config))
    with pytest.raises(fedsim.FedsimError) as err:
        fedsim.run(fedsim.load_config(tmp_path / "b.toml", ["algorithm.factor=1.5"]), progress=False)
    assert str(err.value) == ("--set algorithm.factor=1.5: [algorithm] factor = 1.5 for 'bounded' must be in [0, 1] "
                              "(the share of the mean update taken)")


class ReturnedModels(Strategy):
    """FedAvg written on the models the devices return (start + delta), read from
    `Arrivals.start`: every arrival of a synchronous round started from the global model."""

    name = "returned-models"
    needs_start = True

    def aggregate(self, rnd, arrivals):
        if len(arrivals):
            assert torch.equal(arrivals.start, self.params.expand(len(arrivals), -1))
            self.params = (arrivals.start + arrivals.deltas).mean(0)


def test_a_strategy_that_needs_start_gets_each_arrivals_start_parameters(tmp_path, monkeypatch):
    monkeypatch.setitem(REGISTRY, ReturnedModels.name, ReturnedModels)
    ours = fedsim.run(run_config(tmp_path, "returned", 20, "returned-models"), progress=False)
    fedavg = fedsim.run(run_config(tmp_path, "fedavg", 20, "fedavg"), progress=False)
    np.testing.assert_allclose(final_x(ours.run_dir), final_x(fedavg.run_dir), atol=1e-6)


def test_a_callback_that_returns_nothing_adds_nothing_and_a_wrong_answer_is_one_line(tmp_path):
    from fedsim.runs.callbacks import Callback

    seen = []

    class Printer(Callback):  # returns None everywhere, as a callback that only looks often does
        def on_start(self, run, metrics):
            seen.append("start")

        def on_round(self, run, outcome, metrics):
            seen.append(outcome.round)

        def on_end(self, run, result, metrics):
            seen.append("end")

    class Listing(Callback):
        def on_round(self, run, outcome, metrics):
            return [False, {}]

    result = fedsim.run(run_config(tmp_path, "quiet", 3, "fedavg"), progress=False, callbacks=[Printer()])
    assert result.status == "completed" and seen == ["start", 0, 1, 2, "end"]
    with pytest.raises(fedsim.FedsimError) as err:
        fedsim.run(run_config(tmp_path, "bad", 3, "fedavg"), progress=False, callbacks=[Listing()])
    assert str(err.value) == ("callback Listing: on_round returned [False, {}]; return (stop, metrics), e.g. "
                              "(False, {}) (docs/extending.md, \"Callbacks\")")


def test_fedsim_resume_goes_on_with_a_registered_algorithm_and_only_resume_keys(tmp_path, scaled_fedavg):
    whole = fedsim.run(run_config(tmp_path, "whole", 12, "scaled-fedavg"), progress=False)
    half = fedsim.run(run_config(tmp_path, "half", 5, "scaled-fedavg"), progress=False)
    with pytest.raises(fedsim.FedsimError, match="client.lr cannot be changed when resuming"):
        fedsim.resume(half.run_dir, ["client.lr=0.5"], progress=False)
    resumed = fedsim.resume(half.run_dir, ["run.rounds=12"], progress=False)
    assert resumed.status == "completed" and np.array_equal(final_x(resumed.run_dir), final_x(whole.run_dir))
    assert repr(resumed) == (f"RunResult(run_dir={str(half.run_dir)!r}, algorithm='scaled-fedavg', status='completed', "
                             "reason='12 rounds', rounds=<12 rows>)")


def test_a_resume_keeps_the_option_defaults_the_run_started_with(tmp_path, monkeypatch):
    """FedProx's `mu` left at its default: a release with another default resumes the run with
    the run's own (recorded in checkpoint.pt and manifest.json), so it ends as uninterrupted."""
    import json

    from fedsim.config.catalog import ALGORITHM_OPTIONS

    def config(name, rounds):
        cfg = quadratic_config([[1.0, 0.0], [0.0, 2.0], [3.0, 1.0]], algorithm="fedprox", rounds=rounds, steps=3)
        cfg["run"].update(out=str(tmp_path / "runs"), name=name, progress=False)
        (tmp_path / f"{name}.toml").write_text(dump_toml(cfg))
        return fedsim.load_config(tmp_path / f"{name}.toml")

    whole = fedsim.run(config("whole", 8), progress=False)
    half = fedsim.run(config("half", 4), progress=False)
    assert json.loads((half.run_dir / "manifest.json").read_text())["options"] == {
        "algorithm": {"mu": 0.01}, "selection": "uniform", "model": {}}
    monkeypatch.setitem(ALGORITHM_OPTIONS["fedprox"], "mu", 0.5)  # a later release's default
    resumed = fedsim.resume(half.run_dir, ["run.rounds=8"], progress=False)
    assert np.array_equal(final_x(resumed.run_dir), final_x(whole.run_dir))
    assert not np.allclose(final_x(fedsim.run(config("new", 8), progress=False).run_dir), final_x(whole.run_dir))
