"""Client learning-rate schedules (ALGORITHMS.md §1): values, and their use by the engine."""

from __future__ import annotations

import math

import numpy as np
import pytest

from conftest import final_x, quadratic_config
from fedsim.config import ClientConfig
from fedsim.training.schedules import learning_rate


@pytest.mark.parametrize("schedule, extra, expected", [
    ("constant", {}, [0.4, 0.4, 0.4, 0.4]),
    ("inverse", {}, [0.4, 0.2, 0.4 / 3, 0.1]),  # MIFA: lr / t, t = 1, 2, ...
    # FedAWE: lr / sqrt(t/10 + 1) with its 0-based global round t: the first round has lr
    ("inverse-sqrt", {}, [0.4, 0.4 / math.sqrt(1.1), 0.4 / math.sqrt(1.2), 0.4 / math.sqrt(1.3)]),
    ("step", {"lr_step_every": 2, "lr_step_gamma": 0.5}, [0.4, 0.4, 0.2, 0.2]),
])
def test_schedule_values_of_the_first_rounds(schedule, extra, expected):
    client = ClientConfig(lr=0.4, lr_schedule=schedule, **extra)
    assert [learning_rate(client, t) for t in (1, 2, 3, 4)] == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("schedule", ["inverse", "inverse-sqrt", "step"])
def test_the_engine_trains_round_t_with_the_schedule_of_round_t(cli_run, schedule):
    """One always-online device, one exact gradient step a round on 0.5 (x - u)^2:
    x_T = u + (x_0 - u) prod_t (1 - lr_t)."""
    client = ClientConfig(lr=0.5, lr_schedule=schedule, lr_step_every=3, lr_step_gamma=0.3)
    config = quadratic_config([[2.0]], lr=0.5, rounds=7)
    config["client"].update(lr_schedule=schedule, lr_step_every=3, lr_step_gamma=0.3)
    config["trace"] = {"source": "always"}
    expected = 2.0 + (0.0 - 2.0) * np.prod([1 - learning_rate(client, t) for t in range(1, 8)])
    np.testing.assert_allclose(final_x(cli_run(config)), [expected], rtol=1e-6)
