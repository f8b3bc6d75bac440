"""Test-set loss and accuracy of one flat parameter vector."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedsim.data.clients import ClientData
from fedsim.training.models import Model

CHUNK = 4096  # test samples per forward pass: bounds activation memory for the CNNs


def _test_logits(model: Model, params: Tensor, data: ClientData):
    """(first row, logits, labels) of the test set, a chunk at a time; no dropout."""
    for lo in range(0, len(data.y_test), CHUNK):
        yield lo, model.forward(model.split(params), data.x_test[lo:lo + CHUNK]), data.y_test[lo:lo + CHUNK]


@torch.no_grad()
def evaluate_classifier(model: Model, params: Tensor, data: ClientData) -> tuple[float, float]:
    """(mean cross-entropy, accuracy in [0, 1]) on the test set; no dropout."""
    loss_sum = torch.zeros((), dtype=torch.float64, device=data.device)
    correct = torch.zeros((), dtype=torch.int64, device=data.device)
    for _, logits, y in _test_logits(model, params, data):
        loss_sum += F.cross_entropy(logits, y, reduction="sum").double()
        correct += (logits.argmax(dim=1) == y).sum()
    n = len(data.y_test)
    return float(loss_sum) / n, int(correct) / n


@torch.no_grad()
def evaluate_per_device(model: Model, params: Tensor, data: ClientData) -> dict[str, np.ndarray]:
    """Each device's test loss and accuracy on its own test samples (a dataset with its own
    clients: LEAF's per-client metrics), NaN for a device without any; one pass over the test
    set, summed per device by scatter-adds of counts (exact in any order)."""
    owner = data.owner_test
    devices = data.n_clients + 1  # the last slot gathers the test-only users' samples (owner -1)
    slot = torch.where(owner >= 0, owner, data.n_clients)
    loss_sum = torch.zeros(devices, dtype=torch.float64, device=data.device)
    correct = torch.zeros(devices, dtype=torch.float64, device=data.device)
    for lo, logits, y in _test_logits(model, params, data):
        rows = slot[lo:lo + len(y)]
        loss_sum.index_add_(0, rows, F.cross_entropy(logits, y, reduction="none").double())
        correct.index_add_(0, rows, (logits.argmax(dim=1) == y).double())
    count = torch.bincount(slot, minlength=devices).double()
    with np.errstate(invalid="ignore", divide="ignore"):
        return {"test_loss": (loss_sum / count).cpu().numpy()[:-1], "test_acc": (correct / count).cpu().numpy()[:-1]}
