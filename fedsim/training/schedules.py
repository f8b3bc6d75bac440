"""Client learning-rate schedules (docs/algorithms.md), as a function of the round."""

from __future__ import annotations

import math

from fedsim.config import ClientConfig


def learning_rate(client: ClientConfig, t: int) -> float:
    """The client lr of update round ``t`` (1-based: the first round is t = 1).

    ``inverse`` is MIFA's lr/t, ``inverse-sqrt`` FedAWE's lr/sqrt(t'/10 + 1) with FedAWE's
    0-based global round t' = t - 1 (so the first round trains at lr), ``step`` multiplies by
    ``lr_step_gamma`` every ``lr_step_every`` rounds.
    """
    t = max(int(t), 1)
    if client.lr_schedule == "constant":
        return client.lr
    if client.lr_schedule == "inverse":
        return client.lr / t
    if client.lr_schedule == "inverse-sqrt":
        return client.lr / math.sqrt((t - 1) / 10 + 1)
    if client.lr_schedule == "step":
        return client.lr * client.lr_step_gamma ** ((t - 1) // client.lr_step_every)
    raise ValueError(f"unknown lr_schedule {client.lr_schedule!r}")
