"""One stored vector per device plus their running sum: the O(N·d) state of the algorithms.

MIFA and FedVARP keep every device's latest update on the server, FedLaAvg and FedAWE keep
one vector on each device (its last gradient / its local model). They all need the rows of
some devices rewritten each round and the mean over ALL devices, so the table keeps the
sum in float64 and updates it by the difference of the rewritten rows: O(k·d) per round
instead of O(N·d), without drift worth mentioning. ``stamp`` records the round each row was
last written (-1: never), which is FedAWE's τ_i and the staleness of stored updates.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedsim.algorithms.base import nan_stats


class DeviceTable:
    """``rows`` [N, d] (float32, on the run's device), ``total`` [d] float64, ``stamp`` [N].

    ``on_devices``: where the rows (and stamps) would live in a deployment; it decides only
    how ``server_bytes``/``device_bytes`` account for them. The sum is the server's.
    """

    def __init__(self, n: int, dim: int, device: torch.device, init: Tensor | None = None,
                 on_devices: bool = False):
        if init is None:
            self.rows = torch.zeros(n, dim, device=device)
        else:
            self.rows = init.to(device=device, dtype=torch.float32).unsqueeze(0).repeat(n, 1)
        self.total = self.rows.sum(0, dtype=torch.float64)
        self.stamp = np.full(n, -1, dtype=np.int64)
        self.on_devices = on_devices

    @property
    def n(self) -> int:
        return self.rows.shape[0]

    def get(self, ids: np.ndarray) -> Tensor:
        return self.rows.index_select(0, torch.as_tensor(ids, device=self.rows.device))

    def write(self, ids: np.ndarray, values: Tensor, rnd: int) -> None:
        """rows[ids] <- values (one row per id; a repeated id keeps its last value)."""
        ids = np.asarray(ids, dtype=np.int64)
        if len(np.unique(ids)) < len(ids):  # async buffers may hold a device twice
            _, first_from_end = np.unique(ids[::-1], return_index=True)
            keep = np.sort(len(ids) - 1 - first_from_end)
            ids, values = ids[keep], values.index_select(0, torch.as_tensor(keep, device=values.device))
        index = torch.as_tensor(ids, device=self.rows.device)
        values = values.to(self.rows.dtype)
        self.total += (values.double() - self.rows.index_select(0, index).double()).sum(0)
        self.rows.index_copy_(0, index, values)  # (ids are unique here)
        self.stamp[ids] = rnd

    def mean(self) -> Tensor:
        """Mean over all N rows (never-written rows count with their initial value)."""
        return (self.total / self.n).to(self.rows.dtype)

    def filled(self) -> np.ndarray:
        return self.stamp >= 0

    def metrics(self, rnd: int) -> dict[str, float]:
        """How much of the table is filled and how stale its rows are after round ``rnd``."""
        staleness = rnd - self.stamp[self.filled()]
        mean, worst = nan_stats(staleness)
        return {"memory_filled": float(self.filled().mean()), "staleness_mean": mean,
                "staleness_max": worst}

    # --- checkpoints and accounting ------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"rows": self.rows.clone(), "total": self.total.clone(), "stamp": self.stamp.copy()}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.rows = sd["rows"].to(self.rows.device)
        self.total = sd["total"].to(self.rows.device)
        self.stamp = np.asarray(sd["stamp"], dtype=np.int64).copy()

    def _bytes(self) -> tuple[int, int]:
        table = self.rows.numel() * self.rows.element_size() + self.stamp.nbytes
        return self.total.numel() * self.total.element_size(), table

    def server_bytes(self) -> int:
        total, table = self._bytes()
        return total + (0 if self.on_devices else table)

    def device_bytes(self) -> int:
        return self._bytes()[1] if self.on_devices else 0
