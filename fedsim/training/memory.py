"""The memory a run needs, estimated before it is allocated: a config that cannot fit on its
device is one error line naming what needs the memory and the key to lower, instead of a crash
(or minutes of swapping) when its tensors are made.

The estimate is a lower bound in float32: the algorithm's state (MIFA's table of every device's
update, FedAWE's local models, ...: `State`, measured by setting the algorithm up on the meta
device), the task's data on the device, and for one local step of the largest cohort its
parameters, gradients and starting points (3 copies per device) and the layer outputs of the
devices that one call trains (the batched trainer's chunk, one device on the loop path). It is
checked twice: with the model's size counted on the meta device before the model is built
(so that a module too large is never allocated), and with the trainer's layer outputs once it
is built. Only what needs more than `SHARE` of the device's total memory is refused, so a run
that might fit is left to try.

A lockstep study holds the runs it steps together at once: a run built `beside` others must also
fit with their parameters and state (`NoRoomBeside`: the study steps it in a later batch), in
the process's share of the machine (a sweep's worker process: 1 / the workers).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

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
PROCESS_SHARE = [1.0]  # this process's part of the machine's memory (a sweep's worker: 1 / the workers)
_BESIDE: ContextVar[int] = ContextVar("beside", default=0)  # bytes held by the runs a new one steps beside


class NoRoomBeside(Exception):
    """A run that fits alone, but not beside the runs that a lockstep batch holds already."""


@contextmanager
def beside(held: int):
    """Runs built in this block are stepped beside runs that hold `held` bytes."""
    token = _BESIDE.set(held)
    try:
        yield
    finally:
        _BESIDE.reset(token)


def held_in_lockstep(needs: dict[str, int]) -> int:
    """What a run of `needs` (`check_memory`) holds beside the other runs of its lockstep batch:
    its cohort's parameters and its algorithm's state (the data and one call's layer outputs are
    the group's, shared)."""
    return needs["parameters"] + needs["state"]


def budget(device: torch.device) -> float:
    """Bytes that the runs of this process may hold beside each other."""
    return SHARE * device_memory(device) * PROCESS_SHARE[0]


def budget_text(device: torch.device) -> str:
    """`budget` in words: "90% of this machine's 24.0 GB"."""
    whose = "the GPU's" if device.type == "cuda" else "this machine's"
    text = f"{SHARE:.0%} of {whose} {human_size(device_memory(device))}"
    return text if PROCESS_SHARE[0] == 1 else f"this worker process's share ({PROCESS_SHARE[0]:.2g}) of {text}"


@dataclass(frozen=True)
class State:
    """The algorithm's state on the run's device: what it is (`mifa's table of 100 devices x
    60,000,000 parameters`) and its bytes (0: none worth counting)."""

    what: str = ""
    bytes: int = 0


def device_memory(device: torch.device) -> int:
    """Total bytes of memory of `device`: a GPU's own, or the machine's."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[1]
    try:
        import psutil
    except ImportError:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return psutil.virtual_memory().total


def check_memory(cfg: Config, device: torch.device, n_devices: int, dim: int, state: State,
                 task: Task | None = None, trainer: Trainer | None = None) -> dict[str, int]:
    """The bytes a run of `n_devices` devices of a `dim`-float model needs, by part; FedsimError,
    naming what needs the memory and the key to lower, when it clearly cannot fit on `device`
    (with the built `task` and `trainer`, their data and layer outputs count too); NoRoomBeside
    when it fits alone but not beside the runs of its lockstep batch (`beside`)."""
    cohort = cfg.server.clients_per_round or n_devices
    needs = {"parameters": FLOAT * COPIES * cohort * dim, "state": state.bytes, "activations": 0, "data": 0}
    per_call = width = 0
    if task is not None and trainer is not None:
        ids = np.arange(n_devices)
        per_call, width = trainer.devices_per_call(ids[:cohort]), trainer.batch_width(ids)
        needs.update(activations=FLOAT * task.activations * width * per_call, data=task.data_bytes())
    total = device_memory(device)
    if sum(needs.values()) <= SHARE * total:
        if _BESIDE.get() and sum(needs.values()) + _BESIDE.get() > budget(device):
            raise NoRoomBeside
        return needs
    synthetic = cfg.data.dataset in ("quadratic", "logistic")  # their [data] dim sizes the model
    model = "[model] hidden" if cfg.model.name == "mlp" else "[data] dim" if synthetic else "[model] name"
    cohort_key = "[server] clients_per_round" if cfg.server.clients_per_round else "[data] clients"
    elsewhere = ('[run] device = "cpu" (this machine\'s memory)' if device.type == "cuda"
                 else 'a machine (or with [run] device = "cuda", a GPU) with more memory')
    lower = {"parameters": f"{model} or {cohort_key}" if cohort > 1 else model,
             "state": f"[data] clients (fewer devices) or {model}, choose another [algorithm] name, or use {elsewhere}",
             "activations": "[client] batch_size",
             "data": {"logistic": "[data] samples", "quadratic": "[data] dim"}.get(cfg.data.dataset, "[data] dataset")}
    parts = [f"parameters, gradients and starts of {cohort:,} devices x {dim:,} parameters: "
             f"{human_size(needs['parameters'])}"]
    if state.bytes:
        parts.append(f"{state.what}: {human_size(state.bytes)}")
    if task is not None:
        parts += [f"layer outputs of {per_call * width:,} samples in one call: {human_size(needs['activations'])}",
                  f"data: {human_size(needs['data'])}"]
    where = "the GPU" if device.type == "cuda" else "this machine"
    raise FedsimError(
        f"a local step of the run needs about {human_size(sum(needs.values()))} of memory ({'; '.join(parts)}), "
        f"more than {SHARE:.0%} of the {human_size(total)} of {where}; lower {lower[max(needs, key=needs.get)]}")
