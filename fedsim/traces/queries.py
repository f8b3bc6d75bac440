"""What the two availability indexes share (fedsim/traces/index.py over intervals,
fedsim/traces/round_index.py over a round-indexed trace's bits): where a time falls in the
trace, checked device ids, the last `online` answer kept, and the instants they answer."""

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

    def _instant(self, t, tau, x):
        """The first double at or after the instant of position `x` (float or array, >= 0) in
        the cycle of t (t at position tau = `_phase(t)`): whether a device is online at t is
        decided on tau, which is exact (t mod horizon), so an instant rounded down to below the
        real cycle start + x would be one at which the boundary has not come yet (a device still
        online at the instant its run "ended": a round started and closed there, for ever).
        Without a loop, and in the first cycle, x itself."""
        if not self._loop:
            return x
        return _first_at_or_after(t, tau, x)

    def _instant_next_cycle(self, t, tau, x):
        """`_instant` of position x in the cycle after t's: from the instant that cycle starts."""
        start = _first_at_or_after(t, tau, self.horizon)
        return _first_at_or_after(start, np.mod(start, self.horizon), x)

    def _ids(self, ids) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.n_devices):
            raise IndexError(f"device ids must be in 0..{self.n_devices - 1}")
        return ids


def _first_at_or_after(t, tau, x):
    """The smallest double >= the real number t - tau + x, for doubles with 0 <= tau <= t
    (t - tau is then the real start of t's cycle, whatever its rounding) and x >= tau or x
    below tau by less than an ulp of t: two exact sums (TwoSum) and a step of one ulp."""
    with np.errstate(invalid="ignore"):  # (inf - inf: a run that never ends)
        d = np.subtract(x, tau)
        d_error = _sum_error(x, -np.asarray(tau, dtype=float), d)
        s = np.add(t, d)
        error = _sum_error(t, d, s) + d_error  # the real value is s + error (its sign exact)
        up = np.nextafter(s, math.inf)
        down = np.nextafter(s, -math.inf)
        below = (down - s) - error >= 0  # down >= the real value: s is not the smallest
    out = np.where(error > 0, up, np.where(below, down, s))
    out = np.where(np.isinf(s), s, out)
    return float(out) if np.ndim(out) == 0 else out


def _sum_error(a, b, s):
    """a + b - s exactly, for s = fl(a + b) (Knuth's TwoSum)."""
    b_virtual = s - a
    return (a - (s - b_virtual)) + (b - b_virtual)
