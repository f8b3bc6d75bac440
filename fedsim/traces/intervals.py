"""Vectorised interval algebra shared by the generators and converters.

Everything works on flat (device, start, end) arrays with no Python loop over devices.
"""

from __future__ import annotations

import numpy as np


def runs_of(mask: np.ndarray):
    """Runs of True in each row of a bool matrix ``[rows, cols]``.

    Returns (row, first, stop) int64 arrays, sorted by (row, first); ``stop`` is exclusive.
    """
    rows, cols = mask.shape
    padded = np.zeros((rows, cols + 2), dtype=np.int8)
    padded[:, 1:-1] = mask
    step = np.diff(padded, axis=1)
    row, first = np.nonzero(step == 1)
    _, stop = np.nonzero(step == -1)
    return row.astype(np.int64), first.astype(np.int64), stop.astype(np.int64)


def subtract(dev, start, end, cut_dev, cut_start, cut_end):
    """Parts of the intervals (dev, start, end) not covered by any cut of the same device.

    Inputs may overlap and come in any order; the output pieces are sorted by (dev, start)
    but pieces that touch are not merged (``Trace.from_intervals`` does that). A sweep over
    +1/-1 events per device: a piece is online while some interval is open and no cut is.
    """
    n, c = len(dev), len(cut_dev)
    ev_dev = np.concatenate([dev, dev, cut_dev, cut_dev])
    ev_time = np.concatenate([start, end, cut_start, cut_end])
    ev_open = np.concatenate([np.ones(n), -np.ones(n), np.zeros(2 * c)]).astype(np.int64)
    ev_cut = np.concatenate([np.zeros(2 * n), np.ones(c), -np.ones(c)]).astype(np.int64)
    order = np.lexsort((ev_time, ev_dev))
    ev_dev, ev_time = ev_dev[order], ev_time[order]
    # Each device's events sum to zero, so global running sums restart at every device.
    open_depth = np.cumsum(ev_open[order])
    cut_depth = np.cumsum(ev_cut[order])
    on = (open_depth[:-1] > 0) & (cut_depth[:-1] == 0)
    keep = on & (ev_dev[1:] == ev_dev[:-1]) & (ev_time[1:] > ev_time[:-1])
    return ev_dev[:-1][keep], ev_time[:-1][keep], ev_time[1:][keep]


def clip(dev, start, end, lo: float, hi: float):
    """Intervals cut to [lo, hi); empty ones dropped."""
    start, end = np.maximum(start, lo), np.minimum(end, hi)
    keep = end > start
    return dev[keep], start[keep], end[keep]
