"""FedAsync (Xie et al. 2019, "Asynchronous Federated Optimization", Algorithm 1).

On each arrival the server mixes the model the device returns into the global one:

    x <- (1 - a) x + a x_i,   a = mixing * s(t - tau) (the paper's alpha: `mixing`),   x_i = x_tau + Delta_i

x_i is the device's start model (the global model of version tau, when it was invited) plus
its update; t - tau is the staleness, the server updates since that version (the engine's
version arithmetic, as for FedBuff). So the update handed to the server optimizer is
a (x_tau + Delta_i - x): with `sgd` and server_lr = 1 the paper's rule exactly.
The staleness functions s are the paper's: constant, polynomial (1 + t - tau)^(-a) and hinge
(1 up to b, then 1 / (a (t - tau - b) + 1)). The devices' local loss adds the paper's
(rho/2) ||w - x_tau||^2 (`rho`, 0 by default: plain local SGD).

The server keeps only x (the start models are the devices', which the engine holds while
their tasks run). The config runs it with `[server] mode = "async"` and `buffer = 1`, so that
each arrival is an aggregation of its own; arrivals handed over together are mixed in one
after another, in their order.
"""

from __future__ import annotations

import numpy as np

from fedsim.algorithms.base import Arrivals, Strategy, nan_stats
from fedsim.config.catalog import ALGORITHM_CHOICES, ALGORITHM_OPTIONS, ALGORITHM_RANGES
from fedsim.training.objective import LocalObjective


def staleness_weight(function: str, staleness: np.ndarray, opt: dict) -> np.ndarray:
    """s(t - tau) of the paper, elementwise (float64)."""
    staleness = np.asarray(staleness, dtype=np.float64)
    if function == "constant":
        return np.ones_like(staleness)
    if function == "polynomial":
        return (1.0 + staleness) ** -opt["poly_a"]
    a, b = opt["hinge_a"], opt["hinge_b"]
    return np.where(staleness <= b, 1.0, 1.0 / (a * (staleness - b) + 1.0))


class FedAsync(Strategy):
    """x <- x + step(a (x_start + Delta - x)) for each arrival, a = mixing * s(staleness)."""

    name = "fedasync"
    options, ranges, choices = ALGORITHM_OPTIONS["fedasync"], ALGORITHM_RANGES["fedasync"], ALGORITHM_CHOICES["fedasync"]
    needs_start = True

    def init_state(self, params):
        super().init_state(params)
        self.local_objective = LocalObjective(prox_mu=float(self.opt["rho"]))  # the paper's g_{x_tau}
        self.mixed = np.empty(0)  # the a of the last aggregation's arrivals (a metric, not state)

    def mixing(self, rnd: int, arrivals: Arrivals) -> np.ndarray:
        """a_t of each arrival: mixing * s(t - tau), t - tau from the version arithmetic."""
        return self.opt["mixing"] * staleness_weight(self.opt["staleness"], rnd - arrivals.version, self.opt)

    def aggregate(self, rnd, arrivals):
        self.mixed = self.mixing(rnd, arrivals)
        if not len(arrivals):
            return
        for a, start, delta in zip(self.mixed.tolist(), arrivals.start, arrivals.deltas):
            self.apply_update(a * (start + delta - self.params))

    def metrics(self):
        return {"mixing": nan_stats(self.mixed)[0]}


__all__ = ["FedAsync", "staleness_weight"]
