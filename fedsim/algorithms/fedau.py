"""FedAU (Wang & Ji, concurrent work cited in Xiang et al.): weights from observed intervals.

Without knowing p_i, the server estimates 1/p_i online as the mean interval between a
device's participations, cut off at K rounds so that a device that stops participating
cannot get an unbounded weight; under Bernoulli(p) the weight tends to (1 − (1−p)^K)/p.
O(d) + N server memory (three counters per device).
"""

from __future__ import annotations

import numpy as np
import torch

from fedsim.config.catalog import ALGORITHM_OPTIONS, ALGORITHM_RANGES
from fedsim.algorithms.base import nan_stats
from fedsim.algorithms.fedavg import FedAvg


class FedAu(FedAvg):
    """x <- x + η_g (1/N) Σ_{A_t} ω_i Δ_i, ω_i = mean recorded interval (1 if none yet)."""

    name = "fedau"
    options, ranges = ALGORITHM_OPTIONS["fedau"], ALGORITHM_RANGES["fedau"]
    state = ("params", "absent", "interval_sum", "interval_count")

    def init_state(self, params):
        super().init_state(params)
        self.absent = np.zeros(self.n, dtype=np.int64)  # c_i: rounds since the last record
        self.interval_sum = np.zeros(self.n, dtype=np.int64)
        self.interval_count = np.zeros(self.n, dtype=np.int64)
        self.used = np.empty(0)

    def omega(self) -> np.ndarray:
        """Every device's current weight estimate [N]."""
        count = np.maximum(self.interval_count, 1)
        return np.where(self.interval_count > 0, self.interval_sum / count, 1.0)

    def weights(self, rnd, arrivals):
        self.used = self.omega()[arrivals.ids]  # weights from the intervals recorded so far
        return torch.as_tensor(self.used / self.n, dtype=torch.float32, device=arrivals.deltas.device)

    def counted(self, rnd, arrivals):
        if not len(arrivals):  # (`weights` was not asked)
            self.used = np.empty(0)
        self.record(arrivals.ids)

    def record(self, present_ids: np.ndarray) -> None:
        """Present devices record c_i + 1; absent ones count, recording K at the cutoff."""
        cutoff = int(self.opt["cutoff"])
        present = np.zeros(self.n, dtype=bool)
        present[present_ids] = True
        self.absent[~present] += 1
        done = present | (self.absent >= cutoff)
        self.interval_sum[done] += np.where(present, self.absent + 1, cutoff)[done]
        self.interval_count[done] += 1
        self.absent[done] = 0

    def metrics(self):
        mean, worst = nan_stats(self.used)
        return {"weight_mean": mean, "weight_max": worst}
