"""The partitioned training set and the test set, resident on the run's torch device.

Client i's samples are `indices[starts[i]:starts[i] + sizes[i]]` (CSR), so the minibatches of
a whole cohort are one gather: positions drawn per (device, slot) -> sample ids -> features.
One extra client, id N (`pooled`), holds every sample: plain SGD over the pooled data
(`sequential-sgd`) is then just training that client.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from fedsim.data.datasets import Dataset
from fedsim.data.partition import to_csr


class ClientData:
    def __init__(self, dataset: Dataset, owner: np.ndarray, n_clients: int, device: torch.device):
        offsets, indices = to_csr(owner, n_clients)
        self.n_clients = n_clients
        self.n_classes = dataset.n_classes
        self.shape = dataset.shape
        self.device = device
        self.sizes_np = np.diff(offsets)
        self.labels_np = dataset.y_train
        self.x = self._features(dataset.x_train, dataset.scale)
        self.y = torch.as_tensor(dataset.y_train, device=device)
        self.x_test = self._features(dataset.x_test, dataset.scale)
        self.y_test = torch.as_tensor(dataset.y_test, device=device)
        self.pooled = n_clients
        self.indices = torch.as_tensor(indices, device=device)
        self.starts = torch.as_tensor(np.append(offsets[:-1], 0), device=device)
        self.sizes = torch.as_tensor(np.append(self.sizes_np, len(indices)), device=device)

    def _features(self, x: np.ndarray, scale: float) -> Tensor:
        """float32 model inputs on the device. Stored as floats, not uint8: converting every
        gathered minibatch would cost as much as a logistic regression's whole step."""
        return (torch.as_tensor(x, device=self.device) * scale).to(torch.float32)  # a new tensor

    def label_distribution(self) -> np.ndarray:
        """[N, C] fraction of each client's samples per label."""
        owner = np.repeat(np.arange(self.n_clients), self.sizes_np)
        labels = self.labels_np[self.indices.cpu().numpy()]
        counts = np.zeros((self.n_clients, self.n_classes))
        np.add.at(counts, (owner, labels), 1)
        return counts / self.sizes_np[:, None]

    def _take(self, ids: Tensor, local: Tensor) -> tuple[Tensor, Tensor]:
        """Samples at local positions `local` [m, B] of clients `ids` [m]: ([m, B, *shape], [m, B])."""
        rows = self.indices[self.starts[ids, None] + local]
        return self.x[rows], self.y[rows]

    def minibatch(self, ids: Tensor, u: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Uniform draws with replacement: u [m, B] in [0, 1) -> (x, y, weights 1/B)."""
        size = self.sizes[ids, None]
        local = torch.minimum((u * size).to(torch.int64), size - 1)
        x, y = self._take(ids, local)
        return x, y, torch.full(u.shape, 1.0 / u.shape[1], device=self.device)

    def full_batch(self, ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """All samples of each client, padded to the largest; padding has weight 0, the rest 1/n_i."""
        size = self.sizes[ids, None]
        pos = torch.arange(int(size.max()), device=self.device)[None, :]
        valid = pos < size
        x, y = self._take(ids, torch.where(valid, pos, 0))
        return x, y, valid.to(torch.float32) / size
