"""FedVARP (docs/algorithms.md): variance reduction with every device's latest update.

The server keeps y_i, the last update each device sent (0 before its first), and corrects
the arrivals' mean by the stored updates of the absent devices:
v = ȳ + (1/|A_t|) Σ_{A_t} (Δ_i − y_i). O(N·d) server memory, like MIFA.
"""

from __future__ import annotations

from fedsim.algorithms.base import Strategy, apply_updates_together, run_means
from fedsim.algorithms.table import DeviceTable, tables_together


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
        started = tables_together(runs, FedVarp, "table")
        if started is None:
            return None
        errors, moving = started
        if moving is not None:
            stored = DeviceTable.get_together(moving.tables, moving.ids)
            correction = run_means(moving.sizes, moving.deltas - stored)
            apply_updates_together(moving.strategies, DeviceTable.means_together(moving.tables) + correction)
            DeviceTable.write_together(moving.tables, moving.ids, moving.deltas, moving.rounds, old=stored)
        return errors

    def metrics(self):
        return self.table.metrics(self.last_round)
