"""A device's task as a SimPy process: it runs until it finishes or the trace takes it away."""

from __future__ import annotations

from typing import Callable

import numpy as np
import simpy


class RoundBoard:
    """Where the devices of one round report; closes when every invited device has reported
    ("all-arrived"), at `target` arrivals ("quota"), or at the deadline; `reason` says which.

    Reports after closing are ignored: the server decides what those devices were.
    """

    def __init__(self, env: simpy.Environment, invited: int, target: int):
        self.env = env
        self.invited = invited
        self.target = target
        self.arrived: list[int] = []  # cohort positions, in arrival order
        self.dropped: list[int] = []
        self.closed = env.event()
        self.reason = ""

    def report(self, position: int, outcome: str) -> None:
        if self.closed.triggered:
            return
        (self.arrived if outcome == "arrived" else self.dropped).append(position)
        if len(self.arrived) + len(self.dropped) >= self.invited:
            self.close("all-arrived")
        elif len(self.arrived) >= self.target:
            self.close("quota")

    def close(self, reason: str) -> None:
        if not self.closed.triggered:
            self.reason = reason
            self.closed.succeed()


def device_tasks(env: simpy.Environment, report: Callable[[int, str], None], positions: np.ndarray,
                 ends_at: float, outcomes: np.ndarray, started_at: float | None = None):
    """Download, compute, upload of the devices whose tasks end at the same instant: one
    timeout until then (finished or dropped), then each reports, in the given order.

    The outcome is known at invitation (the trace is known in advance), so a task is one
    event, not one per phase, and devices that end together share it (under ideal timing a
    whole cohort is one event); whoever receives a report decides whether it still counts.
    `started_at`: when tasks that a resumed run restarts had started; they end at the instant
    they would have ended (sim/engine.py's `Environment.timeout_at`).
    """
    if started_at is None:
        yield env.timeout(max(ends_at - env.now, 0.0))
    else:
        yield env.timeout_at(started_at + max(ends_at - started_at, 0.0))
    for position, outcome in zip(positions.tolist(), outcomes.tolist()):
        report(position, outcome)


def start_device_tasks(env: simpy.Environment, report: Callable[[int, str], None], order: np.ndarray,
                       ends_at: np.ndarray, outcomes: np.ndarray, started_at: float | None = None) -> None:
    """One `device_tasks` process per distinct end time. Devices that end at the same instant
    report in `order` (SimPy runs simultaneous events in the order they were scheduled)."""
    order = order[np.argsort(ends_at[order], kind="stable")]
    for group in np.split(order, np.flatnonzero(np.diff(ends_at[order])) + 1) if len(order) else ():
        env.process(device_tasks(env, report, group, ends_at[group[0]], outcomes[group], started_at))


def deadline(env: simpy.Environment, board: RoundBoard, at: float, reason: str):
    """Closes the round at `at` for `reason`. Started after the devices so that a task ending
    exactly at the deadline is processed first and counts as arrived."""
    yield env.timeout(max(at - env.now, 0.0))
    board.close(reason)
