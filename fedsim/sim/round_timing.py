"""`[server] timing`: when a round starts, how each invited device's task goes, when the round
closes. Two policies behind one interface, so that the server's round reads the same story for
both: the papers' round-indexed model (`ideal`) and devices with speeds and links (`model`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import simpy

from fedsim.config import ServerConfig, invite_budget
from fedsim.sim.partial_work import steps_that_fit
from fedsim.sim.timing import DeviceTiming


@dataclass(frozen=True)
class Stop:
    """What a round returns instead of its outcome when the run cannot go on, and why."""

    reason: str
    interrupted: bool = False  # by a stop signal, with the run's state to resume from (not its end)
    # a round max_time cut short is not counted: the run's state and time are those from before it
    resume_at: float | None = None


@dataclass
class Tasks:
    """The tasks of the devices invited at `invited_at` (one entry per device, known in advance:
    the trace says when each device goes offline)."""

    invited_at: float
    download_s: np.ndarray
    compute_s: np.ndarray
    upload_s: np.ndarray
    samples: np.ndarray  # training samples the task computes on
    dropped: np.ndarray  # bool: offline before it finished
    ends_at: np.ndarray  # when it finished, or when it went offline


def wait_for_someone(env: simpy.Environment, index, max_time: float = 0.0):
    """Sleep until a device is online (now, or when the index says). Returns None, or why nobody
    ever will be (or not before max_time): the run is over."""
    t_next = index.next_online(env.now)
    if math.isinf(t_next):
        return f"the trace has nobody online after this point (it ends at {index.horizon:g} s)"
    if max_time and t_next >= max_time:
        return f"max_time {max_time:g} s reached while nobody was online"
    if t_next > env.now:
        yield env.timeout(t_next - env.now)
    return None


def wait_for_count(env: simpy.Environment, index, count: int, max_time: float = 0.0):
    """Sleep until at least `count` devices are online at once (FLASH's min_selected; the index
    answers when, nothing spins). Returns None, or why that never happens (before max_time)."""
    t_next = index.next_online_count(count, env.now)
    if math.isinf(t_next):
        return (f"the trace never has min_selected = {count} devices online at once after "
                f"{env.now:g} s (it ends at {index.horizon:g} s)")
    if max_time and t_next >= max_time:
        return f"max_time {max_time:g} s reached waiting for min_selected = {count} devices online"
    if t_next > env.now:
        yield env.timeout(t_next - env.now)
    return None


LOSS_BYTES = 4  # a device's answer to power-of-choice's question: its loss, one float32


class IdealRounds:
    """The papers' round-indexed model: round r spans [r*D, (r+1)*D); it looks at the trace at
    exactly r*D (no float drift over rounds) and every invited device reports by its end."""

    everyone_arrives = True  # so the server needs no SimPy process per task (sim/server.py)

    def __init__(self, cfg: ServerConfig, index):
        self.duration = cfg.round_duration
        self.trace_end = index.horizon if index.trace.wrap == "none" else math.inf

    def start(self, env: simpy.Environment, rnd: int, max_time: float):
        """Round r starts at r*D: no waiting (the previous round closed then); a trace that
        does not loop ends the run at its horizon."""
        yield from ()  # a generator like ModelRounds.start, with nothing to wait for
        t0 = rnd * self.duration
        return Stop(f"the trace ended at {self.trace_end:g} s") if t0 >= self.trace_end else t0

    def question(self, ids: np.ndarray, samples: np.ndarray, t0: float, model_bytes: int) -> Tasks:
        """Power-of-choice's question takes no time: every candidate answers at once."""
        zero = np.zeros(len(ids))
        return Tasks(t0, zero, zero, zero, samples, np.zeros(len(ids), dtype=bool), zero + t0)

    def tasks(self, rnd: int, ids: np.ndarray, samples: np.ndarray, steps: np.ndarray, t0: float,
              held_bytes: int = 0) -> Tasks:
        """Zero latency: the task spans the round; everyone invited arrives at its end."""
        zero, end = np.zeros(len(ids)), (rnd + 1) * self.duration
        return Tasks(t0, zero, zero + (end - t0), zero, samples, np.zeros(len(ids), dtype=bool),
                     zero + end)

    def close_at(self, rnd: int, t0: float, invited: int) -> float:
        return (rnd + 1) * self.duration

    def target(self, invited: int) -> int:
        return invited

    def quorum(self, invited: int) -> int:
        return 0

    def deadline(self, rnd: int) -> float | None:
        return None


