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


def run_engine(server: Server, *, rounds: int, max_time: float, start_round: int = 0,
               on_round: Callable[[RoundOutcome], bool | str]) -> EngineResult:
    """Drive `server` round after round; `on_round` evaluates/records/checkpoints each one and
    returns why the run should stop now (a string), or False.

    Stops after `rounds` rounds, at `max_time` simulated seconds (0 = none), when the trace
    has nobody online ever again, when `on_round` says so, when the model stops being finite
    (status diverged), or after the round in progress on Ctrl-C or SIGTERM (status interrupted).
    """
    env = server.env
    stop = {"status": "completed", "reason": f"{rounds} rounds"}
    done = {"rounds": start_round}
    stop_signal = {"name": None}

    def main():
        rnd = start_round
        while rnd < rounds:
            if max_time and env.now >= max_time:
                stop["reason"] = f"max_time {max_time:g} s reached"
                return
            outcome = yield env.process(server.round(rnd, max_time))
            if isinstance(outcome, Stop):
                stop["reason"] = outcome.reason
                return
            asked = on_round(outcome)
            done["rounds"] = rnd = rnd + 1
            if not bool(torch.isfinite(server.strategy.params).all()):
                stop.update(status="diverged", reason=f"non-finite model after round {rnd - 1}")
                return
            if stop_signal["name"]:
                stop.update(status="interrupted",
                            reason=f"interrupted by {stop_signal['name']} after round {rnd - 1}")
                return
            if asked:
                stop["reason"] = f"{asked} (after round {rnd - 1})"
                return

    with finish_round_on_stop_signal(stop_signal):
        env.run(until=env.process(main()))
    return EngineResult(stop["status"], stop["reason"], done["rounds"], env.now)


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


__all__ = ["EngineResult", "run_engine", "new_environment"]
