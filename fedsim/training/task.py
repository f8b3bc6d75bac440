"""A Task: the dataset, its partition over the clients and the model, all on the run's device.

Besides the public API the engine uses (init, evaluate, state_dict, sizes), a task gives the
trainers three things: `split`, views of flat parameters as the model's tensors; `inputs`,
one device-side gather of what a cohort needs for one local step (drawn from keyed
randomness); and `step_fn`, the per-device gradients and loss. The batched trainer vmaps
`step_fn` over the cohort; the loop trainer calls it per device.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedsim.config import DataConfig, ModelConfig
from fedsim.data.clients import ClientData
from fedsim.data.datasets import Dataset, load_dataset
from fedsim.data.partition import partition
from fedsim.training import rng
from fedsim.training.evaluate import evaluate_classifier
from fedsim.training.models import Model, build_model

# (parameter tensors of one device, *its inputs) -> (their gradients, loss [])
StepFn = Callable[..., tuple[tuple[Tensor, ...], Tensor]]


class Task:
    n_clients: int
    dim: int
    device: torch.device
    n_classes: int | None
    has_conv: bool = False  # what `auto` chooses a trainer path by
    activations: int = 0  # floats of layer outputs per sample (0: no need to chunk a cohort)
    sizes: Tensor  # int64 [N + 1] samples per client; the last entry is the pooled client
    pooled: int  # id of the virtual client holding all data (= n_clients)

    def init_params(self) -> Tensor:
        raise NotImplementedError

    def client_sizes(self) -> np.ndarray:
        return self.sizes[: self.n_clients].cpu().numpy()

    def label_distribution(self) -> np.ndarray | None:
        return None

    def evaluate(self, params: Tensor) -> tuple[float, float | None]:
        raise NotImplementedError

    def state_dict(self, params: Tensor) -> dict[str, Tensor]:
        """model.pt's tensors, on the CPU so that the file loads on any machine."""
        raise NotImplementedError

    def split(self, flat: Tensor) -> tuple[Tensor, ...]:
        """Views of parameters [..., d] as the model's tensors [..., *shape]."""
        return (flat,)

    def inputs(self, ids: Tensor, rnd: int, step: int, batch_size: int, seed: int) -> tuple[Tensor, ...]:
        """Per-device inputs of local step `step` for devices `ids` [m]; leading dim m each."""
        raise NotImplementedError

    def step_fn(self) -> StepFn:
        raise NotImplementedError

    def cohort_step_fn(self) -> StepFn:
        """`step_fn` over stacked devices: tensors and inputs [m, ...] -> (gradients [m, ...], losses [m])."""
        return torch.func.vmap(self.step_fn())


class ClassificationTask(Task):
    """Cross-entropy on a partitioned labelled dataset, model = a flat-parameter `Model`."""

    def __init__(self, data: ClientData, model: Model, seed: int):
        self.data, self.model, self.seed = data, model, seed
        self.n_clients, self.n_classes = data.n_clients, data.n_classes
        self.dim, self.device = model.dim, data.device
        self.has_conv, self.activations = model.has_conv, model.activations
        self.sizes, self.pooled = data.sizes, data.pooled

    def init_params(self) -> Tensor:
        return self.model.init(self.seed).to(self.device)

    def label_distribution(self) -> np.ndarray:
        return self.data.label_distribution()

    def evaluate(self, params: Tensor) -> tuple[float, float]:
        return evaluate_classifier(self.model, params, self.data)

    def state_dict(self, params: Tensor) -> dict[str, Tensor]:
        return {k: v.detach().cpu().clone() for k, v in self.model.unflatten(params).items()}

    def split(self, flat: Tensor) -> tuple[Tensor, ...]:
        return self.model.split(flat)

    def inputs(self, ids, rnd, step, batch_size, seed):
        if batch_size > 0:
            x, y, weight = self.data.minibatch(ids, rng.uniform(seed, rng.BATCH, rnd, ids, step, batch_size))
        else:
            x, y, weight = self.data.full_batch(ids)
        m, b = y.shape
        n_drop = self.model.dropout_features  # 0: an empty tensor keeps the signature fixed
        u = rng.uniform(seed, rng.DROPOUT, rnd, ids, step, b * n_drop) if n_drop else x.new_zeros(m, 0)
        return x, y, weight, u.view(m, b, n_drop)

    def step_fn(self) -> StepFn:
        model = self.model

        def loss(params: tuple[Tensor, ...], x: Tensor, y: Tensor, weight: Tensor, u: Tensor) -> Tensor:
            logits = model.forward(params, x, u if u.shape[-1] else None)
            return (F.cross_entropy(logits, y, reduction="none") * weight).sum()

        return torch.func.grad_and_value(loss)


def build_task(data: DataConfig, model: ModelConfig, *, seed: int, device: torch.device) -> Task:
    """The task of `[data]` and `[model]`, with everything on `device`."""
    if data.dataset == "quadratic":
        from fedsim.training.quadratic import QuadraticTask

        return QuadraticTask(data, model, seed=seed, device=device)
    return classification_task(load_dataset(data, seed), data, model, seed=seed, device=device)


def classification_task(dataset: Dataset, data: DataConfig, model: ModelConfig, *, seed: int,
                        device: torch.device) -> ClassificationTask:
    """Partition `dataset` as `[data]` says and put it on `device` with the `[model]` network."""
    owner = partition(dataset.y_train, data, seed)
    net = build_model(model, dataset.shape, dataset.n_classes, dataset.name)
    return ClassificationTask(ClientData(dataset, owner, data.clients, device), net, seed)
