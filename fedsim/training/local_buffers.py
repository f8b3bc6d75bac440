"""`[model] local_buffers = true` (FedBN, Li et al. 2021): a module's buffers (BatchNorm's
running statistics) stay on the devices instead of being averaged with the weights.

Each device trains from its own buffers (the server's until it first trains) and keeps what
its local steps leave in them; the buffers of the deltas it sends are zero, so the
algorithms average the weights only. The server's model, which is evaluated and saved as
model.pt, carries the mean of the buffers of the devices that have trained. In train mode the
running statistics do not enter the loss, so the weights train exactly as without this key.
"""

from __future__ import annotations

import torch
from torch import Tensor


class DeviceBuffers:
    def __init__(self, buffers: slice, n_devices: int, device: torch.device):
        self.buffers, self.n_devices, self.device = buffers, n_devices, device
        self.own: Tensor | None = None  # [n_devices, buffer floats], allocated when first used
        self.seen = torch.zeros(n_devices, dtype=torch.bool, device=device)

    def start(self, ids: Tensor, start: Tensor) -> Tensor:
        """The starts [k, d] of devices `ids` with their own buffers where they have them."""
        if self.own is None:
            self.own = start[:1, self.buffers].expand(self.n_devices, -1).clone()
        start = start.clone()
        start[:, self.buffers] = torch.where(self.seen[ids, None], self.own[ids], start[:, self.buffers])
        return start

    def keep(self, ids: Tensor, end: Tensor, deltas: Tensor) -> None:
        """Keep the devices' end buffers; their deltas send none."""
        self.own[ids] = end[:, self.buffers]
        self.seen[ids] = True
        deltas[:, self.buffers] = 0.0

    def served(self, params: Tensor) -> Tensor:
        """The server's parameters [d] with the mean buffers of the devices that have trained."""
        if self.own is None or not bool(self.seen.any()):
            return params
        params = params.clone()
        params[self.buffers] = self.own[self.seen].mean(dim=0)
        return params

    def state_dict(self) -> dict[str, Tensor | None]:
        return {"own": self.own, "seen": self.seen}

    def load_state_dict(self, state: dict[str, Tensor | None]) -> None:
        self.own = None if state["own"] is None else state["own"].to(self.device)
        self.seen = state["seen"].to(self.device)
