"""What a generator function receives and returns (kept apart so model modules avoid a
circular import with the registry)."""

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


@dataclass(frozen=True)
class Generated:
    """A generator's output: raw intervals (merged later) and metadata to record."""

    device_id: np.ndarray
    start: np.ndarray
    end: np.ndarray
    meta: dict = field(default_factory=dict)
    origin: str | None = None
