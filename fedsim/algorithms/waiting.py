"""FedAvg with device sampling that waits (Gu et al. §5.1, ALGORITHMS.md ``fedavg-wait``).

Unbiased without knowing p_i: draw S devices uniformly from all N, wait until each of them
was available at least once, then let all S train from the current model and average.
The price is time: E[max_{i∈S} Geometric(p_i)] rounds per update, so it crawls when some
devices are rarely online. Rounds spent waiting still count (the model is unchanged).
"""

from __future__ import annotations

import numpy as np

from fedsim.algorithms.base import check_range, register
from fedsim.algorithms.fedavg import FedAvg


@register
class FedAvgWait(FedAvg):
    """``S`` (the paper's letter): devices to wait for; 0 = ``[server] clients_per_round``,
    or all N when that is 0 too. The update averages the S models (x + η_g mean Δ)."""

    name = "fedavg-wait"
    options = {"S": 0}
    state = ("params", "sample", "seen", "waited")

    def validate(self):
        check_range(self, "S", 0, self.ctx.n_devices,
                    why="devices drawn and waited for; 0 = [server] clients_per_round")

    def init_state(self, params):
        super().init_state(params)
        self.size = int(self.opt["S"]) or min(self.ctx.clients_per_round, self.n) or self.n
        self.sample = np.empty(0, dtype=np.int64)  # the S drawn devices (empty: draw next round)
        self.seen = np.zeros(0, dtype=bool)  # which of them were available since the draw
        self.waited = 0  # rounds since the draw

    def select(self, rnd, online, rng):
        if len(self.sample) == 0:
            self.sample = np.sort(rng.choice(self.n, size=self.size, replace=False)).astype(np.int64)
            self.seen = np.zeros(self.size, dtype=bool)
            self.waited = 0
        self.seen |= np.isin(self.sample, online)
        self.waited += 1
        if not self.seen.all():
            return online[:0].astype(np.int64)
        invited, self.sample = self.sample, self.sample[:0]  # redraw next round
        return invited

    def metrics(self):
        seen = float(self.seen.mean()) if len(self.seen) else 1.0
        return {"wait_seen": seen, "wait_rounds": float(self.waited)}
