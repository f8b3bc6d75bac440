"""A user's own Strategy, registered from Python, runs through the whole engine like a built-in."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

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