class ModelRounds:
    """Devices with speeds and links (`[devices]`): a round starts when someone is online, a task
    is download + compute + upload unless the trace takes the device away first, and the round
    closes at the deadline, at K arrivals when the server overcommitted, or when every invited
    device has reported. FLASH's rules: a deadline drawn per round, a minimum of devices online
    to start, a quorum of arrivals for the round to count (docs/timing.md)."""

    everyone_arrives = False

    def __init__(self, cfg: ServerConfig, index, timing: DeviceTiming, message_bytes: tuple[int, int],
                 seed: int = 0):
        """`message_bytes`: what the server sends a device and what it sends back."""
        self.cfg, self.index, self.timing, self.seed = cfg, index, timing, seed
        self.download_bytes, self.upload_bytes = message_bytes

    def start(self, env: simpy.Environment, rnd: int, max_time: float):
        """Wait for someone online, or for `min_selected` devices online at once."""
        if self.cfg.min_selected:
            reason = yield env.process(wait_for_count(env, self.index, self.cfg.min_selected, max_time))
        else:
            reason = yield env.process(wait_for_someone(env, self.index, max_time))
        return Stop(reason) if reason else env.now

    def deadline(self, rnd: int) -> float:
        """The round's deadline: fixed, or drawn from N(deadline, deadline_sigma) keyed by
        (seed, round) and clipped at 0 (FLASH's round_ddl), so a round draws the same deadline
        however the run goes."""
        if not self.cfg.deadline_sigma:
            return self.cfg.deadline
        draw = np.random.default_rng([self.seed, rnd, 0xDD1]).normal(self.cfg.deadline, self.cfg.deadline_sigma)
        return max(float(draw), 0.0)

    def tasks(self, rnd: int, ids: np.ndarray, samples: np.ndarray, steps: np.ndarray, t0: float,
              held_bytes: int = 0) -> Tasks:
        """`held_bytes`: what the devices already hold of the invitation (the global model that
        power-of-choice's question sent them): only the rest is downloaded."""
        return self._tasks(ids, t0, *self._phases(ids, samples, steps, held_bytes), samples)

    def question(self, ids: np.ndarray, samples: np.ndarray, t0: float, model_bytes: int) -> Tasks:
        """Power-of-choice's question to each candidate: download the global model
        (`model_bytes`), a forward pass over its `samples`, upload its loss (one float32)."""
        return self._tasks(ids, t0, self.timing.download_s(ids, model_bytes), self.timing.forward_s(ids, samples),
                           self.timing.upload_s(ids, LOSS_BYTES), samples)

    def _tasks(self, ids: np.ndarray, t0: float, download: np.ndarray, compute: np.ndarray, upload: np.ndarray,
               samples: np.ndarray) -> Tasks:
        """Tasks of these phases started at t0, cut short where the trace takes a device away."""
        finish = t0 + (download + compute + upload)
        offline_at = self.index.next_offline(ids, t0)
        dropped = offline_at < finish
        return Tasks(t0, download, compute, upload, samples, dropped,
                     np.where(dropped, offline_at, finish))

    def _phases(self, ids: np.ndarray, samples: np.ndarray, steps: np.ndarray, held_bytes: int = 0):
        """Seconds of each device's download (of what it does not hold yet), compute and upload."""
        return (self.timing.download_s(ids, max(self.download_bytes - held_bytes, 0)),
                self.timing.compute_s(ids, samples, steps), self.timing.upload_s(ids, self.upload_bytes))

    def steps_that_fit(self, ids: np.ndarray, full: np.ndarray, samples_of, t0: float, due: float,
                       held_bytes: int = 0) -> np.ndarray:
        """`[client] work = "fit-deadline"`: the most of its `full` local steps (at least one) with
        which each device invited at `t0` ends its task by `due`; `samples_of(ids, steps)`: the
        training samples of those steps (sim/partial_work.py)."""
        def finish_at(steps):
            download, compute, upload = self._phases(ids, samples_of(ids, steps), steps, held_bytes)
            return t0 + (download + compute + upload)
        return steps_that_fit(finish_at, full, due)

    def close_at(self, rnd: int, t0: float, invited: int) -> float:
        return t0 + (self.deadline(rnd) if invited else self.cfg.round_duration)

    def target(self, invited: int) -> int:
        """Arrivals that close a round early: the first K when the server overcommitted,
        otherwise every invited device (algorithms that invite more than K want all of their
        updates)."""
        k = self.cfg.clients_per_round
        if self.cfg.overcommit > 0 and 0 < k < invited <= invite_budget(self.cfg):
            return k
        return invited

    def quorum(self, invited: int) -> int:
        """Arrivals a round needs to update the model: ceil(update_frac x invited) (0: none)."""
        return math.ceil(self.cfg.update_frac * invited - 1e-9) if self.cfg.update_frac else 0


def round_timing(cfg: ServerConfig, **model_parts) -> IdealRounds | ModelRounds:
    """The policy of `[server] timing`; `model_parts` are ModelRounds' other arguments."""
    if cfg.timing == "ideal":
        return IdealRounds(cfg, model_parts["index"])
    return ModelRounds(cfg, **model_parts)
