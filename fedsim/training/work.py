"""The work a run asks for, bounded before it starts. Under `[client] local_epochs` a device's
task is its epochs' minibatches, known once the data is partitioned: a task of more than
MAX_TASK_STEPS local steps, or a run of more than MAX_RUN_STEPS, is one error line saying what
the value means for the largest device, instead of a first round that never ends. (Without
epochs the config alone bounds the work: fedsim/config/schema.py.)"""

from __future__ import annotations

import math

import numpy as np

from fedsim.config import MAX_TASK_STEPS, Config, check_run_steps
from fedsim.errors import FedsimError
from fedsim.training.task import Task
from fedsim.training.trainer import Trainer


def check_task_steps(cfg: Config, task: Task, trainer: Trainer) -> None:
    """FedsimError naming the largest device's steps when `[client] local_epochs` asks too many."""
    steps = trainer.epoch_steps()
    if steps is None:
        return
    largest = int(np.argmax(steps))
    samples, epochs, batch = int(task.client_sizes()[largest]), cfg.client.local_epochs, cfg.client.batch_size
    if steps[largest] > MAX_TASK_STEPS:
        per_epoch = math.ceil(samples / batch)
        raise FedsimError(
            f"[client] local_epochs = {epochs:g} means {int(steps[largest]):,} local steps a task for the largest "
            f"device ({largest}: {samples:,} samples, {per_epoch:,} minibatches of batch_size = {batch:,} an epoch), "
            f"more than the {MAX_TASK_STEPS:,} a task may take; give local_epochs <= "
            f"{MAX_TASK_STEPS // per_epoch:,} or a larger batch_size")
    check_run_steps(cfg, int(steps[largest]), "local_epochs", cfg.source)
