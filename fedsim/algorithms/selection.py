"""Selection policies: whom the server invites among the online devices (docs/algorithms.md).

A selector is called once per round with the ids of the online devices and returns the ids
to invite (at most ``k``; ``k = 0`` means all of them). Policies with memory keep it in numpy
arrays so that checkpoints can save it.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class Selector:
    # a policy's own [algorithm] keys with their typed defaults (a plugin's; fedsim's own are
    # declared in fedsim/config/catalog.py): its `setup` reads them from `ctx.options`
    options: dict[str, Any] = {}

    def __init__(self, n_devices: int, k: int):
        self.n = n_devices
        self.k = k

    def budget(self, online: np.ndarray) -> int:
        return len(online) if self.k == 0 else min(self.k, len(online))

    def __call__(self, rnd: int, online: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        raise NotImplementedError

    def setup(self, ctx) -> None:
        """What the run tells the policy before round 0 (the Strategy's Context: its options,
        the devices' data sizes); most policies need nothing."""

    def learn(self, rnd: int, arrivals) -> None:
        """What the server heard in round `rnd` (the Strategy's Arrivals: who arrived, with
        their losses, samples and durations, and who was invited but missed). By default the
        policy is told who arrived (`arrived`)."""
        self.arrived(rnd, arrivals.ids)

    def arrived(self, rnd: int, ids: np.ndarray) -> None:
        """The invited devices whose update reached the server in round `rnd`."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        pass

    def candidates(self, rnd: int, online: np.ndarray, rng: np.random.Generator) -> np.ndarray | None:
        """The devices this policy asks for their current local loss before it chooses (the
        server times the question and hands the answers to `answered`), or None: it chooses
        from the online devices alone."""
        return None

    def answered(self, ids: np.ndarray, losses: np.ndarray) -> None:
        """The candidates that reported their loss in time, and the losses [c] (float64)."""


def is_selector(obj: Any) -> bool:
    """Whether `obj` is a selection policy class (a plugin's `[algorithm] selection`)."""
    return isinstance(obj, type) and issubclass(obj, Selector)


class SelectAll(Selector):
    """Every online device (the papers' A_t = available set); ``k`` is ignored."""

    def __call__(self, rnd, online, rng):
        return online.astype(np.int64)


class SelectUniform(Selector):
    """``k`` devices uniformly without replacement among the online ones."""

    def __call__(self, rnd, online, rng):
        if self.budget(online) == len(online):
            return online.astype(np.int64)
        return np.sort(rng.choice(online, size=self.budget(online), replace=False)).astype(np.int64)


class SelectRegularized(Selector):
    """Wang & Ji App. D.1: pop a queue of random permutations of all devices, keep online ones.

    Offline devices popped on the way are discarded, so over a cycle every device gets
    the same number of chances however its availability is patterned.
    """

    def __init__(self, n_devices: int, k: int):
        super().__init__(n_devices, k)
        self.queue = np.empty(0, dtype=np.int64)

    def __call__(self, rnd, online, rng):
        need = self.budget(online)
        is_online = np.zeros(self.n, dtype=bool)
        is_online[online] = True
        chosen: list[np.ndarray] = []
        while need > 0:
            if len(self.queue) == 0:
                self.queue = rng.permutation(self.n).astype(np.int64)
            hits = np.flatnonzero(is_online[self.queue])
            if len(hits) >= need:
                cut = hits[need - 1] + 1
                taken = self.queue[hits[:need]]
                self.queue = self.queue[cut:]
            else:
                taken = self.queue[hits]
                self.queue = self.queue[:0]
            is_online[taken] = False  # never the same device twice in a round
            chosen.append(taken)
            need -= len(taken)
        return np.sort(np.concatenate(chosen)) if chosen else np.empty(0, dtype=np.int64)

    def state_dict(self):
        return {"queue": self.queue.copy()}

    def load_state_dict(self, sd):
        self.queue = np.asarray(sd["queue"], dtype=np.int64)


class SelectLongestAbsent(Selector):
    """FedLaAvg: online devices by last participation ascending (never = -1), ties by id.

    Participation is an arrival: a device that was invited but dropped stays first in line."""

    def __init__(self, n_devices: int, k: int):
        super().__init__(n_devices, k)
        self.last = np.full(n_devices, -1, dtype=np.int64)

    def __call__(self, rnd, online, rng):
        order = np.lexsort((online, self.last[online]))  # primary: last, secondary: id
        return np.sort(online[order[: self.budget(online)]]).astype(np.int64)

    def arrived(self, rnd, ids):
        self.last[ids] = rnd

    def state_dict(self):
        return {"last": self.last.copy()}

    def load_state_dict(self, sd):
        self.last = np.asarray(sd["last"], dtype=np.int64)


class SelectPowerOfChoice(Selector):
    """Power-of-choice (Cho, Wang & Joshi 2020, pow-d): `d` candidates drawn among the online
    devices without replacement with probability proportional to their data size; each reports
    its local loss on the current global model, and the ``k`` with the highest loss are invited
    (ties: the lower id). Only candidates that answered are chosen from: the server passes them
    as the online devices. Nothing is kept between rounds (the draw is the round's rng)."""

    def __init__(self, n_devices: int, k: int, candidates: int = 0, sizes: np.ndarray | None = None):
        super().__init__(n_devices, k)
        self.d = candidates or 2 * k  # 2k: the smallest d of the paper's experiments (d = 2m)
        self.sizes = np.ones(n_devices) if sizes is None else np.asarray(sizes, dtype=np.float64)
        self.losses = np.full(n_devices, np.nan)  # this round's answers

    def setup(self, ctx):
        self.d = int(ctx.options.get("candidates", 0)) or 2 * self.k
        self.sizes = np.asarray(ctx.client_sizes, dtype=np.float64)

    def candidates(self, rnd, online, rng):
        self.losses[:] = np.nan
        online = online[self.sizes[online] > 0]  # (a device without data has no loss)
        weight = self.sizes[online]
        d = min(self.d, len(online))
        if d == len(online):
            return online.astype(np.int64)
        return np.sort(rng.choice(online, size=d, replace=False, p=weight / weight.sum())).astype(np.int64)

    def answered(self, ids, losses):
        self.losses[ids] = losses

    def __call__(self, rnd, online, rng):
        order = np.lexsort((online, -self.losses[online]))  # primary: loss, highest first; then id
        return np.sort(online[order[: self.budget(online)]]).astype(np.int64)
