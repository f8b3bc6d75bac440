"""Vectorised interval algebra shared by the generators and converters.

Everything works on flat (device, start, end) arrays with no Python loop over devices.
"""

from __future__ import annotations

import numpy as np


def alternating(lo, hi, mean_on, mean_off, first_on, rng: np.random.Generator):
    """Online pieces of an alternating renewal process inside each window [lo[w], hi[w]).

    Online and offline spells are exponential with per-window means; window w starts online
    iff ``first_on[w]``. Windows are drawn together in batches of spells (the Python loop runs
    over batches, never over windows). Returns (window, start, end), sorted by window then time.
    """
    n = len(lo)
    mean_on, mean_off = np.broadcast_to(mean_on, n), np.broadcast_to(mean_off, n)
    now = np.asarray(lo, dtype=np.float64).copy()
    state = np.broadcast_to(np.asarray(first_on, dtype=bool), n).copy()
    cycles = (hi - lo) / (mean_on + mean_off)
    batch = max(8, int(2 * np.median(cycles)) + 4) if n else 8
    active = np.flatnonzero(now < hi)
    windows, starts, ends = [], [], []
    while active.size:
        on = (np.arange(batch)[None, :] + (~state[active])[:, None]) % 2 == 0
        scale = np.where(on, mean_on[active, None], mean_off[active, None])
        stop = now[active, None] + np.cumsum(rng.exponential(scale), axis=1)
        begin = np.concatenate([now[active, None], stop[:, :-1]], axis=1)
        limit = hi[active, None]
        take = on & (begin < limit)
        windows.append(np.broadcast_to(active[:, None], take.shape)[take])
        starts.append(begin[take])
        ends.append(np.minimum(stop, limit)[take])
        now[active] = stop[:, -1]
        state[active] ^= batch % 2 == 1
        active = active[now[active] < hi[active]]
    if not windows:
        return np.zeros(0, np.int64), np.zeros(0), np.zeros(0)
    window = np.concatenate(windows)
    start, end = np.concatenate(starts), np.concatenate(ends)
    order = np.argsort(window, kind="stable")  # batches interleave windows; restore window order
    return window[order], start[order], end[order]


def clip(dev, start, end, lo: float, hi: float):
    """Intervals cut to [lo, hi); empty ones dropped."""
    start, end = np.maximum(start, lo), np.minimum(end, hi)
    keep = end > start
    return dev[keep], start[keep], end[keep]
