"""FedVARP (docs/algorithms.md): variance reduction with every device's latest update.

The server keeps y_i, the last update each device sent (0 before its first), and corrects
the arrivals' mean by the stored updates of the absent devices:
v = ȳ + (1/|A_t|) Σ_{A_t} (Δ_i − y_i). O(N·d) server memory, like MIFA.
"""

from __future__ import annotations

import torch

from fedsim.algorithms.base import Strategy, apply_updates_together, each_run, steps_together
from fedsim.algorithms.table import DeviceTable, padded_rows


class FedVarp(Strategy):
    """x <- x + η_g v; y_i <- Δ_i for the arrivals. Nobody arrived: unchanged."""

    name = "fedvarp"
    state = ("params", "table", "last_round")

    def init_state(self, params):
        super().init_state(params)
        self.table = DeviceTable(self.n, params.numel(), params.device)
        self.last_round = -1

    def aggregate(self, rnd, arrivals):
        self.last_round = rnd
        if not len(arrivals):
            return
        correction = (arrivals.deltas - self.table.get(arrivals.ids)).mean(0)
        self.apply_update(self.table.mean() + correction)
        self.table.write(arrivals.ids, arrivals.deltas, rnd)

    @classmethod
    def receive_together(cls, runs):
        """The runs' corrections from one gather of their stored rows, their steps in one call and
        their tables written in one (`DeviceTable.write_together`; tables of one shape)."""
        if not (all(steps_together(s, FedVarp.aggregate) for s, _, _ in runs)
                and DeviceTable.stackable([s.table for s, _, _ in runs])):
            return None
        errors: list[Exception | None] = [None] * len(runs)
        each_run(runs, errors, lambda s, rnd, a: s.selector.learn(rnd, a))
        for (strategy, rnd, _), error in zip(runs, errors):
            if error is None:
                strategy.last_round = rnd
        moving = [run for run, error in zip(runs, errors) if error is None and len(run[2])]
        if moving:
            tables, ids = [s.table for s, _, _ in moving], [a.ids for _, _, a in moving]
            deltas = torch.cat([a.deltas for _, _, a in moving])
            differences = padded_rows([len(i) for i in ids], deltas - DeviceTable.get_together(tables, ids))
            arrived = torch.tensor([len(i) for i in ids], dtype=deltas.dtype).to(deltas.device)
            correction = differences.sum(1) / arrived.unsqueeze(1)
            apply_updates_together([s for s, _, _ in moving], DeviceTable.means_together(tables) + correction)
            DeviceTable.write_together(tables, ids, deltas, [rnd for _, rnd, _ in moving])
        return errors

    def metrics(self):
        return self.table.metrics(self.last_round)
