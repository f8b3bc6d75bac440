"""Vectorised availability queries over a trace.

The engine never turns availability flips into SimPy events; it asks this index instead, so
the cost of a round follows the cohort, not the population. Three precomputed structures:

* per-device lookup: row pointers per device (CSR) and a vectorised binary search inside
  each queried device's few rows, so the k queries touch a handful of cache lines each;
* time buckets: every interval is listed (as contiguous copies) in the buckets of width ~ the
  mean interval length that it overlaps, so ``online(t)`` scans one bucket, not every device;
* the union of all intervals, for "when is anybody online next".

With ``wrap = "loop"`` a time t reads the trace at ``t mod horizon`` (exact); a run that
reaches the horizon continues into the device's interval starting at 0. The instants the
index answers in a later cycle are the first doubles at or after the real cycle start +
position (`_instant`), so that at the instant a run ends the device is offline; they are the
exact sums where those are representable (e.g. whole seconds).
"""

from __future__ import annotations

import math
from functools import cached_property

import numpy as np

from fedsim.traces.round_bits import RoundBits
from fedsim.traces.queries import TraceQueries
from fedsim.traces.round_index import RoundIndex
from fedsim.traces.schema import Trace

_MAX_BUCKETS = 1 << 16


def availability_index(trace):
    """The index of a trace: of its intervals (Trace), or of its bits (RoundBits)."""
    return RoundIndex(trace) if isinstance(trace, RoundBits) else AvailabilityIndex(trace)


def same_availability(a, b) -> bool:
    """Whether traces `a` and `b` say the same about who is online when, so that one index
    answers for both (the runs of a study that replay one trace share it): the same kind,
    devices, extent and wrap, and equal intervals or bits."""
    if (type(a), a.n_devices, a.horizon, a.wrap) != (type(b), b.n_devices, b.horizon, b.wrap):
        return False
    if isinstance(a, RoundBits):
        return a.round_duration == b.round_duration and np.array_equal(a.bits, b.bits)
    return all(np.array_equal(getattr(a, part), getattr(b, part)) for part in ("device_id", "start", "end"))


