"""One stored vector per device plus their running sum: the O(N·d) state of the algorithms.

MIFA and FedVARP keep every device's latest update on the server, FedLaAvg and FedAWE keep
one vector on each device (its last gradient / its local model). They all need the rows of
some devices rewritten each round and the mean over ALL devices, so the table keeps the
sum in float64 and updates it by the difference of the rewritten rows: O(k·d) per round
instead of O(N·d), without drift worth mentioning. ``stamp`` records the round each row was
last written (-1: never), which is FedAWE's τ_i and the staleness of stored updates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedsim.algorithms.base import each_run, nan_stats, padded_rows, steps_together


class DeviceTable:
    """``rows`` [N, d] (float32, on the run's device), ``total`` [d] float64, ``stamp`` [N].

    ``on_devices``: where the rows (and stamps) would live in a deployment; it decides only
    how ``server_bytes``/``device_bytes`` account for them. The sum is the server's.
    """

    def __init__(self, n: int, dim: int, device: torch.device, init: Tensor | None = None,
                 on_devices: bool = False):
        if init is None:
            self.rows = torch.zeros(n, dim, device=device)
        else:
            self.rows = init.to(device=device, dtype=torch.float32).unsqueeze(0).repeat(n, 1)
        self.total = self.rows.sum(0, dtype=torch.float64)
        self.stamp = np.full(n, -1, dtype=np.int64)
        self.on_devices = on_devices

    @property
    def n(self) -> int:
        return self.rows.shape[0]

    def get(self, ids: np.ndarray) -> Tensor:
        return self.rows.index_select(0, torch.as_tensor(ids, device=self.rows.device))

    def write(self, ids: np.ndarray, values: Tensor, rnd: int) -> None:
        """rows[ids] <- values (one row per id; a repeated id keeps its last value)."""
        ids = np.asarray(ids, dtype=np.int64)
        if len(np.unique(ids)) < len(ids):  # async buffers may hold a device twice
            _, first_from_end = np.unique(ids[::-1], return_index=True)
            keep = np.sort(len(ids) - 1 - first_from_end)
            ids, values = ids[keep], values.index_select(0, torch.as_tensor(keep, device=values.device))
        index = torch.as_tensor(ids, device=self.rows.device)
        values = values.to(self.rows.dtype)
        self.total += (values.double() - self.rows.index_select(0, index).double()).sum(0)
        self.rows.index_copy_(0, index, values)  # (ids are unique here)
        self.stamp[ids] = rnd

    def mean(self) -> Tensor:
        """Mean over all N rows (never-written rows count with their initial value)."""
        return (self.total / self.n).to(self.rows.dtype)

    @staticmethod
    def stackable(tables: list[DeviceTable]) -> bool:
        """Whether several runs' tables can be held in one stack: rows of one shape, dtype and device."""
        first = tables[0].rows
        return all(t.rows.shape == first.shape and t.rows.dtype == first.dtype and t.rows.device == first.device
                   for t in tables)

    @staticmethod
    def get_together(tables: list[DeviceTable], ids: list[np.ndarray]) -> Tensor:
        """Each table's rows of its `ids`, run after run [sum of ids, d], in one gather (`TableStack`)."""
        stack = TableStack.of(tables)
        return stack.flat().index_select(0, stack.index(tables, ids))

    @staticmethod
    def write_together(tables: list[DeviceTable], ids: list[np.ndarray], values: Tensor, rnd: list[int],
                       old: Tensor | None = None) -> None:
        """`table.write(ids, values, rnd)` of several runs' tables (each its own devices' rows,
        no id twice; `values` run after run) in one gather, one difference and one copy for all,
        their rows and sums held in one stacked tensor (`TableStack`). `old`: those rows as they
        are, where the caller gathered them already (`get_together`). To float rounding: the
        sums of the rows' differences are taken for all tables at once."""
        stack = TableStack.of(tables)
        index, flat = stack.index(tables, ids), stack.flat()
        fresh = values.to(stack.rows.dtype)
        old = flat.index_select(0, index) if old is None else old
        change = padded_rows([len(i) for i in ids], fresh.double() - old.double())
        at = stack.at(tables)
        stack.total.index_copy_(0, at, stack.total.index_select(0, at) + change.sum(1))
        flat.index_copy_(0, index, fresh)
        for table, i, r in zip(tables, ids, rnd):
            table.stamp[i] = r

    @staticmethod
    def means_together(tables: list[DeviceTable]) -> Tensor:
        """Each table's `mean()` [tables, d], in one call."""
        stack = TableStack.of(tables)
        return (stack.total.index_select(0, stack.at(tables)) / stack.n).to(stack.rows.dtype)

    def filled(self) -> np.ndarray:
        return self.stamp >= 0

    def metrics(self, rnd: int) -> dict[str, float]:
        """How much of the table is filled and how stale its rows are after round ``rnd``."""
        staleness = rnd - self.stamp[self.filled()]
        mean, worst = nan_stats(staleness)
        return {"memory_filled": float(self.filled().mean()), "staleness_mean": mean,
                "staleness_max": worst}

    # --- checkpoints and accounting ------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"rows": self.rows.clone(), "total": self.total.clone(), "stamp": self.stamp.copy()}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.rows = sd["rows"].to(self.rows.device)
        self.total = sd["total"].to(self.rows.device)
        self.stamp = np.asarray(sd["stamp"], dtype=np.int64).copy()

    def _bytes(self) -> tuple[int, int]:
        table = self.rows.numel() * self.rows.element_size() + self.stamp.nbytes
        return self.total.numel() * self.total.element_size(), table

    def server_bytes(self) -> int:
        total, table = self._bytes()
        return total + (0 if self.on_devices else table)

    def device_bytes(self) -> int:
        return self._bytes()[1] if self.on_devices else 0


class TableStack:
    """The rows [tables, N, d] and sums [tables, d] of several runs' tables in one tensor each,
    every table's `rows` and `total` a view of its part: the runs of a lockstep group write their
    tables in one call per round (`DeviceTable.write_together`). Made when such a group first
    writes together (a copy of each table), kept on the tables while their parts stay views."""

    def __init__(self, tables: list[DeviceTable]):
        first = tables[0]
        self.rows = first.rows.new_empty((len(tables), *first.rows.shape))
        self.total = first.total.new_empty((len(tables), *first.total.shape))
        self.n, self.device = self.rows.shape[1], self.rows.device
        self.parts = list(zip(self.rows.unbind(), self.total.unbind()))  # each table's views
        for r, table in enumerate(tables):  # (one table at a time: each table's own rows freed as it moves)
            self.parts[r][0].copy_(table.rows)
            self.parts[r][1].copy_(table.total)
            (table.rows, table.total), table.stacked = self.parts[r], (self, r)

    @staticmethod
    def of(tables: list[DeviceTable]) -> TableStack:
        """The stack that holds every one of `tables` (their own, or a new one of them)."""
        stacks = {id(s): s for s, _ in (getattr(t, "stacked", (None, 0)) for t in tables) if s is not None}
        if len(stacks) == 1:
            stack = next(iter(stacks.values()))
            if all(stack.holds(t) for t in tables):
                return stack
        return TableStack(tables)

    def holds(self, table: DeviceTable) -> bool:
        """Whether `table`'s rows and sum are still its part of this stack (a checkpoint's
        `load_state_dict` gives a table tensors of its own)."""
        stacked = getattr(table, "stacked", None)
        if stacked is None or stacked[0] is not self:
            return False
        rows, total = self.parts[stacked[1]]
        return table.rows is rows and table.total is total

    def flat(self) -> Tensor:
        """Every table's rows, table after table [tables x N, d] (a view)."""
        return self.rows.view(-1, self.rows.shape[2])

    def at(self, tables: list[DeviceTable]) -> Tensor:
        """The tables' places in the stack."""
        return torch.as_tensor([t.stacked[1] for t in tables], device=self.device)

    def index(self, tables: list[DeviceTable], ids: list[np.ndarray]) -> Tensor:
        """The rows of each table's `ids` in `flat()`, table after table."""
        return torch.as_tensor(np.concatenate([np.asarray(i, dtype=np.int64) + t.stacked[1] * self.n
                                               for t, i in zip(tables, ids)]), device=self.device)


@dataclass
class TablesRound:
    """What the runs that received something in a batched receive hand to their tables' step
    (MIFA, FedVARP, SCAFFOLD, FedDyn): their strategies, tables, arrivals (and their ids), deltas (run
    after run, `sizes` rows each) and rounds."""

    strategies: list
    tables: list[DeviceTable]
    arrivals: list
    ids: list[np.ndarray]
    sizes: list[int]
    deltas: Tensor
    rounds: list[int]


def tables_together(runs: list[tuple], owner: type, table: str) -> tuple[list, TablesRound | None] | None:
    """The start that the batched receives of the algorithms with a device table `table` share:
    None where one of the runs cannot take `owner`'s batched step (`steps_together`, its own local
    objective, tables of another shape); else each run's selection policy learns and its
    `last_round` is set, and (each run's error, the runs that received something, or None)."""
    if not (all(steps_together(s, owner.aggregate) and type(s).local_objective_of is owner.local_objective_of
                for s, _, _ in runs) and DeviceTable.stackable([getattr(s, table) for s, _, _ in runs])):
        return None
    errors: list[Exception | None] = [None] * len(runs)
    each_run(runs, errors, lambda s, rnd, a: s.selector.learn(rnd, a))
    for (strategy, rnd, _), error in zip(runs, errors):
        if error is None:
            strategy.last_round = rnd
    moving = [run for run, error in zip(runs, errors) if error is None and len(run[2])]
    if not moving:
        return errors, None
    ids = [a.ids for _, _, a in moving]
    return errors, TablesRound([s for s, _, _ in moving], [getattr(s, table) for s, _, _ in moving],
                               [a for _, _, a in moving], ids,
                               [len(i) for i in ids], torch.cat([a.deltas for _, _, a in moving]),
                               [rnd for _, rnd, _ in moving])
