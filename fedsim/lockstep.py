"""Several runs in one process, stepped together so that their cohorts train in shared
batched calls (a study of many small runs fills a device the way one large cohort does).

Each run keeps its own SimPy environment, engine, strategy and outputs, exactly as alone; the
only difference is where its round's training happens. A run's server asks its gate to train
and waits on an event; the driver steps every run until each waits on its gate (or has
ended), trains all the waiting cohorts with `train_together`, hands each run its result, and
goes on. Runs whose rounds differ in length simply wait for each other at the training step.
Asynchronous runs train on their own (their server has no gate).
"""

from __future__ import annotations

from typing import Sequence

import simpy

from fedsim.experiment import Experiment, RunResult
from fedsim.sim.engine import finish_round_on_stop_signal
from fedsim.sim.server import Server
from fedsim.training.cohort import train_together


class TrainGate:
    """Holds a run's training request until the driver trains it with the others'."""

    def __init__(self, env: simpy.Environment):
        self.env = env
        self.pending: tuple | None = None
        self.event: simpy.Event | None = None

    def request(self, server: Server, rnd, ids, start, steps, lr) -> simpy.Event:
        self.pending = (server.trainer, rnd, ids, start, steps, lr, server.strategy.local_objective)
        self.event = self.env.event()
        return self.event

    def resolve(self, result) -> None:
        self.pending = None
        self.event.succeed(result)


def run_together(experiments: Sequence[Experiment], resumes: Sequence[dict | None] = ()) -> list[RunResult]:
    """Run `experiments` (each from its checkpoint state in `resumes`, if given) in lockstep;
    their results, in order. Ctrl-C or SIGTERM stops every run after its round in progress."""
    resumes = list(resumes) or [None] * len(experiments)
    stop_signal = {"name": None}
    with experiments[0].threads.scope():
        with finish_round_on_stop_signal(stop_signal):
            engines = [e.start(r, stop_signal) for e, r in zip(experiments, resumes)]
            for engine in engines:
                if type(engine.server) is Server:
                    engine.server.gate = TrainGate(engine.env)
            live = engines
            while live:
                for engine in live:
                    gate = engine.server.gate
                    while not engine.process.triggered and (gate is None or gate.pending is None):
                        engine.env.step()
                waiting = [e.server.gate for e in live if e.server.gate is not None and e.server.gate.pending]
                for gate, result in zip(waiting, train_together([g.pending for g in waiting])):
                    gate.resolve(result)
                live = [e for e in live if not e.process.triggered]
        return [e.end() for e in experiments]
