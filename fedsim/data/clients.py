"""The partitioned training set and the test set, resident on the run's torch device.

Client i's samples are `indices[starts[i]:starts[i] + sizes[i]]` (CSR), so the minibatches of
a whole cohort are one gather: positions drawn per (device, slot) -> sample ids -> features
(and the sample ids of all local steps of a round are one gather too).
One extra client, id N (`pooled`), holds every sample: plain SGD over the pooled data
(`sequential-sgd`) is then just training that client.
"""

from __future__ import annotations

import hashlib
import warnings
import weakref

import numpy as np
import torch
from torch import Tensor

from fedsim.data.dataset import Dataset
from fedsim.data.partition import to_csr


class ClientData:
    def __init__(self, dataset: Dataset, owner: np.ndarray, n_clients: int, device: torch.device):
        offsets, indices = to_csr(owner, n_clients)
        self.n_clients = n_clients
        self.n_classes = dataset.n_classes
        self.shape = dataset.shape
        self.device = device
        self.sizes_np = np.diff(offsets)
        self.users = dataset.users  # device -> the dataset's user (datasets with their own clients)
        # the device of each test sample (-1: a test-only user), for per-device metrics
        self.owner_test = None if dataset.owner_test is None else torch.as_tensor(dataset.owner_test, device=device)
        self.labels_np = dataset.y_train
        self.tokens = dataset.vocab_size > 0
        self.x = self._features(dataset.x_train, dataset.scale)
        self.y = shared_features(dataset.y_train, None, device)
        self.x_test = self._features(dataset.x_test, dataset.scale)
        self.y_test = shared_features(dataset.y_test, None, device)
        self.pooled = n_clients
        self.indices = torch.as_tensor(indices, device=device)
        self.starts = torch.as_tensor(np.append(offsets[:-1], 0), device=device)
        self.sizes = torch.as_tensor(np.append(self.sizes_np, len(indices)), device=device)

    def _features(self, x: np.ndarray, scale: float) -> Tensor:
        """float32 model inputs on the device. Stored as floats, not uint8: converting every
        gathered minibatch would cost as much as a logistic regression's whole step. Shared
        with the other runs of this process that hold the same array (`shared_features`).
        Token ids (text) stay int64: the model's embedding looks them up."""
        return shared_features(x, None if self.tokens else scale, self.device)

    def label_distribution(self) -> np.ndarray:
        """[N, C] fraction of each client's samples per label."""
        owner = np.repeat(np.arange(self.n_clients), self.sizes_np)
        return label_distribution(owner, self.labels_np[self.indices.cpu().numpy()], self.n_clients, self.n_classes)

    def take(self, rows: Tensor) -> tuple[Tensor, Tensor]:
        """Features [..., *shape] and labels [...] of the samples `rows` [...]."""
        return gather(self.x, rows), gather(self.y, rows)

    def minibatch_rows(self, ids: Tensor, u: Tensor) -> Tensor:
        """Sample ids of uniform draws with replacement: u [..., m, B] in [0, 1) -> [..., m, B]."""
        return gather(self.indices, self.starts[ids, None] + self._positions(ids, u))

    def minibatch_weights(self, ids: Tensor, u: Tensor, width: int) -> tuple[Tensor, Tensor]:
        """The same draws as `minibatch_rows`, as each client's samples once (padded to `width`
        >= the largest client) weighted by how often they were drawn over B: (sample ids [m, width],
        weights [S, m, width]). Without dropout, the weighted loss over these rows is the
        minibatch loss and its gradient exactly, on min(n_i, B) rows instead of B. The counts are
        sums of ones, exact in any order, so a GPU's atomic adds keep runs deterministic."""
        rows, _ = self.full_rows(ids, width)
        counts = torch.zeros(*u.shape[:-1], width, device=self.device)
        counts.scatter_add_(-1, self._positions(ids, u), torch.ones_like(u))
        return rows, counts.div_(u.shape[-1])

    def epoch_batches(self, ids: Tensor, bits: Tensor, steps: int, batch: int, width: int) -> tuple[Tensor, Tensor]:
        """Local epochs: each client's samples shuffled once per epoch and cut into minibatches
        of `batch` (the last of an epoch smaller), as a DataLoader with shuffle=True does. `bits`
        [E, m, n] (random bits of each epoch, n >= the largest client) order the shuffles; the
        sample ids of steps 0..steps-1 [S, m, width] and their weights (1 / the batch's size;
        0 on padding). `width` = min(batch, the largest client): no batch is wider."""
        size = self.sizes[ids]
        padding = torch.arange(bits.shape[-1], device=self.device) >= size[:, None]
        shuffled = bits.masked_fill(padding, torch.iinfo(torch.int64).max).argsort(dim=-1, stable=True)
        per_epoch = ((size + batch - 1) // batch).clamp(min=1)  # [m] steps of an epoch
        step = torch.arange(steps, device=self.device)[:, None]
        first = (step % per_epoch) * batch  # [S, m] where each step's batch starts in its epoch
        at = first[..., None] + torch.arange(width, device=self.device)
        valid = at < torch.minimum(size, first + batch)[..., None]
        epoch = (step // per_epoch).clamp(max=bits.shape[0] - 1)
        picked = shuffled[epoch[..., None], torch.arange(len(ids), device=self.device)[:, None], torch.where(valid, at, 0)]
        rows = gather(self.indices, self.starts[ids][:, None] + picked)
        weight = valid / valid.sum(dim=-1, keepdim=True).clamp(min=1)
        return rows, weight

    def _positions(self, ids: Tensor, u: Tensor) -> Tensor:
        """Positions in each client's own samples of uniform draws u [..., m, B]."""
        size = self.sizes[ids, None]
        return torch.minimum((u * size).to(torch.int64), size - 1)

    def full_rows(self, ids: Tensor, width: int | None = None) -> tuple[Tensor, Tensor]:
        """All samples of each client, padded to `width` (default: the largest): (sample ids
        [m, width], weights [m, width]), the padding with weight 0, the rest 1/n_i."""
        size = self.sizes[ids, None]
        pos = torch.arange(width or int(size.max()), device=self.device)[None, :]
        valid = pos < size
        return gather(self.indices, self.starts[ids, None] + torch.where(valid, pos, 0)), valid.to(torch.float32) / size


# float32 features by content: a study's points in lockstep (fedsim/studies/lockstep.py) that train on
# one dataset hold one copy (Fashion-MNIST's training images are 188 MB as floats; 64 copies
# would not fit in memory). Read-only: the training only gathers from them.
_SHARED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def shared_features(x: np.ndarray, scale: float | None, device: torch.device) -> Tensor:
    """`x * scale` as float32 on `device` (scale None: x as int64: token ids, labels), the same
    tensor for equal arrays while one is alive."""
    digest = hashlib.sha1(np.ascontiguousarray(x).view(np.uint8).reshape(-1)).hexdigest()
    key = (digest, x.dtype.str, x.shape, scale, str(device))
    features = _SHARED.get(key)
    if features is None:
        with warnings.catch_warnings():  # x may be read-only (a cached dataset): it is only read here
            warnings.filterwarnings("ignore", "The given NumPy array is not writable")
            raw = torch.as_tensor(x, device=device)
        features = raw.to(torch.int64, copy=True) if scale is None else (raw * scale).to(torch.float32)
        _SHARED[key] = features
    return features


def gather(table: Tensor, rows: Tensor) -> Tensor:
    """table[rows] for an index tensor of any shape; index_select is ~4x faster than indexing
    on the CPU for a minibatch-sized gather."""
    return table.index_select(0, rows.flatten()).view(*rows.shape, *table.shape[1:])


def stack_clients(parts: list[ClientData]) -> tuple[ClientData, list[int]] | None:
    """Several runs' partitions of one training set as one ClientData (their CSR tables
    concatenated), and where each run's client ids start in it: the inputs of all their
    cohorts are then one set of gathers (fedsim/training/cohort.py). None unless they share
    the features and labels (the same dataset: `shared_features` holds one copy)."""
    first = parts[0]
    if any(p.x is not first.x or p.y is not first.y for p in parts):
        return None
    stacked = object.__new__(ClientData)
    stacked.x, stacked.y, stacked.device = first.x, first.y, first.device
    samples = np.cumsum([0, *[len(p.indices) for p in parts]])
    clients = np.cumsum([0, *[len(p.sizes) for p in parts]])  # each run's N clients and its pooled one
    stacked.indices = torch.cat([p.indices for p in parts])
    stacked.starts = torch.cat([p.starts + int(lo) for p, lo in zip(parts, samples)])
    stacked.sizes = torch.cat([p.sizes for p in parts])
    return stacked, [int(c) for c in clients[:-1]]


def label_distribution(owner: np.ndarray, labels: np.ndarray, n_clients: int, n_classes: int) -> np.ndarray:
    """[N, C] fraction of each client's samples per label (`owner[i]`: the client of sample i)."""
    counts = np.zeros((n_clients, n_classes))
    np.add.at(counts, (owner, labels), 1)
    return counts / np.bincount(owner, minlength=n_clients)[:, None]
