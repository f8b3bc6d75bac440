"""Test-set loss and accuracy of one flat parameter vector."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from fedsim.data.clients import ClientData
from fedsim.training.models import Model

CHUNK = 4096  # test samples per forward pass: bounds activation memory for the CNNs


@torch.no_grad()
def evaluate_classifier(model: Model, params: Tensor, data: ClientData) -> tuple[float, float]:
    """(mean cross-entropy, accuracy in [0, 1]) on the test set; no dropout."""
    loss_sum = torch.zeros((), dtype=torch.float64, device=data.device)
    correct = torch.zeros((), dtype=torch.int64, device=data.device)
    for lo in range(0, len(data.y_test), CHUNK):
        x = data.x_test[lo:lo + CHUNK]
        y = data.y_test[lo:lo + CHUNK]
        logits = model.forward(model.split(params), x)
        loss_sum += F.cross_entropy(logits, y, reduction="sum").double()
        correct += (logits.argmax(dim=1) == y).sum()
    n = len(data.y_test)
    return float(loss_sum) / n, int(correct) / n
