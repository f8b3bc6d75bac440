"""FedDyn (Acar et al. 2021): a dynamic regulariser that makes the devices' optima the global one.

Each device i keeps h_i (the gradient of its regularised loss at its last model, 0 before it
first participates) and minimises f_i(w) − <h_i, w> + (alpha/2)‖w − x‖² by its local steps:
the per-device linear term −h_i and the proximal term of its local objective. After the round
h_i <- h_i − alpha (y_i − x); the server keeps h <- h − alpha (1/N) Σ_{A_t} (y_i − x) and sets
x <- mean_{A_t} y_i − h / alpha (as an update of x, scaled by η_g). As h and every h_i start
at 0, h stays the mean of all N h_i: it is the table's running mean, not a vector of its own.

Absent devices keep their h_i (stale), and it keeps counting in h with weight 1/N.
"""

from __future__ import annotations

import numpy as np
import torch

from fedsim.algorithms.base import Strategy, apply_updates_together, rows_of_runs, run_means
from fedsim.algorithms.table import DeviceTable, tables_together
from fedsim.config.catalog import ALGORITHM_OPTIONS, ALGORITHM_RANGES
from fedsim.training.objective import LocalObjective


class FedDyn(Strategy):
    """x <- x + η_g (mean Δ_i − h / alpha) after the arrivals' h_i moved. Nobody arrived: unchanged."""

    name = "feddyn"
    options, ranges = ALGORITHM_OPTIONS["feddyn"], ALGORITHM_RANGES["feddyn"]
    state = ("params", "gradients", "last_round")

    def init_state(self, params):
        super().init_state(params)
        self.alpha = float(self.opt["alpha"])
        self.gradients = DeviceTable(self.n, params.numel(), params.device, on_devices=True)  # h_i; h = their mean
        self.last_round = -1

    def local_objective_of(self, ids: np.ndarray) -> LocalObjective:
        return LocalObjective(prox_mu=self.alpha, linear=-self.gradients.get(ids))

    def aggregate(self, rnd, arrivals):
        self.last_round = rnd
        if not len(arrivals):
            return
        fresh = self.gradients.get(arrivals.ids) - self.alpha * arrivals.deltas  # h_i − alpha (y_i − x)
        self.gradients.write(arrivals.ids, fresh, rnd)
        self.apply_update(arrivals.deltas.mean(0) - self.gradients.mean() / self.alpha)

    @classmethod
    def receive_together(cls, runs):
        """The runs' h_i gathered, written and averaged in one call each, their steps in one."""
        started = tables_together(runs, FedDyn, "gradients")
        if started is None:
            return None
        errors, moving = started
        if moving is not None:
            alpha = torch.tensor([s.alpha for s in moving.strategies], dtype=moving.deltas.dtype).to(moving.deltas.device)
            row_alpha = alpha.index_select(0, rows_of_runs(moving.sizes, moving.deltas.device)).unsqueeze(1)
            fresh = DeviceTable.get_together(moving.tables, moving.ids) - row_alpha * moving.deltas  # h_i − alpha (y_i − x)
            DeviceTable.write_together(moving.tables, moving.ids, fresh, moving.rounds)
            apply_updates_together(moving.strategies, run_means(moving.sizes, moving.deltas)
                                   - DeviceTable.means_together(moving.tables) / alpha.unsqueeze(1))
        return errors

    def metrics(self):
        return self.gradients.metrics(self.last_round)
