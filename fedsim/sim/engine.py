"""Runs the server's rounds in a SimPy environment until the run's end (rounds, time, trace)."""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

import simpy
import torch

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
                 diverged: Callable[[RoundOutcome], str | None] = lambda outcome: None):
        self.server, self.env = server, server.env
        self.rounds, self.max_time = rounds, max_time
        self.on_round, self.stop_signal, self.diverged = on_round, stop_signal, diverged
        self.status, self.reason = "completed", f"{rounds} rounds"
        self.done = start_round
        self.process = self.env.process(self._main(start_round))

    def _main(self, rnd: int):
        env, max_time, server = self.env, self.max_time, self.server
        while rnd < self.rounds:
            if max_time and env.now >= max_time:
                self.reason = f"max_time {max_time:g} s reached"
                return
            outcome = yield env.process(server.round(rnd, max_time))
            if isinstance(outcome, Stop):
                self.reason = outcome.reason
                return
            asked = self.on_round(outcome)
            self.done = rnd = rnd + 1
            if not bool(torch.isfinite(server.strategy.params).all()):
                self.status, self.reason = "diverged", f"non-finite model after round {rnd - 1}"
                return
            why = self.diverged(outcome)
            if why:
                self.status, self.reason = "diverged", f"{why} after round {rnd - 1}"
                return
            if self.stop_signal["name"]:
                self.status = "interrupted"
                self.reason = f"interrupted by {self.stop_signal['name']} after round {rnd - 1}"
                return
            if asked:
                self.reason = f"{asked} (after round {rnd - 1})"
                return

    def result(self) -> EngineResult:
        return EngineResult(self.status, self.reason, self.done, self.env.now)


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


STOP_SIGNALS = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}


@contextmanager
def finish_round_on_stop_signal(stop_signal: dict):
    """The first Ctrl-C or SIGTERM (`kill`, `timeout`, a batch scheduler's time limit) lets the
    round in progress finish, so that the run stops at a round boundary with its results and a
    consistent checkpoint to resume from; a second one aborts at once (KeyboardInterrupt),
    leaving the last periodic checkpoint in place."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        if stop_signal["name"]:
            raise KeyboardInterrupt
        stop_signal["name"] = STOP_SIGNALS[signum]
        print(f"\nstopping after this round ({stop_signal['name']} again to abort)",
              file=sys.stderr, flush=True)

    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, old_handler in previous.items():
            signal.signal(sig, old_handler)


def new_environment(start_time: float = 0.0) -> simpy.Environment:
    return simpy.Environment(initial_time=start_time)


__all__ = ["Engine", "EngineResult", "finish_round_on_stop_signal", "new_environment", "run_engine"]
