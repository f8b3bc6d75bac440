"""A round's arrivals, gathered from its training call's rows: one run's, or those of the runs
of a lockstep group whose cohorts trained in one call, in one gather per field for all of them
(on a GPU each gather is a kernel launched from the host: one per group rather than one per run).
The rows are the same numbers either way (a gather copies them), so each run's arrivals equal
its own, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from fedsim.algorithms.base import Arrivals
from fedsim.training.trainer import TrainResult


@dataclass
class ArrivalRows:
    """What a round's arrivals are made of: the devices that arrived (`ids`, in arrival order),
    their rows in the training result (`rows`), and what the server knows of each."""

    ids: np.ndarray  # int64 [k]
    rows: np.ndarray  # int64 [k]: each arrival's row in `result`
    result: TrainResult | None  # None: nobody trained
    steps: np.ndarray  # int64 [k]
    lr: float
    rnd: int  # the model version the devices started from
    invited_at: float
    start: Tensor | None  # [trained, d] the trained devices' start parameters (a Strategy's `needs_start`)
    arrived_at: np.ndarray
    missed: np.ndarray
    waited_s: np.ndarray
    dim: int
    device: torch.device

    def arrivals(self) -> Arrivals:
        """The Arrivals of this run alone."""
        if self.result is None:
            return self._complete(Arrivals.none(self.dim, self.device))
        rows = torch.as_tensor(self.rows, device=self.device)
        r = self.result
        return self._fill(r.deltas.index_select(0, rows), r.samples.index_select(0, rows),
                          r.loss.index_select(0, rows), torch.as_tensor(self.steps, device=self.device),
                          _lr_column(np.full(len(self.ids), self.lr)).to(self.device),
                          None if self.start is None else self.start.index_select(0, rows))

    def _fill(self, deltas, samples, loss, steps, lr, start) -> Arrivals:
        return self._complete(Arrivals(
            ids=self.ids, deltas=deltas, steps=steps, samples=samples, loss=loss,
            version=np.full(len(self.ids), self.rnd, dtype=np.int64), lr=lr,
            invited_at=np.full(len(self.ids), self.invited_at), start=start))

    def _complete(self, arrivals: Arrivals) -> Arrivals:
        arrivals.arrived_at = self.arrived_at
        arrivals.missed, arrivals.waited_s = self.missed, self.waited_s
        return arrivals


def _lr_column(lr: np.ndarray) -> Tensor:
    """Learning rates as float32 through float64 (an lr beyond float32's range is inf, and the
    run diverges, not crashes)."""
    return torch.as_tensor(np.asarray(lr, dtype=np.float64)).float()


def arrivals_together(pending: list[ArrivalRows]) -> list[Arrivals]:
    """The Arrivals of several runs: those whose rows lie in one training call's result
    (`TrainResult.call`) gathered in one `index_select` per field, the others each alone."""
    found: list[Arrivals | None] = [None] * len(pending)
    by_call: dict[int, list[int]] = {}
    for i, p in enumerate(pending):
        if p.result is not None and p.result.call is not None and p.start is None and len(p.ids):
            by_call.setdefault(id(p.result.call), []).append(i)
        else:
            found[i] = p.arrivals()
    for members in by_call.values():
        if len(members) == 1:
            found[members[0]] = pending[members[0]].arrivals()
            continue
        runs = [pending[i] for i in members]
        call, device = runs[0].result.call, runs[0].device
        rows = torch.as_tensor(np.concatenate([p.rows + p.result.first_row for p in runs]), device=device)
        sizes = [len(p.ids) for p in runs]
        deltas, samples, loss = (getattr(call, f).index_select(0, rows).split(sizes)
                                 for f in ("deltas", "samples", "loss"))
        steps = torch.as_tensor(np.concatenate([p.steps for p in runs]), device=device).split(sizes)
        lr = _lr_column(np.concatenate([np.full(n, p.lr) for p, n in zip(runs, sizes)])).to(device).split(sizes)
        for i, p, *fields in zip(members, runs, deltas, samples, loss, steps, lr):
            found[i] = p._fill(*fields, None)
    return found

