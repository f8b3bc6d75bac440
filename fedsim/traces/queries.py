"""What the two availability indexes share (fedsim/traces/index.py over intervals,
fedsim/traces/round_index.py over a round-indexed trace's bits): where a time falls in the
trace, checked device ids, and the last `online` answer kept."""

from __future__ import annotations

import math

import numpy as np


class TraceQueries:
    """The common part of an availability index of `trace`; subclasses answer `_online(t)`."""

    def __init__(self, trace):
        self.trace = trace
        self.n_devices = trace.n_devices
        self.horizon = trace.horizon
        self._loop = trace.wrap == "loop"
        self._last_t, self._last_online = math.nan, None

    def online(self, t: float) -> np.ndarray:
        """bool [N]: who is online at time t. The last answer is kept: the server asks
        `next_online(t)` and then `online(t)` at the start of every round."""
        if t != self._last_t:
            self._last_t, self._last_online = t, self._online(t)
        return self._last_online.copy()

    def _online(self, t: float) -> np.ndarray:
        raise NotImplementedError

    def online_ids(self, t: float) -> np.ndarray:
        """int64 [n]: ids of the devices online at t, ascending."""
        return np.flatnonzero(self.online(t))

    def _phase(self, t: float) -> float | None:
        """Position of t inside the trace, or None when the trace says everyone is offline."""
        if self._loop:
            return float(np.mod(t, self.horizon))
        return float(t) if 0 <= t < self.horizon else None

    def _ids(self, ids) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.n_devices):
            raise IndexError(f"device ids must be in 0..{self.n_devices - 1}")
        return ids
