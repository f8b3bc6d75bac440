"""`[client] work = "fit-deadline"`: the local steps a device manages before its deadline
(docs/timing.md, "Partial work").

An invited device that knows the deadline and its own speed trains the most of its local steps
with which its task (download, compute, upload) still ends by the deadline: the largest s in
[1, full] with finish(s) <= due. A task's time grows with its steps, so bisection finds s for
the whole cohort at once, with the very arithmetic that times the task (it arrives exactly when
it fits). At least one step: a device too slow for even one trains one and is late, as under
full work. The trace's future is not consulted: a device may still go offline and drop.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def steps_that_fit(finish_at: Callable[[np.ndarray], np.ndarray], full: np.ndarray, due: float) -> np.ndarray:
    """Per device, the largest s in [1, full] with ``finish_at(s) <= due`` (1 where none is),
    `full` and the result int64 [k]; `finish_at` maps steps [k] to the tasks' end times [k]."""
    full = np.asarray(full, dtype=np.int64)
    low, high = np.minimum(full, 1), full.copy()
    while (active := low < high).any():
        mid = (low + high + 1) // 2
        fits = finish_at(mid) <= due
        low = np.where(active & fits, mid, low)
        high = np.where(active & ~fits, mid - 1, high)
    return low
