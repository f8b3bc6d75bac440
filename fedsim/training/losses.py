"""The local loss every model trains on, and the step functions' shapes."""

from __future__ import annotations

from typing import Callable

import torch.nn.functional as F
from torch import Tensor

StepLoss = Callable[[Tensor, Tensor, Tensor], Tensor]  # (logits [..., B, C], y [..., B], weight [..., B]) -> loss [...]
# (parameter tensors of one device, *its inputs) -> (their gradients, loss [])
StepFn = Callable[..., tuple[tuple[Tensor, ...], Tensor]]


def weighted_cross_entropy(logits: Tensor, y: Tensor, weight: Tensor) -> Tensor:
    """sum_b weight_b * CE(logits_b, y_b) over the last batch dimension: [..., B, C] -> [...]."""
    ce = F.cross_entropy(logits.flatten(0, -2), y.flatten(), reduction="none")
    return (ce.view_as(y) * weight).sum(dim=-1)


def mean_cross_entropy(logits: Tensor, y: Tensor, weight: Tensor) -> Tensor:
    """The mean CE of one device's step [B, C] -> [], as a plain loop computes it: for the loop's
    steps, whose samples are its own, each weighted 1 / their number (`weight` is not read)."""
    return F.cross_entropy(logits, y)
