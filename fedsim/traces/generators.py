"""The built-in synthetic availability generators (their names: fedsim/config/catalog.py GENERATORS)
and the one entry point, ``generate``.

Two families (docs/traces.md):

* round-indexed models (``always``, ``bernoulli``, ``grid``, ``periodic``) define a
  probability p_i^t per device and round and draw who is online as bits per round and device
  (RoundBits, what a run holds); as intervals, the trace puts round r on [r*D, (r+1)*D) and
  merges consecutive online rounds. The per-device parameters go into ``Trace.generator`` so that
  ``known_probability`` recomputes p_i^t later (``fedavg-known-p`` needs it);
* wall-clock models (``markov``, ``sleep-window``, ``diurnal``) produce intervals in seconds
  over ``days`` (or ``rounds * round_duration`` seconds).

Each generator declares every option it accepts with a typed default (``None``: accepts
several types, checked by the generator); the config layer validates ``[trace]`` keys
against them.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from fedsim.config.catalog import GENERATORS
from fedsim.errors import FedsimError, did_you_mean
from fedsim.traces import clock_models, round_models
from fedsim.traces.request import Generated, GeneratedRounds, Request, finite_numbers, short
from fedsim.traces.round_bits import RoundBits
from fedsim.traces.schema import Trace, check_devices, positive_seconds, whole_number

MAX_OPTION_INT = 2**53  # integer options stay exact as floats and cannot overflow int64 sums


@dataclass(frozen=True)
class GeneratorSpec:
    """One generator: its options with typed defaults, and how it works.

    ``needs_labels``: the generator uses the devices' label distributions when the experiment
    passes them (bernoulli's label-derived p, grid and periodic groups); ``probability``
    (round-indexed only) recomputes p_i^t ``[R, N]`` from the recorded metadata. ``version``,
    recorded with the trace, changes whenever the generator draws other traces for the same
    call (a run records its generated trace by that call and a fingerprint, not its intervals).
    """

    name: str
    options: dict
    round_indexed: bool
    needs_labels: bool
    doc: str
    fn: Callable[[Request], Generated | GeneratedRounds]
    probability: Callable[[dict, np.ndarray], np.ndarray] | None = None
    version: int = 1


def is_generator(obj: Any) -> bool:
    """What fedsim.config.catalog.GENERATORS accepts: a GeneratorSpec."""
    return isinstance(obj, GeneratorSpec)


BUILT_IN: dict[str, GeneratorSpec] = {
    spec.name: spec
    for spec in [
        GeneratorSpec("always", {}, True, False,
                      "every device online for the whole horizon",
                      round_models.always, round_models.always_probability),
        GeneratorSpec("bernoulli", round_models.BERNOULLI_OPTIONS, True, True,
                      "independent per-round Bernoulli(p_i^t) with FedAWE dynamics; p_i given, "
                      "label-derived <nu_i, phi>, or MIFA's p_min + (1-p_min) min(j,k)/9",
                      round_models.bernoulli, round_models.bernoulli_probability),
        GeneratorSpec("grid", round_models.GRID_OPTIONS, True, True,
                      "FedLaAvg two-group grid: devices with majority digit < digits online when "
                      "(t mod 2E) < E, the others otherwise",
                      round_models.grid, round_models.grid_probability),
        GeneratorSpec("periodic", round_models.PERIODIC_OPTIONS, True, True,
                      "groups of majority labels take turns of rounds_per_group rounds, with a "
                      "random offset of the cycle (Wang & Ji)",
                      round_models.periodic, round_models.periodic_probability),
        GeneratorSpec("markov", clock_models.MARKOV_OPTIONS, False, False,
                      "two-state on/off chain, exponential session and gap lengths, per-device "
                      "rates spread lognormally",
                      clock_models.markov),
        GeneratorSpec("sleep-window", clock_models.SLEEP_OPTIONS, False, False,
                      "one fixed window of `hours` per local day, where the device is least "
                      "active (a random night placement without activity data)",
                      clock_models.sleep_window),
        GeneratorSpec("diurnal", clock_models.DIURNAL_OPTIONS, False, False,
                      "time-zone mixture, nightly charging/idle/Wi-Fi window with per-device "
                      "start, length and weekend shift, short random interruptions",
                      clock_models.diurnal),
    ]
}


def generate(kind: str, n_devices: int, *, seed: int, rounds: int | None = None,
             round_duration: float = 1.0, days: float | None = None,
             label_dist: np.ndarray | None = None, as_bits: bool = False, **options) -> Trace | RoundBits:
    """Make a synthetic trace. Deterministic for a seed. ``as_bits``: a round-indexed
    generator's trace as bits per round and device (RoundBits, what a run holds), not as
    intervals; the same availability either way."""
    spec = _spec(kind)
    options = check_options(kind, options)
    where = f"trace generator {kind!r}"
    n_devices = whole_number(n_devices, "devices", where, 1)
    check_devices(n_devices, where, "generate fewer devices")
    seed = whole_number(seed, "seed", where, 0)
    rounds, round_duration, horizon = _extent(spec, rounds, round_duration, days)
    if label_dist is not None:
        label_dist = _label_dist(kind, label_dist, n_devices)
    request = Request(n_devices, np.random.default_rng(seed), horizon, rounds,
                      round_duration, label_dist, options, where, intervals=not as_bits)
    out = spec.fn(request)
    generator = {"kind": kind, "version": spec.version, "seed": seed, "rounds": rounds,
                 "round_duration": round_duration, "days": days or None, "options": options,
                 **out.meta}
    if isinstance(out, GeneratedRounds):
        bits = RoundBits(out.bits, out.online_count, n_devices, round_duration, generator=generator)
        return bits if as_bits else bits.to_trace(where)
    return Trace.from_intervals(out.device_id, out.start, out.end, n_devices=n_devices,
                                horizon=horizon, origin=out.origin, generator=generator,
                                where=where)


def known_probability(trace: Trace, rnd) -> np.ndarray:
    """p_i^t ``[N]`` for one round (``[R, N]`` for an array of rounds) of a round-indexed
    generated trace, recomputed from its metadata. Rounds past the horizon follow the trace:
    probability 0 (wrap "none") or the round modulo the trace length (wrap "loop")."""
    kind = trace.generator.get("kind")
    spec = GENERATORS.get(kind)
    if spec is None or spec.probability is None:
        made = f"generator {kind!r}" if kind else "a file with no generator metadata"
        known = ", ".join(name for name, s in GENERATORS.items() if s.probability)
        raise FedsimError(f"trace made by {made} defines no per-round availability probability "
                          f"p_i^t; fedavg-known-p needs a trace from one of: {known}")
    rounds_total = int(trace.generator["rounds"])
    scalar = np.ndim(rnd) == 0
    rounds = np.atleast_1d(np.asarray(rnd, dtype=np.int64))
    inside = (rounds >= 0) & (rounds < rounds_total)
    if trace.wrap == "loop":
        rounds, inside = np.mod(rounds, rounds_total), np.ones_like(inside)
    p = spec.probability(trace.generator, np.where(inside, rounds, 0))
    p = np.where(inside[:, None], p, 0.0)
    return p[0] if scalar else p


def known_probability_at(trace: Trace, t: float) -> np.ndarray:
    """p_i ``[N]`` of the trace round that contains simulated time ``t`` (the round grid of the
    generator's ``round_duration``), for runs whose rounds are not the trace's rounds."""
    duration = float(trace.generator.get("round_duration") or 1.0)
    return known_probability(trace, math.floor(t / duration + 1e-9))


# options given another name, (generator, old name) -> new name, for their refusal
RENAMED_OPTIONS = {("periodic", "offset"): "phase"}  # (a run's [trace] offset is where it starts)


def check_options(kind: str, options: dict) -> dict:
    """The generator's options with defaults filled in; unknown keys and wrong types raise."""
    spec = _spec(kind)
    resolved = dict(spec.options)
    for key, value in options.items():
        if key not in spec.options:
            valid = sorted(spec.options)
            if not valid:
                raise FedsimError(f"trace generator {kind!r} takes no options; remove {key!r}")
            renamed = RENAMED_OPTIONS.get((kind, key))
            hint = f"it is {renamed!r} now? " if renamed else did_you_mean(key, valid, end='? ')
            raise FedsimError(f"trace generator {kind!r}: unknown option {key!r}; {hint}valid options: {', '.join(valid)}")
        resolved[key] = _typed(kind, key, value, spec.options[key])
    return resolved


def _typed(kind: str, key: str, value, default):
    """Coerce int -> float where a float is expected; refuse other type mismatches, floats
    that are not finite, huge integers and lists that are not of finite numbers (every list
    option is one)."""
    if default is None or value is None:
        return value
    expected = type(default)
    real = isinstance(value, (int, float)) and not isinstance(value, bool)
    if expected is float and real and abs(value) <= sys.float_info.max:  # finite, not nan
        return float(value)
    if expected is list and isinstance(value, (list, tuple)):
        numbers = finite_numbers(value)
        if numbers is not None:
            return numbers.tolist()
        raise FedsimError(f"trace generator {kind!r}: option {key} = {short(value)} must be a "
                          f"list of finite numbers, like {default!r}")
    if expected is int and real and abs(value) <= MAX_OPTION_INT and float(value).is_integer():
        return int(value)
    if expected is str and isinstance(value, str):
        return value
    what = _EXPECTED.get(expected, expected.__name__)
    raise FedsimError(f"trace generator {kind!r}: option {key} = {short(value)} has the wrong "
                      f"type or range; expected {what} like {default!r}")


_EXPECTED = {float: "a finite number", int: f"an integer within +-{MAX_OPTION_INT:,}", str: "text"}


def _spec(kind: str) -> GeneratorSpec:
    return GENERATORS.lookup(kind, "trace generator")


def _extent(spec: GeneratorSpec, rounds, round_duration, days):
    """Resolve (rounds, round_duration, horizon) for the generator's family."""
    where = f"trace generator {spec.name!r}"
    round_duration = positive_seconds(round_duration, "round_duration", where)
    if rounds is not None:
        rounds = whole_number(rounds, "rounds", where, 1)
        positive_seconds(rounds * round_duration, "rounds x round_duration", where)
    if days is not None and not (isinstance(days, (int, float)) and math.isfinite(days) and days >= 0):
        raise FedsimError(f"{where}: days = {days!r}; give a number of days > 0")
    days = days or None
    if days is not None:
        positive_seconds(days * 86400.0, "days x 86400", where)  # finite in seconds too
    if spec.round_indexed:
        if rounds is None and days is not None:
            rounds = math.ceil(days * 86400 / round_duration)
        if rounds is None:
            raise FedsimError(f"{where} is round-indexed: give rounds (--rounds R), or days")
        return int(rounds), round_duration, int(rounds) * round_duration
    if days is not None:
        return (None if rounds is None else int(rounds)), round_duration, float(days) * 86400.0
    if rounds is None:
        raise FedsimError(f"{where} runs on wall-clock time: give days (--days D), or rounds "
                          f"and round_duration")
    return int(rounds), round_duration, int(rounds) * round_duration


def _label_dist(kind: str, label_dist, n_devices: int) -> np.ndarray:
    """Rows normalised to label distributions (counts are fine too)."""
    dist = np.asarray(label_dist, dtype=np.float64)
    if dist.ndim != 2 or dist.shape[0] != n_devices:
        raise FedsimError(f"trace generator {kind!r}: label_dist has shape {dist.shape}; it needs "
                          f"one row per device, [{n_devices}, classes]")
    if not np.all(np.isfinite(dist)) or np.any(dist < 0):
        raise FedsimError(f"trace generator {kind!r}: label_dist must be finite and >= 0")
    total = dist.sum(axis=1, keepdims=True)
    return np.divide(dist, total, out=np.zeros_like(dist), where=total > 0)