class AvailabilityIndex(TraceQueries):
    """Answers who is online when, for one trace."""

    def __init__(self, trace: Trace):
        super().__init__(trace)
        dev, start, end = trace.device_id, trace.start, trace.end
        self._dev, self._start, self._end = dev, start, end
        self._ptr = np.searchsorted(dev, np.arange(self.n_devices + 1))
        longest = int(np.diff(self._ptr).max()) if self.n_devices else 0
        self._steps = max(1, longest).bit_length()
        self._run_end = self._run_ends()
        self._build_buckets()

    # -- queries -------------------------------------------------------------------------

    def _online(self, t: float) -> np.ndarray:
        out = np.zeros(self.n_devices, dtype=bool)
        tau = self._phase(t)
        if tau is None or not self._bucket_width:
            return out
        b = min(int(tau / self._bucket_width), self._n_buckets - 1)
        lo, hi = self._bucket_ptr[b], self._bucket_ptr[b + 1]
        hit = (self._b_start[lo:hi] <= tau) & (tau < self._b_end[lo:hi])
        out[self._b_dev[lo:hi][hit]] = True
        return out

    def next_offline(self, ids, t: float) -> np.ndarray:
        """float [k]: when the current online run of each device ends (inf if never); t for a
        device that is offline at t."""
        ids = self._ids(ids)
        out = np.full(len(ids), float(t))
        tau = self._phase(t)
        if tau is None:
            return out
        row, on = self._locate(ids, tau)
        out[on] = self._run_end_at(t, tau, row[on])
        return out

    def next_online(self, t: float) -> float:
        """Earliest t' >= t at which any device is online; math.inf if nobody ever is again."""
        if self.online(t).any():  # one bucket's scan; spares building the union
            return float(t)
        us, ue = self._union
        if not len(us):
            return math.inf
        if not self._loop and t < 0:
            return float(us[0])
        tau = self._phase(t)
        if tau is None:
            return math.inf
        k = int(np.searchsorted(us, tau, side="right")) - 1
        if k >= 0 and tau < ue[k]:
            return float(t)
        if k + 1 < len(us):
            return float(self._instant(t, tau, us[k + 1]))
        return float(self._instant_next_cycle(t, tau, us[0])) if self._loop else math.inf

    def next_online_count(self, count: int, t: float) -> float:
        """Earliest t' >= t at which at least `count` devices are online at once; math.inf if
        never again. One binary search in the times where the count of online devices reaches
        `count` (built once per count)."""
        if int(self.online(t).sum()) >= count:
            return float(t)
        tau = self._phase(t)
        if tau is None and (self._loop or t >= 0):
            return math.inf
        tau = float(t) if tau is None else tau
        reached = self._count_reached(count)
        k = int(np.searchsorted(reached, tau, side="right"))
        if k < len(reached):
            return float(self._instant(t, tau, reached[k]))
        return float(self._instant_next_cycle(t, tau, reached[0])) if self._loop and len(reached) else math.inf

    def most_online(self) -> int:
        """The most devices online at once, at any time of the trace."""
        return int(self._online_counts()[1].max(initial=0))

    def _online_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """(the sorted times where an interval starts or ends, the count online from each)."""
        starts, ends = np.sort(self._start), np.sort(self._end)
        times = np.unique(np.concatenate([starts, ends]))
        return times, np.searchsorted(starts, times, side="right") - np.searchsorted(ends, times, side="right")

    def _count_reached(self, count: int) -> np.ndarray:
        """Sorted times at which at least `count` devices are online (the count only changes
        where an interval starts or ends: count(x) = #starts <= x - #ends <= x)."""
        cache = self.__dict__.setdefault("_reached", {})
        if count not in cache:
            times, online = self._online_counts()
            cache[count] = times[online >= count]
        return cache[count]

    def online_during(self, ids, t0: float, t1: float) -> np.ndarray:
        """bool [k]: online for the whole of [t0, t1); a device that drops out and comes back
        inside the window is False. An empty window (t1 <= t0) asks for online at t0."""
        ids = self._ids(ids)
        tau = self._phase(t0)
        if tau is None:
            return np.zeros(len(ids), dtype=bool)
        row, on = self._locate(ids, tau)
        on[on] = self._run_end_at(t0, tau, row[on]) >= t1
        return on

    # -- internals -----------------------------------------------------------------------

    def _locate(self, ids: np.ndarray, tau: float):
        """Row of the last interval of each device starting at or before tau, and whether the
        device is online at tau (row is meaningless where it is not)."""
        if not len(self._start):
            return np.zeros(len(ids), dtype=np.int64), np.zeros(len(ids), dtype=bool)
        first, lo, hi = self._ptr[ids], self._ptr[ids], self._ptr[ids + 1]
        start, last = self._start, len(self._start) - 1
        for _ in range(self._steps):  # upper bound of tau in start[lo:hi], all devices at once
            mid = (lo + hi) >> 1
            below = start[np.minimum(mid, last)] <= tau
            lo, hi = np.where(below & (lo < hi), mid + 1, lo), np.where(below, hi, mid)
        row = np.maximum(lo - 1, 0)
        return row, (lo > first) & (tau < self._end[row])

    @cached_property
    def _union(self):
        """Merged union of all devices' intervals (built on first use: only needed when
        nobody is online)."""
        return _union(self._start, self._end)

    def _run_ends(self) -> np.ndarray:
        """Per interval: where the online run containing it ends, as a position in the trace
        (its end), or in the next cycle (`_wraps_into`: the run reaches the horizon and goes on
        into the device's interval starting at 0), or never (inf: online throughout)."""
        run_end = self._end.copy()
        self._wraps_into = np.zeros(len(run_end), dtype=bool)
        if not self._loop or not len(run_end):
            return run_end
        first = self._ptr[self._dev]  # row of each device's first interval
        wraps = (self._end == self.horizon) & (self._start[first] == 0)
        forever = wraps & (first == np.arange(len(first)))
        self._wraps_into = wraps & ~forever
        run_end[wraps] = self._end[first[wraps]]
        run_end[forever] = math.inf
        return run_end

    def _run_end_at(self, t: float, tau: float, rows: np.ndarray) -> np.ndarray:
        """The instants at which the runs holding intervals `rows` (online at t) end."""
        ends = self._run_end[rows]
        wraps = self._wraps_into[rows]
        if not wraps.any():
            return self._instant(t, tau, ends)
        out = np.asarray(self._instant(t, tau, ends), dtype=float).copy()
        out[wraps] = self._instant_next_cycle(t, tau, ends[wraps])
        return out

    def _build_buckets(self) -> None:
        """List each interval in every bucket it overlaps; bucket width ~ mean interval length
        keeps the copies near 2x the interval count. Bucket of a time: trunc(t / width), in
        the build and in `online` alike (monotone in t, so [first, last] covers an interval).
        Memory-bound over tens of millions of copies for big traces: int32 row numbers and one
        radix sort, no extra passes."""
        start, end = self._start, self._end
        self._bucket_width = 0.0
        self._n_buckets = 0
        if not len(start):
            return
        width = max(float(np.mean(end - start)), self.horizon / _MAX_BUCKETS)
        n = max(1, math.ceil(self.horizon / width))
        first = np.minimum((start / width).astype(np.int64), n - 1)
        count = np.minimum((end / width).astype(np.int64), n - 1) - first + 1
        index = np.int32 if count.sum() < 2**31 else np.int64
        rows = np.repeat(np.arange(len(start), dtype=index), count)
        # copy j of interval i goes to bucket first[i] + j
        bucket = np.repeat((first - (np.cumsum(count) - count)).astype(index), count)
        bucket += np.arange(len(rows), dtype=index)
        rows = rows[np.argsort(bucket.astype(np.uint16), kind="stable")]  # radix sort: n <= 2**16
        self._bucket_width, self._n_buckets = width, n
        self._bucket_ptr = np.concatenate([[0], np.cumsum(np.bincount(bucket, minlength=n))])
        self._b_start, self._b_end = start[rows], end[rows]
        self._b_dev = self._dev.astype(np.int32 if self.n_devices < 2**31 else np.int64)[rows]


def _union(start: np.ndarray, end: np.ndarray):
    """Merged union of all devices' intervals: when anybody at all is online."""
    if not len(start):
        return start, end
    order = np.argsort(start, kind="stable")
    start, end = start[order], end[order]
    reach = np.maximum.accumulate(end)
    opens = np.concatenate([[True], start[1:] > reach[:-1]])
    first = np.flatnonzero(opens)
    last = np.concatenate([first[1:], [len(start)]]) - 1
    return start[first], reach[last]
