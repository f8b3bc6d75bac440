"""The quadratic task (docs/algorithms.md): client i has f_i(x) = 0.5 ||x - u_i||^2; the model is x.

It exists to check closed-form results through the whole engine, so a noiseless step is
exactly the float32 recurrence x <- x - lr * (x - u_i): the gradient is the plain difference,
with no autograd and no extra terms.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from fedsim.config import DataConfig, ModelConfig
from fedsim.errors import FedsimError
from fedsim.training import rng
from fedsim.training.task import StepFn, Task


class QuadraticTask(Task):
    n_classes = None

    def __init__(self, data: DataConfig, model: ModelConfig, *, seed: int, device: torch.device):
        self.n_clients, self.device, self.noise = data.clients, device, data.noise
        if data.targets:
            dims = {len(t) if isinstance(t, list) else -1 for t in data.targets}
            if len(dims) != 1 or min(dims) < 1:
                raise FedsimError("[data] targets must be a list of equally long lists of numbers, one per client")
            targets = np.asarray(data.targets, dtype=np.float64)
        else:
            if data.dim < 1:
                raise FedsimError(f"[data] dim = {data.dim} must be >= 1 for the quadratic task")
            targets = np.random.default_rng([seed, 0x0AD]).normal(size=(data.clients, data.dim))
        if len(targets) != data.clients:
            raise FedsimError(
                f"[data] targets has {len(targets)} entries but [data] clients = {data.clients}; give one per client"
            )
        self.dim = targets.shape[1]
        if model.init and len(model.init) != self.dim:
            raise FedsimError(
                f"[model] init has {len(model.init)} numbers but the quadratic targets have dim {self.dim}"
            )
        self.x0 = torch.tensor(model.init or [0.0] * self.dim, dtype=torch.float32, device=device)
        # the pooled client's target is the mean: its gradient is that of mean_i f_i
        pooled = np.vstack([targets, targets.mean(axis=0)])
        self.targets = torch.as_tensor(pooled, dtype=torch.float32, device=device)
        self.pooled = self.n_clients
        self.sizes = torch.ones(self.n_clients + 1, dtype=torch.int64, device=device)

    def init_params(self) -> Tensor:
        return self.x0.clone()

    def data_bytes(self) -> int:
        return self.targets.numel() * self.targets.element_size()

    def evaluate(self, params: Tensor) -> tuple[float, None]:
        """mean_i f_i(x), in float64."""
        diff = params.double()[None, :] - self.targets[: self.n_clients].double()
        return float(0.5 * (diff**2).sum(dim=1).mean()), None

    def local_losses(self, ids: np.ndarray, params: Tensor) -> np.ndarray:
        """f_i(x) of each device, in float64."""
        diff = params.double()[None, :] - self.targets[torch.as_tensor(ids, device=self.device)].double()
        return (0.5 * (diff**2).sum(dim=1)).cpu().numpy()

    def state_dict(self, params: Tensor) -> dict[str, Tensor]:
        return {"x": params.detach().cpu().clone()}

    def inputs(self, ids, rnd, steps, batch_size, seed, width=None, epochs=0.0, draws=None, data=None, cut=False):
        targets = self.targets[ids]
        if self.noise == 0:
            return lambda step, which: (targets[which],)
        noise = self.noise * rng.normal(seed, rng.NOISE, rnd, ids, range(steps), self.dim)
        return lambda step, which: (targets[which], noise[step, which])

    def step_fn(self) -> StepFn:
        def step(params: tuple[Tensor], target: Tensor, *noise: Tensor) -> tuple[tuple[Tensor], Tensor]:
            diff = params[0] - target
            loss = 0.5 * (diff * diff).sum(dim=-1)
            return (diff + noise[0] if noise else diff,), loss

        return step

    def cohort_step_fn(self) -> StepFn:
        return self.step_fn()  # row-wise already: one function serves a device and a cohort
