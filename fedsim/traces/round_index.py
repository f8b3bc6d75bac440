"""The availability queries of AvailabilityIndex over a round-indexed trace held as bits
(RoundBits), with the same answers as the index of its interval form.

Who is online at t is one row of bits (ceil(N / 8) bytes, unpacked); when an online device's
run ends is a forward scan of its bit column in doubling windows, remembered per device until
the run is over; when someone (or `count` devices) is next online comes from the online count
per round.
"""

from __future__ import annotations

import math

import numpy as np

from fedsim.traces.queries import TraceQueries
from fedsim.traces.round_bits import CHUNK_BYTES, RoundBits


class RoundIndex(TraceQueries):
    """AvailabilityIndex's queries for a RoundBits trace."""

    def __init__(self, trace: RoundBits):
        super().__init__(trace)
        self._d, self._rounds = trace.round_duration, trace.rounds
        self._busy = np.flatnonzero(trace.online_count > 0)
        self._reached: dict[int, np.ndarray] = {}
        self._run_from = np.zeros(self.n_devices, dtype=np.int64)  # a known run: rounds [from, stop)
        self._run_stop = np.full(self.n_devices, -1, dtype=np.int64)
        self._first_stop = np.full(self.n_devices, -1, dtype=np.int64)  # end of each device's first run

    # -- queries (as AvailabilityIndex) --------------------------------------------------

    def _online(self, t: float) -> np.ndarray:
        r = self._round(t)
        return np.zeros(self.n_devices, bool) if r is None else self.trace.row(r)

    def next_offline(self, ids, t: float) -> np.ndarray:
        """float [k]: when the current online run of each device ends (inf if never); t for a
        device that is offline at t."""
        ids = self._ids(ids)
        out = np.full(len(ids), float(t))
        on, ends = self._run_ends(ids, t)
        out[on] = ends
        return out

    def online_during(self, ids, t0: float, t1: float) -> np.ndarray:
        """bool [k]: online for the whole of [t0, t1)."""
        on, ends = self._run_ends(self._ids(ids), t0)
        on[on] = ends >= t1
        return on

    def next_online(self, t: float) -> float:
        """Earliest t' >= t at which any device is online; math.inf if nobody ever is again."""
        if self.online(t).any():
            return float(t)
        return self._next_round_in(self._busy, t)

    def next_online_count(self, count: int, t: float) -> float:
        """Earliest t' >= t at which at least `count` devices are online at once."""
        if int(self.online(t).sum()) >= count:
            return float(t)
        if count not in self._reached:
            self._reached[count] = np.flatnonzero(self.trace.online_count >= count)
        return self._next_round_in(self._reached[count], t)

    def most_online(self) -> int:
        """The most devices online at once, in any round of the trace."""
        return int(self.trace.online_count.max(initial=0))

    # -- internals -----------------------------------------------------------------------

    def _round(self, t: float) -> int | None:
        tau = self._phase(t)
        return None if tau is None else self.trace.round_of(tau)

    def _next_round_in(self, rounds: np.ndarray, t: float) -> float:
        """Start of the first of `rounds` (sorted) after the round of t, as the interval
        index computes it: its start in t's cycle (`_instant`), or in the next when the trace loops."""
        if not len(rounds):
            return math.inf
        tau = self._phase(t)
        if tau is None:
            if self._loop or t >= 0:
                return math.inf
            tau, r = float(t), -1
        else:
            r = self.trace.round_of(tau)
            r = self._rounds if r is None else r
        k = int(np.searchsorted(rounds, r, side="right"))
        if k < len(rounds):
            return float(self._instant(t, tau, rounds[k] * self._d))
        return float(self._instant_next_cycle(t, tau, rounds[0] * self._d)) if self._loop else math.inf

    def _run_ends(self, ids: np.ndarray, t: float) -> tuple[np.ndarray, np.ndarray]:
        """Which of `ids` are online at t, and for those when their online run ends (across
        the loop's wrap point: the first run of a device online at round 0 continues it)."""
        tau = self._phase(t)
        r = None if tau is None else self.trace.round_of(tau)
        if r is None:
            return np.zeros(len(ids), dtype=bool), np.zeros(0)
        on = self._bit(r, ids)
        live = ids[on]
        stop = self._stops(live, r)
        ends = np.asarray(self._instant(t, tau, stop * self._d), dtype=float)
        if self._loop:
            wraps = np.flatnonzero(stop == self._rounds)
            wraps = wraps[self._bit(0, live[wraps])]
            first = self._first_stops(live[wraps])
            ends[wraps] = np.where(first == self._rounds, math.inf,
                                   self._instant_next_cycle(t, tau, first * self._d))
        return on, ends

    def _bit(self, r: int, ids: np.ndarray) -> np.ndarray:
        return ((self.trace.bits[r, ids >> 3] >> (ids & 7).astype(np.uint8)) & 1).astype(bool)

    def _stops(self, ids: np.ndarray, r: int) -> np.ndarray:
        """The round at which the run of online rounds holding round r ends, per device."""
        known = (self._run_from[ids] <= r) & (r < self._run_stop[ids])
        todo = ids[~known]
        if todo.size:
            self._run_from[todo], self._run_stop[todo] = r, self._scan(todo, r)
        return self._run_stop[ids]

    def _first_stops(self, ids: np.ndarray) -> np.ndarray:
        todo = ids[self._first_stop[ids] < 0]
        if todo.size:
            self._first_stop[todo] = self._scan(todo, 0)
        return self._first_stop[ids]

    def _scan(self, ids: np.ndarray, r: int) -> np.ndarray:
        """First round >= r at which each device is offline (all rounds: the trace's end)."""
        stop = np.full(len(ids), self._rounds, dtype=np.int64)
        byte, bit = ids >> 3, (ids & 7).astype(np.uint8)
        pending, lo, width = np.arange(len(ids)), r, 64
        while pending.size and lo < self._rounds:
            hi = min(self._rounds, lo + width)
            off = (self.trace.bits[lo:hi][:, byte[pending]] >> bit[pending]) & 1 == 0
            hit = off.any(axis=0)
            stop[pending[hit]] = lo + off.argmax(axis=0)[hit]
            pending, lo = pending[~hit], hi
            width = min(width * 2, max(64, CHUNK_BYTES // max(len(pending), 1)))
        return stop
