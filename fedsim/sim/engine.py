"""Runs the server's rounds in a SimPy environment until the run's end (rounds, time, trace)."""

from __future__ import annotations

import signal
from contextlib import contextmanager
from dataclasses import dataclass
from heapq import heappush
from typing import Callable, Generator

import simpy

from fedsim.errors import STOP_SIGNALS, Stopped, on_stop_signals, say_stopping
from fedsim.sim.round_timing import Stop
from fedsim.sim.server import RoundOutcome, Server


@dataclass
class EngineResult:
    status: str  # completed | diverged | interrupted
    reason: str  # why it stopped, in words
    rounds: int  # rounds completed
    sim_time: float


class Engine:
    """The server's rounds as one SimPy process in the server's environment, until the run's
    end (rounds, time, trace, divergence, a stop signal or `on_round`'s word).

    `on_round` evaluates/records/checkpoints each round and returns why the run should stop
    now (a string), or False; `diverged` says why a round's outcome means divergence (beyond
    a non-finite model), or None. `stop_signal` is the dict that `finish_round_on_stop_signal`
    fills; several engines driven together (fedsim/studies/lockstep.py) share one.
    """

    def __init__(self, server: Server, *, rounds: int, max_time: float, start_round: int = 0,
                 on_round: Callable[[RoundOutcome], bool | str], stop_signal: dict,
                 diverged: Callable[[RoundOutcome], str | None] = lambda outcome: None,
                 before_callbacks: Callable[[RoundOutcome], Generator] | None = None):
        self.server, self.env = server, server.env
        self.before_callbacks = before_callbacks  # what the round may wait for first (lockstep's evaluation)
        self.rounds, self.max_time = rounds, max_time
        self.on_round, self.stop_signal, self.diverged = on_round, stop_signal, diverged
        self.status, self.reason = "completed", f"{rounds} rounds"
        self.done = start_round
        self.end_time: float | None = None  # where the run's state stands, when not at env.now
        server.stop_signal = stop_signal  # (an asynchronous aggregation may end on it: sim/buffered.py)
        self.process = self.env.process(self._main(start_round))

    def _main(self, rnd: int):
        env, max_time, server = self.env, self.max_time, self.server
        while rnd < self.rounds:
            if max_time and env.now >= max_time:
                self.reason = f"max_time {max_time:g} s reached"
                return
            if self.stop_signal["name"]:  # it came while the run started: no round to finish
                self.status = "interrupted"
                self.reason = f"interrupted by {self.stop_signal['name']} before round {rnd}"
                return
            outcome = yield from server.round(rnd, max_time)
            if isinstance(outcome, Stop):
                self.reason = outcome.reason
                if outcome.interrupted:
                    self.status = "interrupted"
                self.end_time = outcome.resume_at
                return
            if self.before_callbacks is not None:
                yield from self.before_callbacks(outcome)
            asked = self.on_round(outcome)
            self.done = rnd = rnd + 1
            if not server.model_finite():
                self.status, self.reason = "diverged", f"non-finite model after {rounds(rnd)}"
                return
            why = self.diverged(outcome)
            if why:
                self.status, self.reason = "diverged", f"{why} after {rounds(rnd)}"
                return
            if self.stop_signal["name"]:
                self.status = "interrupted"
                self.reason = f"interrupted by {self.stop_signal['name']} after {rounds(rnd)}"
                return
            if asked:
                self.reason = f"{asked} (after {rounds(rnd)})"
                return

    def result(self) -> EngineResult:
        return EngineResult(self.status, self.reason, self.done,
                            self.env.now if self.end_time is None else self.end_time)


def rounds(n: int) -> str:
    """`12 rounds`: a count, as the tables count rounds (rounds.parquet numbers them from 0)."""
    return f"{n} round{'s' * (n != 1)}"


def run_engine(server: Server, *, rounds: int, max_time: float, start_round: int = 0,
               on_round: Callable[[RoundOutcome], bool | str]) -> EngineResult:
    """Drive `server` round after round until the run's end (see Engine); the first Ctrl-C or
    SIGTERM lets the round in progress finish (status interrupted)."""
    stop_signal = {"name": None}
    with finish_round_on_stop_signal(stop_signal):
        engine = Engine(server, rounds=rounds, max_time=max_time, start_round=start_round,
                        on_round=on_round, stop_signal=stop_signal)
        server.env.run(until=engine.process)
    return engine.result()


@contextmanager
def finish_round_on_stop_signal(stop_signal: dict, notice: str = "stopping after this round"):
    """The first Ctrl-C or SIGTERM (`kill`, `timeout`, a batch scheduler's time limit) lets the
    round in progress finish, so that the run stops at a round boundary with its results and a
    consistent checkpoint to resume from (`notice`, on stderr, says what it waits for: "" for
    nothing); a second one aborts at once (Stopped), leaving the last periodic checkpoint in place. Nested
    (a comparison's algorithm, a study's group of points), the signal reaches the enclosing
    one too: it stops the comparison or study after this run."""
    def handler(signum, frame):
        if stop_signal["name"]:
            raise Stopped(STOP_SIGNALS[signum])
        stop_signal["name"] = STOP_SIGNALS[signum]
        if notice:
            say_stopping(f"{notice} ({stop_signal['name']} again to abort)")

    handler.stop_signal = stop_signal
    with on_stop_signals(handler) as previous:
        yield
    outer = getattr(previous.get(signal.SIGINT), "stop_signal", None)
    if outer is not None and stop_signal["name"] and not outer["name"]:
        outer["name"] = stop_signal["name"]


class Environment(simpy.Environment):
    """SimPy's environment, whose timeouts can also end at a given instant (`timeout_at`)."""

    def timeout_at(self, at: float) -> simpy.Event:
        """A timeout that ends at exactly `at` (>= now): a resumed run ends its tasks in flight
        at the instants the stopped run had them end, which `timeout(at - now)` cannot promise
        (SimPy's now + (at - now) may round to a neighbour of `at`)."""
        timeout = simpy.Event(self)
        timeout._ok, timeout._value = True, None  # triggered, as simpy.Timeout is
        heappush(self._queue, (max(at, self.now), simpy.events.NORMAL, next(self._eid), timeout))  # its `schedule`
        return timeout


def new_environment(start_time: float = 0.0) -> Environment:
    return Environment(initial_time=start_time)


__all__ = ["Engine", "EngineResult", "Environment", "finish_round_on_stop_signal", "new_environment", "run_engine"]
