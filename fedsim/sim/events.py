"""The rows of the events log (events.parquet): one per invitation.

A round hands over its invitations as they are (`task_events`: references, no copies, so the
log costs a round next to nothing); `event_columns` turns a batch of rounds into the log's
columns in a few vectorised operations. Times are simulated seconds; NaN (null in the file)
where the task never got there: `started` when the device went offline during the download,
`finished` when it went offline before the upload completed. `staleness` is the async
server's (aggregation round - model version); -1 (null) for synchronous rounds.

`work_s` is the seconds of work a device did for its invitation: until its task ended (done,
or offline) or the server stopped waiting for it (the deadline), whichever came first; `phase`
is where that work stopped (download, compute, upload), "done" when the task completed. Work
whose update the model never received (dropped, late, surplus, a round failed for its quorum)
is the round's `wasted_s` in rounds.parquet.

Power-of-choice's question to its candidates (their loss on the global model, before the
invitations) is a row of its own per candidate, outcome "answered" (reported by the time the
server chose) or "unanswered" (offline first, `finished` null, or not by the round's deadline),
with `steps` 0, `samples` the samples of its forward pass, and `compute_s` that pass. Its work
is not a training task's and not in `wasted_s`.
"""

from __future__ import annotations

import numpy as np

from fedsim.sim.round_timing import Tasks

# the codes 0..5 of the outcome column: a training task's, then a question's (power-of-choice)
OUTCOMES = ("arrived", "dropped", "late", "surplus", "answered", "unanswered")
ARRIVED, DROPPED, LATE, SURPLUS, ANSWERED, UNANSWERED = range(6)
PHASES = ("download", "compute", "upload", "done")  # the codes 0..3 of the phase column
COLUMNS = ("round", "device_id", "invited_at", "started", "finished", "outcome", "download_s",
           "compute_s", "upload_s", "staleness", "steps", "samples", "phase", "work_s")


def task_events(rnd: int, ids: np.ndarray, tasks: Tasks, outcome: np.ndarray, steps: np.ndarray,
                staleness: np.ndarray | None = None, *, stop_at, wasted: bool = False) -> dict:
    """One round's invitations (outcome: the codes above); `stop_at`: when the server stopped
    waiting for each (its deadline); `wasted`: the round's arrivals were refused too (quorum)."""
    return {"n": len(ids), "round": rnd, "device_id": ids, "tasks": tasks, "outcome": outcome,
            "steps": steps, "staleness": staleness, "stop_at": stop_at, "wasted": wasted}


def failed(outcome: np.ndarray) -> np.ndarray:
    """Which rows `[run] events = "failures"` keeps: neither arrived nor answered."""
    return (outcome != ARRIVED) & (outcome != ANSWERED)


def work(tasks: Tasks, stop_at) -> tuple[np.ndarray, np.ndarray]:
    """Seconds of work each task did by the time it ended or was no longer waited for, and the
    phase it stopped in (codes of PHASES)."""
    ended = np.minimum(tasks.ends_at, stop_at)
    work_s = ended - tasks.invited_at
    done = ~tasks.dropped & (tasks.ends_at <= stop_at)
    phase = np.where(work_s < tasks.download_s, 0, np.where(work_s < tasks.download_s + tasks.compute_s, 1, 2))
    return work_s, np.where(done, 3, phase).astype(np.int8)


def wasted_seconds(events: dict) -> float:
    """Device-seconds of a round's invitations whose update the model did not receive."""
    if not events.get("n"):
        return 0.0
    unused = np.ones(events["n"], dtype=bool) if events["wasted"] else events["outcome"] != ARRIVED
    if not unused.any():  # (every update arrived: most rounds)
        return 0.0
    work_s, _ = work(events["tasks"], events["stop_at"])
    return float(work_s[unused].sum())


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
    worked = [work(b["tasks"], b["stop_at"]) for b in batches]
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
        "phase": np.concatenate([p for _, p in worked]) if batches else np.empty(0, np.int8),
        "work_s": np.concatenate([w for w, _ in worked]).astype(np.float64) if batches else np.empty(0),
    }
