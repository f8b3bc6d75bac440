"""Test evaluation: the inference path equals a plain forward pass; runs evaluated together
equal each run evaluated alone; a mixed group falls back to each run's own evaluation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedsim.config import DataConfig, ModelConfig
from fedsim.data.datasets import Dataset
from fedsim.training import build_task, evaluate as evaluation
from fedsim.training.group_eval import evaluate_together, evaluation_key
from fedsim.training.kernels import pool_max
from fedsim.training.task import classification_task

CPU = torch.device("cpu")
RNG = np.random.default_rng(0)
X = RNG.integers(0, 256, size=(300, 1, 28, 28), dtype=np.uint8)
Y = RNG.integers(0, 10, size=300)
IMAGES = Dataset("images", X[:200], Y[:200], X[200:], Y[200:], 10, scale=1 / 255)


def image_task(model: str, seed: int = 0, **model_keys):
    return classification_task(IMAGES, DataConfig(clients=4), ModelConfig(name=model, **model_keys),
                               seed=seed, device=CPU)


def trained(task, seed: int) -> torch.Tensor:
    """Parameters away from the init (its zero biases would hide a bias mix-up)."""
    gen = torch.Generator().manual_seed(seed)
    return task.init_params() + 0.05 * torch.randn(task.dim, generator=gen)


def reference(task, params):
    """Mean cross-entropy and accuracy by the model's training forward pass, all at once."""
    with torch.no_grad():
        logits = task.model.forward(task.model.split(params), task.data.x_test)
        y = task.data.y_test
        return F.cross_entropy(logits, y).item(), (logits.argmax(1) == y).double().mean().item()


@pytest.mark.parametrize("model, keys", [("lenet5", {}), ("cnn-fmnist", {"dropout": 0.3}), ("mlp", {}),
                                         ("logreg", {}), ("lstm", {})])
def test_evaluation_equals_the_plain_forward_pass(model, keys, monkeypatch):
    task = image_task(model, **keys)
    params = trained(task, 1)
    loss, acc = reference(task, params)
    assert task.evaluate(params) == (pytest.approx(loss, rel=1e-6), acc)
    monkeypatch.setattr(evaluation, "CPU_FLOATS", task.model.activations * 7)  # chunks of 7: 15 chunks
    assert evaluation.chunk_size(task.model, CPU) == 7
    assert task.evaluate(params) == (pytest.approx(loss, rel=1e-6), acc)


def test_pool_max_is_max_pool2d_on_any_size():
    x = torch.randn(3, 4, 7, 9)
    x[0, 0, :2, :2] = 0.5  # ties
    x[1, 1, 2, 2] = float("nan")
    expected = F.max_pool2d(x, 2)
    assert torch.equal(pool_max(x).isnan(), expected.isnan())
    assert torch.equal(pool_max(x).nan_to_num(), expected.nan_to_num())
    assert pool_max(x).shape == (3, 4, 3, 4)


def test_the_inference_order_moves_relu_after_the_pool_and_drops_dropout():
    names = [type(layer).__name__ for layer in image_task("lenet5", dropout=0.5).model.inference_layers]
    assert names == ["Conv", "MaxPool", "ReLU", "Conv", "MaxPool", "ReLU", "Flatten",
                     "Dense", "ReLU", "Dense", "ReLU", "Dense"]


def test_the_cpu_chunk_keeps_16_mib_of_layer_outputs():
    lenet = image_task("lenet5").model
    assert lenet.activations == 15002  # 6x28x28 + 6x14x14 twice ... per sample
    assert evaluation.chunk_size(lenet, CPU) == 2**22 // 15002 == 279
    assert evaluation.chunk_size(lenet, CPU, runs=8) == 2**22 // (8 * 15002) == 34
    assert evaluation.chunk_size(lenet, torch.device("cuda")) == 2**28 // 15002


