"""Round-indexed availability models of the papers (docs/traces.md).

Each model is a probability p_i^t per device i and round t, computed from parameters that
are recorded in the trace metadata (so ``known_probability`` can recompute it). Rounds are
sampled in blocks of rounds x all devices and kept as bits (fedsim/traces/round_bits.py).
"""

from __future__ import annotations

import difflib

import numpy as np

from fedsim.errors import FedsimError
from fedsim.traces.request import Generated, GeneratedRounds, Request, finite_numbers, short
from fedsim.traces.round_bits import check_bits, count_runs, pack
from fedsim.traces.schema import check_rows

DYNAMICS = ("stationary", "staircase", "sine", "interleaved-sine")
DEFAULT_CLASSES = 10  # label count assumed for group membership when no labels are given

BERNOULLI_OPTIONS = {
    "p": None,               # float for everyone or a list with one value per device
    "dynamics": "stationary",
    "gamma": 0.3,
    "period": 20,
    "delta0": 0.1,
    "phi_max": [1.0] * 5 + [0.5] * 5,
    "p_min": None,           # float: MIFA's label-dependent p_i
}
GRID_OPTIONS = {"half_period": 100, "digits": 5}
# (`phase` was `offset` before 2026-11-28, a name a run's [trace] offset took: recorded traces keep it in their params)
PERIODIC_OPTIONS = {"groups": 5, "rounds_per_group": 100, "phase": None}


