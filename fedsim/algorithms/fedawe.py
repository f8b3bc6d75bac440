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
from fedsim.algorithms.base import (Strategy, each_run, nan_stats, padded_rows, rows_of_runs, run_means,
                                   steps_together)
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
        self.echoes(rnd, arrivals)
        if not len(arrivals):
            return
        echo = self.echo.to(arrivals.deltas.device)
        update = self.server_step((echo @ arrivals.deltas) / len(arrivals))
        limit = float(self.opt["clip"])
        if limit > 0:  # (the norm only then: on a GPU reading it back waits for the GPU)
            norm = float(update.norm())
            if norm > limit:
                update = update * (limit / norm)
                self.clipped = 1.0
        x = self.local.get(arrivals.ids).mean(0) + update
        self.local.write(arrivals.ids, x.unsqueeze(0).expand(len(arrivals), -1), rnd)

    @classmethod
    def receive_together(cls, runs):
        """The runs' echoed sums, clipping (one read-back of the norms), new local models and their
        writes in one call each (`DeviceTable.write_together`; tables of one shape)."""
        if not (all(steps_together(s, FedAwe.aggregate) for s, _, _ in runs)
                and DeviceTable.stackable([s.local for s, _, _ in runs])):
            return None
        errors: list[Exception | None] = [None] * len(runs)
        each_run(runs, errors, lambda s, rnd, a: s.selector.learn(rnd, a) or s.echoes(rnd, a))
        moving = [run for run, error in zip(runs, errors) if error is None and len(run[2])]
        if not moving:
            return errors
        strategies, tables = [s for s, _, _ in moving], [s.local for s, _, _ in moving]
        ids, sizes = [a.ids for _, _, a in moving], [len(a) for _, _, a in moving]
        deltas = torch.cat([a.deltas for _, _, a in moving])
        echo = padded_rows(sizes, torch.cat([s.echo for s in strategies]).to(deltas.device))
        counts = torch.tensor(sizes, dtype=deltas.dtype).to(deltas.device).unsqueeze(1)
        lr = torch.tensor([s.server_optimizer.cfg.lr for s in strategies], dtype=deltas.dtype).to(deltas.device)
        updates = lr.unsqueeze(1) * (torch.bmm(echo.unsqueeze(1), padded_rows(sizes, deltas)).squeeze(1) / counts)
        limits = torch.tensor([float(s.opt["clip"]) for s in strategies], dtype=torch.float64)
        if (limits > 0).any():
            norms = updates.norm(dim=1).cpu().double()
            clipped = (limits > 0) & (norms > limits)
            for strategy, cut in zip(strategies, clipped.tolist()):
                strategy.clipped = float(cut)
            scale = torch.where(clipped, limits / norms, torch.ones_like(norms)).to(updates.dtype)
            updates = updates * scale.to(updates.device).unsqueeze(1)
        x = run_means(sizes, DeviceTable.get_together(tables, ids)) + updates
        DeviceTable.write_together(tables, ids, x.index_select(0, rows_of_runs(sizes, deltas.device)),
                                   [rnd for _, rnd, _ in moving])
        return errors

    def echoes(self, rnd, arrivals) -> None:
        """The arrivals' echo factors t − τ_i (a metric too); nothing clipped yet."""
        self.echo = torch.as_tensor(rnd - self.local.stamp[arrivals.ids], dtype=torch.float32)
        self.clipped = 0.0

    def metrics(self):
        mean, worst = nan_stats(self.echo.numpy())
        return {"echo_mean": mean, "echo_max": worst, "clipped": self.clipped}