@pytest.mark.parametrize("model", ["lenet5", "mlp", "cnn-svhn"])
def test_runs_evaluated_together_equal_each_alone(model, monkeypatch):
    tasks = [image_task(model, seed=s) for s in range(3)]
    runs = [(task, trained(task, s)) for s, task in enumerate(tasks)]
    alone = [task.evaluate(params) for task, params in runs]
    assert len({evaluation_key(task) for task in tasks}) == 1
    assert len(set(alone)) == 3  # three different models
    calls = []
    stacked = evaluation.evaluate_stacked
    monkeypatch.setattr("fedsim.training.group_eval.evaluate_stacked",
                        lambda model, params, data: calls.append(len(params)) or stacked(model, params, data))
    together = evaluate_together(runs)
    assert calls == [3]  # one call for the three
    for (loss, acc), (loss1, acc1) in zip(together, alone):
        assert loss == pytest.approx(loss1, rel=1e-6) and acc == acc1


def test_a_mixed_group_falls_back_to_each_runs_own_evaluation(monkeypatch):
    lenets = [image_task("lenet5", seed=s) for s in range(2)]
    other_labels = classification_task(Dataset("images", X[:200], Y[:200], X[200:], 9 - Y[200:], 10, scale=1 / 255),
                                       DataConfig(clients=4), ModelConfig(name="lenet5"), seed=0, device=CPU)
    quadratic = build_task(DataConfig(dataset="quadratic", clients=3, targets=[[1.0], [2.0], [3.0]]),
                           ModelConfig(), seed=0, device=CPU)
    tasks = [lenets[0], image_task("mlp"), other_labels, quadratic, image_task("lstm"), lenets[1]]
    runs = [(task, trained(task, s) if task is not quadratic else torch.zeros(1)) for s, task in enumerate(tasks)]
    assert evaluation_key(quadratic) is None
    assert evaluation_key(other_labels) == evaluation_key(lenets[0])  # same images ...
    calls = []
    stacked = evaluation.evaluate_stacked
    monkeypatch.setattr("fedsim.training.group_eval.evaluate_stacked",
                        lambda model, params, data: calls.append(len(params)) or stacked(model, params, data))
    together = evaluate_together(runs)
    assert calls == [2]  # ... other labels: not with them; only the two lenets shared a call
    assert together[3] == quadratic.evaluate(torch.zeros(1)) == (pytest.approx(7 / 3), None)
    for (task, params), (loss, acc) in zip(runs, together):
        alone = task.evaluate(params)
        assert loss == pytest.approx(alone[0], rel=1e-6) and acc == alone[1]
    assert together[0] != together[2]  # the other labels were evaluated against their own


def test_a_model_without_a_shared_first_layer_is_evaluated_run_by_run():
    tasks = [image_task("lstm", seed=s) for s in range(2)]
    runs = [(task, trained(task, s)) for s, task in enumerate(tasks)]
    assert evaluation.evaluate_stacked(tasks[0].model, torch.stack([p for _, p in runs]), tasks[0].data) is None
    assert evaluate_together(runs) == [task.evaluate(params) for task, params in runs]


@pytest.mark.parametrize("model", ["lenet5", "mlp"])
def test_local_losses_are_each_devices_mean_loss_over_its_own_training_samples(model, monkeypatch):
    """power-of-choice's question, batched over the candidates and cut into chunks that straddle
    devices, equals each device's own plain forward pass over its samples."""
    task = image_task(model)
    params = trained(task, 2)
    data, ids = task.data, np.array([3, 0, 2])
    expected = []
    with torch.no_grad():
        for i in ids:
            rows = data.indices[int(data.starts[i]):int(data.starts[i]) + int(data.sizes[i])]
            logits = task.model.forward(task.model.split(params), data.x[rows])
            expected.append(F.cross_entropy(logits, data.y[rows]).item())
    monkeypatch.setattr(evaluation, "CPU_FLOATS", task.model.activations * 7)  # chunks of 7 samples
    np.testing.assert_allclose(task.local_losses(ids, params), expected, rtol=1e-6)
