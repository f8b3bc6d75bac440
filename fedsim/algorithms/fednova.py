"""FedNova (Wang et al., NeurIPS 2020, "Tackling the Objective Inconsistency Problem in
Heterogeneous Federated Optimization"): normalised averaging (docs/algorithms.md).

Devices that take more local steps move further; FedAvg's plain mean of their updates then
converges to the optimum of an objective that weighs each device by its local work. FedNova
divides each update by its device's steps τ_i (plain local SGD: a_i = τ_i) and rescales the
mean by τ_eff = Σ p_i τ_i, so each device counts by p_i whatever its work. p_i = 1/|A_t| over
the arrivals, as fedsim's FedAvg weighs them (the paper's n_i / n over equally large devices).
O(d) server memory.
"""

from __future__ import annotations

import math

import torch

from fedsim.algorithms.fedavg import FedAvg


class FedNova(FedAvg):
    """x <- x + η_g τ_eff Σ_i p_i Δ_i / τ_i, τ_eff = Σ_i p_i τ_i, p_i = 1/|A_t| (τ_i: `arrivals.steps`)."""

    name = "fednova"

    def init_state(self, params):
        super().init_state(params)
        self.tau_eff = math.nan  # of the last round (metric)

    def weights(self, rnd, arrivals):
        tau = arrivals.steps.to(device=arrivals.deltas.device, dtype=torch.float64)
        p = 1.0 / len(arrivals)
        tau_eff = p * tau.sum()
        self.tau_eff = float(tau_eff)
        return (tau_eff * p / tau).float()

    def counted(self, rnd, arrivals):
        if not len(arrivals):  # (`weights` was not asked)
            self.tau_eff = math.nan

    def metrics(self):
        return {"tau_eff": self.tau_eff}
