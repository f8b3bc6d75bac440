"""One stored vector per device plus their running sum: the O(N·d) state of the algorithms.

MIFA and FedVARP keep every device's latest update on the server, FedLaAvg and FedAWE keep
one vector on each device (its last gradient / its local model). They all need the rows of
some devices rewritten each round and the mean over ALL devices, so the table keeps the
sum in float64 and updates it by the difference of the rewritten rows: O(k·d) per round
instead of O(N·d), without drift worth mentioning. ``stamp`` records the round each row was
last written (-1: never), which is FedAWE's τ_i and the staleness of stored updates.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedsim.algorithms.base import nan_stats


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
    def write_together(tables: list[DeviceTable], ids: list[np.ndarray], values: Tensor, rnd: list[int]) -> None:
        """`table.write(ids, values, rnd)` of several runs' tables (each its own devices' rows,
        no id twice; `values` run after run) in one gather, one difference and one copy for all,
        their rows and sums held in one stacked tensor (`TableStack`). To float rounding: the
        sums of the rows' differences are taken for all tables at once."""
        stack = TableStack.of(tables)
        index, flat = stack.index(tables, ids), stack.flat()
        fresh = values.to(stack.rows.dtype)
        change = padded_rows([len(i) for i in ids], fresh.double() - flat.index_select(0, index).double())
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


def padded_rows(sizes: list[int], rows: Tensor) -> Tensor:
    """Runs' rows [sum(sizes), ...], run after run, as [runs, k, ...], k the most rows of a run, a
    run with fewer padded with zeros. No sum over a run's k rows reaches another run's
    (deterministic on a GPU, and one run's inf stays its own, as a summing matrix over all rows
    would not keep it)."""
    k, runs = max(sizes), len(sizes)
    if min(sizes) == k:
        return rows.view(runs, k, *rows.shape[1:])
    run = torch.as_tensor(np.repeat(np.arange(runs), sizes), device=rows.device)
    slot = torch.as_tensor(np.concatenate([np.arange(n) for n in sizes]), device=rows.device)
    padded = rows.new_zeros((runs, k, *rows.shape[1:]))
    padded[run, slot] = rows
    return padded
