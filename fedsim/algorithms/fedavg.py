"""The FedAvg family (docs/algorithms.md): x <- x + η_g Σ_{i∈A_t} w_i Δ_i for some weights w.

The members differ only in the weights: the mean over the arrivals (``fedavg``, and its
``fedsgd``/``fedprox`` variants), absent devices counted as zero (``fedavg-all``, biased
towards often-available devices), inverse true availability (``fedavg-known-p``,
unbiased when the trace knows p_i^t), or FedBuff's staleness discount (``fedbuff``, for
``[server] mode = "async"``). Nobody arrived: the model is unchanged.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from fedsim.config.catalog import ALGORITHM_OPTIONS, ALGORITHM_RANGES
from fedsim.algorithms.base import (Arrivals, Strategy, apply_updates_together, each_run, padded_rows,
                                   steps_together, weighted_sum)
from fedsim.errors import FedsimError
from fedsim.training.objective import LocalObjective


class FedAvg(Strategy):
    """x <- x + η_g · mean of the arrived deltas."""

    name = "fedavg"

    def weights(self, rnd: int, arrivals: Arrivals) -> Tensor:
        """w_i of each arrival (only called when something arrived)."""
        k = len(arrivals)
        return torch.full((k,), 1.0 / k, device=arrivals.deltas.device)

    def update(self, rnd: int, arrivals: Arrivals) -> Tensor | None:
        """Σ w_i Δ_i, or None when nobody arrived."""
        if not len(arrivals):
            return None
        return weighted_sum(arrivals.deltas, self.weights(rnd, arrivals))

    def aggregate(self, rnd: int, arrivals: Arrivals) -> None:
        update = self.update(rnd, arrivals)
        if update is not None:
            self.apply_update(update)
        self.counted(rnd, arrivals)

    def counted(self, rnd: int, arrivals: Arrivals) -> None:
        """What the algorithm notes of the round's arrivals once the model has moved (FedAU:
        the devices' participation intervals); nothing by default."""

    @classmethod
    def receive_together(cls, runs: list[tuple[Strategy, int, Arrivals]]) -> list[Exception | None] | None:
        """The runs' weighted sums in one call (`updates_together`) and their server steps in one:
        runs whose server optimizer is sgd and whose class keeps the family's rule (`update`,
        `aggregate`, the step); else None."""
        if not all(steps_together(s, FedAvg.aggregate) and type(s).update is FedAvg.update for s, _, _ in runs):
            return None
        errors: list[Exception | None] = [None] * len(runs)
        moving, updates = updates_together(runs, errors)
        if moving:
            apply_updates_together([runs[i][0] for i in moving], updates)
        each_run(runs, errors, lambda s, rnd, a: s.counted(rnd, a))
        return errors


class FedAvgAll(FedAvg):
    """(1/N) Σ Δ_i: absent devices count as a zero update (Xiang et al. Example 1: biased)."""

    name = "fedavg-all"

    def weights(self, rnd, arrivals):
        return torch.full((len(arrivals),), 1.0 / self.n, device=arrivals.deltas.device)


class FedAvgKnownP(FedAvg):
    """(1/N) Σ Δ_i / p_i^t with the trace's true availability probability (unbiased)."""

    name = "fedavg-known-p"

    def validate(self):
        p = self.ctx.known_p(0.0) if self.ctx.known_p is not None else None
        if p is None:
            raise FedsimError(
                "[algorithm] name = 'fedavg-known-p' needs the true availability probabilities "
                "p_i^t, which this trace cannot give; use a round-indexed generator "
                "([trace] source = 'bernoulli', 'grid', 'periodic', 'always') or another algorithm"
            )

    def weights(self, rnd, arrivals):
        # p_i of the trace round in which each device was seen online (async: several rounds)
        times, which = np.unique(arrivals.invited_at, return_inverse=True)
        table = np.stack([np.asarray(self.ctx.known_p(float(t)), dtype=np.float64) for t in times])
        p = table[which.reshape(-1), arrivals.ids]
        if (p <= 0).any():
            who = int(arrivals.ids[np.flatnonzero(p <= 0)[0]])
            raise FedsimError(
                f"fedavg-known-p: device {who} arrived in round {rnd} although the trace gives it "
                f"availability probability 0 there; the trace's p_i^t does not describe this run "
                f"(check [server] timing and round_duration against the trace's round grid)"
            )
        return torch.as_tensor(1.0 / (self.n * p), dtype=torch.float32, device=arrivals.deltas.device)


class FedBuff(FedAvg):
    """FedBuff (Nguyen et al. 2022, Algorithm 1): x <- x + η_g (1/K) Σ s(τ_i) Δ_i with the
    staleness discount s(τ) = 1/sqrt(1 + τ), τ_i the server updates since device i's model was
    current. The sum is divided by the K arrivals, not by Σ s(τ_i): stale buffers take shorter
    steps. In synchronous rounds every τ_i is 0: FedAvg."""

    name = "fedbuff"

    def weights(self, rnd, arrivals):
        staleness = torch.as_tensor(rnd - arrivals.version, dtype=torch.float32, device=arrivals.deltas.device)
        return 1.0 / (len(arrivals) * torch.sqrt(1.0 + staleness))


class FedSGD(FedAvg):
    """FedAvg with one local step per round, whatever ``[client] local_steps`` says."""

    name = "fedsgd"

    def local_steps(self, rnd, ids):
        return np.ones(len(ids), dtype=np.int64)


class FedProx(FedAvg):
    """FedAvg whose local loss adds (mu/2)·‖w − x‖² (declared as its local objective)."""

    name = "fedprox"
    options, ranges = ALGORITHM_OPTIONS["fedprox"], ALGORITHM_RANGES["fedprox"]

    def init_state(self, params):
        super().init_state(params)
        self.local_objective = LocalObjective(prox_mu=float(self.opt["mu"]))


def updates_together(runs: list[tuple[FedAvg, int, Arrivals]], errors: list) -> tuple[list[int], Tensor | None]:
    """The FedAvg family's part of a batched receive: each run's selection policy learns and its
    `weights` are asked (a run that raises keeps its error in `errors`); then the sums Σ w_i Δ_i
    of the runs that received something, in one call: (their indexes, [those runs, d])."""
    weights = each_run(runs, errors, lambda s, rnd, a: s.selector.learn(rnd, a) or
                       (s.weights(rnd, a) if len(a) else None))
    moving = [i for i, (_, _, a) in enumerate(runs) if errors[i] is None and len(a)]
    if not moving:
        return moving, None
    sizes = [len(runs[i][2]) for i in moving]
    deltas = padded_rows(sizes, torch.cat([runs[i][2].deltas for i in moving]))
    row_weights = padded_rows(sizes, torch.cat([weights[i] for i in moving]).to(deltas.dtype))
    return moving, torch.bmm(row_weights.unsqueeze(1), deltas).squeeze(1)
