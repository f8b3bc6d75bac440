"""What an algorithm adds to its devices' local loss, declared in one place the trainers read.

The local loss is the task's loss plus these terms: FedProx's proximal term
(mu/2)·‖w − w_start‖², and a per-device linear term <g_i, w> whose gradient g_i is added to
every local step's (SCAFFOLD's correction c − c_i, FedDyn's −h_i). New terms become fields
here and a line in `sgd_update_`, without another argument travelling through the servers
and trainers.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

import torch
from torch import Tensor


@dataclass(frozen=True, eq=False)
class LocalObjective:
    """Equal (and hashed alike) when the terms are: the same weights, a linear term on or off,
    whatever its rows (cohorts of equal objectives may train stacked, their rows stacked too)."""

    prox_mu: float = 0.0  # weight of the proximal term; 0 = off
    # [k, d]: g_i of each device of the cohort, in the order of its ids; None = off
    linear: Tensor | None = field(default=None, repr=False)

    def key(self) -> tuple:
        """What equal objectives share."""
        return (self.prox_mu, self.linear is not None)

    def __eq__(self, other) -> bool:
        return isinstance(other, LocalObjective) and self.key() == other.key()

    def __hash__(self) -> int:
        return hash(self.key())

    @property
    def uses_start(self) -> bool:
        """Whether a step needs the parameters the device started the round from."""
        return self.prox_mu != 0.0

    @property
    def per_device(self) -> bool:
        """Whether the terms differ from device to device (rows to select and stack)."""
        return self.linear is not None

    def rows(self, which: slice | Tensor) -> "LocalObjective":
        """The terms of some devices of the cohort (`which` indexes its rows)."""
        return self if self.linear is None else replace(self, linear=self.linear[which])

    def on(self, device: torch.device) -> "LocalObjective":
        """The terms as float32 tensors on `device` (where the cohort trains)."""
        return self if self.linear is None else replace(self, linear=self.linear.to(device, torch.float32))

    @staticmethod
    def stacked(objectives: Sequence["LocalObjective"]) -> "LocalObjective":
        """The terms of cohorts of equal objectives stacked one after another (lockstep studies)."""
        first = objectives[0]
        if first.linear is None:
            return first
        return replace(first, linear=torch.cat([o.linear for o in objectives]))


PLAIN = LocalObjective()
