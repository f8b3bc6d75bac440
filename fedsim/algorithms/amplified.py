"""Generalized FedAvg with amplified updates (Wang & Ji, Alg. 1).

Plain FedAvg steps (weights 1/|A_t|) are accumulated in u over an interval of ``period``
rounds; at its end the accumulated update is applied ``eta`` times in total
(x <- x + (eta − 1)·u). Over a whole participation cycle the accumulated update points to
the optimum of all devices, not of the last group online, so amplifying it corrects the
drift towards whoever happened to be available. ``eta = 1`` is FedAvg. Pairs with the
``regularized`` selection (its default).
"""

from __future__ import annotations

import torch

from fedsim.config.catalog import ALGORITHM_OPTIONS, ALGORITHM_RANGES
from fedsim.algorithms.base import apply_updates_together, each_run, steps_together
from fedsim.algorithms.fedavg import FedAvg, updates_together


class Amplified(FedAvg):
    name = "amplified"
    options, ranges = ALGORITHM_OPTIONS["amplified"], ALGORITHM_RANGES["amplified"]
    selection = "regularized"
    state = ("params", "accumulated", "interval_start", "amplified")

    def init_state(self, params):
        super().init_state(params)
        self.accumulated = params.new_zeros(params.shape)  # u
        self.interval_start = 0  # t0
        self.amplified = 0.0

    def aggregate(self, rnd, arrivals):
        update = self.update(rnd, arrivals)
        if update is not None:
            step = self.server_step(update)  # u accumulates the steps taken
            self.params = self.params + step
            self.accumulated = self.accumulated + step
        self.amplify(rnd)

    @classmethod
    def receive_together(cls, runs):
        """The runs' weighted sums (`updates_together`), steps and accumulations in one call each."""
        if not all(steps_together(s, Amplified.aggregate) and type(s).update is FedAvg.update for s, _, _ in runs):
            return None
        errors: list[Exception | None] = [None] * len(runs)
        moving, updates = updates_together(runs, errors)
        if moving:
            strategies = [runs[i][0] for i in moving]
            steps = apply_updates_together(strategies, updates)
            for strategy, accumulated in zip(strategies, torch.stack([s.accumulated for s in strategies]) + steps):
                strategy.accumulated = accumulated
        each_run(runs, errors, lambda s, rnd, a: s.amplify(rnd))
        return errors

    def amplify(self, rnd: int) -> None:
        """At the end of a period: x <- x + (eta − 1) u, and u starts again."""
        self.amplified = 0.0
        if rnd + 1 - self.interval_start == int(self.opt["period"]):
            self.params = self.params + (float(self.opt["eta"]) - 1.0) * self.accumulated
            self.accumulated = self.accumulated.new_zeros(self.accumulated.shape)
            self.interval_start = rnd + 1
            self.amplified = 1.0

    def metrics(self):
        return {"amplified": self.amplified}
