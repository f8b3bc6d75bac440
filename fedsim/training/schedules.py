"""Client learning-rate schedules (docs/algorithms.md), as a function of the round; the
names are those of fedsim/config/catalog.py SCHEDULES.

``t`` is the update round, 1-based (the first round is t = 1).
"""

from __future__ import annotations

import math

from fedsim.config.catalog import SCHEDULES
from fedsim.config import ClientConfig


def constant(client: ClientConfig, t: int) -> float:
    return client.lr


def inverse(client: ClientConfig, t: int) -> float:
    """MIFA's lr / t."""
    return client.lr / t


def inverse_sqrt(client: ClientConfig, t: int) -> float:
    """FedAWE's lr / sqrt(t'/10 + 1) with its 0-based global round t' = t - 1 (so the first
    round trains at lr)."""
    return client.lr / math.sqrt((t - 1) / 10 + 1)


def step(client: ClientConfig, t: int) -> float:
    """lr times ``lr_step_gamma`` every ``lr_step_every`` rounds."""
    return client.lr * client.lr_step_gamma ** ((t - 1) // client.lr_step_every)


def learning_rate(client: ClientConfig, t: int) -> float:
    """The client lr of update round ``t`` under ``[client] lr_schedule``."""
    return SCHEDULES.lookup(client.lr_schedule, "[client] lr_schedule")(client, max(int(t), 1))
