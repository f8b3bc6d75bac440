"""Oort's participant selection (Lai et al., OSDI 2021), as FedScale runs it (docs/algorithms.md,
"oort"): exploit the devices whose last participation reported the highest statistical utility,
penalised when they were slower than the preferred round duration T, and explore devices never
heard from, a share epsilon of the cohort that decays over rounds; a pacer relaxes T when the
exploited utility stops growing.

It knows only what a server hears: each device's reported training loss and samples, and how
long its update took to arrive (invitation to arrival); never the trace or the device table.
"""

from __future__ import annotations

import math

import numpy as np

from fedsim.algorithms.selection import Selector
from fedsim.config import check_option
from fedsim.config.catalog import SELECTION_OPTIONS, SELECTION_RANGES

NAME = "oort"
AUGMENT = 10  # exploitation draws among at least 10 x as many devices as it invites (FedScale's)
FLAT, SHARP = 0.1, 5.0  # pacer: a window's utility within 10 % of the previous one relaxes T, 5 x tightens it


class SelectOort(Selector):
    """Oort: exploitation by utility x system penalty with a staleness bonus, exploration of
    unexplored devices by data size, epsilon decaying per round, the pacer."""

    def __init__(self, n_devices: int, k: int):
        super().__init__(n_devices, k)
        self.opt = dict(SELECTION_OPTIONS[NAME])
        self.size = np.ones(n_devices)  # data size: the exploration's prior
        self.utility = np.zeros(n_devices)  # U_i = samples x mean training loss, last heard
        self.duration = np.full(n_devices, np.nan)  # t_i: seconds to arrive, last heard (NaN: never)
        self.last = np.zeros(n_devices, dtype=np.int64)  # round (from 1) last heard from; 0 = unexplored
        self.fresh = np.zeros(n_devices, dtype=bool)  # heard from since the round began
        self.exploited = np.zeros(n_devices, dtype=bool)  # invited by exploitation this round
        self.history = np.empty(0)  # the exploited devices' mean utility, per round (the last 2 W)
        self.epsilon = self.opt["oort_exploration_factor"]
        self.threshold = self.opt["oort_round_threshold"]  # T's percentile of the durations
        self.round = -1  # the round whose bookkeeping is done

    def setup(self, ctx) -> None:
        self.opt.update({k: ctx.options[k] for k in self.opt if k in ctx.options})
        for key, bounds in SELECTION_RANGES[NAME].items():
            check_option(NAME, key, self.opt[key], *bounds)
        self.epsilon = self.opt["oort_exploration_factor"]
        self.threshold = self.opt["oort_round_threshold"]
        self.size = np.asarray(ctx.client_sizes, dtype=np.float64)

    # --- selection -----------------------------------------------------------------------------
    def __call__(self, rnd, online, rng):
        if rnd != self.round:
            self.begin_round(rnd)
        k = self.budget(online)
        if k == len(online):
            return np.sort(online).astype(np.int64)
        heard = self.last[online] > 0
        explored, unexplored = online[heard], online[~heard]
        n_explore = min(int(k * self.epsilon), len(unexplored))
        n_exploit = min(k - n_explore, len(explored))
        n_explore = min(k - n_exploit, len(unexplored))  # slots exploitation cannot fill
        deadline = self.preferred_duration()
        exploit = self.exploit(explored, n_exploit, rnd + 1, deadline, rng)
        explore = self.explore(unexplored, n_explore, rng)
        self.exploited[exploit] = True
        return np.sort(np.concatenate([exploit, explore])).astype(np.int64)

    def begin_round(self, rnd: int) -> None:
        """Once per round, before its first selection: epsilon decays, the utility of the last
        round's exploitation joins the pacer's history, and every W rounds the pacer moves T."""
        self.round = rnd
        self.epsilon = max(self.epsilon * self.opt["oort_exploration_decay"], self.opt["oort_exploration_min"])
        told = self.exploited & self.fresh
        window = self.opt["oort_pacer_step"]
        self.history = np.append(self.history, self.utility[told].mean() if told.any() else 0.0)[-2 * window:]
        self.fresh[:] = False
        self.exploited[:] = False
        if rnd + 1 >= 2 * window and (rnd + 1) % window == 0:
            before, now = self.history[:window].sum(), self.history[window:].sum()
            delta = self.opt["oort_pacer_delta"]
            if abs(now - before) <= FLAT * before:
                self.threshold = min(100.0, self.threshold + delta)
            elif abs(now - before) >= SHARP * before:
                self.threshold = max(delta, self.threshold - delta)

    def preferred_duration(self) -> float:
        """T: the `threshold` percentile of the durations heard (infinite at 100, or before any)."""
        known = np.sort(self.duration[~np.isnan(self.duration)])
        if self.threshold >= 100.0 or not len(known):
            return math.inf
        return float(known[min(int(len(known) * self.threshold / 100.0), len(known) - 1)])

    def penalty(self, ids: np.ndarray, deadline: float) -> np.ndarray:
        """(T / t_i)^alpha for the devices slower than T, 1 for the others."""
        t = self.duration[ids]
        slow = t > deadline  # (NaN: never heard, not slow)
        ratio = deadline / np.maximum(np.where(slow, t, 1.0), 1e-4)
        return np.where(slow, ratio ** self.opt["oort_round_penalty"], 1.0)

    def scores(self, ids: np.ndarray, r: int, deadline: float) -> np.ndarray:
        """Oort's exploitation score in round r (from 1): the utility clipped at its
        `clip_bound` quantile and scaled to [0, 1] over the positive ones, plus the staleness
        bonus sqrt(0.1 ln r / last_i), times the system penalty."""
        u = self.utility[ids]
        positive = np.sort(u[u > 0])
        if len(positive):
            clip = positive[min(int(len(positive) * self.opt["oort_clip_bound"]), len(positive) - 1)]
            low = positive[0] * 0.999
            span = max(positive[-1] - low, 1e-4)
        else:
            clip, low, span = 0.0, 0.0, 1e-4
        score = (np.minimum(u, clip) - low) / span + np.sqrt(0.1 * math.log(r) / self.last[ids])
        return np.abs(score * self.penalty(ids, deadline))

    def exploit(self, ids: np.ndarray, n: int, r: int, deadline: float, rng: np.random.Generator) -> np.ndarray:
        """n devices drawn by score, without replacement, among those scoring at least
        cut_off_util x the (n+1)-th highest score (and at least the 10 n + 1 best)."""
        if n == 0:
            return np.empty(0, dtype=np.int64)
        score = self.scores(ids, r, deadline)
        order = np.lexsort((ids, -score))  # by score, ties by id
        cut = score[order[min(n, len(order) - 1)]] * self.opt["oort_cut_off_util"]
        pool = order[:max(int((score >= cut).sum()), min(len(order), AUGMENT * n + 1))]
        return draw(ids[pool], score[pool], n, rng)

    def explore(self, ids: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
        """n unexplored devices drawn by data size among the sample_window x n largest."""
        if n == 0:
            return np.empty(0, dtype=np.int64)
        order = np.lexsort((ids, -self.size[ids]))[:min(int(self.opt["oort_sample_window"] * n), len(ids))]
        return draw(ids[order], self.size[ids[order]], n, rng)

    # --- what the server heard ---------------------------------------------------------------
    def learn(self, rnd, arrivals):
        """Arrived devices: U_i = samples x mean training loss, t_i = arrival - invitation. Devices
        invited but missed (FedScale's stragglers): the mean utility of this round's arrivals
        (their own when none arrived), and t_i at least the seconds the server waited on them."""
        ids, missed = arrivals.ids, arrivals.missed
        if len(ids):
            loss = np.nan_to_num(arrivals.loss.double().cpu().numpy())  # (0 steps: no loss, no utility)
            self.utility[ids] = arrivals.samples.double().cpu().numpy() * loss
            self.duration[ids] = arrivals.duration_s()
        if len(missed):
            if len(ids):
                self.utility[missed] = self.utility[ids].mean()
            self.duration[missed] = np.fmax(self.duration[missed], arrivals.waited_s)
        heard = np.concatenate([ids, missed])
        self.last[heard] = rnd + 1
        self.fresh[heard] = True

    STATE = ("utility", "duration", "last", "fresh", "exploited", "history")

    def state_dict(self):
        return {**{name: getattr(self, name).copy() for name in self.STATE},
                "epsilon": float(self.epsilon), "threshold": float(self.threshold), "round": int(self.round)}

    def load_state_dict(self, sd):
        for name in self.STATE:
            setattr(self, name, np.asarray(sd[name]).copy())
        self.epsilon, self.threshold, self.round = float(sd["epsilon"]), float(sd["threshold"]), int(sd["round"])


def draw(ids: np.ndarray, weight: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """n of `ids` without replacement, with probabilities proportional to `weight` (uniform when
    fewer than n weights are positive)."""
    total = float(weight.sum())
    p = weight / total if total > 0 and int((weight > 0).sum()) >= n else None
    return rng.choice(ids, size=n, replace=False, p=p).astype(np.int64)
