"""What a generator function receives and returns, and the check of numeric list options
(kept apart so model modules avoid a circular import with the registry)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Request:
    """Everything a generator function needs, already validated."""

    n_devices: int
    rng: np.random.Generator
    horizon: float
    rounds: int | None
    round_duration: float
    label_dist: np.ndarray | None
    options: dict
    where: str = "trace generator"  # starts error messages: "trace generator 'diurnal'"
    intervals: bool = True  # a round-indexed generator's bits become intervals: refuse too many early


def finite_numbers(value) -> np.ndarray | None:
    """``value`` as a flat float64 array when it is a list of finite numbers, else None
    (strings, booleans, nested lists, nan or inf): the caller words the error."""
    try:
        array = np.asarray(value)
    except ValueError:  # ragged nesting
        return None
    numeric = np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)
    if array.ndim != 1 or not numeric or not np.all(np.isfinite(array)):
        return None
    return array.astype(np.float64)


def short(value) -> str:
    """``repr(value)`` cut to one readable piece of an error line."""
    text = repr(value)
    return text if len(text) < 60 else text[:57] + "..."


@dataclass(frozen=True)
class Generated:
    """A generator's output: raw intervals (merged later) and metadata to record."""

    device_id: np.ndarray
    start: np.ndarray
    end: np.ndarray
    meta: dict = field(default_factory=dict)
    origin: str | None = None


@dataclass(frozen=True)
class GeneratedRounds:
    """A round-indexed generator's output: who is online per round, as bits (see
    fedsim/traces/round_bits.py `pack`), the online count per round, and metadata to record."""

    bits: np.ndarray
    online_count: np.ndarray
    meta: dict = field(default_factory=dict)
