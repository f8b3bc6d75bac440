"""Runs the server's rounds in a SimPy environment until the run's end (rounds, time, trace)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import simpy
import torch

from fedsim.sim.server import RoundOutcome, Server


@dataclass
class EngineResult:
    status: str  # completed | diverged | interrupted
    reason: str  # why it stopped, in words
    rounds: int  # rounds completed
    sim_time: float


def run_engine(server: Server, *, rounds: int, max_time: float, start_round: int = 0,
               on_round: Callable[[RoundOutcome], None]) -> EngineResult:
    """Drive `server` round after round; `on_round` evaluates/records/checkpoints each one.

    Stops after `rounds` rounds, at `max_time` simulated seconds (0 = none), when the trace
    has nobody online ever again, or when the model stops being finite (status diverged).
    """
    env = server.env
    stop = {"status": "completed", "reason": f"{rounds} rounds"}
    done = {"rounds": start_round}

    def main():
        rnd = start_round
        while rnd < rounds:
            if max_time and env.now >= max_time:
                stop["reason"] = f"max_time {max_time:g} s reached"
                return
            outcome = yield env.process(server.round(rnd, max_time))
            if outcome is None:
                stop["reason"] = server.stop_reason
                return
            on_round(outcome)
            done["rounds"] = rnd = rnd + 1
            if not bool(torch.isfinite(server.strategy.params).all()):
                stop.update(status="diverged", reason=f"non-finite model after round {rnd - 1}")
                return

    try:
        env.run(until=env.process(main()))
    except KeyboardInterrupt:
        stop.update(status="interrupted", reason="interrupted by the user")
    return EngineResult(stop["status"], stop["reason"], done["rounds"], env.now)


def new_environment(start_time: float = 0.0) -> simpy.Environment:
    return simpy.Environment(initial_time=start_time)


__all__ = ["EngineResult", "run_engine", "new_environment"]