def sample_rounds(req: Request, params: dict, probability, *, random: bool) -> GeneratedRounds:
    """Draw online[t, i] ~ Bernoulli(p_i^t) (or take p as 0/1 when not ``random``) in blocks of
    rounds x all devices (the draws do not depend on the block size) and keep them as bits.
    When the bits are to become intervals, their rows are projected from the blocks drawn so
    far, so that a trace too big is refused early."""
    n, total = req.n_devices, req.rounds
    check_bits(n, total, req.where)
    bits = np.empty((total, (n + 7) // 8), dtype=np.uint8)
    online_count = np.empty(total, dtype=np.int64)
    block = max(1, (1 << (22 if req.intervals else 20)) // n)
    made = 0
    for r0 in range(0, total, block):
        rounds = np.arange(r0, min(total, r0 + block))
        p = probability(params, rounds)
        online = req.rng.random(p.shape) < p if random else p >= 1
        bits[rounds] = pack(online)
        online_count[rounds] = online.sum(axis=1)
        if req.intervals:
            made += count_runs(online)
            check_rows(made * total / (r0 + len(rounds)), f"{n:,} devices over {total:,} rounds",
                       req.where, "generate fewer devices or rounds")
    return GeneratedRounds(bits, online_count, params)


# -- always ---------------------------------------------------------------------------------

def always(req: Request) -> Generated | GeneratedRounds:
    """One interval per device (a year of 1 s rounds is still one row each), or its bits."""
    n = req.n_devices
    if req.intervals:
        return Generated(np.arange(n), np.zeros(n), np.full(n, req.horizon), {"n": n})
    return sample_rounds(req, {"n": n}, always_probability, random=False)


def always_probability(params: dict, rounds: np.ndarray) -> np.ndarray:
    return np.ones((len(rounds), params["n"]))


# -- bernoulli ------------------------------------------------------------------------------

def bernoulli(req: Request) -> GeneratedRounds:
    o = req.options
    if o["dynamics"] not in DYNAMICS:
        close = difflib.get_close_matches(str(o["dynamics"]), DYNAMICS, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise FedsimError(f"trace generator 'bernoulli': dynamics = {o['dynamics']!r} is unknown; "
                          f"{hint}valid: {', '.join(DYNAMICS)}")
    _check_range("bernoulli", "gamma", o["gamma"], 0.0, 1.0)
    _check_range("bernoulli", "delta0", o["delta0"], 0.0, 1.0)
    if o["period"] < 1:
        raise FedsimError(f"trace generator 'bernoulli': period = {o['period']}; give rounds >= 1")
    params = {"p": _base_probability(req).tolist(), "dynamics": o["dynamics"],
              "gamma": o["gamma"], "period": o["period"], "delta0": o["delta0"]}
    return sample_rounds(req, params, bernoulli_probability, random=True)


def bernoulli_probability(params: dict, rounds: np.ndarray) -> np.ndarray:
    """p_i^t = clip01(p_i f(t)) for the FedAWE dynamics (002 App. J.3)."""
    p = np.asarray(params["p"], dtype=np.float64)[None, :]
    t = np.asarray(rounds, dtype=np.float64)[:, None]
    period, gamma = params["period"], params["gamma"]
    dynamics = params["dynamics"]
    if dynamics == "stationary":
        pt = np.broadcast_to(p, (len(rounds), p.shape[1]))
    elif dynamics == "staircase":
        pt = p * np.where(np.mod(t, period) < period / 2, 1.0, 0.4)
    else:
        pt = p * (gamma * np.sin(2 * np.pi * t / period) + 1 - gamma)
        if dynamics == "interleaved-sine":
            pt = np.where(pt >= params["delta0"], pt, 0.0)
    return np.clip(pt, 0.0, 1.0)


def _base_probability(req: Request) -> np.ndarray:
    """p_i: given, MIFA label-dependent (p_min), or FedAWE label-derived <nu_i, phi>."""
    o, n = req.options, req.n_devices
    if o["p"] is not None and o["p_min"] is not None:
        raise FedsimError("trace generator 'bernoulli': p and p_min both given; p fixes each "
                          "device's probability, p_min derives it from labels: keep one")
    if o["p"] is not None:
        given = o["p"]
        if isinstance(given, (int, float)) and not isinstance(given, bool):
            p = np.full(n, float(given))
        else:
            p = finite_numbers(given) if isinstance(given, (list, tuple, np.ndarray)) else None
        if p is None or len(p) != n:
            raise FedsimError(f"trace generator 'bernoulli': p must be a probability or a list of "
                              f"{n} (one per device), got {short(given)}")
        bad = np.flatnonzero(~((p >= 0) & (p <= 1)))
        if bad.size:
            raise FedsimError(f"trace generator 'bernoulli': p = {p[bad[0]]} for device "
                              f"{bad[0]} is not a probability in [0, 1]")
        return p
    dist = _labels(req, "p_i from labels (or give p = 0.5 or one p per device)")
    classes = dist.shape[1]
    if o["p_min"] is not None:
        _check_range("bernoulli", "p_min", o["p_min"], 0.0, 1.0)
        order = np.argsort(-dist, axis=1, kind="stable")
        j = order[:, 0]
        second = order[:, 1] if classes > 1 else j
        k = np.where(dist[np.arange(n), second] > 0, second, j)
        return o["p_min"] + (1 - o["p_min"]) * np.minimum(j, k) / max(classes - 1, 1)
    phi_max = np.asarray(o["phi_max"], dtype=np.float64)
    if phi_max.shape != (classes,) or np.any(phi_max < 0):
        raise FedsimError(f"trace generator 'bernoulli': phi_max has {phi_max.size} values but the "
                          f"data has {classes} classes; give one bound >= 0 per class")
    phi = req.rng.uniform(0.0, phi_max)
    return np.clip(dist @ phi, 0.0, 1.0)


# -- two-group grid (FedLaAvg) --------------------------------------------------------------

def grid(req: Request) -> GeneratedRounds:
    o = req.options
    if o["half_period"] < 1 or o["digits"] < 0:
        raise FedsimError(f"trace generator 'grid': half_period = {o['half_period']} must be >= 1 "
                          f"and digits = {o['digits']} >= 0")
    majority = majority_labels(req)
    group = (majority >= o["digits"]).astype(np.int64)
    if req.label_dist is not None and req.n_devices > 1 and len(np.unique(group)) == 1:
        side = "below" if group[0] == 0 else "at or above"
        raise FedsimError(f"trace generator 'grid': every device's most frequent label is {side} digits = "
                          f"{o['digits']} (they are {majority.min()}..{majority.max()}), so one group is empty and "
                          f"nobody is online half the time; set [trace] digits between them (e.g. "
                          f"{(majority.min() + majority.max() + 1) // 2})")
    params = {"half_period": o["half_period"], "group": group.tolist()}
    return sample_rounds(req, params, grid_probability, random=False)


def grid_probability(params: dict, rounds: np.ndarray) -> np.ndarray:
    e = params["half_period"]
    first_half = (np.mod(rounds, 2 * e) < e)[:, None]
    group0 = (np.asarray(params["group"]) == 0)[None, :]
    return (first_half == group0).astype(np.float64)


# -- periodic groups (Wang & Ji) ------------------------------------------------------------

def periodic(req: Request) -> GeneratedRounds:
    o = req.options
    groups, length = o["groups"], o["rounds_per_group"]
    if groups < 1 or length < 1:
        raise FedsimError(f"trace generator 'periodic': groups = {groups} and rounds_per_group = "
                          f"{length} must both be >= 1")
    offset = o["phase"]
    if offset is None:
        offset = int(req.rng.integers(0, length))
    elif isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset < length:
        raise FedsimError(f"trace generator 'periodic': phase = {offset!r}; give an integer in "
                          f"0..{length - 1}, or leave it out for a random one")
    group = periodic_groups(req, groups)
    params = {"groups": groups, "rounds_per_group": length, "offset": offset,
              "group": group.tolist()}
    return sample_rounds(req, params, periodic_probability, random=False)


def periodic_groups(req: Request, groups: int) -> np.ndarray:
    """Device i's group: floor(c G / C) for its most frequent label c of C classes (Wang & Ji:
    consecutive labels share a turn); without labels i mod G, so that every group has devices
    (3 devices in 3 groups take three turns, not one)."""
    if req.label_dist is None:
        return np.arange(req.n_devices) % groups
    return majority_labels(req) * groups // req.label_dist.shape[1]


def periodic_probability(params: dict, rounds: np.ndarray) -> np.ndarray:
    turn = ((np.asarray(rounds) + params["offset"]) // params["rounds_per_group"]) % params["groups"]
    return (turn[:, None] == np.asarray(params["group"])[None, :]).astype(np.float64)


# -- helpers --------------------------------------------------------------------------------

def majority_labels(req: Request) -> np.ndarray:
    """Each device's most frequent label; without labels device i counts as label i mod 10."""
    if req.label_dist is None:
        return np.arange(req.n_devices) % DEFAULT_CLASSES
    return np.argmax(req.label_dist, axis=1)


def _labels(req: Request, why: str) -> np.ndarray:
    if req.label_dist is None:
        raise FedsimError(f"trace generator 'bernoulli' needs the devices' label distributions for "
                          f"{why}; run it from an experiment config")
    return req.label_dist


def _check_range(kind: str, key: str, value, lo: float, hi: float) -> None:
    real = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (real and lo <= value <= hi):
        raise FedsimError(f"trace generator {kind!r}: {key} = {value!r}; give a value in [{lo}, {hi}]")

