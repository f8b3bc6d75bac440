"""Latest-gradient averaging: MIFA (Gu et al., Alg. 1) and FedLaAvg (Yan et al., §3.2, §5).

Both keep every device's most recent summed gradient G_i = (x − LocalSGD(x)) / lr and step
with the average over ALL N devices every round, also when nobody arrived, so a rarely
available device keeps its weight through its stored gradient (0 before it first arrives,
N stays the denominator). They differ in who is invited and where G_i lives: MIFA invites
every online device and stores the table on the server (O(N·d) server memory); FedLaAvg
invites the K = round(beta·N) longest-absent ones, each device keeps its own G_i and uploads
G_i − G_i^last, so the server holds only the running mean (O(d) + N). With beta = 1 and a
constant lr the two are the same algorithm.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from fedsim.config.catalog import ALGORITHM_OPTIONS, ALGORITHM_RANGES
from fedsim.algorithms.base import Strategy, apply_updates_together, each_run
from fedsim.algorithms.table import DeviceTable, tables_together


class Mifa(Strategy):
    """x <- x − η_g · lr_t · (1/N) Σ_i G^i, with lr_t counted over update rounds.

    ``warmup = true`` (the paper's experiments): no update until every device was available
    at least once; in that round all devices compute G^i at the same x. As x does not move
    during the warm-up, each device computes its G^i at x the first time it is online and
    the first update comes when all N are stored: the same numbers, and it also works when
    devices can drop (model timing), which only delays the end of the warm-up.
    """

    name = "mifa"
    options = ALGORITHM_OPTIONS["mifa"]
    state = ("params", "table", "seen", "updates", "last_round")
    stored_on_devices = False

    def init_state(self, params):
        super().init_state(params)
        self.table = DeviceTable(self.n, params.numel(), params.device,
                                 on_devices=self.stored_on_devices)
        self.seen = np.zeros(self.n, dtype=bool)  # warmup: G^i computed at the initial x
        self.updates = 0  # update rounds so far: the t of lr_t
        self.last_round = -1  # for the staleness metric

    def warming_up(self) -> bool:
        return bool(self.opt.get("warmup", False)) and not self.seen.all()

    def client_lr(self, rnd: int) -> float:
        return self.ctx.lr(self.updates + 1)

    def select(self, rnd, online, rng):
        if self.warming_up():
            return online[~self.seen[online]].astype(np.int64)
        return super().select(rnd, online, rng)

    def aggregate(self, rnd, arrivals):
        if len(arrivals):
            fresh = -arrivals.deltas / arrivals.lr.unsqueeze(1)  # G_i = (x − LocalSGD(x)) / lr
            self.table.write(arrivals.ids, fresh, rnd)
        if self.count_update(rnd, arrivals):
            lr = self.ctx.lr(self.updates)
            self.apply_update(-lr * self.table.mean())

    @classmethod
    def receive_together(cls, runs):
        """The runs' tables written in one call (`DeviceTable.write_together`) and the steps of
        those past their warm-up in one (tables of one shape; the rule, not a subclass's other)."""
        started = tables_together(runs, Mifa, "table")
        if started is None:
            return None
        errors, writing = started
        if writing is not None:
            fresh = -writing.deltas / torch.cat([a.lr for a in writing.arrivals]).unsqueeze(1)
            DeviceTable.write_together(writing.tables, writing.ids, fresh, writing.rounds)
        stepping = [s for s, stepped in zip((run[0] for run in runs),
                                            each_run(runs, errors, lambda s, rnd, a: s.count_update(rnd, a))) if stepped]
        if stepping:
            lr = torch.tensor([-s.ctx.lr(s.updates) for s in stepping]).to(stepping[0].params.device)
            means = DeviceTable.means_together([s.table for s in stepping])
            apply_updates_together(stepping, lr.to(means.dtype).unsqueeze(1) * means)
        return errors

    def count_update(self, rnd, arrivals) -> bool:
        """After the round's rows are written: whether this round updates the model (past the
        warm-up), counting it (the t of lr_t)."""
        self.last_round = rnd
        if self.warming_up():
            self.seen[arrivals.ids] = True
            if self.warming_up():
                return False
        self.updates += 1
        return True

    def refuse(self, rnd):
        """A failed round does not step with the table (which would move the model) nor store
        the refused gradients; lr_t counts update rounds, so it does not advance either."""
        self.selector.arrived(rnd, np.empty(0, dtype=np.int64))
        self.last_round = rnd

    def metrics(self):
        return self.table.metrics(self.last_round)


class FedLaAvg(Mifa):
    """MIFA's update with longest-absent selection of K = round(beta·N) devices per round.

    ``beta = 0`` (default) takes K from ``[server] clients_per_round`` (every online device
    when that is 0 too), so FedLaAvg invites as many devices as the algorithms beside it.
    """

    name = "fedlaavg"
    options, ranges = ALGORITHM_OPTIONS["fedlaavg"], ALGORITHM_RANGES["fedlaavg"]
    selection = "longest-absent"
    stored_on_devices = True  # each device keeps its G^last and uploads the difference

    def budget(self):
        beta = float(self.opt["beta"])
        if beta == 0.0:
            return self.ctx.invite
        return max(1, math.floor(beta * self.n + 0.5))  # round half up, never 0 (= "all")
