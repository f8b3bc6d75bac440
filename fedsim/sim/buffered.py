"""Asynchronous buffered aggregation (``server.mode = "async"``, FedBuff-style).

The server keeps up to ``concurrency`` devices training, each from the model current when it
was invited, and aggregates every ``buffer`` arrivals: one aggregation is one row of
rounds.parquet. Free slots are refilled whenever a task ends.

Who may be invited: online devices that are not training and have not yet run on the current
model version. When nobody is training and every such device already ran on it (fewer than
``buffer`` distinct devices can report on this version: few devices online, or their tasks
dropped), they may run again on the same version, so the buffer always fills if anyone can
arrive. A repeat starts from the same model with the same randomness key (seed, round,
device) as the first run, so it sends the same update again: that device weighs more in
the aggregation, the price of a buffer larger than the devices available.

Simulated time always moves on: with nobody online the server sleeps until the index says
someone comes online; when the Strategy invites nobody although devices are free it retries
``round_duration`` later. An aggregation that cannot fill its buffer ends the run (the round
returns a Stop saying why): the trace has nobody online ever again, or
``max_time`` is reached (checked before every invitation or wait; neither the retry nor the
wait for the next task's end goes past it: a task that ends later is not heard of), so a run
with ``max_time`` always ends, at ``max_time``. Updates buffered then are not aggregated
and the tasks of that unfinished aggregation are not recorded.

A task still running at the deadline (invitation + ``deadline``) is late, also when the device
goes offline after the deadline: it was late before it dropped.

Training stays batched: every device invited while model version v is current starts from
the same server state, and none of their updates is needed before the aggregation that closes
version v, so all of them are trained in ONE call at that moment (the ones that will drop or
overrun the deadline are skipped: their fate is known when they are invited).

A checkpoint holds the server's whole state (`state_dict`): the tasks in flight (who, from which
version, their fate, their trained updates, and their start parameters for a Strategy that
needs them), the reports not yet read, the buffer, the
aggregation in progress (a stop at max_time ends the run inside one) and the counters. A resumed
run restarts the tasks in flight in the order they started, to end at the very instants they
would have ended, so it goes on exactly as the stopped run would have.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields
from types import SimpleNamespace

import numpy as np
import simpy
import torch

from fedsim.algorithms.base import Arrivals
from fedsim.sim.device import start_device_tasks
from fedsim.sim.events import ARRIVED, OUTCOMES, task_events, wasted_seconds
from fedsim.sim.round_timing import Stop, Tasks, wait_for_someone
from fedsim.sim.server import RoundOutcome, Server


RESULT_FIELDS = ("deltas", "loss", "samples")  # what the trainer computed, per device that will arrive


@dataclass
class Dispatch:
    """Devices invited together: what they start from, their fate, and (later) what they computed."""

    number: int  # the server's count of dispatches when it was made: the order its tasks started in
    version: int
    at: float  # simulated time of the invitation
    ids: np.ndarray
    start: torch.Tensor | None  # [k, d] (None once trained, unless the Strategy needs_start)
    steps: np.ndarray
    lr: float
    will_arrive: np.ndarray  # bool [k]
    tasks: Tasks
    ends_at: np.ndarray  # when each device reports (at the deadline, if still running then)
    fate: np.ndarray  # what each reports: arrived, dropped, late
    reported: np.ndarray  # bool [k]: its task has ended
    rows: np.ndarray | None = None  # row of each device in `result` (-1: not trained)
    result: object = None  # TrainResult of the devices that will arrive


@dataclass
class Aggregation:
    """The aggregation in progress: when it began, who was invited for it, which of their
    tasks ended dropped or late (dispatch, position, outcome)."""

    t_start: float
    invited: list = field(default_factory=list)
    resolved: list = field(default_factory=list)


class BufferedServer(Server):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        n = len(self.client_sizes)
        self.busy = np.zeros(n, dtype=bool)
        self.ran_this_version = np.zeros(n, dtype=bool)  # repeats only when needed (docstring)
        self.done = simpy.Store(self.env)  # (dispatch, position, outcome) of the tasks that ended
        self.running = 0
        self.untrained: list[Dispatch] = []
        self.buffer: list[tuple[Dispatch, int]] = []
        self.dispatches = 0
        self.in_flight: dict[int, Dispatch] = {}  # by number: the dispatches with a task still running
        self.open: Aggregation | None = None
        self.retry_at = 0.0  # when an empty selection is retried (kept where max_time cut the wait)
        self.stop_signal = {"name": None}  # the engine's (sim/engine.py)
        self.signalled_at: float | None = None  # simulated time an aggregation first saw a stop signal

    def round(self, rnd: int, max_time: float = 0.0):
        """Run until `buffer` updates have arrived, then aggregate them; None if the run is over."""
        wall0 = time.perf_counter()
        if self.open is None:
            self.open = Aggregation(self.env.now)
        agg = self.open
        resume_at = min(self.retry_at, max_time) if max_time else self.retry_at
        if resume_at > self.env.now:  # resumed where max_time had cut a retry's wait short
            yield self.env.timeout_at(resume_at)
        while len(self.buffer) < self.cfg.buffer:
            if max_time and self.env.now >= max_time:
                return self._stop(rnd, f"max_time {max_time:g} s reached")
            if self._cut_by_stop_signal():
                return self._stop(rnd, f"interrupted by {self.stop_signal['name']}", interrupted=True)
            self.retry_at = 0.0
            agg.invited.append(self._refill(rnd))
            if self.running == 0:  # nobody training, nobody invited: let simulated time move on
                if not self.index.online(self.env.now).any():
                    reason = yield self.env.process(wait_for_someone(self.env, self.index, max_time))
                    if reason:
                        return self._stop(rnd, reason)
                else:  # free devices, but the Strategy invited none of them: retry later
                    wait = self.cfg.round_duration
                    self.retry_at = self.env.now + wait
                    yield self.env.timeout(min(wait, max_time - self.env.now) if max_time else wait)
                continue
            report = self.done.get()
            if max_time:  # a task that ends after max_time is not heard of: the run stops there
                yield report | self.env.timeout(max(max_time - self.env.now, 0.0))
                if not report.triggered:
                    report.cancel()
                    continue
            dispatch, pos, outcome = yield report
            device = dispatch.ids[pos]
            self.running -= 1
            self.busy[device] = False
            if outcome == "arrived":
                self.buffer.append((dispatch, pos))
            else:
                agg.resolved.append((dispatch, pos, outcome))
        self._train_untrained(rnd)
        taken, self.buffer, self.open = self.buffer, [], None
        arrivals = self._arrivals_of(taken)
        resolved = agg.resolved
        # the dropped and late tasks of this aggregation, and how long the server waited on each
        arrivals.missed = self._ids(resolved)
        arrivals.waited_s = np.array([d.ends_at[pos] - d.at for d, pos, _ in resolved], dtype=np.float64)
        model = self.strategy.params
        self.strategy.receive(rnd, arrivals)
        self.strategy.check_model(rnd, model)
        self.ran_this_version[:] = False
        outcome = np.array([o for _, _, o in resolved], dtype=object)  # the tasks' reports
        events = self._events(rnd, taken, resolved)
        return RoundOutcome(
            round=rnd, t_start=agg.t_start, t_end=self.env.now,
            online=int(self.index.online(self.env.now).sum()),
            invited=np.concatenate(agg.invited), arrived=arrivals.ids,
            dropped=self._ids(resolved)[outcome == "dropped"], late=self._ids(resolved)[outcome == "late"],
            train_loss=float(arrivals.loss.mean()), wall_s=time.perf_counter() - wall0,
            close_reason="quota", events=events,
            extra={"staleness": float(np.mean(rnd - arrivals.version)), "wasted_s": wasted_seconds(events)},
        )

    def state_dict(self) -> dict:
        """What a resumed run needs to go on exactly as this one would (module docstring): the
        dispatches that still matter, the others referring to them by their place in the list."""
        reports = list(self.done.items)
        resolved = self.open.resolved if self.open else []
        held = [*self.in_flight.values(), *(d for d, *_ in [*reports, *self.buffer, *resolved]), *self.untrained]
        live = sorted({id(d): d for d in held}.values(), key=lambda d: d.number)
        place = {id(d): i for i, d in enumerate(live)}
        results = list({id(d.result): d.result for d in live if d.result is not None}.values())
        result_of = {id(r): i for i, r in enumerate(results)}
        return {  # (a trained dispatch keeps its start only for a Strategy that needs it)
            "dispatches": [{**{f.name: getattr(d, f.name) for f in fields(Dispatch)}, "tasks": asdict(d.tasks),
                            "result": result_of.get(id(d.result), -1)} for d in live],
            "results": [{name: getattr(r, name).detach().clone() for name in RESULT_FIELDS} for r in results],
            "reports": [(place[id(d)], pos, outcome) for d, pos, outcome in reports],
            "buffer": [(place[id(d)], pos) for d, pos in self.buffer],
            "untrained": [place[id(d)] for d in self.untrained],
            "open": None if self.open is None else {
                "t_start": self.open.t_start, "invited": self.open.invited,
                "resolved": [(place[id(d)], pos, outcome) for d, pos, outcome in resolved]},
            "busy": self.busy.copy(), "ran_this_version": self.ran_this_version.copy(), "running": self.running,
            "dispatches_made": self.dispatches, "retry_at": self.retry_at,
        }

    def load_state_dict(self, state: dict) -> None:
        """The state of `state_dict`; the tasks in flight start again, in the order they first
        started, to end at the instants they would have ended."""
        results = [SimpleNamespace(**{name: r[name].to(self.device) for name in RESULT_FIELDS})
                   for r in state["results"]]
        live = []
        for saved in state["dispatches"]:
            start = saved["start"]
            live.append(Dispatch(**{**saved, "tasks": Tasks(**saved["tasks"]),
                                    "start": None if start is None else start.to(self.device),
                                    "result": results[saved["result"]] if saved["result"] >= 0 else None}))
        self.done.items.extend((live[i], pos, outcome) for i, pos, outcome in state["reports"])
        self.buffer = [(live[i], pos) for i, pos in state["buffer"]]
        self.untrained = [live[i] for i in state["untrained"]]
        agg = state["open"]
        self.open = None if agg is None else Aggregation(
            agg["t_start"], list(agg["invited"]), [(live[i], pos, outcome) for i, pos, outcome in agg["resolved"]])
        self.busy, self.ran_this_version = state["busy"].copy(), state["ran_this_version"].copy()
        self.running, self.dispatches, self.retry_at = state["running"], state["dispatches_made"], state["retry_at"]
        for d in live:
            if not d.reported.all():
                self._start_tasks(d, np.flatnonzero(~d.reported), started_at=d.at)

    @staticmethod
    def _ids(resolved: list) -> np.ndarray:
        return np.array([d.ids[pos] for d, pos, *_ in resolved], dtype=np.int64)

    def _events(self, rnd: int, taken: list, resolved: list) -> dict[str, np.ndarray]:
        """The events of the invitations this aggregation resolved: the buffered arrivals, then
        the dropped and late (a buffer holds a few devices: gathered entry by entry)."""
        entries = [(d, pos, "arrived") for d, pos in taken] + resolved
        pick = lambda get: np.array([get(d)[pos] for d, pos, _ in entries])  # noqa: E731
        tasks = Tasks(pick(lambda d: np.full(len(d.ids), d.at)), pick(lambda d: d.tasks.download_s),
                      pick(lambda d: d.tasks.compute_s), pick(lambda d: d.tasks.upload_s),
                      pick(lambda d: d.tasks.samples), pick(lambda d: d.tasks.dropped),
                      pick(lambda d: d.tasks.ends_at))
        outcome = np.array([OUTCOMES.index(o) for *_, o in entries], dtype=np.int8)
        staleness = np.where(outcome == ARRIVED, rnd - pick(lambda d: np.full(len(d.ids), d.version)), -1)
        return task_events(rnd, pick(lambda d: d.ids), tasks, outcome, pick(lambda d: d.steps), staleness,
                           stop_at=tasks.invited_at + self.cfg.deadline)

    def _cut_by_stop_signal(self) -> bool:
        """Whether a stop signal ends the aggregation in progress where it is, as max_time does
        (its checkpoint holds it; a resume goes on from there): once it has gone on for a
        deadline of simulated time after the signal, the time any task it invited needs to
        end. Until then it may finish, as a round does; one whose updates do not come (tasks
        all late) would never finish."""
        if not self.stop_signal["name"]:
            return False
        if self.signalled_at is None:
            self.signalled_at = self.env.now
        return self.env.now >= self.signalled_at + self.cfg.deadline

    def _stop(self, rnd: int, reason: str, interrupted: bool = False) -> Stop:
        """End the run in the middle of an aggregation."""
        return Stop(f"{reason} (aggregation {rnd} unfinished: "
                    f"{len(self.buffer)} of {self.cfg.buffer} updates buffered)", interrupted)

    def _candidates(self) -> np.ndarray:
        """Free online devices that have not run on this version; when nobody is training and
        there are none, the free online devices that did (repeats, see the module docstring)."""
        free = self.index.online(self.env.now) & ~self.busy
        fresh = free & ~self.ran_this_version
        return np.flatnonzero(fresh if self.running or fresh.any() else free)

    def _refill(self, rnd: int) -> np.ndarray:
        """Invite devices into the free slots; their fate is decided now, training later."""
        free = self.cfg.concurrency - self.running
        candidates = self._candidates()
        if free <= 0 or not len(candidates):
            return np.empty(0, dtype=np.int64)
        self.dispatches += 1
        rng = np.random.default_rng([self.seed, rnd, self.dispatches, 0xA5])
        ids = self.strategy.invitations(rnd, candidates, rng)
        if len(ids) > free:
            ids = np.sort(rng.choice(ids, size=free, replace=False))
        if not len(ids):
            return ids
        now = self.env.now
        steps = self.strategy.steps_of(rnd, ids)
        if self.fit_deadline:
            steps = self.rounds.steps_that_fit(ids, steps, self.trainer.samples, now, now + self.cfg.deadline)
        tasks = self.rounds.tasks(rnd, ids, self.trainer.samples(ids, steps), steps, now)
        fate = np.where(tasks.dropped, "dropped", "arrived").astype(object)
        # still running at the deadline: late, also when the device drops (goes offline) after it
        overrun = tasks.ends_at > now + self.cfg.deadline
        fate[overrun] = "late"
        ends_at = np.where(overrun, now + self.cfg.deadline, tasks.ends_at)
        # a dispatch none of whose updates arrive keeps no start (an aggregation may invite for long)
        arrive = fate == "arrived"
        start = self.strategy.start_params(ids).clone() if arrive.any() else None
        dispatch = Dispatch(self.dispatches, rnd, now, ids, start, steps, self.strategy.client_lr(rnd), arrive, tasks,
                            ends_at, fate, np.zeros(len(ids), dtype=bool))
        self.untrained.append(dispatch)
        self.busy[ids] = True
        self.ran_this_version[ids] = True
        self.running += len(ids)
        self._start_tasks(dispatch, np.arange(len(ids)))
        return ids

    def _start_tasks(self, dispatch: Dispatch, positions: np.ndarray, started_at: float | None = None) -> None:
        """The tasks of these devices of `dispatch` as SimPy processes, which report to `done`
        (`started_at`: tasks a resumed run restarts)."""
        def report(pos: int, outcome: str) -> None:
            dispatch.reported[pos] = True
            if dispatch.reported.all():
                del self.in_flight[dispatch.number]
            self.done.put((dispatch, pos, outcome))

        self.in_flight[dispatch.number] = dispatch
        start_device_tasks(self.env, report, positions, dispatch.ends_at, dispatch.fate, started_at)

    def _train_untrained(self, rnd: int) -> None:
        """One batched call for every device invited on the model version that closes now."""
        todo, self.untrained = self.untrained, []
        parts = [(d, np.flatnonzero(d.will_arrive)) for d in todo]
        parts = [(d, pos) for d, pos in parts if len(pos)]
        if not parts:
            return
        ids = np.concatenate([d.ids[pos] for d, pos in parts])
        start = torch.cat([d.start[torch.as_tensor(pos, device=self.device)] for d, pos in parts])
        if not self.strategy.needs_start:
            for d in todo:
                d.start = None  # (not needed any more)
        steps = np.concatenate([d.steps[pos] for d, pos in parts])
        lr = torch.cat([torch.full((len(pos),), float(d.lr), device=self.device) for d, pos in parts])
        # (asked now: the Strategy has not changed since these devices were invited, it aggregates next)
        result = self.trainer.train(rnd, ids, start, steps, lr, self.strategy.local_objective_of(ids))
        offset = 0
        for d, pos in parts:
            d.rows = np.full(len(d.ids), -1, dtype=np.int64)
            d.rows[pos] = offset + np.arange(len(pos))
            d.result = result
            offset += len(pos)

    def _arrivals_of(self, taken: list[tuple[Dispatch, int]]) -> Arrivals:
        """Gather the buffered updates: one index per training call, not one per device."""
        calls: dict[int, tuple[object, list[int]]] = {}
        for d, pos in taken:
            calls.setdefault(id(d.result), (d.result, []))[1].append(int(d.rows[pos]))
        parts = [(result, torch.as_tensor(rows, device=self.device)) for result, rows in calls.values()]

        def gather(field: str) -> torch.Tensor:
            return torch.cat([getattr(result, field)[rows] for result, rows in parts])

        # the same order as the gathered rows: grouped by training call
        order = sorted(range(len(taken)), key=lambda j: list(calls).index(id(taken[j][0].result)))
        taken = [taken[j] for j in order]
        return Arrivals(
            ids=np.array([d.ids[pos] for d, pos in taken], dtype=np.int64),
            deltas=gather("deltas"), samples=gather("samples"), loss=gather("loss"),
            steps=torch.as_tensor(np.array([d.steps[pos] for d, pos in taken]), device=self.device),
            version=np.array([d.version for d, _ in taken], dtype=np.int64),
            lr=torch.tensor([float(d.lr) for d, _ in taken], device=self.device),
            invited_at=np.array([d.at for d, _ in taken], dtype=np.float64),
            start=torch.stack([d.start[pos] for d, pos in taken]) if self.strategy.needs_start else None,
            arrived_at=np.array([d.ends_at[pos] for d, pos in taken], dtype=np.float64),
        )
