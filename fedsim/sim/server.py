"""The server process: one synchronous round after another (README, "How a round is simulated").

Each round: ask the index who is online, let the Strategy choose, decide each invited
device's fate from the trace and the timing model (known in advance), train the devices that
will arrive in ONE batched call, run their SimPy processes, aggregate whatever arrived by
the close of the round, evaluate when due, record.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import simpy
import torch

from fedsim.algorithms.base import Arrivals, Strategy
from fedsim.config import ServerConfig
from fedsim.sim.device import RoundBoard, deadline, start_device_tasks
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
    late: np.ndarray  # ids
    train_loss: float | None
    wall_s: float
    extra: dict = field(default_factory=dict)  # server-side metrics (async: staleness)


def invite_budget(cfg: ServerConfig) -> int:
    """How many devices to invite per round: K, or ceil(K (1 + overcommit)) under model timing
    (0 = every online device). Ideal timing has no stragglers to overcommit against."""
    k = cfg.clients_per_round
    if not k or cfg.timing == "ideal":
        return k
    return math.ceil(k * (1 + cfg.overcommit) - 1e-9)  # 10 * 1.1 is 11.000000000000002


def round_target(cfg: ServerConfig, invited: int) -> int:
    """Arrivals that close a round early: the first K when the server overcommitted, otherwise
    every invited device (algorithms that invite more than K want all of their updates)."""
    k = cfg.clients_per_round
    if cfg.overcommit > 0 and 0 < k < invited <= invite_budget(cfg):
        return k
    return invited


class Server:
    def __init__(self, *, env: simpy.Environment, index, strategy: Strategy, trainer, timing: DeviceTiming,
                 cfg: ServerConfig, batch_size: int, client_sizes: np.ndarray, model_bytes: int,
                 seed: int, device: torch.device):
        self.env = env
        self.index = index
        self.strategy = strategy
        self.trainer = trainer
        self.timing = timing
        self.cfg = cfg
        self.batch_size = batch_size
        self.client_sizes = client_sizes
        self.model_bytes = model_bytes
        self.seed = seed
        self.device = device

    stop_reason = ""

    def wait_for_someone(self, max_time: float = 0.0):
        """Sleep until a device is online (now, or when the index says). False if none ever will
        (or not before max_time): the run is over, and `stop_reason` says why."""
        t_next = self.index.next_online(self.env.now)
        if math.isinf(t_next):
            self.stop_reason = "the trace has nobody online after this point"
            return False
        if max_time and t_next >= max_time:
            self.stop_reason = f"max_time {max_time:g} s reached while nobody was online"
            return False
        if t_next > self.env.now:
            yield self.env.timeout(t_next - self.env.now)
        return True

    def round(self, rnd: int, max_time: float = 0.0):
        """One synchronous round (a SimPy sub-process); returns its RoundOutcome, or None when
        the run cannot go on (model timing: nobody will ever be online again)."""
        env, cfg, strategy = self.env, self.cfg, self.strategy
        ideal = cfg.timing == "ideal"
        if not ideal and not (yield env.process(self.wait_for_someone(max_time))):
            return None
        wall0 = time.perf_counter()
        # ideal timing: round r looks at the trace at exactly r*D (no float drift over rounds)
        t0 = rnd * cfg.round_duration if ideal else env.now
        online = np.flatnonzero(self.index.online(t0))
        rng = np.random.default_rng([self.seed, rnd, 0x5E1])
        ids = np.asarray(strategy.select(rnd, online, rng), dtype=np.int64)
        steps = np.asarray(strategy.local_steps(rnd, ids), dtype=np.int64)
        lr = strategy.client_lr(rnd)

        if ideal:  # the papers' round-indexed model: zero latency, everyone invited arrives
            ends_at = np.full(len(ids), t0)
            fate = np.full(len(ids), "arrived", dtype=object)
            close_at = (rnd + 1) * cfg.round_duration
        else:
            ends_at, fate = self.fates(ids, steps, t0)
            close_at = t0 + (cfg.deadline if len(ids) else cfg.round_duration)
        will_arrive = (fate == "arrived") & (ends_at <= close_at)

        trained = np.flatnonzero(will_arrive)
        result = None
        if len(trained):
            start = strategy.start_params(ids)[torch.as_tensor(trained, device=self.device)]
            result = self.trainer.train(rnd, ids[trained], start, steps[trained], lr,
                                        strategy.local_objective)

        target = len(ids) if ideal else round_target(cfg, len(ids))
        board = RoundBoard(env, invited=len(ids), target=target)
        # ties in end time report in a random order, so that equal speeds do not always favour
        # the lowest ids at the K-th arrival
        start_device_tasks(env, board.report, rng.permutation(len(ids)), ends_at, fate)
        closer = env.process(deadline(env, board, close_at))
        yield closer if ideal or not len(ids) else board.closed

        arrived_pos = np.asarray(board.arrived, dtype=np.int64)
        dropped_pos = np.asarray(board.dropped, dtype=np.int64)
        late_mask = np.ones(len(ids), dtype=bool)
        late_mask[arrived_pos] = False
        late_mask[dropped_pos] = False
        arrivals = self._arrivals(rnd, t0, ids, arrived_pos, trained, result, steps, lr)
        strategy.receive(rnd, arrivals)
        loss = float(arrivals.loss.mean()) if len(arrivals) else None
        return RoundOutcome(
            round=rnd, t_start=t0, t_end=env.now, online=len(online), invited=ids,
            arrived=ids[arrived_pos], dropped=ids[dropped_pos], late=ids[late_mask],
            train_loss=loss, wall_s=time.perf_counter() - wall0,
        )

    def fates(self, ids: np.ndarray, steps: np.ndarray, t0: float) -> tuple[np.ndarray, np.ndarray]:
        """When each task invited at t0 ends, and how: 'dropped' if the trace has the device
        offline at any moment before it finishes (known in advance), else 'arrived'."""
        per_step = self.client_sizes[ids] if self.batch_size == 0 else self.batch_size
        finish = t0 + self.timing.task_s(ids, steps * per_step, self.model_bytes)
        offline_at = self.index.next_offline(ids, t0)
        dropped = offline_at < finish
        return np.where(dropped, offline_at, finish), np.where(dropped, "dropped", "arrived").astype(object)

    def _arrivals(self, rnd, t0, ids, arrived_pos, trained, result, steps, lr) -> Arrivals:
        """The trained rows of the devices that arrived, in arrival order."""
        row_of = np.full(len(ids), -1, dtype=np.int64)
        row_of[trained] = np.arange(len(trained))
        rows = torch.as_tensor(row_of[arrived_pos], device=self.device)
        if result is None:
            d = self.strategy.params.shape[0]
            empty = torch.empty(0, device=self.device)
            return Arrivals(ids=ids[:0], deltas=torch.empty(0, d, device=self.device), steps=empty,
                            samples=empty, loss=empty, version=ids[:0], lr=empty,
                            invited_at=np.empty(0))
        return Arrivals(
            ids=ids[arrived_pos],
            deltas=result.deltas[rows],
            steps=torch.as_tensor(steps[arrived_pos], device=self.device),
            samples=result.samples[rows],
            loss=result.loss[rows],
            version=np.full(len(arrived_pos), rnd, dtype=np.int64),
            lr=torch.full((len(arrived_pos),), float(lr), device=self.device),
            invited_at=np.full(len(arrived_pos), t0),
        )
