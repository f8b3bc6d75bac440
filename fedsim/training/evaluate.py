"""Test-set loss and accuracy of flat parameter vectors: one run's, or several runs' of one
model in one pass over the test set.

Evaluation is inference only (torch.inference_mode: no autograd bookkeeping) and runs the
model's inference form (`Model.predict`; on fedsim's kernels pooling without indices, ReLU
after the pool). The
test set goes through in chunks sized by their layer outputs: on a CPU small enough to stay in
the cache (LeNet-5's layers took half the time of chunks of 4,096), on a GPU wide. Sums stay on the
device (float64 losses, int64 counts) and reach the host once, at the end.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedsim.data.clients import ClientData
from fedsim.training.models import Model

CPU_FLOATS = 2**22  # layer outputs of one chunk on a CPU (16 MiB: half of a 32 MiB L3 cache)
GPU_FLOATS = 2**28  # on a GPU (1 GiB): wide calls keep its kernels busy


def chunk_size(model: Model, device: torch.device, runs: int = 1) -> int:
    """Test samples per forward pass of `runs` models (benchmarks/bench_eval.py measured the
    CPU budget: near the best chunk for lenet5, cnn-fmnist and mlp alike)."""
    budget = GPU_FLOATS if device.type == "cuda" else CPU_FLOATS
    return max(1, budget // max(1, model.activations * runs))


@torch.inference_mode()
def evaluate_classifier(model: Model, params: Tensor, data: ClientData) -> tuple[float, float]:
    """(mean cross-entropy, accuracy in [0, 1]) of flat parameters [d] on the test set."""
    return evaluate_stacked(model, params[None], data)[0]


@torch.inference_mode()
def evaluate_stacked(model: Model, params: Tensor, data: ClientData) -> list[tuple[float, float]] | None:
    """(mean cross-entropy, accuracy) of each of m flat parameter vectors [m, d] of `model` on
    the test set, in one pass (m > 1: `predict_together`); None where the model has no
    stacked form."""
    m, n = len(params), len(data.y_test)
    loss_sum = torch.zeros(m, dtype=torch.float64, device=data.device)
    correct = torch.zeros(m, dtype=torch.int64, device=data.device)
    size = chunk_size(model, data.device, m)
    for lo in range(0, n, size):
        x, y = data.x_test[lo:lo + size], data.y_test[lo:lo + size]
        logits = model.predict(params[0], x)[None] if m == 1 else model.predict_together(params, x)
        if logits is None:
            return None
        losses = F.cross_entropy(logits.flatten(0, 1), y.repeat(m), reduction="none").view(m, -1)
        loss_sum += losses.double().sum(dim=1)
        correct += (logits.argmax(dim=-1) == y).sum(dim=1)
    return [(loss, acc) for loss, acc in torch.stack([loss_sum / n, correct.double() / n]).T.tolist()]


@torch.inference_mode()
def evaluate_per_device(model: Model, params: Tensor, data: ClientData) -> dict[str, np.ndarray]:
    """Each device's test loss and accuracy on its own test samples (a dataset with its own
    clients: LEAF's per-client metrics), NaN for a device without any; one pass over the test
    set, summed per device by scatter-adds of counts (exact in any order)."""
    owner = data.owner_test
    devices = data.n_clients + 1  # the last slot gathers the test-only users' samples (owner -1)
    slot = torch.where(owner >= 0, owner, data.n_clients)
    loss_sum = torch.zeros(devices, dtype=torch.float64, device=data.device)
    correct = torch.zeros(devices, dtype=torch.float64, device=data.device)
    size = chunk_size(model, data.device)
    for lo in range(0, len(data.y_test), size):
        logits, y, rows = model.predict(params, data.x_test[lo:lo + size]), data.y_test[lo:lo + size], slot[lo:lo + size]
        loss_sum.index_add_(0, rows, F.cross_entropy(logits, y, reduction="none").double())
        correct.index_add_(0, rows, (logits.argmax(dim=1) == y).double())
    count = torch.bincount(slot, minlength=devices).double()
    with np.errstate(invalid="ignore", divide="ignore"):
        return {"test_loss": (loss_sum / count).cpu().numpy()[:-1], "test_acc": (correct / count).cpu().numpy()[:-1]}


@torch.inference_mode()
def local_losses(model: Model, params: Tensor, data: ClientData, ids: np.ndarray) -> np.ndarray:
    """Each device's mean cross-entropy [k] (float64) of flat parameters [d] over its own
    training samples (power-of-choice's question to its candidates): their samples in one
    sequence, through the model in chunks as the test set, summed per device by scatter-adds."""
    which = torch.as_tensor(ids, dtype=torch.int64, device=data.device)
    sizes = data.sizes[which]
    slot = torch.repeat_interleave(torch.arange(len(ids), device=data.device), sizes)
    first = torch.cumsum(sizes, 0) - sizes  # where each device's samples begin in the sequence
    rows = data.indices[data.starts[which][slot] + torch.arange(len(slot), device=data.device) - first[slot]]
    loss_sum = torch.zeros(len(ids), dtype=torch.float64, device=data.device)
    size = chunk_size(model, data.device)
    for lo in range(0, len(rows), size):
        x, y = data.take(rows[lo:lo + size])
        losses = F.cross_entropy(model.predict(params, x), y, reduction="none").double()
        loss_sum.index_add_(0, slot[lo:lo + size], losses)
    return (loss_sum / sizes.double()).cpu().numpy()
