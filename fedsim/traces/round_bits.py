"""Round-indexed availability held as one bit per round and device.

A round-indexed generator (``always``, ``bernoulli``, ``grid``, ``periodic``) decides, round
by round, who is online; its interval form puts round r on ``[r*D, (r+1)*D)`` and merges
consecutive online rounds, which takes 24 bytes per run of online rounds (72 M rows for a
Bernoulli trace of 5,000 devices over 60,000 rounds). The bits take one bit per round and
device (37.5 MB for that trace), whatever the trace looks like. A run keeps this form and
queries it through ``RoundIndex``; ``to_trace`` gives the interval form (the trace file
contract) and ``intervals`` streams it device chunk by device chunk, with the same floats:
an interval of rounds [a, b) is ``[a * D, b * D)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from fedsim.errors import FedsimError
from fedsim.traces.schema import Trace, check_rows

MAX_BIT_BYTES = 1 << 32  # 4 GiB of bits: e.g. 100,000 devices over 340,000 rounds
CHUNK_BYTES = 1 << 18  # packed bits read at once (2 M rounds x devices: up to 2 M changes of state)


def check_bits(n_devices: int, rounds: int, where: str) -> None:
    """Refuse up front a bit table beyond MAX_BIT_BYTES."""
    size = float(rounds) * ((n_devices + 7) // 8)
    if not size <= MAX_BIT_BYTES:
        raise FedsimError(f"{where}: {n_devices:,} devices over {rounds:,} rounds would take "
                          f"{size:,.0f} bytes of availability bits (one per 8 devices and round), "
                          f"above fedsim's limit of {MAX_BIT_BYTES:,}; use fewer devices or rounds")


def pack(online: np.ndarray) -> np.ndarray:
    """bool ``[rounds, devices]`` -> uint8 ``[rounds, ceil(devices / 8)]`` (device i is bit
    i % 8 of byte i // 8)."""
    return np.packbits(online, axis=1, bitorder="little")


def count_runs(online: np.ndarray) -> int:
    """Runs of online rounds in a bool ``[rounds, devices]`` block (each device's runs)."""
    return int(online[0].sum() + (online[1:] & ~online[:-1]).sum()) if len(online) else 0


@dataclass(eq=False)
class RoundBits:
    """Who is online in each round: ``bits`` uint8 ``[rounds, ceil(n_devices / 8)]`` (see
    ``pack``) and ``online_count`` ``[rounds]``. Round r spans ``[r * D, (r + 1) * D)`` of
    ``round_duration`` D; ``wrap``, ``origin`` and ``generator`` as for a Trace."""

    bits: np.ndarray
    online_count: np.ndarray
    n_devices: int
    round_duration: float
    wrap: str = "none"
    origin: str | None = None
    generator: dict = field(default_factory=dict)
    _cursor: "_OnlineRounds | _OnlineSeconds | None" = field(default=None, repr=False)
    _full: np.ndarray | None = field(default=None, repr=False)

    @property
    def rounds(self) -> int:
        return len(self.bits)

    @property
    def horizon(self) -> float:
        return self.rounds * self.round_duration

    def row(self, r: int) -> np.ndarray:
        """bool [n_devices]: who is online in round r."""
        return self.rows(r, r + 1)[0]

    def rows(self, r0: int, r1: int) -> np.ndarray:
        """bool [r1 - r0, n_devices]."""
        return np.unpackbits(self.bits[r0:r1], axis=1, count=self.n_devices, bitorder="little").view(bool)

    def round_of(self, tau: float) -> int | None:
        """The round r with r*D <= tau < (r+1)*D, compared with the same products as the
        interval form's ends; None outside [0, horizon)."""
        d = self.round_duration
        r = math.floor(tau / d)
        if r * d > tau:
            r -= 1
        elif (r + 1) * d <= tau:
            r += 1
        return r if 0 <= r < self.rounds else None

    def rounds_before(self, t: float) -> int:
        """How many rounds start before t (r*D < t), at most all of them."""
        d = self.round_duration
        k = min(self.rounds, max(0, math.ceil(t / d)))
        while k > 0 and (k - 1) * d >= t:
            k -= 1
        while k < self.rounds and k * d < t:
            k += 1
        return k

    # -- the interval form ---------------------------------------------------------------

    def changes(self, r0: int, r1: int, c0: int, c1: int, close: bool):
        """Where the devices of bytes [c0, c1) go online or offline in rounds [r0, r1): (device,
        round) sorted by device, then round. The state before r0 is round r0 - 1's (offline
        before round 0); with `close` every device goes offline at r1. Found on the packed
        bytes, one bit position at a time, without unpacking the rounds."""
        block = self.bits[max(r0 - 1, 0):r1, c0:c1]
        rows = [np.zeros((1, c1 - c0), np.uint8)] if r0 == 0 else []
        rows += [block] + ([np.zeros((1, c1 - c0), np.uint8)] if close else [])
        columns = np.ascontiguousarray(np.concatenate(rows).T)
        flips = columns[:, 1:] ^ columns[:, :-1]  # [bytes, rounds]: a change at round r0 + j
        dev, rnd = [], []
        for bit in range(8):
            col, at = np.nonzero((flips >> bit) & 1)
            dev.append((col + c0) * 8 + bit)
            rnd.append(at + r0)
        dev, rnd = np.concatenate(dev), np.concatenate(rnd)
        key = dev - c0 * 8  # each device's changes are in round order: a stable sort keeps it
        order = np.argsort(key.astype(np.uint16) if c1 - c0 <= 8192 else key, kind="stable")  # (radix)
        return dev[order], rnd[order]

    def runs(self, rounds: int | None = None):
        """(device, first, stop) of the runs of online rounds within the first `rounds`
        rounds, device chunk by device chunk in (device, first) order; `stop` is exclusive."""
        rounds = self.rounds if rounds is None else rounds
        width = self.bits.shape[1]
        step = max(1, min(CHUNK_BYTES // max(rounds, 1), 8192))
        for c0 in range(0, width, step):
            dev, rnd = self.changes(0, rounds, c0, min(width, c0 + step), close=True)
            yield dev[0::2], rnd[0::2], rnd[1::2]

    def intervals(self, horizon: float | None = None):
        """(device_id, start, end) of the interval form over [0, horizon) (ends cut there),
        device chunk by device chunk."""
        horizon = self.horizon if horizon is None else horizon
        d = self.round_duration
        for dev, first, stop in self.runs(self.rounds_before(horizon)):
            yield dev, first * d, np.minimum(stop * d, horizon)

    def n_runs(self) -> int:
        """Rows of the interval form."""
        return sum(len(dev) for dev, _, _ in self.runs())

    def to_trace(self, where: str, fix: str = "generate fewer devices or rounds") -> Trace:
        """The interval form (what `fedsim trace generate` writes), refused beyond the rows
        a trace may have."""
        check_rows(self.n_runs(), f"{self.n_devices:,} devices over {self.rounds:,} rounds", where, fix)
        parts = list(self.intervals())
        dev, start, end = (np.concatenate([p[k] for p in parts]) if parts else np.zeros(0) for k in range(3))
        return Trace.from_intervals(dev, start, end, n_devices=self.n_devices, horizon=self.horizon,
                                    wrap=self.wrap, origin=self.origin, generator=self.generator, where=where)

    # -- seconds online ------------------------------------------------------------------

    def online_seconds(self, until: float) -> np.ndarray:
        """Per device, the seconds online in [0, until) (until <= horizon), added interval by
        interval in time order as the interval form's np.bincount adds them, so the floats are
        equal. A cursor keeps what earlier calls added: a run that asks at every checkpoint
        reads each round once."""
        if until >= self.horizon:
            if self._full is None:
                self._full = self._seconds_cursor().advance(self.rounds).at(self.horizon)
            return self._full.copy()
        k = self.rounds_before(until)
        if self._cursor is None or self._cursor.done > k:
            self._cursor = self._seconds_cursor()
        return self._cursor.advance(k).at(until)

    def _seconds_cursor(self) -> "_OnlineRounds | _OnlineSeconds":
        """Counting online rounds gives the interval form's sums when every r * D and every
        sum of them is exact (D = p / 2^e with p * rounds < 2^53: D = 1.0, 60.0, 0.5, ...);
        otherwise the runs are added one by one, in its order."""
        numerator = self.round_duration.as_integer_ratio()[0]
        exact = numerator * max(self.rounds, 1) < 2**53
        return _OnlineRounds(self) if exact else _OnlineSeconds(self)


class _OnlineSeconds:
    """Seconds of the runs of online rounds closed so far, per device, and when each device's
    open run started (nan: none open), after the first `done` rounds."""

    def __init__(self, bits: RoundBits):
        self.bits, self.done = bits, 0
        self.closed = np.zeros(bits.n_devices)
        self.open_start = np.full(bits.n_devices, np.nan)

    def advance(self, k: int) -> "_OnlineSeconds":
        """Read rounds [done, k): close the runs that end there, in round order per device."""
        if k <= self.done:
            return self
        bits, d = self.bits, self.bits.round_duration
        width = bits.bits.shape[1]
        step = max(1, min(CHUNK_BYTES // (k - self.done), width))
        for c0 in range(0, width, step):
            dev, rnd = bits.changes(self.done, k, c0, min(width, c0 + step), close=False)
            if not len(dev):
                continue
            nth = np.arange(len(dev)) - np.searchsorted(dev, dev)  # the n-th change of its device
            opened = ~np.isnan(self.open_start[dev])  # online before `done`: the first change ends that run
            ends = (nth + opened) % 2 == 1
            begun = np.where(nth > 0, np.roll(rnd, 1) * d, self.open_start[dev])
            np.add.at(self.closed, dev[ends], rnd[ends] * d - begun[ends])
            last = np.r_[dev[1:] != dev[:-1], True]
            self.open_start[dev[last]] = np.where(ends[last], np.nan, rnd[last] * d)
        self.done = k
        return self

    def at(self, until: float) -> np.ndarray:
        """Seconds online in [0, until), until in the round after the last one read."""
        out = self.closed.copy()
        open_ = ~np.isnan(self.open_start)
        out[open_] += until - self.open_start[open_]
        return out


class _OnlineRounds:
    """Online rounds per device within the first `done` rounds and the last round each device
    was offline: seconds are whole rounds times D (exact, see RoundBits._seconds_cursor)."""

    def __init__(self, bits: RoundBits):
        self.bits, self.done = bits, 0
        self.online = np.zeros(bits.n_devices, dtype=np.int64)
        self.last_off = np.full(bits.n_devices, -1, dtype=np.int64)

    def advance(self, k: int) -> "_OnlineRounds":
        step = max(1, CHUNK_BYTES * 8 // max(self.bits.n_devices, 1))
        for r0 in range(self.done, k, step):
            rows = self.bits.rows(r0, min(k, r0 + step))
            self.online += rows.sum(axis=0)
            off = ~rows[::-1]
            seen = off.any(axis=0)
            self.last_off[seen] = r0 + len(rows) - 1 - off.argmax(axis=0)[seen]
        self.done = max(self.done, k)
        return self

    def at(self, until: float) -> np.ndarray:
        """Seconds online in [0, until), until in the round after the last one read: the runs
        closed by then, plus until - start of the run still open."""
        d, k = self.bits.round_duration, self.done
        first = self.last_off + 1  # first round of the run open at round k - 1, where one is
        open_ = first < k
        out = (self.online - np.where(open_, k - first, 0)) * d
        out[open_] += until - first[open_] * d
        return out
