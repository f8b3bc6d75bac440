"""SCAFFOLD (Karimireddy et al. 2020, option II): local steps corrected by control variates.

Each device i keeps a control variate c_i (0 before it first participates), the server keeps
c. A device steps y <- y − lr (∇f_i(y) − c_i + c), declared as the per-device linear term
c − c_i of its local objective, then computes c_i⁺ = c_i − c + (x − y_i) / (K_i lr) with
K_i the local steps it took; the server moves x <- x + η_g mean Δ_i and
c <- c + (1/N) Σ_{A_t} (c_i⁺ − c_i). As c starts at 0 with every c_i, that keeps c equal to
the mean of all N control variates, so c is the table's running mean rather than a vector of
its own (the same numbers, nothing to drift apart).

Absent devices keep their last c_i (stale, or 0 if they never arrived), and it keeps counting
in c with weight 1/N: nothing is refreshed or decayed for them. The c_i live on the devices
in a deployment (an O(N·d) table here), and a task carries the model and c down, and the
update and the change of c_i back up.
"""

from __future__ import annotations

import numpy as np
import torch

from fedsim.algorithms.base import Strategy, apply_updates_together, rows_of_runs, run_means
from fedsim.algorithms.table import DeviceTable, tables_together
from fedsim.training.objective import LocalObjective


class Scaffold(Strategy):
    """x <- x + η_g mean Δ_i; the arrivals' c_i <- c_i⁺ (and with them c). Nobody arrived: unchanged."""

    name = "scaffold"
    state = ("params", "controls", "last_round")

    def init_state(self, params):
        super().init_state(params)
        self.controls = DeviceTable(self.n, params.numel(), params.device, on_devices=True)  # c_i; c = their mean
        self.last_round = -1

    def local_objective_of(self, ids: np.ndarray) -> LocalObjective:
        """The correction c − c_i of each invited device's gradient."""
        return LocalObjective(linear=self.controls.mean().unsqueeze(0) - self.controls.get(ids))

    def message_bytes(self):
        """The model and c down, the update and c_i⁺ − c_i up: twice a model each way."""
        size = 2 * 4 * self.params.numel()
        return size, size

    def aggregate(self, rnd, arrivals):
        self.last_round = rnd
        if not len(arrivals):
            return
        correction = self.local_objective_of(arrivals.ids).linear  # c − c_i, as the devices stepped with it
        per_step = (arrivals.steps.to(arrivals.lr.dtype) * arrivals.lr).unsqueeze(1)  # K_i lr
        self.apply_update(arrivals.deltas.mean(0))
        self.controls.write(arrivals.ids, -arrivals.deltas / per_step - correction, rnd)  # c_i⁺

    @classmethod
    def receive_together(cls, runs):
        """The runs' corrections from one gather of their controls, their steps in one call and
        their controls written in one (`DeviceTable.write_together`; tables of one shape)."""
        started = tables_together(runs, Scaffold, "controls")
        if started is None:
            return None
        errors, moving = started
        if moving is not None:
            run = rows_of_runs(moving.sizes, moving.deltas.device)
            correction = (DeviceTable.means_together(moving.tables).index_select(0, run)
                          - DeviceTable.get_together(moving.tables, moving.ids))  # c − c_i
            per_step = torch.cat([a.steps.to(a.lr.dtype) * a.lr for a in moving.arrivals]).unsqueeze(1)  # K_i lr
            apply_updates_together(moving.strategies, run_means(moving.sizes, moving.deltas))
            DeviceTable.write_together(moving.tables, moving.ids, -moving.deltas / per_step - correction, moving.rounds)
        return errors

    def metrics(self):
        return self.controls.metrics(self.last_round)
