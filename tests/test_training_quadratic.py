"""The quadratic task: exact float32 steps, keyed noise, evaluation, pooled SGD."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsim.config import ClientConfig, DataConfig, ModelConfig
from fedsim.errors import FedsimError
from fedsim.training import build_task, build_trainer

CPU = torch.device("cpu")
TARGETS = [[1.0, 0.0, 0.25], [0.0, 1.0, -3.0], [0.3, 0.7, 1e-3]]


def quadratic(noise=0.0, init=(0.5, 2.0, -1.0)):
    data = DataConfig(dataset="quadratic", clients=3, targets=TARGETS, noise=noise)
    return build_task(data, ModelConfig(init=list(init)), seed=0, device=CPU)


@pytest.mark.parametrize("path", ["batched", "loop", "auto"])
def test_noiseless_step_is_the_exact_float32_recurrence(path):
    task = quadratic()
    trainer = build_trainer(task, ClientConfig(batch_size=0, trainer=path), seed=0)
    x0 = task.init_params()
    steps = np.array([7, 1, 0])
    lr = torch.tensor([0.3, 0.1, 0.5])
    res = trainer.train(4, np.arange(3), x0[None].repeat(3, 1), steps, lr)
    for i in range(3):
        x, u = x0.clone(), torch.tensor(TARGETS[i], dtype=torch.float32)
        for _ in range(steps[i]):
            x = x - lr[i] * (x - u)
        assert torch.equal(res.deltas[i], x - x0)  # the recurrence's end, minus start
    assert torch.equal(res.samples, torch.tensor([7, 1, 0]))
    assert torch.isnan(res.loss[2])


def test_loss_is_the_mean_over_steps():
    task = quadratic(init=(0.0, 0.0, 0.0))
    trainer = build_trainer(task, ClientConfig(batch_size=0), seed=0)
    res = trainer.train(0, np.array([0]), torch.zeros(1, 3), np.array([2]), 0.5)
    u = np.array(TARGETS[0])
    assert res.loss[0].item() == pytest.approx((0.5 * u @ u + 0.5 * (0.5 * u) @ (0.5 * u)) / 2, rel=1e-6)


def test_noise_is_keyed_and_has_the_configured_spread():
    task = build_task(DataConfig(dataset="quadratic", clients=200, dim=50, noise=2.0), ModelConfig(),
                      seed=0, device=CPU)
    ids = np.arange(200)
    start = task.targets[:200].clone()  # at the optimum: the step is the noise alone
    runs = {p: build_trainer(task, ClientConfig(batch_size=0, trainer=p), seed=9)
            .train(1, ids, start, np.ones(200, dtype=int), 1.0) for p in ("batched", "loop")}
    noise = -runs["batched"].deltas
    assert torch.equal(runs["batched"].deltas, runs["loop"].deltas)
    assert abs(noise.std().item() - 2.0) < 0.05 and abs(noise.mean().item()) < 0.05
    other = build_trainer(task, ClientConfig(batch_size=0), seed=9).train(2, ids, start, np.ones(200, dtype=int), 1.0)
    assert not torch.allclose(other.deltas, runs["batched"].deltas)


def test_random_targets_from_the_seed_and_evaluate():
    a = build_task(DataConfig(dataset="quadratic", clients=4, dim=3), ModelConfig(), seed=1, device=CPU)
    b = build_task(DataConfig(dataset="quadratic", clients=4, dim=3), ModelConfig(), seed=1, device=CPU)
    assert a.dim == 3 and a.n_classes is None and a.label_distribution() is None
    assert torch.equal(a.targets, b.targets) and torch.equal(a.init_params(), torch.zeros(3))
    u = a.targets[:4].double()
    loss, acc = a.evaluate(torch.zeros(3))
    assert acc is None and loss == pytest.approx(float(0.5 * (u**2).sum(dim=1).mean()))
    assert list(a.state_dict(torch.ones(3))) == ["x"]
    assert np.array_equal(a.client_sizes(), np.ones(4))


def test_pooled_sgd_descends_the_mean_objective():
    task = quadratic(init=(0.0, 0.0, 0.0))
    trainer = build_trainer(task, ClientConfig(batch_size=0), seed=0)
    delta = trainer.train_pooled(0, torch.zeros(3), 1, 0.5)
    assert torch.allclose(delta, 0.5 * torch.tensor(TARGETS).mean(dim=0))


@pytest.mark.parametrize("data, model, words", [
    (DataConfig(dataset="quadratic", clients=2, targets=[[1.0], [1.0, 2.0]]), ModelConfig(), "equally long"),
    (DataConfig(dataset="quadratic", clients=2, targets=[[1.0], [2.0]]), ModelConfig(init=[0.0, 1.0]), "[model] init"),
    (DataConfig(dataset="quadratic", clients=3, targets=[[1.0], [2.0]]), ModelConfig(), "one per client"),
])
def test_quadratic_config_errors(data, model, words):
    with pytest.raises(FedsimError) as err:
        build_task(data, model, seed=0, device=CPU)
    assert words in str(err.value)
