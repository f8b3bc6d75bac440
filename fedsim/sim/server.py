"""The server process: one synchronous round after another (docs/running.md, "How a round is simulated").

Each round: ask the index who is online, let the Strategy choose, decide each invited
device's fate from the trace and the timing model (known in advance), train the devices that
will arrive in ONE batched call, run their SimPy processes, aggregate whatever arrived by
the close of the round, evaluate when due, record.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import numpy as np
import simpy
import torch

from fedsim.algorithms.base import Strategy
from fedsim.config import ServerConfig
from fedsim.sim.arrivals import ArrivalRows
from fedsim.sim.device import RoundBoard, deadline, start_device_tasks
from fedsim.sim.events import ANSWERED, ARRIVED, DROPPED, LATE, SURPLUS, UNANSWERED, task_events, wasted_seconds
from fedsim.sim.receive import finite, receive
from fedsim.sim.round_timing import Stop, Tasks, round_timing
from fedsim.sim.timing import DeviceTiming


@dataclass
class RoundOutcome:
    """Everything the recorder needs about one round."""

    round: int
    t_start: float
    t_end: float
    online: int
    invited: np.ndarray  # ids
    arrived: np.ndarray  # ids
    dropped: np.ndarray  # ids
    late: np.ndarray  # ids: missed the deadline
    train_loss: float | None
    wall_s: float
    # ids that finished in time after the round had closed at K arrivals (overcommit)
    surplus: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    close_reason: str = ""  # all-arrived | quota | deadline | nobody-invited | max-time | quorum
    events: dict = field(default_factory=dict)  # one entry per invitation (sim/events.py)
    questions: dict = field(default_factory=dict)  # power-of-choice: one entry per candidate asked
    extra: dict = field(default_factory=dict)  # server-side metrics (async: staleness)


class Server:
    def __init__(self, *, env: simpy.Environment, index, strategy: Strategy, trainer, timing: DeviceTiming,
                 cfg: ServerConfig, client_sizes: np.ndarray,
                 seed: int, device: torch.device, work: str = "full", counts_cut_rounds: bool = False):
        """`work`: `[client] work`, how much of its local steps an invited device trains.
        `counts_cut_rounds`: a round that max_time cuts short closes there and counts (training
        rules 10 and before: fedsim/training/rules.py); otherwise it does not count, so that a
        run resumed with a later max_time goes on as if it had had that max_time from the start."""
        self.env = env
        self.index = index
        self.strategy = strategy
        self.trainer = trainer
        self.cfg = cfg
        self.client_sizes = client_sizes
        self.seed = seed
        self.device = device
        self.fit_deadline = work == "fit-deadline"
        self.counts_cut_rounds = counts_cut_rounds
        self.rounds = round_timing(cfg, index=index, timing=timing, message_bytes=strategy.message_bytes(),
                                   seed=seed)
        self.gate = None  # set when runs train together (fedsim/studies/lockstep.py)
        self.known_finite: torch.Tensor | None = None  # a global model found finite with other runs'

    def state_dict(self) -> dict:
        """The server's state between rounds, for checkpoints: none, a round leaves nothing in
        flight (the asynchronous server does, sim/buffered.py)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """The state of `state_dict`."""

    def train(self, rnd: int, ids: np.ndarray, start: torch.Tensor, steps: np.ndarray, lr: float):
        """The cohort's local training: at once, or, when this run trains together with others,
        once the driver has trained every waiting run's cohort in one call."""
        if self.gate is None:
            return self.trainer.train(rnd, ids, start, steps, lr, self.strategy.local_objective_of(ids))
        return (yield self.gate.request(self, rnd, ids, start, steps, lr))

    def round(self, rnd: int, max_time: float = 0.0):
        """One synchronous round (a SimPy sub-process): wait until the round can start, invite,
        train the devices that will arrive in one batched call, let every task run until the
        round closes, aggregate what arrived (or refuse it, short of the quorum). Returns its
        RoundOutcome, or a Stop."""
        env, strategy = self.env, self.strategy
        begun = env.now
        t0 = yield from self.rounds.start(env, rnd, max_time)
        if isinstance(t0, Stop):
            return t0
        # waiting for min_selected devices is part of the round (FLASH); for anyone, it is not
        t_start = begun if self.cfg.min_selected else t0
        wall0 = time.perf_counter()
        before = self.state_before(rnd, t0, max_time)
        online = np.flatnonzero(self.index.online(t0))
        rng = np.random.default_rng([self.seed, rnd, 0x5E1])
        candidates = strategy.candidates(rnd, online, rng)
        invited_at, choices, questions, held = t0, online, {}, 0
        if candidates is not None:
            held = 4 * strategy.params.numel()  # the global model, which the question sends
            invited_at, choices, questions = yield from self.ask(rnd, candidates, t0, held, max_time)
        ids = strategy.invitations(rnd, choices, rng)
        steps = strategy.steps_of(rnd, ids)
        if self.fit_deadline and len(ids):
            steps = self.rounds.steps_that_fit(ids, steps, self.trainer.samples, invited_at,
                                               t0 + self.rounds.deadline(rnd), held)
        lr = strategy.client_lr(rnd)
        tasks = self.rounds.tasks(rnd, ids, self.trainer.samples(ids, steps), steps, invited_at, held)
        close_at, cut_short = self.close(rnd, t0, len(ids), max_time)
        target = self.rounds.target(len(ids))

        in_time = ~tasks.dropped & (tasks.ends_at <= close_at)
        # the arrivals are known now (min(target, in time)): a round short of its quorum trains nobody
        failed = min(target, int(in_time.sum())) < self.rounds.quorum(len(ids))
        trained = np.empty(0, dtype=np.int64) if failed else np.flatnonzero(in_time)
        result = start = None
        if len(trained):
            start = strategy.start_params(ids)
            if len(trained) < len(ids):
                start = start.index_select(0, torch.as_tensor(trained, device=self.device))
            result = yield from self.train(rnd, ids[trained], start, steps[trained], lr)

        # ties in end time report in a random order, so that equal speeds do not always favour
        # the lowest ids at the K-th arrival
        order = rng.permutation(len(ids))
        if self.rounds.everyone_arrives:  # ideal timing: the whole cohort reports at the close, in that order
            yield env.timeout(max(close_at - env.now, 0.0))
            arrived_pos, reason = order, "all-arrived" if len(ids) else "nobody-invited"
        else:
            arrived_pos, reason = yield from self._tasks_until_close(tasks, order, target, close_at, cut_short)
        if reason == "max-time" and not self.counts_cut_rounds:
            self.restore(before)
            return Stop(f"max_time {max_time:g} s reached before the round in progress closed (it is not counted)",
                        resume_at=begun)
        # a round that closed before max_time: its other tasks' fates are those of its own close
        # (a device still running at max_time may finish by its deadline: surplus, not late)
        fates_until = close_at if reason == "max-time" else self.rounds.close_at(rnd, t0, len(ids))
        outcome = self.outcomes(tasks, arrived_pos, fates_until)
        model = strategy.params  # (what the round's aggregation must leave a model like)
        if failed:
            strategy.refuse(rnd)
            loss = None
        else:
            missed, waited_s = self.missed(tasks, ids, arrived_pos, env.now)
            loss = yield from self.receive(ArrivalRows(
                ids=ids[arrived_pos], rows=self._rows(len(ids), arrived_pos, trained), result=result,
                steps=steps[arrived_pos], lr=lr, rnd=rnd, invited_at=invited_at,
                start=start if strategy.needs_start else None, arrived_at=tasks.ends_at[arrived_pos],
                missed=missed, waited_s=waited_s, dim=strategy.params.shape[0], device=self.device))
        strategy.check_model(rnd, model)
        events = task_events(rnd, ids, tasks, outcome, steps, stop_at=fates_until, wasted=failed)
        extra = {"wasted_s": wasted_seconds(events)}
        round_deadline = self.rounds.deadline(rnd)
        if round_deadline is not None:
            extra.update(deadline=round_deadline, wait_s=t0 - t_start)
        return RoundOutcome(
            round=rnd, t_start=t_start, t_end=env.now, online=len(online), invited=ids,
            arrived=ids[arrived_pos], dropped=ids[outcome == DROPPED], late=ids[outcome == LATE],
            surplus=ids[outcome == SURPLUS], close_reason="quorum" if failed else reason,
            train_loss=loss, wall_s=time.perf_counter() - wall0, events=events, questions=questions, extra=extra,
        )

    def ask(self, rnd: int, candidates: np.ndarray, t0: float, model_bytes: int, max_time: float):
        """Power-of-choice's question before the invitations (a SimPy sub-process): each
        candidate downloads the global model, computes its loss over its own training data (a
        forward pass, timed by its speed) and uploads it. The server chooses once every
        candidate has answered or gone offline, at the latest at the round's close; it chooses
        among those that answered, whose losses it hands to the strategy (computed in one
        batched call). Returns (when it chose, who answered, the question's events)."""
        samples = self.client_sizes[candidates]
        asked = self.rounds.question(candidates, samples, t0, model_bytes)
        close_at, _ = self.close(rnd, t0, len(candidates), max_time)
        chosen_at = min(float(asked.ends_at.max(initial=t0)), close_at)
        answered = ~asked.dropped & (asked.ends_at <= chosen_at)
        ids = candidates[answered]
        if len(ids):
            self.strategy.answered(ids, self.trainer.task.local_losses(ids, self.strategy.params))
        yield self.env.timeout(max(chosen_at - self.env.now, 0.0))
        outcome = np.where(answered, ANSWERED, UNANSWERED).astype(np.int8)
        events = task_events(rnd, candidates, asked, outcome, np.zeros(len(candidates), dtype=np.int64),
                             stop_at=chosen_at)
        return chosen_at, ids, events

    def state_before(self, rnd: int, t0: float, max_time: float) -> dict | None:
        """A copy of what a round may change before it closes (the strategy's state, the
        devices' own buffers), where max_time may cut the round short and so undo it; else None."""
        if self.counts_cut_rounds or not any(self.close(rnd, t0, invited, max_time)[1] for invited in (0, 1)):
            return None
        kept = self.trainer.task.device_buffers
        return copy.deepcopy({"strategy": self.strategy.state_dict(),
                              "device_buffers": kept.state_dict() if kept is not None else None})

    def restore(self, before: dict) -> None:
        """The state of `state_before`: the round cut short never happened."""
        self.strategy.load_state_dict(before["strategy"])
        if before["device_buffers"] is not None:
            self.trainer.task.device_buffers.load_state_dict(before["device_buffers"])

    def close(self, rnd: int, t0: float, invited: int, max_time: float) -> tuple[float, bool]:
        """When the round closes, and whether max_time cuts it short (closes it before its own
        close). Ideal rounds are never cut (a round that starts before max_time runs whole);
        under training rules 10 and before, a round that invites nobody lasts its
        round_duration past max_time, and one whose own close is max_time counts as cut."""
        own = self.rounds.close_at(rnd, t0, invited)
        if not max_time or self.rounds.everyone_arrives:
            return own, False
        if self.counts_cut_rounds:
            return (min(own, max_time), own >= max_time) if invited else (own, False)
        return min(own, max_time), own > max_time

    def _tasks_until_close(self, tasks: Tasks, order: np.ndarray, target: int, close_at: float, cut_short: bool):
        """The invited devices' tasks as SimPy processes until the round closes (devices with
        speeds and links): the positions that arrived, in arrival order, and why it closed."""
        env, invited = self.env, len(order)
        board = RoundBoard(env, invited=invited, target=target)
        reports = np.where(tasks.dropped, "dropped", "arrived").astype(object)
        start_device_tasks(env, board.report, order, tasks.ends_at, reports)
        why = "max-time" if cut_short else "nobody-invited" if not invited else "deadline"
        env.process(deadline(env, board, close_at, why))
        yield board.closed
        return np.asarray(board.arrived, dtype=np.int64), board.reason

    @staticmethod
    def outcomes(tasks: Tasks, arrived_pos: np.ndarray, close_at: float) -> np.ndarray:
        """What each invitation came to: arrived (counted), dropped (offline before it finished,
        by the deadline), surplus (finished by the deadline, after the round had closed at K
        arrivals), late (neither by the deadline); codes of sim/events.py."""
        outcome = np.full(len(tasks.ends_at), LATE, dtype=np.int8)
        in_time = tasks.ends_at <= close_at
        outcome[in_time & tasks.dropped] = DROPPED
        outcome[in_time & ~tasks.dropped] = SURPLUS
        outcome[arrived_pos] = ARRIVED
        return outcome

    @staticmethod
    def missed(tasks: Tasks, ids: np.ndarray, arrived_pos: np.ndarray, closed_at: float):
        """The invited devices whose update did not arrive, and the seconds the server waited on
        each: until it went offline, or until the round closed."""
        missing = np.ones(len(ids), dtype=bool)
        missing[arrived_pos] = False
        return ids[missing], np.minimum(tasks.ends_at[missing], closed_at) - tasks.invited_at

    def receive(self, arrivals: ArrivalRows):
        """The strategy's `receive` of the round's arrivals, and their mean training loss (None:
        nobody arrived): at once, or, when this run steps with others whose numbers may differ
        from their runs alone by float rounding (a lockstep group on a GPU), in the driver's
        step for all of them."""
        if self.gate is not None and self.gate.rounding_allowed:
            loss, self.known_finite = yield self.gate.request_receive(self.strategy, arrivals)
            return loss
        return receive(self.strategy, arrivals.rnd, arrivals.arrivals())

    def model_finite(self) -> bool:
        """Whether the global model is finite: known already where the group's receive read it
        back with its other runs' (`known_finite`: one wait for all on a GPU), else looked at."""
        params = self.strategy.params
        return params is self.known_finite or finite(params)

    @staticmethod
    def _rows(invited: int, arrived_pos: np.ndarray, trained: np.ndarray) -> np.ndarray:
        """Each arrival's row in the training result, which holds the `trained` positions' rows."""
        row_of = np.full(invited, -1, dtype=np.int64)
        row_of[trained] = np.arange(len(trained))
        return row_of[arrived_pos]
