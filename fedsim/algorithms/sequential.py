"""Sequential SGD (Yan et al. baseline): plain SGD over the pooled data of all devices.

The ideal a federated algorithm is measured against: no availability problem at all, and
the same computation per round as the cohort (the steps the selected devices would take,
summed), on one virtual client holding every device's data (``Context.train_pooled``).
No device is invited.
"""

from __future__ import annotations

import numpy as np

from fedsim.algorithms.base import Strategy
from fedsim.errors import FedsimError


class SequentialSgd(Strategy):
    name = "sequential-sgd"
    state = ("params", "pending", "taken")
    invites_devices = False

    def validate(self):
        if self.ctx.train_pooled is None:
            raise FedsimError("[algorithm] name = 'sequential-sgd' needs a trainer over the pooled "
                              "data, which this task's trainer does not offer; pick another algorithm")

    def init_state(self, params):
        super().init_state(params)
        self.pending = 0  # steps owed for this round: those the cohort would have taken
        self.taken = 0  # steps taken in the last round (metric)

    def select(self, rnd, online, rng):
        cohort = super().select(rnd, online, rng)
        self.pending = int(np.sum(super().local_steps(rnd, cohort)))
        return cohort[:0]

    def aggregate(self, rnd, arrivals):
        if self.pending > 0:
            delta = self.ctx.train_pooled(rnd, self.params, self.pending, self.client_lr(rnd))
            self.apply_update(delta)
        self.taken, self.pending = self.pending, 0

    def metrics(self):
        return {"pooled_steps": float(self.taken)}
