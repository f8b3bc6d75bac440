"""The rows of the events log (events.parquet): one per invitation, as numpy columns.

Times are simulated seconds; NaN (null in the file) where the task never got there: `started`
when the device went offline during the download, `finished` when it went offline before the
upload completed. `staleness` is the async server's (aggregation round - model version).
"""

from __future__ import annotations

import numpy as np

from fedsim.sim.round_timing import Tasks

OUTCOMES = ("arrived", "dropped", "late", "surplus")


def task_events(rnd: int, ids: np.ndarray, tasks: Tasks, outcome: np.ndarray, steps: np.ndarray,
                staleness: np.ndarray | None = None) -> dict[str, np.ndarray]:
    n = len(ids)
    return {
        "round": np.full(n, rnd, dtype=np.int64), "device_id": ids.astype(np.int64),
        "invited_at": np.broadcast_to(np.asarray(tasks.invited_at, dtype=np.float64), (n,)),
        "started": tasks.started, "finished": tasks.finished,
        "outcome": np.asarray(outcome, dtype=object),
        "download_s": tasks.download_s, "compute_s": tasks.compute_s, "upload_s": tasks.upload_s,
        "staleness": (np.full(n, -1, dtype=np.int64) if staleness is None
                      else staleness.astype(np.int64)),  # -1: not async (null in the file)
        "steps": steps.astype(np.int64), "samples": tasks.samples.astype(np.int64),
    }
