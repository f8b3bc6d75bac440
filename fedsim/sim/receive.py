"""The receive step of a round: the strategy's `receive` of the round's arrivals, their mean
training loss, and whether the global model is still finite; for one run, or for the runs of
a lockstep group on a GPU (fedsim/studies/lockstep.py) at once: their arrivals gathered in one
go (sim/arrivals.py), the runs of one algorithm in one batched aggregation where it has one
(`Strategy.receive_together`), the losses and the models' sums read back in one copy, where each
run alone launches its own kernels and waits for the GPU twice a round. A group's runs agree
with their runs alone to float rounding, as their stacked training does.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fedsim.algorithms.base import Arrivals, Strategy, each_run
from fedsim.sim.arrivals import ArrivalRows, arrivals_together


STACKED_FLOATS = 1 << 26  # the most floats of models stacked at once for their sums (256 MiB)


def receive(strategy: Strategy, rnd: int, arrivals: Arrivals) -> float | None:
    """`strategy.receive(rnd, arrivals)`, and the arrivals' mean training loss (None: nobody arrived)."""
    strategy.receive(rnd, arrivals)
    return float(arrivals.loss.mean()) if len(arrivals) else None


def finite(params: Tensor, sum_: float | None = None) -> bool:
    """Whether every entry is finite. Any inf or NaN makes the sum non-finite, so a finite sum
    (`sum_`, where the caller read it already) answers in one reduction (no [d] mask a round);
    only a non-finite sum (perhaps an overflow of finite entries) looks at the entries."""
    return math.isfinite(float(params.sum()) if sum_ is None else sum_) or bool(torch.isfinite(params).all())


def receive_together(pending: list[tuple[Strategy, ArrivalRows]]) -> list[tuple[float | None, Tensor | None] | Exception]:
    """Each run's `strategy.receive` of its round's arrivals (gathered for all runs at once), the
    runs of one algorithm in one batched step where it has one (`Strategy.receive_together`: to
    float rounding), else each alone; and for each run the mean training loss of its arrivals
    (None: nobody arrived) and its global model where that is finite (else None), both read
    back in one copy per device for all runs; or the exception its receive raised."""
    arrivals = arrivals_together([rows for _, rows in pending])
    runs = [(strategy, rows.rnd, a) for (strategy, rows), a in zip(pending, arrivals)]
    by_algorithm: dict[type, list[int]] = {}
    for i, (strategy, _, _) in enumerate(runs):
        by_algorithm.setdefault(type(strategy), []).append(i)
    errors: list[Exception | None] = [None] * len(runs)
    for cls, members in by_algorithm.items():
        together = cls.receive_together([runs[i] for i in members]) if len(members) > 1 else None
        if together is None:
            together = [None] * len(members)
            each_run([runs[i] for i in members], together, lambda s, rnd, a: s.receive(rnd, a))
        for i, error in zip(members, together):
            errors[i] = error
    ok = [i for i, error in enumerate(errors) if error is None]
    found: list = list(errors)
    for i, loss, model in zip(ok, mean_losses([arrivals[i] for i in ok]),
                              finite_models([runs[i][0] for i in ok])):
        found[i] = (loss, model)
    return found


def mean_losses(arrivals: list[Arrivals]) -> list[float | None]:
    """Each run's mean training loss (None: nobody arrived), every device's losses copied to
    the host at once: a GPU waits once for all runs, not once for each."""
    means: list[float | None] = [None] * len(arrivals)
    by_device: dict[torch.device, list[int]] = {}
    for i, a in enumerate(arrivals):
        if len(a):
            by_device.setdefault(a.loss.device, []).append(i)
    for members in by_device.values():
        losses = torch.cat([arrivals[i].loss for i in members]).cpu().split([len(arrivals[i]) for i in members])
        for i, loss in zip(members, losses):
            means[i] = float(loss.mean())
    return means


def finite_models(strategies: list[Strategy]) -> list[Tensor | None]:
    """Each strategy's global model where every entry is finite (`finite`), else None: the sums
    of models of one size on one device (a lockstep group's) taken and read back in one call. A
    model derived from the state anew at each look (FedAWE's mean) is not looked at here (None:
    its run looks itself)."""
    found: list[Tensor | None] = [None] * len(strategies)
    alike: dict[tuple, list[int]] = {}
    for i, strategy in enumerate(strategies):
        params = None if isinstance(getattr(type(strategy), "params", None), property) else strategy.params
        if isinstance(params, Tensor) and params.dim() == 1:  # (a plugin's wrong model: its own check says so)
            alike.setdefault((params.device, params.shape, params.dtype), []).append(i)
    for members in alike.values():
        models = [strategies[i].params for i in members]
        at_once = max(1, STACKED_FLOATS // models[0].numel())  # (two kernels for so many models, not one each)
        sums = torch.cat([torch.stack(models[j:j + at_once]).sum(1) for j in range(0, len(models), at_once)]).tolist()
        for i, sum_ in zip(members, sums):
            if finite(strategies[i].params, sum_):
                found[i] = strategies[i].params
    return found
