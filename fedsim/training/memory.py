"""The memory a run needs, estimated before it trains: a config that cannot fit on its device
is one error line naming the key to lower, instead of a crash (or minutes of swapping) in its
first round.

The estimate is a lower bound in float32: the task's data on the device, and for one local
step of the largest cohort its parameters, gradients and starting points (3 copies per
device) and the layer outputs of the devices that one call trains (the batched trainer's
chunk, one device on the loop path). Only what needs more than `SHARE` of the device's total
memory is refused, so a run that might fit is left to try.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from fedsim.config import Config
from fedsim.errors import FedsimError
from fedsim.files import human_size
from fedsim.training.task import Task
from fedsim.training.trainer import Trainer

FLOAT = 4  # bytes of a float32
COPIES = 3  # per device of the cohort: its parameters, their gradients, its starting point
SHARE = 0.9  # of the device's total memory, above which a run is refused


def device_memory(device: torch.device) -> int:
    """Total bytes of memory of `device`: a GPU's own, or the machine's."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[1]
    try:
        import psutil
    except ImportError:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return psutil.virtual_memory().total


def check_memory(cfg: Config, task: Task, trainer: Trainer) -> None:
    """FedsimError, naming the key to lower, when the run clearly cannot fit on its device."""
    ids = np.arange(task.n_clients)
    cohort = cfg.server.clients_per_round or task.n_clients
    per_call, width = trainer.devices_per_call(ids[:cohort]), trainer.batch_width(ids)
    needs = {
        "parameters": FLOAT * COPIES * cohort * task.dim,
        "activations": FLOAT * task.activations * width * per_call,
        "data": task.data_bytes(),
    }
    total = device_memory(task.device)
    if sum(needs.values()) <= SHARE * total:
        return
    synthetic = cfg.data.dataset in ("quadratic", "logistic")  # their [data] dim sizes the model
    model = "[model] hidden" if cfg.model.name == "mlp" else "[data] dim" if synthetic else "[model] name"
    cohort_key = "[server] clients_per_round" if cfg.server.clients_per_round else "[data] clients"
    lower = {"parameters": f"{model} or {cohort_key}" if cohort > 1 else model,
             "activations": "[client] batch_size",
             "data": {"logistic": "[data] samples", "quadratic": "[data] dim"}.get(cfg.data.dataset, "[data] dataset")}
    where = "the GPU" if task.device.type == "cuda" else "this machine"
    raise FedsimError(
        f"a local step of the run needs about {human_size(sum(needs.values()))} of memory (parameters, gradients "
        f"and starts of {cohort:,} devices x {task.dim:,} parameters: {human_size(needs['parameters'])}; layer "
        f"outputs of {per_call * width:,} samples in one call: {human_size(needs['activations'])}; data: "
        f"{human_size(needs['data'])}), more than {SHARE:.0%} of the {human_size(total)} of {where}; lower "
        f"{lower[max(needs, key=needs.get)]}")
