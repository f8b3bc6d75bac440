"""FedAWE (Xiang et al., Alg. 1): adaptive innovation echoing and implicit gossiping.

Each device trains from its OWN model x_i and echoes its update by the rounds since it was
last active, (t − τ_i), which makes up for the rounds it missed (the echo factors a device
has used sum to R whenever it is active in round R−1). The server averages the echoed
models of the round's arrivals and sends the result back only to them, so absent devices
keep their stale x_i: an implicit gossip that equalises the devices' weights. The evaluated
model is the mean of all x_i. Server memory O(d); the x_i and τ_i live on the devices.
"""

from __future__ import annotations

import torch

from fedsim.config.catalog import ALGORITHM_OPTIONS, ALGORITHM_RANGES
from fedsim.algorithms.base import Strategy, nan_stats
from fedsim.algorithms.table import DeviceTable


class FedAwe(Strategy):
    """x = mean_{A_t}(x_i + η_g (t − τ_i) Δ_i); x_i <- x and τ_i <- t for i ∈ A_t.

    ``clip > 0`` caps the L2 norm of the aggregated echoed update mean_{A_t} η_g (t − τ_i) Δ_i
    (the authors' code clips at 0.5); 0 = off, the algorithm as analysed.
    """

    name = "fedawe"
    options, ranges = ALGORITHM_OPTIONS["fedawe"], ALGORITHM_RANGES["fedawe"]
    state = ("local",)  # its rows and τ (stamp) are device state, its running sum the server's

    def init_state(self, params):
        self.local = DeviceTable(self.n, params.numel(), params.device, init=params, on_devices=True)
        self.echo = torch.empty(0)
        self.clipped = 0.0

    @property
    def params(self):
        """The evaluated model: the mean of all devices' local models."""
        return self.local.mean()

    def start_params(self, ids):
        return self.local.get(ids)

    def aggregate(self, rnd, arrivals):
        self.echo = torch.as_tensor(rnd - self.local.stamp[arrivals.ids], dtype=torch.float32)
        self.clipped = 0.0
        if not len(arrivals):
            return
        echo = self.echo.to(arrivals.deltas.device)
        update = self.server_step((echo @ arrivals.deltas) / len(arrivals))
        limit = float(self.opt["clip"])
        norm = float(update.norm())
        if limit > 0 and norm > limit:
            update = update * (limit / norm)
            self.clipped = 1.0
        x = self.local.get(arrivals.ids).mean(0) + update
        self.local.write(arrivals.ids, x.unsqueeze(0).expand(len(arrivals), -1), rnd)

    def metrics(self):
        mean, worst = nan_stats(self.echo.numpy())
        return {"echo_mean": mean, "echo_max": worst, "clipped": self.clipped}
