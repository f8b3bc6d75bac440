"""A device's task as a SimPy process: it runs until it finishes or the trace takes it away."""

from __future__ import annotations

from typing import Callable

import simpy


class RoundBoard:
    """Where the devices of one round report; closes on target, all resolved, or deadline.

    Reports after closing are ignored: a device still running then is counted as late.
    """

    def __init__(self, env: simpy.Environment, invited: int, target: int):
        self.env = env
        self.invited = invited
        self.target = target
        self.arrived: list[int] = []  # cohort positions, in arrival order
        self.dropped: list[int] = []
        self.closed = env.event()

    def report(self, position: int, outcome: str) -> None:
        if self.closed.triggered:
            return
        (self.arrived if outcome == "arrived" else self.dropped).append(position)
        resolved = len(self.arrived) + len(self.dropped)
        if len(self.arrived) >= self.target or resolved >= self.invited:
            self.closed.succeed()

    def close(self) -> None:
        if not self.closed.triggered:
            self.closed.succeed()


def device_task(env: simpy.Environment, report: Callable[[int, str], None], position: int,
                ends_at: float, outcome: str):
    """Download, compute, upload: one timeout until the task ends (finished or dropped).

    The outcome is known at invitation (the trace is known in advance), so a task is one
    event, not one per phase; whoever receives the report decides whether it still counts.
    """
    yield env.timeout(max(ends_at - env.now, 0.0))
    report(position, outcome)


def deadline(env: simpy.Environment, board: RoundBoard, at: float):
    """Closes the round at `at`. Started after the devices so that a task ending exactly at
    the deadline is processed first and counts as arrived."""
    yield env.timeout(max(at - env.now, 0.0))
    board.close()
