"""The rows of the events log (events.parquet): one per invitation.

A round hands over its invitations as they are (`task_events`: references, no copies, so the
log costs a round next to nothing); `event_columns` turns a batch of rounds into the log's
columns in a few vectorised operations. Times are simulated seconds; NaN (null in the file)
where the task never got there: `started` when the device went offline during the download,
`finished` when it went offline before the upload completed. `staleness` is the async
server's (aggregation round - model version); -1 (null) for synchronous rounds.
"""

from __future__ import annotations

import numpy as np

from fedsim.sim.round_timing import Tasks

OUTCOMES = ("arrived", "dropped", "late", "surplus")  # the codes 0..3 of the outcome column
ARRIVED, DROPPED, LATE, SURPLUS = range(4)
COLUMNS = ("round", "device_id", "invited_at", "started", "finished", "outcome", "download_s",
           "compute_s", "upload_s", "staleness", "steps", "samples")


def task_events(rnd: int, ids: np.ndarray, tasks: Tasks, outcome: np.ndarray, steps: np.ndarray,
                staleness: np.ndarray | None = None) -> dict:
    """One round's invitations (outcome: the codes above)."""
    return {"n": len(ids), "round": rnd, "device_id": ids, "tasks": tasks, "outcome": outcome,
            "steps": steps, "staleness": staleness}


def event_columns(batches: list[dict]) -> dict[str, np.ndarray]:
    """The log's columns (COLUMNS) of several rounds' invitations."""
    counts = [b["n"] for b in batches]

    def joined(get) -> np.ndarray:
        return np.concatenate([get(b) for b in batches]) if batches else np.empty(0)

    def task(name: str) -> np.ndarray:
        return joined(lambda b: np.broadcast_to(getattr(b["tasks"], name), (b["n"],))).astype(np.float64)

    invited_at, download = task("invited_at"), task("download_s")
    ends_at, dropped = task("ends_at"), joined(lambda b: b["tasks"].dropped).astype(bool)
    started = invited_at + download
    started[dropped & (ends_at < started)] = np.nan
    return {
        "round": np.repeat(np.array([b["round"] for b in batches], dtype=np.int64), counts),
        "device_id": joined(lambda b: b["device_id"]).astype(np.int64),
        "invited_at": invited_at, "started": started,
        "finished": np.where(dropped, np.nan, ends_at),
        "outcome": joined(lambda b: b["outcome"]).astype(np.int8),
        "download_s": download, "compute_s": task("compute_s"), "upload_s": task("upload_s"),
        "staleness": joined(lambda b: np.full(b["n"], -1) if b["staleness"] is None
                            else b["staleness"]).astype(np.int64),
        "steps": joined(lambda b: b["steps"]).astype(np.int64),
        "samples": joined(lambda b: b["tasks"].samples).astype(np.int64),
    }
