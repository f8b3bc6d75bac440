"""FedAvg with device sampling that waits (Gu et al. §5.1; docs/algorithms.md ``fedavg-wait``).

Unbiased without knowing p_i: draw S devices uniformly from all N, wait until each of them
was available at least once, then let all S train from the current model and average.
The price is time: E[max_{i∈S} Geometric(p_i)] rounds per update, so it crawls when some
devices are rarely online. Rounds spent waiting still count (the model is unchanged).

Because x does not change during a wait, a drawn device can compute its update from x in the
first round it is online instead of in the round the wait ends: the same update (exact
gradients), but it also works when devices take time and can drop (model timing), where
the S devices are rarely online all at the same moment. A device that drops is invited again
the next time it is online; the wait ends when all S updates have arrived.
"""

from __future__ import annotations

import numpy as np
import torch

from fedsim.config.catalog import ALGORITHM_OPTIONS
from fedsim.algorithms.base import check_range
from fedsim.algorithms.fedavg import FedAvg


class FedAvgWait(FedAvg):
    """``S`` (the paper's letter): devices to wait for; 0 = ``[server] clients_per_round``,
    or all N when that is 0 too. The update averages the S models (x + η_g mean Δ). Client
    learning rate: that of the round the wait began."""

    name = "fedavg-wait"
    options = ALGORITHM_OPTIONS["fedavg-wait"]
    state = ("params", "sample", "arrived", "delta_sum", "waited", "drawn_at")
    uses_selection = False  # (its own draw of S devices; a study's selection for the others is left aside)

    def validate(self):
        check_range(self, "S", 0, self.ctx.n_devices,
                    why="devices drawn and waited for; 0 = [server] clients_per_round")

    def init_state(self, params):
        super().init_state(params)
        self.size = int(self.opt["S"]) or self.ctx.clients_per_round or self.n
        self.sample = np.empty(0, dtype=np.int64)  # the S drawn devices (empty: draw next round)
        self.arrived = np.zeros(0, dtype=bool)  # whose update from x is in delta_sum
        self.delta_sum = torch.zeros_like(params)
        self.waited = 0  # rounds since the draw
        self.drawn_at = 0

    def select(self, rnd, online, rng):
        if len(self.sample) == 0:
            self.sample = np.sort(rng.choice(self.n, size=self.size, replace=False)).astype(np.int64)
            self.arrived = np.zeros(self.size, dtype=bool)
            self.delta_sum.zero_()
            self.waited, self.drawn_at = 0, rnd
        self.waited += 1
        pending = self.sample[~self.arrived]
        return pending[np.isin(pending, online)]

    def client_lr(self, rnd):
        return self.ctx.lr(self.drawn_at + 1)

    def aggregate(self, rnd, arrivals):
        if len(arrivals):
            slot = np.searchsorted(self.sample, arrivals.ids)
            self.arrived[slot] = True
            self.delta_sum += arrivals.deltas.sum(0)
        if len(self.sample) and self.arrived.all():
            self.apply_update((1.0 / self.size) * self.delta_sum)
            self.sample = self.sample[:0]  # redraw next round

    def metrics(self):
        done = float(self.arrived.mean()) if len(self.sample) else 1.0
        return {"wait_seen": done, "wait_rounds": float(self.waited)}
